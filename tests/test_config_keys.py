"""One source of truth: configs/default.py and the dataclasses config_rules.py reads from it."""
from __future__ import annotations

import dataclasses
import os

import pytest

from memsearcher_jax.config_rules import (
    COMPUTED_FIELDS,
    KEYS_READ_HERE,
    SECTIONS_OF,
    TrainConfigError,
    grpo_config,
    loop_config,
    typed,
)
from memsearcher_jax.config_utils import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")

# Where the tiny CPU run of configs/default.py departs from a dataclass default (the recipe's
# values, docs/method.md), and why. Any other difference is drift and fails the test below.
TINY_RUN_VALUES = {
    "GRPOConfig.micro_batch_size", "GRPOConfig.logprob_batch_size", "GRPOConfig.min_seq_len",  # a tiny model's rows
    "OptimConfig.learning_rate",                              # 1e-6 is for a pretrained 3B model
    "LoopConfig.max_refill",                                  # refills only act under filter_groups=zero_std
    "AgentConfig.max_turns", "AgentConfig.max_new_tokens", "AgentConfig.memory_budget",  # a 2-core CPU budget
    "AgentConfig.max_response_tokens", "AgentConfig.max_context_tokens",
    "AgentConfig.default_top_n", "AgentConfig.max_top_n",     # the synthetic world's short passages
    "AgentConfig.max_observation_tokens",                     # its observations (<= 971 tokens), none cut
    "AgentConfig.top_p", "AgentConfig.prompt_style",          # a tiny model: plain sampling, a few-token prompt
    "AgentConfig.summary_budget",  # history tokens before a summary: a tiny run's acts and observations are short
    "GRPOConfig.old_logprobs",  # f32 sampling: the sampler's log-probs are the trainer's (the recipe's bf16 are not)
}


def _default():
    return load_config(DEFAULT)


def _fields(cls):
    return {f.name: f for f in dataclasses.fields(cls)}


def test_every_dataclass_field_has_its_config_key():
    cfg = _default()
    for cls, sections in SECTIONS_OF.items():
        for name in _fields(cls):
            if name not in COMPUTED_FIELDS.get(cls, ()):
                assert any(name in cfg[s] for s in sections), f"{cls.__name__}.{name}: no key in {sections}"


def test_every_config_key_of_those_sections_has_a_reader():
    cfg = _default()
    readers: dict[str, set] = {}
    for cls, sections in SECTIONS_OF.items():
        for s in sections:
            readers.setdefault(s, set()).update(_fields(cls))
    for s, names in readers.items():
        unread = set(cfg[s].keys()) - names - set(KEYS_READ_HERE.get(s, ()))
        assert not unread, f"{s}: keys no dataclass takes and no module reads by name: {sorted(unread)}"
    # A key is never in two sections of one dataclass (which one would win?).
    for cls, sections in SECTIONS_OF.items():
        if len(sections) > 1:
            keys = [set(cfg[s].keys()) & set(_fields(cls)) for s in sections]
            assert not set.intersection(*keys), (cls.__name__, set.intersection(*keys))


def test_default_config_agrees_with_the_dataclass_defaults():
    cfg = _default()
    drift = []
    for cls, sections in SECTIONS_OF.items():
        for name, f in _fields(cls).items():
            if f.default is dataclasses.MISSING or name in COMPUTED_FIELDS.get(cls, ()):
                continue
            value = next(cfg[s][name] for s in sections if name in cfg[s])
            if value != f.default and f"{cls.__name__}.{name}" not in TINY_RUN_VALUES:
                drift.append(f"{cls.__name__}.{name}: dataclass {f.default!r}, configs/default.py {value!r}")
    assert not drift, drift
    # And every listed departure is still one (a stale entry hides nothing, but misleads).
    for entry in TINY_RUN_VALUES:
        cls_name, name = entry.split(".")
        cls = next(c for c in SECTIONS_OF if c.__name__ == cls_name)
        value = next(cfg[s][name] for s in SECTIONS_OF[cls] if name in cfg[s])
        assert value != _fields(cls)[name].default, f"{entry} now agrees: drop it from TINY_RUN_VALUES"


def test_fields_once_unreachable_are_set_from_the_config():
    cfg = load_config(DEFAULT, [("rl.max_seq_len", "4096"), ("train.samples_per_log", "9"),
                                ("optim.final_lr_fraction", "0.5"), ("rl.logits_chunk", "64")])
    grpo, loop = grpo_config(cfg), loop_config(cfg)
    assert grpo.max_seq_len == 4096 and grpo.logits_chunk == 64 and grpo.optim.final_lr_fraction == 0.5
    assert loop.samples_per_log == 9 and loop.output_dir == os.path.abspath(cfg.train.output_dir)


def test_a_config_without_a_key_is_refused_naming_it():
    from memsearcher_jax.rl.trainer import LoopConfig

    cfg = _default()
    with cfg.unlocked():
        del cfg.train["samples_per_log"]
    with pytest.raises(TrainConfigError, match=r"no train.samples_per_log or rl.samples_per_log"):
        typed(LoopConfig, cfg, output_dir="x", sampling_dtype="float32")
