"""The base model shipped with the package (small enough for git; see its base_manifest.json).

- `reading_v3` (hidden 256, 4 layers, bf16, 8.1 MB), pretrained with
  `memsearcher-jax pretrain --config configs/base_v3.py` on one H200 GPU (~11 minutes): binding
  drills from step 0, contexts up to 16 passages, multi-objective questions, and agent episodes
  in all four workflows' formats in equal shares. The embedded default (configs/default.py)
  starts from it.

Earlier bases, removed (git history keeps them): `reading_tiny` (`git show e9ea9fe:configs/base_tiny.py`)
and `reading_v2` (4 x 128, `configs/base_v2.py`; removed 2026-11-26): reading_v3 reads better at
every length, and the default learns as much from it in fewer steps (docs/experiments.md).

`DEFAULT_BASE` is the one the embedded default starts from; code and tests that mean "the
shipped base" name it, not a directory.
"""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
READING_V3 = os.path.join(_HERE, "reading_v3")
DEFAULT_BASE = READING_V3
