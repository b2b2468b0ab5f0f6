"""Base models shipped with the package (small enough for git; see each one's base_manifest.json).

- `reading_tiny`: the first reading base (hidden 128, 4 layers), pretrained with
  `memsearcher-jax pretrain --config configs/base_tiny.py`. The embedded default starts from it.
- `reading_v2`: the same shape pretrained with `configs/base_v2.py` to bind values to their
  subjects over up to 16 passages and to write every workflow's format. It reads far better
  (final probe, reserved names: 91% / 75% / 60% at 2 / 8 / 16 passages against reading_tiny's
  79% / 27% / 8%), but the default job learns much less from it (held-out EM 5 -> 21 against
  3 -> 76; learning bench gains +16 / +21 / +29 over three seeds, 2026-11-26): its agent writes
  memories from the wrong sentence and never makes the second hop. It is not the default until
  that is understood (docs/experiments.md, 2026-11-26).

`DEFAULT_BASE` is the one the embedded default (configs/default.py) starts from; code and tests
that mean "the shipped base" name it, not a directory.
"""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
READING_TINY = os.path.join(_HERE, "reading_tiny")
READING_V2 = os.path.join(_HERE, "reading_v2")
DEFAULT_BASE = READING_TINY
