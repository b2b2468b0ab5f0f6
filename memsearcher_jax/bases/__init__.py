"""Base models shipped with the package (small enough for git; see each one's base_manifest.json).

- `reading_tiny`: a 0.8M-parameter Qwen2-architecture model pretrained to read and copy with
  `memsearcher-jax pretrain --config configs/base_tiny.py`.

`DEFAULT_BASE` is the one the embedded default (configs/default.py) starts from; code and tests
that mean "the shipped base" name it, not a directory.
"""
import os

READING_TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reading_tiny")
DEFAULT_BASE = READING_TINY
