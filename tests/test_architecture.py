"""The house's shape: no import circles, layers that point one way, the method cited in-repo.

Imports are read with `ast` from every file of the library (module level, inside functions and
under `if TYPE_CHECKING:`: a lazy or a type-only import is still a dependency), so a new circle
or a layer pointing back fails here.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("memsearcher_jax", "retrieval", "launch")


def _modules(root: str = ROOT, packages=PACKAGES) -> dict[str, str]:
    """dotted module name -> file path, for every .py file of the packages."""
    out = {}
    for pkg in packages:
        for dirpath, _, files in os.walk(os.path.join(root, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].replace(os.sep, ".")
                    out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


def import_graph(root: str = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the modules of ours it imports. A package's face (`__init__`) is a module like any
    other: `from pkg import name` leans on it, `from pkg import module` on that module alone (the
    face runs first in Python, but that holds for every module of a package, so it is no arrow)."""
    mods = _modules(root, packages)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                # the longest known module the name starts with (a package's face counts as itself)
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_reader_sees_type_only_imports_and_circles_through_a_face(tmp_path):
    files = {
        # a <-> b, where b's arrow is for annotations only
        "pkg/a.py": "from pkg.b import B\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\nB = 1\n",
        # c -> the face of sub -> sub.d -> c: a circle that runs through a package's __init__
        "pkg/c.py": "from pkg.sub import D\n",
        "pkg/sub/__init__.py": "from pkg.sub.d import D\n",
        "pkg/sub/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\nD = 1\n",
        # the face hands on its own module: `from pkg.sub import d` is an arrow to pkg.sub.d alone
        "pkg/e.py": "from pkg.sub import d\n",
        "pkg/__init__.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph = import_graph(str(tmp_path), ("pkg",))
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.e"] == {"pkg.sub.d"}
    assert sorted(find_cycles(graph)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub", "pkg.sub.d"]]


def test_no_import_circles():
    """No circle in the library's imports, counting type-only ones and those through a package's face."""
    graph = import_graph()
    assert "memsearcher_jax.app.experiment" in graph["memsearcher_jax.app.jobs"]  # the reader sees real edges
    assert "memsearcher_jax.agent.rollout" in graph["memsearcher_jax.rl.trainer"]
    assert "memsearcher_jax.agent.prompts" in graph["memsearcher_jax.agent.workflows.base"]  # type-only
    assert find_cycles(graph) == []


M = "memsearcher_jax."
# The layer rules: (area, "only" or "never", areas of ours, why). An area is a top-level package
# (`retrieval`), a sub-package (`memsearcher_jax.rl`) or a module (`memsearcher_jax.errors`,
# `memsearcher_jax.app.rft`); a rule holds for every module under its area, and names every module
# under the areas it lists. "only": the area may import these areas and no other of ours; "never":
# it may not import these. models <- sampling <- agent <- rl; errors is the one leaf every layer may raise from.
LAYER_RULES = (
    (M + "errors", "only", (), "the leaf every layer raises from imports none of ours"),
    (M + "models", "only", (M + "errors",), "models imports no other package of ours"),
    (M + "sampling", "only", (M + "models", M + "errors"), "sampling sits on models alone"),
    (M + "agent", "only", (M + "models", M + "sampling", M + "errors", "retrieval"),
     "the agent drives the sampler and the search tool, and knows no learner or data set"),
    (M + "qa_metrics", "only", (M + "agent", M + "errors"), "answer scoring reads the agent's tags only"),
    (M + "runtime", "only", (M + "models", M + "errors"),
     "the process's machinery (hosts and meshes, the compile counter, the log line, JSON Lines) sits on models alone"),
    (M + "runtime.compile_stats", "only", (), "the compile counter listens to JAX's events and imports none of ours"),
    (M + "runtime.console", "only", (), "the log line imports none of ours"),
    (M + "runtime.jsonl", "only", (), "JSON Lines reading imports none of ours"),
    (M + "rl.token_metrics", "only", (), "context metrics are arithmetic over per-episode numbers"),
    (M + "rl", "only", (M + "models", M + "sampling", M + "agent", M + "qa_metrics", M + "runtime.compile_stats",
                        M + "runtime.distributed", M + "errors"),
     "the learner reads no data files, builds no retriever and knows no experiment"),
    (M + "data", "never", (M + "rl", M + "app", M + "rules", M + "plan", M + "cli", M + "pretrain", M + "settings"),
     "data knows no learner and no run"),
    (M + "settings", "only", (M + "errors", M + "bases", M + "models", M + "sampling", M + "agent",
                              M + "qa_metrics", M + "rl", M + "data"),
     "the typed settings name the lower layers' choices for their rules, and sit below whatever reads a config"),
    (M + "plan", "only", (M + "errors", M + "models", M + "sampling", M + "agent", M + "runtime", M + "settings"),
     "the memory plan reads the typed settings and the model's shapes, and sits below the checks that ask it"),
    (M + "rules", "never", (M + "app", M + "cli", M + "pretrain"),
     "the config's rules sit below what builds and runs from a checked config"),
    (M + "app.warm_start", "never", (M + "app.jobs", M + "cli", M + "app.rft"),
     "the warm start sits below the jobs and the controls that continue it"),
    (M + "app.rft", "never", (M + "app.jobs", M + "cli"), "the RFT control continues a warm start and runs no job"),
    (M + "pretrain", "never", (M + "app", M + "cli", M + "plan"),
     "pretraining is a job beside app/: the command line calls it, it calls no other job"),
    ("retrieval", "only", (M + "errors",), "retrieval stands apart: a library the agent reaches as a tool"),
)


def is_under(module: str, area: str) -> bool:
    """`memsearcher_jax.rl.grpo` is under `memsearcher_jax.rl` (and under itself), not under `memsearcher_jax.r`."""
    return module == area or module.startswith(area + ".")


def layer_violations(graph: dict[str, set[str]], rules=LAYER_RULES) -> list[str]:
    """Every import arrow of `graph` (module -> modules it imports) that a rule forbids, as
    'importer -> imported (why)'. An arrow inside a rule's own area is never a violation of it, nor
    one to the root package face `memsearcher_jax` (a `from memsearcher_jax import x` names x, not the root)."""
    out = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if dep == "memsearcher_jax":
                continue
            for area, kind, areas, why in rules:
                if not is_under(mod, area) or is_under(dep, area):
                    continue
                if any(is_under(dep, a) for a in areas) == (kind == "never"):
                    out.append(f"{mod} -> {dep} ({why})")
    return out


def test_the_layer_checker_catches_a_wrong_way_arrow():
    """The rule table, checked against fake graphs: each wrong-way arrow is named, the right ones pass."""
    fine = {M + "sampling.sampler": {M + "models.qwen2", M + "sampling.buckets"}, M + "models.qwen2": {M + "errors"},
            M + "rl.grpo": {M + "agent.rollout", M + "qa_metrics", "memsearcher_jax"},
            M + "data.demos": {M + "agent.parsing", M + "qa_metrics"}, "retrieval.bm25": {M + "errors"},
            M + "app.jobs": {M + "app.warm_start", M + "app.rft", M + "rules.config_rules"}}
    assert layer_violations(fine) == []
    wrong = {M + "models.qwen2": {M + "sampling.sampler"},         # models reaching up
             M + "sampling.sampler": {M + "agent.rollout"},       # sampling reaching up
             M + "agent.rollout": {M + "rl.grpo"},                # agent reaching up
             M + "app.warm_start": {M + "app.jobs"},              # a module's rule inside its package
             M + "data.demos": {M + "rl.reward"},                 # the arrow this rule was written for
             M + "rl.trainer": {M + "data.qa", "retrieval.bm25"},  # the learner reading data / building a retriever
             "retrieval.server": {M + "sampling.buckets"}}        # retrieval leaning on the library
    got = layer_violations(wrong)
    assert [g.split(" (")[0] for g in got] == [
        M + "agent.rollout -> " + M + "rl.grpo", M + "app.warm_start -> " + M + "app.jobs",
        M + "data.demos -> " + M + "rl.reward",
        M + "models.qwen2 -> " + M + "sampling.sampler", M + "rl.trainer -> " + M + "data.qa",
        M + "rl.trainer -> retrieval.bm25", M + "sampling.sampler -> " + M + "agent.rollout",
        "retrieval.server -> " + M + "sampling.buckets"], got
    assert "data knows no learner" in got[2]


def test_layers_point_one_way():
    """The real import graph obeys LAYER_RULES (models <- sampling <- agent <- rl; data and retrieval
    never import rl; models imports no other package of ours; retrieval stands apart)."""
    graph = import_graph()
    assert M + "agent.rollout" in graph[M + "rl.trainer"]  # the checker sees real edges
    assert M + "qa_metrics" in graph[M + "data.demos"]
    bad = layer_violations(graph)
    assert bad == [], "wrong-way imports:\n" + "\n".join(bad)


def test_the_loop_file_stays_small_and_the_method_is_cited_in_repo():
    with open(os.path.join(ROOT, "memsearcher_jax", "rl", "trainer.py"), encoding="utf-8") as f:
        assert sum(1 for _ in f) < 300
    cite = "SPEC" + " §"  # spelt apart so this file does not match itself
    hits = subprocess.run(["git", "grep", "-n", cite, "--", ".", ":!docs"], cwd=ROOT, capture_output=True,
                          text=True).stdout
    assert hits == "", hits



# `path.py`, `path.py:function`, `path.py::Class.method`, `path.py::Class` or `path.py::test_x`, in backticks.
_CODE_REF = re.compile(r"`([\w./-]+\.py)(?:(::?)([\w.]+))?`")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _class_members(cls: ast.ClassDef) -> set[str]:
    """Methods and class-level names (`PRESETS = ...`, annotated fields) of a class."""
    names = {n.name for n in cls.body if isinstance(n, _DEFS)}
    names |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return names | {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def code_ref_problems(text: str, root: str = ROOT) -> list[str]:
    """Every `file.py[:function | ::Class.method]` reference in `text` that does not exist:
    the file under `root`, the top-level function in it, the class and its member."""
    problems = []
    for path, sep, name in _CODE_REF.findall(text):
        full = os.path.join(root, path)
        if not os.path.isfile(full):
            problems.append(f"{path}: no such file")
            continue
        if not name:
            continue
        with open(full, encoding="utf-8") as f:
            top = {n.name: n for n in ast.parse(f.read()).body if isinstance(n, _DEFS)}
        cls_name, _, member = name.partition(".")
        node = top.get(cls_name)
        if sep == ":" and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            problems.append(f"{path}:{name}: no top-level function {name!r}")
        elif sep == "::" and not member and node is None:  # pytest's `file.py::test_x` names a function too
            problems.append(f"{path}::{name}: no function or class {name!r}")
        elif sep == "::" and member and not isinstance(node, ast.ClassDef):
            problems.append(f"{path}::{name}: no class {cls_name!r}")
        elif sep == "::" and member and member not in _class_members(node):
            problems.append(f"{path}::{name}: class {cls_name!r} has no {member!r}")
    return problems


def test_the_reference_checker_catches_a_missing_name():
    text = ("`memsearcher_jax/rl/trainer.py::Trainer.train_step` `memsearcher_jax/rl/batching.py:pack_rows` "
            "`memsearcher_jax/models/config.py::ModelConfig.PRESETS` `retrieval/base.py` "
            "`tests/test_architecture.py::test_layers_point_one_way` `tests/test_architecture.py::test_nothing` "
            "`memsearcher_jax/rl/trainer.py::Trainer.no_such_step` `memsearcher_jax/rl/grpo.py:no_such_fn` "
            "`memsearcher_jax/rl/grpo.py::NoSuchClass.run` `memsearcher_jax/no_such_file.py` "
            "`memsearcher_jax/rl/grpo.py:GRPOLearner.train_on_rows`")  # a method needs `::`
    assert code_ref_problems(text) == [
        "tests/test_architecture.py::test_nothing: no function or class 'test_nothing'",
        "memsearcher_jax/rl/trainer.py::Trainer.no_such_step: class 'Trainer' has no 'no_such_step'",
        "memsearcher_jax/rl/grpo.py:no_such_fn: no top-level function 'no_such_fn'",
        "memsearcher_jax/rl/grpo.py::NoSuchClass.run: no class 'NoSuchClass'",
        "memsearcher_jax/no_such_file.py: no such file",
        "memsearcher_jax/rl/grpo.py:GRPOLearner.train_on_rows: no top-level function 'GRPOLearner.train_on_rows'"]


def test_the_architecture_page_names_only_what_exists():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(_CODE_REF.findall(text)) > 30  # the page does name the code it maps
    assert code_ref_problems(text) == []


MAX_FUNCTION_LINES = 80
# file:function -> why it reads better whole (one line each). Empty is the goal.
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {
}


def long_functions(root: str = ROOT, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """`file.py:function` -> lines, for every function (or method, `file.py:Class.method`) of
    memsearcher_jax/ and retrieval/ longer than `limit` lines, docstring included."""
    out = {}
    for pkg in ("memsearcher_jax", "retrieval"):
        for dirpath, _, files in os.walk(os.path.join(root, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                for node in tree.body:
                    funcs = [(node.name, node)] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
                    if isinstance(node, ast.ClassDef):
                        funcs = [(f"{node.name}.{m.name}", m) for m in node.body
                                 if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
                    for name, fn in funcs:
                        n = fn.end_lineno - fn.lineno + 1
                        if n > limit:
                            out[f"{rel}:{name}"] = n
    return out


def test_no_function_a_reader_must_scroll():
    """No function over MAX_FUNCTION_LINES lines, but those allowed with a reason; an allowed one
    that got short leaves the list."""
    assert long_functions(limit=20), "the walker finds functions"  # it does see the code
    too_long = long_functions()
    unexplained = {k: v for k, v in too_long.items() if k not in LONG_FUNCTIONS_ALLOWED}
    assert not unexplained, f"split these into named steps (or allow one with a reason): {unexplained}"
    stale = set(LONG_FUNCTIONS_ALLOWED) - set(too_long)
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines, drop from LONG_FUNCTIONS_ALLOWED: {stale}"


MAX_FILE_LINES = 600
# Files still over the limit, by name, until they are split. Empty is the goal.
LONG_FILES_ALLOWED: set = set()


def long_files(root: str = ROOT, limit: int = MAX_FILE_LINES) -> dict[str, int]:
    """`path.py` -> lines, for every .py file of memsearcher_jax/ and retrieval/ over `limit` lines."""
    out = {}
    for pkg in ("memsearcher_jax", "retrieval"):
        for dirpath, _, files in os.walk(os.path.join(root, pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    with open(path, encoding="utf-8") as fh:
                        n = sum(1 for _ in fh)
                    if n > limit:
                        out[os.path.relpath(path, root).replace(os.sep, "/")] = n
    return out


def test_no_library_file_a_reader_must_page_through():
    """No library file over MAX_FILE_LINES lines (split it where it has a seam), but those named
    in LONG_FILES_ALLOWED."""
    assert "memsearcher_jax/rl/grpo.py" in long_files(limit=100)  # the walker sees the code
    too_long = {k: v for k, v in long_files().items() if k not in LONG_FILES_ALLOWED}
    assert not too_long, f"split these where they have a seam: {too_long}"
