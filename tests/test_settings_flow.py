"""Below the entry points no function takes the raw ConfigDict: each takes the typed Settings, or
the section it reads (memsearcher_jax/settings/). An ast scan of memsearcher_jax/ (outside
pretrain/, which has its own config) and bench/ for a parameter annotated ml_collections.ConfigDict."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (file, function): why it may take a ConfigDict.
ENTRY_POINTS = {
    ("memsearcher_jax/settings/config.py", "from_config"): "the conversion itself: ConfigDict -> Settings",
    ("memsearcher_jax/settings/config_utils.py", "schema_of"): "the schema is read off a ConfigDict with every key",
    ("memsearcher_jax/settings/config_utils.py", "missing_keys"):
        "names the keys a user's file lacks (before any Settings)",
    ("memsearcher_jax/settings/config_utils.py", "schema_problems"): "names a file's unknown keys and missing sections",
    ("memsearcher_jax/settings/config_utils.py", "apply_override"): "--config.SECTION.KEY=VALUE on the file's dict",
    ("memsearcher_jax/rules/config_rules.py", "config_problems"):
        "a library user's check of a file: its missing and unknown keys reported before it becomes Settings",
    ("memsearcher_jax/rules/config_rules.py", "validate"): "config_problems raised: the library user's one-call check",
    ("memsearcher_jax/rules/config_rules.py", "settings_of"):
        "the jobs' first line: a user's ConfigDict, converted once",
    ("memsearcher_jax/app/jobs.py", "train_job"): "a job: a library user may call it with a ConfigDict",
    ("memsearcher_jax/app/jobs.py", "run_eval"): "a job: a library user may call it with a ConfigDict",
}


def _scanned_files():
    for top in ("memsearcher_jax", "bench"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ("pretrain", "__pycache__")]
            for name in filenames:
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/")


def configdict_parameters(rel: str) -> list[tuple[str, str, int]]:
    """(function, parameter, line) of each parameter of `rel` annotated as a ConfigDict."""
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs:
                if arg.annotation is not None and "ConfigDict" in ast.unparse(arg.annotation):
                    found.append((node.name, arg.arg, node.lineno))
    return found


def test_scan_finds_a_configdict_parameter(tmp_path):
    # The scan itself: a parameter annotated with the ConfigDict (as a string or in a union) is found.
    path = tmp_path / "m.py"
    path.write_text("import ml_collections\n\ndef f(cfg: ml_collections.ConfigDict, n: int):\n    pass\n\n"
                    "def g(s: 'ml_collections.ConfigDict | None' = None):\n    pass\n\ndef h(s: int):\n    pass\n")
    # os.path.join(ROOT, an absolute path) is that path.
    assert [(fn, p) for fn, p, _ in configdict_parameters(str(path))] == [("f", "cfg"), ("g", "s")]


def test_no_function_below_the_entry_points_takes_a_configdict():
    offenders = [f"{rel}:{line} {fn}({param})" for rel in _scanned_files()
                 for fn, param, line in configdict_parameters(rel) if (rel, fn) not in ENTRY_POINTS]
    assert not offenders, ("take the typed Settings (memsearcher_jax.settings) or the section read, not the raw "
                           "ConfigDict (an entry point converts once: Settings.from_config):\n  " +
                           "\n  ".join(offenders))


def test_every_listed_entry_point_exists():
    # A stale allowance (its function renamed or converted) would let a new ConfigDict parameter in unseen.
    present = {(rel, fn) for rel in _scanned_files() for fn, _, _ in configdict_parameters(rel)}
    assert not set(ENTRY_POINTS) - present, sorted(set(ENTRY_POINTS) - present)
