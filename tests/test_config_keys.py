"""One source of truth: configs/default.py and the dataclasses config_rules.py reads from it."""
from __future__ import annotations

import dataclasses
import os

import ml_collections
import pytest

from memsearcher_jax.rules.config_rules import (
    COMPUTED_FIELDS,
    KEYS_READ_HERE,
    SECTIONS_OF,
    TrainConfigError,
    config_problems,
    grpo_config,
    loop_config,
    validate,
)
from memsearcher_jax.settings import Settings
from memsearcher_jax.settings.config_utils import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")

# Where the tiny CPU run of configs/default.py departs from a dataclass default (the recipe's
# values, docs/method.md), and why. Any other difference is drift and fails the test below.
TINY_RUN_VALUES = {
    "GRPOConfig.micro_batch_size", "GRPOConfig.min_seq_len",  # a tiny model's rows
    "OptimConfig.learning_rate",                              # 1e-6 is for a pretrained 3B model
    "LoopConfig.save_every", "LoopConfig.eval_every",         # 10 CPU steps: one checkpoint, evaluated at the ends
    "AgentConfig.max_turns", "AgentConfig.max_new_tokens", "AgentConfig.memory_budget",  # a 2-core CPU budget
    "AgentConfig.max_response_tokens", "AgentConfig.max_context_tokens",
    "AgentConfig.default_top_n", "AgentConfig.max_top_n",     # the synthetic world's short passages
    "AgentConfig.missing_top_n",                              # a call without top_n gets what the prompt says
    "AgentConfig.max_observation_tokens",                     # its observations (<= 971 tokens), none cut
    "AgentConfig.top_p", "AgentConfig.prompt_style",          # a tiny model: plain sampling, a few-token prompt
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
    cfg = Settings.from_config(load_config(DEFAULT, [("rl.max_seq_len", "4096"), ("train.samples_per_log", "9"),
                                                     ("optim.final_lr_fraction", "0.5"), ("rl.logits_chunk", "64")]))
    grpo, loop = grpo_config(cfg), loop_config(cfg)
    assert grpo.max_seq_len == 4096 and grpo.logits_chunk == 64 and grpo.optim.final_lr_fraction == 0.5
    assert loop.samples_per_log == 9 and loop.output_dir == os.path.abspath(cfg.train.output_dir)


def test_a_config_without_a_key_is_refused_naming_it():
    # A ConfigDict is refused at the entry (config_problems), before any Settings or typed reader.
    cfg = _default()
    with cfg.unlocked():
        del cfg.train["samples_per_log"]
    problems = config_problems(cfg, files=False)
    assert len(problems) == 1 and "the config has no train.samples_per_log" in problems[0]
    with pytest.raises(TrainConfigError, match=r"the config has no train.samples_per_log"):
        validate(cfg)


# ----------------------------------------------------------------------------- issue 82, item 11: a config file's keys

def _write_config(path, *lines, base=DEFAULT) -> str:
    """A config file made as the docs advise: the shipped config's get_config(), then changes."""
    body = "\n".join(f"    {line}" for line in lines)
    path.write_text(f"from memsearcher_jax.settings.config_utils import load_config\n\n\ndef get_config():\n"
                    f"    c = load_config({base!r})\n{body}\n    return c\n")
    return str(path)


def _run(capsys, *argv) -> tuple[int, str]:
    from memsearcher_jax.cli import main

    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_every_shipped_config_sets_only_known_keys():
    """configs/default.py, the recipe and every pod recipe (its hardware section, model.vocab_size
    optional) against the training schema; configs/base_v8.py against the pretraining one."""
    from memsearcher_jax.settings.config_utils import (
        load_config_module,
        pretrain_schema,
        schema_problems,
        training_schema,
    )

    recipe = os.path.join(ROOT, "configs", "recipe.py")
    shipped = [DEFAULT, os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py")]
    shipped += [f"{recipe}:{model},{pod}" for model, pod in load_config_module(recipe).RECIPES]
    for path in shipped:
        assert schema_problems(load_config(path), training_schema()) == [], path
    assert "hardware.device_memory_gib" in training_schema().keys and "hardware" not in training_schema().required
    assert schema_problems(load_config(os.path.join(ROOT, "configs", "base_v8.py")), pretrain_schema()) == []


def _documented_commands() -> list[tuple[str, str, list[str]]]:
    """(command, --config, its --config.K=V overrides) of every `memsearcher-jax train|eval|plan|
    pretrain --config FILE` in the README and docs/ (not the dated lab notes), placeholders left out."""
    import glob
    import re
    import shlex

    found = []
    for doc in [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md"))]:
        text = open(doc, encoding="utf-8").read().replace("\\\n", " ")
        for m in re.finditer(r"memsearcher-jax (train|eval|plan|pretrain)\b([^`\n#]*)", text):
            words = shlex.split(m[2].replace("[", " ").replace("]", " ").replace("...", " "))
            if "--config" not in words[:-1]:
                continue
            path = words[words.index("--config") + 1]
            if not re.fullmatch(r"configs/[a-z0-9_]+\.py(:[a-z0-9_]+,[a-z0-9_]+)?", path):
                continue  # configs/recipe.py:MODEL,POD and the like
            overrides = [w for w in words if w.startswith("--config.") and "=" in w and not re.search(r"[A-Z]{3}", w)]
            found.append((m[1], path, overrides))
    return found


def test_every_config_the_docs_name_loads_with_its_overrides():
    from memsearcher_jax.cli import _load
    from memsearcher_jax.settings.config_utils import pretrain_schema, split_overrides, training_schema

    commands = _documented_commands()
    assert {c for c, _, _ in commands} == {"train", "eval", "plan", "pretrain"}, commands
    assert any(o for _, _, o in commands)  # overrides are among them
    for command, path, words in commands:
        args = type("Args", (), {"config": os.path.join(ROOT, path), "config_overrides": split_overrides(words)[1]})
        cfg = _load(args, pretrain_schema if command == "pretrain" else training_schema)
        assert cfg is not None, (command, path, words)


@pytest.mark.parametrize("command", ["train", "eval", "plan"])
def test_a_misspelled_key_in_a_config_file_is_refused_naming_the_closest(command, tmp_path, capsys):
    """`c.rl.group_szie = 8` in a config file was accepted and recorded (a misspelled --config.
    override was refused): now one line naming the key and the one it most likely meant, exit 2,
    before any work."""
    from memsearcher_jax.bases import DEFAULT_BASE

    path = _write_config(tmp_path / "mine.py", "c.rl.group_szie = 8", f"c.train.output_dir = {str(tmp_path / 'r')!r}")
    extra = ["--model", DEFAULT_BASE] if command == "eval" else []
    code, msg = _run(capsys, command, "--config", path, *extra)
    assert code == 2, msg
    assert "unknown config key rl.group_szie: did you mean rl.group_size?" in msg and path in msg, msg
    assert len(msg.strip().splitlines()) == 1 and "Traceback" not in msg
    assert not (tmp_path / "r").exists()


def test_a_misplaced_or_misspelled_key_names_where_it_belongs():
    from memsearcher_jax.rules.config_rules import config_problems

    cfg = _default()
    cfg.train.group_size = 3             # a key of another section
    cfg.optim.learnin_rate = 1e-3        # a misspelling
    cfg.hardwre = ml_collections.ConfigDict({"hosts": 2})
    problems = config_problems(cfg, files=False)  # a library user's config is held to the same keys
    assert any("unknown config key train.group_size: did you mean rl.group_size?" in p for p in problems), problems
    assert any("optim.learnin_rate: did you mean optim.learning_rate?" in p for p in problems), problems
    assert any("unknown config key hardwre: did you mean hardware?" in p for p in problems), problems


def test_a_misspelled_key_in_a_pretraining_config_file_is_refused(tmp_path, capsys):
    base = os.path.join(ROOT, "configs", "base_v8.py")
    path = _write_config(tmp_path / "base.py", "c.train.log_evry = 10",
                         "c.train.output_dir = " + repr(str(tmp_path / "r")), base=base)
    code, msg = _run(capsys, "pretrain", "--config", path)
    assert code == 2 and "unknown config key train.log_evry: did you mean train.log_every?" in msg, msg
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["train", "eval", "plan"])
def test_a_config_file_missing_a_section_is_one_line(command, tmp_path, capsys):
    """A config file without a whole section: a 48-line AttributeError; now one line naming it (issue 82, item 22)."""
    from memsearcher_jax.bases import DEFAULT_BASE

    path = _write_config(tmp_path / "mine.py", "del c['world']")
    extra = ["--model", DEFAULT_BASE] if command == "eval" else []
    code, msg = _run(capsys, command, "--config", path, *extra)
    assert code == 2 and "the config has no world section" in msg, msg
    assert len(msg.strip().splitlines()) == 1 and "Traceback" not in msg


def test_a_config_missing_a_key_a_rule_reads_names_it():
    from memsearcher_jax.rules.config_rules import config_problems

    cfg = _default()
    with cfg.unlocked():
        del cfg.rl["batch_questions"]
    problems = config_problems(cfg, files=False)
    assert len(problems) == 1 and "the config has no rl.batch_questions" in problems[0], problems
