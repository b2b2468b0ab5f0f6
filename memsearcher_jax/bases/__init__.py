"""The base model shipped with the package (small enough for git; see its base_manifest.json).

- `reading_v8` (hidden 256, 4 layers, bf16, 8.1 MB), pretrained with
  `memsearcher-jax pretrain --config configs/base_v8.py` on the 2-core CPU (resumed across
  sessions): binding drills from step 0, contexts up to 16 passages, multi-objective questions,
  agent episodes in all four workflows' formats in equal shares, and a last reading phase at a
  lower rate after the episodes, over worlds in wording "v2" (the works_for and product values
  after "... called"; every world built for it uses that wording, which its vocabulary records).
  The embedded default (configs/default.py) starts from it.

Earlier bases, removed (git history keeps them and their configs): `reading_tiny`
(`git show e9ea9fe:configs/base_tiny.py`), `reading_v2` (4 x 128, `git show e0483b8:configs/base_v2.py`;
removed 2026-11-26) and `reading_v3` (`git show e0483b8:configs/base_v3.py`, the same model on wording
"v1", which never bound works_for; removed 2026-11-29) and `reading_v7` (reading_v8's first 10400 steps:
the first five phases of configs/base_v8.py; removed 2026-11-29). The lab notes (docs/lab/README.md) have the
comparisons; reading_v8/README.md is this base's model card.

`DEFAULT_BASE` is the one the embedded default starts from; code and tests that mean "the
shipped base" name it, not a directory.
"""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
READING_V8 = os.path.join(_HERE, "reading_v8")
DEFAULT_BASE = READING_V8
