"""The base model shipped with the package (small enough for git; see its base_manifest.json).

- `reading_v2` (hidden 128, 4 layers, bf16, 3.5 MB), pretrained with
  `memsearcher-jax pretrain --config configs/base_v2.py`: binding drills from step 0, contexts up
  to 16 passages, multi-objective questions, and agent episodes in all four workflows' formats in
  equal shares. The embedded default (configs/default.py) starts from it.

The first base, `reading_tiny` (`git show e9ea9fe:configs/base_tiny.py`), was removed on 2026-11-26: reading_v2
reads far better at every length and the default learns more from it (docs/experiments.md).

`DEFAULT_BASE` is the one the embedded default starts from; code and tests that mean "the
shipped base" name it, not a directory.
"""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
READING_V2 = os.path.join(_HERE, "reading_v2")
DEFAULT_BASE = READING_V2
