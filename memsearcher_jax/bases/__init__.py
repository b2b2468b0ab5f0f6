"""Base models shipped with the package (small enough for git; see each one's base_manifest.json).

- `reading_v2`: a 0.8M-parameter Qwen2-architecture model pretrained to read, bind values to
  their subjects over up to 16 passages, and write every workflow's format, with
  `memsearcher-jax pretrain --config configs/base_v2.py`. (The first base, `reading_tiny`, is in
  git history before 2026-11-26.)

`DEFAULT_BASE` is the one the embedded default (configs/default.py) starts from; code and tests
that mean "the shipped base" name it, not a directory.
"""
import os

READING_V2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reading_v2")
DEFAULT_BASE = READING_V2 if os.path.isdir(READING_V2) else os.path.join(os.path.dirname(READING_V2), "reading_tiny")
