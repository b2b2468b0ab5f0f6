"""The typed settings (memsearcher_jax/settings/): one place for each default and doc line, a
config's values unchanged through them, the reference page they generate, and no `.get(key,
default)` fallback left to give a run another value than its config."""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os

import ml_collections
import pytest

from memsearcher_jax.settings import (
    SECTIONS,
    HardwareSettings,
    MeshSettings,
    Settings,
    doc_of,
    load_settings,
    schema,
    setting,
)
from memsearcher_jax.settings.config_utils import ConfigError, load_config, load_config_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
RECIPE_3B = os.path.join(ROOT, "configs", "memsearcher_qwen2_5_3b.py")
RECIPE = os.path.join(ROOT, "configs", "recipe.py")


def _shipped() -> list[str]:
    """configs/default.py, the recipe and every pod recipe of configs/recipe.py."""
    return [DEFAULT, RECIPE_3B] + [f"{RECIPE}:{model},{pod}" for model, pod in load_config_module(RECIPE).RECIPES]


# ----------------------------------------------------------------------------- doc lines and the reference page

def undocumented(cls) -> list[str]:
    """The fields of a section that lack a one-line doc or a type."""
    return [f.name for f in dataclasses.fields(cls) if not doc_of(f).strip() or "\n" in doc_of(f) or not f.type]


def test_the_doc_line_check_catches_a_field_without_one():
    @dataclasses.dataclass(frozen=True)
    class Loose:
        documented: int = setting(1, "a doc line")
        bare: int = 2
        two_lines: int = setting(3, "a doc\nover two lines")
    assert undocumented(Loose) == ["bare", "two_lines"]


def test_every_key_has_a_type_and_a_doc_line():
    for name, cls in SECTIONS.items():
        assert undocumented(cls) == [], f"{name}: fields without a one-line doc"
    count = sum(len(dataclasses.fields(cls)) for cls in SECTIONS.values())
    assert count == len(schema().keys)  # every key a config may set is a field


def test_the_reference_page_is_current_and_lists_every_key():
    """docs/config.md is what `python -m memsearcher_jax.settings.reference` writes now."""
    from memsearcher_jax.settings.reference import PAGE, main, reference_page

    text = reference_page()
    with open(PAGE, encoding="utf-8") as f:
        assert f.read() == text, "docs/config.md is stale: run python -m memsearcher_jax.settings.reference"
    assert all(f"| `{key}` |" in text for key in schema().keys)
    assert main(["--check"]) == 0
    assert "| `agent.max_context_tokens` | `int` | `16384` | `1024` |" in text  # default, then the CPU job's


# ----------------------------------------------------------------------------- a config through the settings

def test_every_shipped_config_keeps_every_value_through_the_settings():
    """A config file's values are its settings' values: from_config then to_config gives the same
    dict (every key, no key added), and the record a run compares on resume is unchanged."""
    from memsearcher_jax.rules.run_dir import config_record

    for path in _shipped():
        cfg = load_config(path)
        settings = Settings.from_config(cfg)
        assert settings.to_config().to_dict() == cfg.to_dict(), path
        assert json.dumps(config_record(settings.to_config())) == json.dumps(config_record(cfg)), path
        assert Settings.from_config(settings.to_config()) == settings, path


def test_the_run_record_of_the_default_job_and_the_recipe_is_the_one_before_the_settings():
    """run_config.json (run_dir.config_record) of configs/default.py and the recipes as the code
    before the typed settings (8b8171c) wrote it, model.source aside (a path of this checkout): a
    resume would otherwise call an old run another experiment. A deliberate change of a shipped
    value moves a digest: say so, then recompute it. A key added since is held at its default
    (off) and left out of the digest (a recorded run without it resumes: run_dir.changed_keys)."""
    from memsearcher_jax.rules.run_dir import config_record

    added_since = {("rl", "max_staleness"): 0, ("sampler", "devices"): 0,  # issue 85
                   ("rl", "coverage_coef"): 0.0}  # issue 83

    digests = {DEFAULT: "a4091bfd7344ec1d1a148820bd0b787e33d0b2745178d736a6921361e8b57d02",
               RECIPE_3B: "54c865bd9f8b4b1a037f6f30625990440e497c790047b926f06785cc26fefbf8",
               f"{RECIPE}:qwen2_5_7b,v5e_64": "0bac762aaa52ee672fc581d8ecf210561078fe927e08b1052a86ed4152c6bdea"}
    for path, digest in digests.items():
        record = config_record(load_settings(path).to_config())
        record["model"]["source"] = "<source>"
        for (section, key), default in added_since.items():
            assert record[section].pop(key) == default, (path, f"{section}.{key}")
        assert hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest() == digest, path


def test_a_key_a_file_leaves_out_takes_its_default_and_can_be_overridden(tmp_path):
    """The entry point's config has every key: one a file leaves out takes the dataclass default,
    and --config.SECTION.KEY reaches it, type-checked. Before the settings, such a config had no
    key (the rules' `.get(key, default)` and the readers could disagree on its value)."""
    from memsearcher_jax.cli import _load

    path = tmp_path / "mine.py"
    path.write_text(f"from memsearcher_jax.settings.config_utils import load_config\n\n\ndef get_config():\n"
                    f"    c = load_config({DEFAULT!r})\n    del c.rl['old_logprobs']\n    del c.sft['early_two_hop']\n"
                    f"    return c\n")
    args = type("Args", (), {"config": str(path), "config_overrides": [("sft.early_two_hop", "first_hop")]})
    cfg = _load(args)
    assert cfg.rl.old_logprobs == "recompute" == Settings().rl.old_logprobs  # the default, not configs/default.py's
    assert cfg.sft.early_two_hop == "first_hop"
    bad = type("Args", (), {"config": str(path), "config_overrides": [("rl.kl_coef", "lots")]})
    with pytest.raises(ConfigError, match=r"--config.rl.kl_coef: expected a number"):
        _load(bad)


def test_a_bench_run_recorded_before_a_key_existed_reads_it_at_its_default(tmp_path):
    """bench/episode_report.py replays a paper_tables run from its settings.json: a section it records
    without a key added since (agent.hint, world.objectives_schedule) gets the key at its default,
    which the readers, with no `.get` fallback left, need; a section it does not record, the section's
    defaults (the report's Settings have every section)."""
    from tests.bench_loader import load_bench

    recorded = load_config(DEFAULT).to_dict()
    del recorded["agent"]["hint"], recorded["world"]["objectives_schedule"], recorded["mesh"]
    (tmp_path / "settings.json").write_text(json.dumps({"workflow_configs": {"memsearcher": recorded}}, default=list))
    cfg = load_bench("episode_report").run_config(str(tmp_path), "memsearcher")
    assert cfg.agent.hint == "none" and cfg.world.objectives_schedule == "" and cfg.mesh == MeshSettings()
    assert cfg.agent.max_turns == load_config(DEFAULT).agent.max_turns  # what it records stays
    assert cfg.train.output_dir == os.path.join(str(tmp_path), "memsearcher")


def test_an_unknown_key_is_refused_naming_the_closest_and_a_missing_section_named():
    cfg = load_config(DEFAULT)
    cfg.rl.group_szie = 8
    with pytest.raises(ConfigError, match=r"unknown config key rl.group_szie: did you mean rl.group_size\?"):
        Settings.from_config(cfg)
    partial = ml_collections.ConfigDict({"model": {"dtype": "float32"}})
    with pytest.raises(ConfigError, match=r"the config has no world section"):
        Settings.from_config(partial)
    with pytest.raises(ConfigError, match=r"unknown config key agent.max_turn: did you mean agent.max_turns\?"):
        Settings().with_values({"agent.max_turn": 3})


def test_settings_read_as_the_config_does():
    """`s.agent.max_turns`, `s["agent"]["max_turns"]` and the ConfigDict's reads agree on every key;
    with_values changes a copy; an optional section is None until a config sets it."""
    cfg = load_config(f"{RECIPE}:qwen2_5_3b,v5e_64")
    s = Settings.from_config(cfg)
    for name in SECTIONS:
        for key, value in cfg[name].items():
            assert getattr(s[name], key) == s[name][key] == value, f"{name}.{key}"
    changed = s.with_values({"agent.max_turns": 8}, **{"rl.group_size": 3})
    assert (changed.agent.max_turns, changed.rl.group_size, s.agent.max_turns) == (8, 3, cfg.agent.max_turns)
    assert changed.agent.top_p == s.agent.top_p and Settings().hardware is None
    assert s.hardware.hosts == 16 and Settings.from_config(load_config(DEFAULT)).hardware is None
    assert HardwareSettings.from_section(ml_collections.ConfigDict({"num_devices": 8})).hosts == 1
    with pytest.raises(KeyError):
        s["agent"]["max_turn"]


def test_the_settings_schema_is_the_config_files_schema():
    from memsearcher_jax.settings.config_utils import training_schema

    ours, theirs = schema(), training_schema()
    assert (ours.keys, ours.sections, ours.required, ours.optional) == \
        (theirs.keys, theirs.sections, theirs.required, theirs.optional)


def test_each_sections_rules_and_the_cross_section_ones_still_name_their_keys():
    """One wrong value in every section and one disagreement between sections: each reported once,
    naming its key, together (the rules moved from config_rules.py into the sections)."""
    from memsearcher_jax.rules.config_rules import config_problems

    wrong = {"model.dtype": "float8", "world.schedule_window": 0, "retrieval.kind": "faiss", "agent.hint": "loud",
             "sampler.prefill_query_block": -1, "sft.early_two_hop": "never", "rl.filter_groups": "some",
             "train.steps": -1, "data.train_path": "x.jsonl"}
    cfg = Settings.from_config(load_config(DEFAULT)).with_values(wrong, **{"rl.old_logprobs": "sampler",
                                                                         "sampler.cache_dtype": "bfloat16"})
    problems = config_problems(cfg.to_config(), files=False)
    for key in [*wrong, "rl.old_logprobs='sampler'"]:
        assert sum(p.startswith(key) for p in problems) == 1, (key, problems)
    assert len(problems) == len(wrong) + 1, problems


# ----------------------------------------------------------------------------- no fallback defaults

SECTION_NAMES = frozenset(SECTIONS)
CONFIG_NAMES = frozenset({"cfg", "config", "c", "base"})


def _name(node) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def fallbacks(source: str) -> list[str]:
    """`.get(...)` reads of a config section that would give a value the config does not hold:
    `cfg.rl.get(...)`, `cfg[section].get(...)`, `cfg.get("hardware")`, and `.get` on a name bound
    to a section in the same function (`hw = cfg.hardware; hw.get(...)`)."""
    tree, found = ast.parse(source), []
    scopes = [(tree, set())] + [(f, _section_names(f)) for f in ast.walk(tree)
                                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope, bound in scopes:
        for n in ast.walk(scope):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"):
                continue
            recv = n.func.value
            if (_name(recv) in SECTION_NAMES or _section_get(n) or isinstance(recv, ast.Name) and recv.id in bound
                    or isinstance(recv, ast.Subscript) and _name(recv.value) in CONFIG_NAMES):
                found.append(f"{n.lineno}: {ast.unparse(n)}")
    return sorted(set(found), key=lambda hit: int(hit.split(":")[0]))


def _section_names(func) -> set[str]:
    """Names a function binds to a config section (`w = cfg.world`, `hw = cfg.get("hardware")`, `s = cfg[k]`)."""
    def is_section(value) -> bool:
        return (_name(value) in SECTION_NAMES or _section_get(value)
                or isinstance(value, ast.Subscript) and _name(value.value) in CONFIG_NAMES)
    return {t.id for n in ast.walk(func) if isinstance(n, ast.Assign) and is_section(n.value) for t in n.targets
            if isinstance(t, ast.Name)}


def _section_get(node) -> bool:
    """`x.get("<section>", ...)`: a section read that may be absent."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in SECTION_NAMES)


def test_the_fallback_finder_finds_each_kind():
    source = ("def f(cfg, section):\n    a = cfg.rl.get('old_logprobs', 'recompute')\n"
              "    hw = cfg.get('hardware', None)\n    b = hw.get('hosts', 1)\n    w = cfg.world\n"
              "    d = w.get('schedule_window', 5)\n"
              "    e = cfg[section].get('x', 'auto')\n    ok = {'a': 1}.get('a')\n    return cfg.rl.old_logprobs\n")
    assert [line.split(":")[0] for line in fallbacks(source)] == ["2", "3", "4", "6", "7"]


def test_no_config_key_has_a_fallback_default_in_the_library_or_the_benches():
    """Every value a run reads is its config's (the settings fill what a file leaves out): no
    `cfg.section.get(key, default)` in memsearcher_jax/ (pretrain/ reads its own config) or bench/."""
    found = {}
    for top in ("memsearcher_jax", "bench"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            if os.path.join("memsearcher_jax", "pretrain") in dirpath:
                continue
            for n in names:
                if n.endswith(".py") and (hits := fallbacks(open(os.path.join(dirpath, n), encoding="utf-8").read())):
                    found[os.path.relpath(os.path.join(dirpath, n), ROOT)] = hits
    assert not found, found
