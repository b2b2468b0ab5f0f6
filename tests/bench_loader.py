"""Load a bench script (bench/<name>.py: scripts, not a package) as a module, for its tests."""
from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_bench(name: str):
    if ROOT not in sys.path:  # a bench script may import the repository's own top-level modules
        sys.path.insert(0, ROOT)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(ROOT, "bench", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
