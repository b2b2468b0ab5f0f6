"""One typed settings object per run, built once from the config file and its overrides.

    settings = load_settings("configs/default.py", [("rl.group_size", "8")])   # the entry point's one build
    settings = Settings.from_config(cfg)        # a ConfigDict: each key it leaves out at its default
    cfg = settings.to_config()                  # back to a ConfigDict with every key
    settings.problems(training=True)            # every section's own rules, then the cross-section ones
    settings.with_values({"agent.max_turns": 8})  # a copy with some keys changed

`settings.agent.max_turns` reads as `cfg.agent.max_turns` does; `settings["agent"]["max_turns"]`
too. A key the schema does not know is an error naming the closest key, as for a config file.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from memsearcher_jax.settings.agent import AgentSettings, SamplerSettings
from memsearcher_jax.settings.config_utils import (
    ConfigError,
    Schema,
    apply_override,
    closest_key,
    load_config,
    schema_of,
    schema_problems,
)
from memsearcher_jax.settings.cross import cross_section_problems
from memsearcher_jax.settings.fields import Section
from memsearcher_jax.settings.model import (
    DataSettings,
    HardwareSettings,
    MeshSettings,
    ModelSettings,
    RetrievalSettings,
    WorldSettings,
)
from memsearcher_jax.settings.training import OptimSettings, RLSettings, SFTSettings, TrainSettings

# The sections in the config's order; `hardware` is the one a config may leave out (a pod's).
SECTIONS: dict[str, type[Section]] = {
    cls.key: cls for cls in (ModelSettings, WorldSettings, DataSettings, RetrievalSettings, AgentSettings,
                             SamplerSettings, SFTSettings, RLSettings, OptimSettings, TrainSettings, MeshSettings,
                             HardwareSettings)}
OPTIONAL_SECTIONS = ("hardware",)


def _section(cls: type[Section]):
    return dataclasses.field(default_factory=cls)


@dataclasses.dataclass(frozen=True)
class Settings:
    """A run's settings, one frozen dataclass per config section (field names = the config's keys)."""
    model: ModelSettings = _section(ModelSettings)
    world: WorldSettings = _section(WorldSettings)
    data: DataSettings = _section(DataSettings)
    retrieval: RetrievalSettings = _section(RetrievalSettings)
    agent: AgentSettings = _section(AgentSettings)
    sampler: SamplerSettings = _section(SamplerSettings)
    sft: SFTSettings = _section(SFTSettings)
    rl: RLSettings = _section(RLSettings)
    optim: OptimSettings = _section(OptimSettings)
    train: TrainSettings = _section(TrainSettings)
    mesh: MeshSettings = _section(MeshSettings)
    hardware: HardwareSettings | None = None

    @classmethod
    def from_config(cls, cfg: ml_collections.ConfigDict) -> Settings:
        """The settings of a config (a file's, with its overrides): each key it sets, the others at
        their defaults. ConfigError naming each key the schema does not know (with the closest known
        one) and each section it lacks, as for a config file."""
        problems = schema_problems(cfg, schema())
        if problems:
            raise ConfigError(problems[0] if len(problems) == 1 else "invalid config:\n  - " + "\n  - ".join(problems))
        return cls(**{name: SECTIONS[name].from_section(cfg[name]) for name in SECTIONS if name in cfg})

    def to_dict(self) -> dict:
        """Every section and key as plain values (a section or key left unset, left out)."""
        return {name: getattr(self, name).to_dict() for name in SECTIONS if getattr(self, name) is not None}

    def to_config(self) -> ml_collections.ConfigDict:
        """A ConfigDict with every key (overrides are type-checked against its values, as for a file's)."""
        return ml_collections.ConfigDict(self.to_dict())

    def __getitem__(self, name: str) -> Section | None:
        if name not in SECTIONS:
            raise KeyError(name)
        return getattr(self, name)

    def with_values(self, values: Mapping[str, Any] | None = None, /, **dotted: Any) -> Settings:
        """A copy with the given keys changed: `with_values({"agent.max_turns": 8})` or
        `with_values(**{"agent.max_turns": 8})`. ConfigError naming an unknown key."""
        changes: dict[str, dict[str, Any]] = {}
        for key, value in {**(values or {}), **dotted}.items():
            if key not in schema().keys:
                near = closest_key(key, schema())
                raise ConfigError(f"unknown config key {key}" + (f": did you mean {near}?" if near else ""))
            section, _, leaf = key.partition(".")
            changes.setdefault(section, {})[leaf] = value
        return dataclasses.replace(self, **{name: dataclasses.replace(self[name] or SECTIONS[name](), **kv)
                                            for name, kv in changes.items()})

    def problems(self, training: bool = True) -> list[str]:
        """Every section's own rules, then the cross-section ones (settings/cross.py)."""
        sections = [getattr(self, name) for name in SECTIONS if getattr(self, name) is not None]
        return [p for section in sections for p in section.problems(training)] + cross_section_problems(self, training)


@functools.lru_cache(maxsize=1)
def schema() -> Schema:
    """The keys a training or evaluation config may set: every field of every section. Required:
    every section but `hardware`; optional (a config may leave them unset): hardware's keys and
    those whose default is None (model.vocab_size). Named configs/default.py in messages: that
    file sets every key."""
    optional = {name: tuple(f.name for f in dataclasses.fields(cls)
                            if name in OPTIONAL_SECTIONS or f.default is None)
                for name, cls in SECTIONS.items()}
    return schema_of(Settings().to_config(), "configs/default.py", {k: v for k, v in optional.items() if v})


def load_settings(path: str, overrides: Sequence[tuple[str, str]] = ()) -> Settings:
    """The entry point's settings: the config file (its own keys held to the schema), each key it
    leaves out at its default, then the --config.SECTION.KEY=VALUE overrides (type-checked against
    those values)."""
    cfg = Settings.from_config(load_config(path, (), schema())).to_config()
    for key, value in overrides:
        apply_override(cfg, key, value)
    return Settings.from_config(cfg)
