"""The house's shape: no import circles, layers that point one way, the method cited in-repo.

Imports are read with `ast` from every file of the library (module level and inside functions:
a lazy import is still a dependency), so a new circle or a layer pointing back fails here.
"""
from __future__ import annotations

import ast
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("memsearcher_jax", "retrieval", "launch")


def _modules() -> dict[str, str]:
    """dotted module name -> file path, for every .py file of the packages."""
    out = {}
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
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
                names = [f"{base}.{a.name}" for a in node.names] + [base]
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


def test_no_import_circles():
    # Package faces (__init__) that hand names on are excluded: importing a.b runs a/__init__,
    # which is not a dependency of a.b on a's other modules.
    graph = {m: {d for d in deps if not _is_face(d)} for m, deps in import_graph().items() if not _is_face(m)}
    assert "memsearcher_jax.experiment" in graph["memsearcher_jax.jobs"]  # the reader sees real edges
    assert "memsearcher_jax.agent.rollout" in graph["memsearcher_jax.rl.trainer"]
    assert find_cycles(graph) == []


def _is_face(mod: str) -> bool:
    return _modules()[mod].endswith("__init__.py")


def _imports_of(prefix: str) -> set[str]:
    return {d for m, deps in import_graph().items() if m == prefix or m.startswith(prefix + ".") for d in deps}


def test_layers_point_one_way():
    """models <- sampling <- agent <- rl; rl never reads data files or builds retrievers."""
    below = {"memsearcher_jax.models": (), "memsearcher_jax.sampling": ("memsearcher_jax.models",),
             "memsearcher_jax.agent": ("memsearcher_jax.models", "memsearcher_jax.sampling")}
    upper = ("memsearcher_jax.sampling", "memsearcher_jax.agent", "memsearcher_jax.rl", "memsearcher_jax.data",
             "memsearcher_jax.experiment", "memsearcher_jax.jobs", "memsearcher_jax.cli")
    for layer, allowed in below.items():
        bad = {d for d in _imports_of(layer) if d.startswith(upper) and not d.startswith((layer, *allowed))}
        assert not bad, f"{layer} imports from layers above it: {sorted(bad)}"
    bad = {d for d in _imports_of("memsearcher_jax.rl") if d.startswith(("memsearcher_jax.data", "retrieval",
                                                                          "memsearcher_jax.experiment",
                                                                          "memsearcher_jax.jobs"))}
    assert not bad, f"rl/ imports {sorted(bad)}"
    assert not {d for d in _imports_of("retrieval") if d.startswith("memsearcher_jax")} - {
        "memsearcher_jax.errors", "memsearcher_jax.sampling.buckets", "memsearcher_jax.sampling", "memsearcher_jax"}


def test_the_loop_file_stays_small_and_the_method_is_cited_in_repo():
    with open(os.path.join(ROOT, "memsearcher_jax", "rl", "trainer.py"), encoding="utf-8") as f:
        assert sum(1 for _ in f) < 300
    cite = "SPEC" + " §"  # spelt apart so this file does not match itself
    hits = subprocess.run(["git", "grep", "-n", cite, "--", ".", ":!docs"], cwd=ROOT, capture_output=True,
                          text=True).stdout
    assert hits == "", hits
