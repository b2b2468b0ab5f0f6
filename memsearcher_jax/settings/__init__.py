"""Typed settings: one frozen dataclass per config section, each owning its keys' defaults, their
doc lines and its own rules; the cross-section rules in settings/cross.py; the reference page
(docs/config.md) generated from them (settings/reference.py).

    from memsearcher_jax.settings import Settings, load_settings
    settings = load_settings("configs/default.py", overrides)   # file + overrides -> Settings, once
    settings.agent.max_turns                                    # a typed read, as cfg.agent.max_turns

Light to import (no JAX): configs/default.py starts from `Settings().to_config()`.
"""
from memsearcher_jax.settings.agent import AgentSettings, SamplerSettings
from memsearcher_jax.settings.config import (
    OPTIONAL_SECTIONS,
    SECTIONS,
    Settings,
    load_settings,
    schema,
)
from memsearcher_jax.settings.cross import cross_section_problems
from memsearcher_jax.settings.fields import Section, TrainConfigError, doc_of, setting
from memsearcher_jax.settings.model import (
    DataSettings,
    HardwareSettings,
    MeshSettings,
    ModelSettings,
    RetrievalSettings,
    WorldSettings,
)
from memsearcher_jax.settings.readers import (
    auto_flag,
    demo_objective_counts,
    multi_answer_prompt,
    parse_objective_counts,
    train_objective_counts,
)
from memsearcher_jax.settings.training import (
    OptimSettings,
    RLSettings,
    SFTSettings,
    TrainSettings,
    info_problems,
    load_reward_fn,
)

__all__ = [
    "OPTIONAL_SECTIONS", "SECTIONS", "AgentSettings", "DataSettings", "HardwareSettings", "MeshSettings",
    "ModelSettings", "OptimSettings", "RLSettings", "RetrievalSettings", "SFTSettings", "SamplerSettings", "Section",
    "Settings", "TrainConfigError", "TrainSettings", "WorldSettings", "auto_flag", "cross_section_problems",
    "demo_objective_counts", "doc_of", "info_problems", "load_reward_fn", "load_settings", "multi_answer_prompt",
    "parse_objective_counts", "schema", "setting", "train_objective_counts",
]
