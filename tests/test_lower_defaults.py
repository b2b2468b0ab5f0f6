"""One place for each default (issue 84, item 2): a field of the dataclasses `agent/`, `rl/`,
`data/` and `models/` take, filled from a config key, has no default (its builder always passes
it) or the key's default in memsearcher_jax/settings/; and the builders pass every such field, so
a run's value is its settings' whatever the lower default. Those layers may not import settings/
(tests/test_architecture.py), so the comparison lives here."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from memsearcher_jax.agent.config import AgentConfig
from memsearcher_jax.app.experiment import demo_config
from memsearcher_jax.app.warm_start import sft_config
from memsearcher_jax.data.demos import DemoConfig
from memsearcher_jax.models import ModelConfig
from memsearcher_jax.plan.memory_estimates import model_config_for_plan
from memsearcher_jax.rl.grpo import GRPOConfig
from memsearcher_jax.rl.learner import OptimConfig
from memsearcher_jax.rl.losses import LossConfig
from memsearcher_jax.rl.sft import SFTConfig
from memsearcher_jax.rl.trainer import LoopConfig
from memsearcher_jax.rules.config_rules import (
    COMPUTED_FIELDS,
    SECTIONS_OF,
    agent_config,
    grpo_config,
    loop_config,
    output_path,
)
from memsearcher_jax.settings import Settings

# Fields under another name than their key, or in a dataclass config_rules.typed does not fill.
RENAMED = {
    (AgentConfig, "sampler_batch_size"): "sampler.batch_size",
    (LossConfig, "temperature"): "agent.temperature",      # greedy (0) becomes 1.0 for the learner
    (LoopConfig, "output_dir"): "train.output_dir",         # made absolute
    **{(DemoConfig, k): f"sft.{k}" for k in ("vague_query_rate", "wrong_answer_rate", "early_answer_rate",
                                             "two_hop_early_rate", "early_two_hop", "early_several",
                                             "react_share", "no_result_note")},
    (DemoConfig, "top_n"): "agent.default_top_n",
    (DemoConfig, "workflow"): "agent.workflow",
    (DemoConfig, "turns_per_question"): "agent.turns_per_question",
    (SFTConfig, "batch_size"): "sft.batch_size",
    (SFTConfig, "lr"): "sft.learning_rate",
    (SFTConfig, "warmup"): "sft.warmup",                    # at most the steps
    (SFTConfig, "seed"): "train.seed",
    (SFTConfig, "max_len"): "agent.max_context_tokens",
    (SFTConfig, "min_len"): "sft.min_len",
    (SFTConfig, "max_batch_tokens"): "sft.max_batch_tokens",
    **{(ModelConfig, k): f"model.{k}" for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                                                "num_kv_heads", "head_dim", "param_dtype", "lora_rank",
                                                "lora_alpha", "lora_targets")},
}
# Fields whose default stays apart from the key's, and why; the builders pass the key's value.
KEPT_APART = {
    # ModelConfig is the model library's description of a network (presets, config.json, each
    # checkpoint's metadata read back with ModelConfig(**meta)): its defaults are full precision
    # and no scan, those of a model built or loaded outside a run, and of a checkpoint written
    # before a field existed. model.* keys describe a run's policy (bf16, scanned, rematerialised;
    # rope_theta only for a random init, which the Qwen presets set to 1e6).
    (ModelConfig, "dtype"): "model.dtype",
    (ModelConfig, "scan_layers"): "model.scan_layers",
    (ModelConfig, "remat"): "model.remat",
    (ModelConfig, "rope_theta"): "model.rope_theta",
    # The dtype weights move to the sampler in: the model's compute dtype, ModelConfig.dtype's default above.
    (LoopConfig, "sampling_dtype"): "model.dtype",
}
# Fields the builders compute from several keys (no key's default to compare with), and the
# warm start's own constants, which no key sets.
DERIVED = {(DemoConfig, "max_turns"), (SFTConfig, "steps"), (OptimConfig, "total_steps"),
           (OptimConfig, "later_rates"), (GRPOConfig, "loss"), (GRPOConfig, "optim")}
NO_KEY = {(SFTConfig, name) for name in ("final_lr_fraction", "weight_decay", "max_grad_norm", "progress")}


def mapped_fields() -> dict[tuple[type, str], str]:
    """(lower dataclass, field) -> the config key whose value it holds."""
    mapping = dict(RENAMED)
    for cls, sections in SECTIONS_OF.items():
        for f in dataclasses.fields(cls):
            if f.name not in COMPUTED_FIELDS.get(cls, ()):
                section = next(s for s in sections if f.name in {g.name for g in dataclasses.fields(Settings()[s])})
                mapping[(cls, f.name)] = f"{section}.{f.name}"
    return mapping


def setting_value(settings: Settings, key: str):
    section, name = key.split(".")
    return getattr(settings[section], name)


def default_of(cls, name: str):
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def apart_from_the_settings(mapping) -> list[str]:
    """Each field with a default that is not its key's default, named with both."""
    settings = Settings()
    return [f"{cls.__name__}.{name}: {default_of(cls, name)!r}, {key} {setting_value(settings, key)!r}"
            for (cls, name), key in mapping.items()
            if default_of(cls, name) is not dataclasses.MISSING
            and default_of(cls, name) != setting_value(settings, key)]


def test_the_check_finds_a_default_apart_from_its_keys():
    @dataclasses.dataclass(frozen=True)
    class Lower:
        seed: int                   # no default: its builder always passes it
        max_turns: int = 7          # agent.max_turns is 5
        top_p: float = 0.99         # agent.top_p's

    found = apart_from_the_settings({(Lower, "max_turns"): "agent.max_turns", (Lower, "top_p"): "agent.top_p",
                                     (Lower, "seed"): "train.seed"})
    assert found == ["Lower.max_turns: 7, agent.max_turns 5"]


def test_every_lower_default_is_its_keys_default():
    mapping = mapped_fields()
    assert not apart_from_the_settings(mapping)
    # Each field kept apart still is (an entry that now agrees belongs in the check above).
    assert len(apart_from_the_settings(KEPT_APART)) == len(KEPT_APART)


def test_every_field_of_the_built_dataclasses_is_accounted_for():
    """A field added to one of these dataclasses is mapped to its key, kept apart or derived."""
    known = set(mapped_fields()) | set(KEPT_APART) | DERIVED | NO_KEY
    built = [*SECTIONS_OF, DemoConfig, SFTConfig]
    unknown = [f"{cls.__name__}.{f.name}" for cls in built for f in dataclasses.fields(cls)
               if (cls, f.name) not in known]
    assert not unknown


# ----------------------------------------------------------------------------- the builders pass every field

ALTERNATIVES = {  # a valid value other than the default, for each key that is not a number or a bool
    "agent.workflow": "react", "agent.summary_overlong_mask": "segment", "agent.prompt_style": "compact",
    "rl.aggregation": "trajectory_mean", "rl.kl_estimator": "k1", "rl.filter_groups": "zero_std",
    "rl.old_logprobs": "sampler", "rl.info_signal": "reward", "optim.schedule": "cosine",
    "sft.early_two_hop": "first_hop", "sft.early_several": "skip", "sft.no_result_note": "No page on {s}.",
    "train.output_dir": "/tmp/elsewhere", "model.dtype": "float32", "model.param_dtype": "bfloat16",
    "model.lora_targets": ("q", "v"), "model.num_kv_heads": 3,  # a divisor of num_heads (4 + 2)
}


def changed(value, key: str):
    """A valid value other than `value` (ints + 2 keep head_dim even and num_heads a multiple of num_kv_heads)."""
    if key in ALTERNATIVES:
        return ALTERNATIVES[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 2
    return value / 2 if value else 0.1


def every_key_changed() -> Settings:
    keys = {key for key in {**mapped_fields(), **KEPT_APART}.values()}
    base = Settings()
    return base.with_values({key: changed(setting_value(base, key), key) for key in keys} | {"model.source": "init"})


def _call(builder, settings: Settings, *args):
    """builder(settings) or, for a builder still taking the ConfigDict, builder(its ConfigDict)."""
    first = next(iter(inspect.signature(builder).parameters.values()))
    takes_dict = "ConfigDict" in str(first.annotation)
    return builder(settings.to_config() if takes_dict else settings, *args)


def built(settings: Settings) -> dict[type, object]:
    grpo = _call(grpo_config, settings)
    return {AgentConfig: _call(agent_config, settings), GRPOConfig: grpo, LossConfig: grpo.loss,
            OptimConfig: grpo.optim, LoopConfig: _call(loop_config, settings),
            DemoConfig: _call(demo_config, settings), SFTConfig: _call(sft_config, settings, 10 ** 6),
            ModelConfig: _call(model_config_for_plan, settings, 512)}


@pytest.mark.parametrize("which", ["defaults", "every key changed"])
def test_the_builders_pass_each_keys_value(which):
    settings = Settings().with_values({"model.source": "init"}) if which == "defaults" else every_key_changed()
    lower = built(settings)
    wrong = []
    for (cls, name), key in {**mapped_fields(), **KEPT_APART}.items():
        want, got = setting_value(settings, key), getattr(lower[cls], name)
        if key == "train.output_dir":
            want = output_path(want)  # the run's directory, made absolute
        if got != want:
            wrong.append(f"{cls.__name__}.{name}: {got!r}, {key} {want!r}")
    assert not wrong
