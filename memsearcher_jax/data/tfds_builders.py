"""TFDS builders for the paper's QA sets and the synthetic world, stored as array_record.

TensorFlow is not needed: datasets are written with `file_format="array_record"` and read with
`builder.as_data_source(split)` (random access, no tf.data). Sources are local files (see
`qa.py` for the accepted layouts); nothing is downloaded.

    builder = prepare_paper_qa(source_root, "hotpotqa", data_dir)   # builds once, then reuses
    rows = read_split(builder, "dev")                               # list of plain dicts

Prepared data lives under `data_dir/<fingerprint of the source files>/`, so editing a source
file builds a fresh copy instead of silently reusing a stale one.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from memsearcher_jax.data import qa
from memsearcher_jax.data.synthetic import load_world

# TFDS finds a builder's source file through the `importlib_resources` backport, which it only
# declares as a dependency for Python < 3.9; naming the file here skips that lookup.
_CODE_PATH = epath.Path(__file__)

_QA_FEATURES = {
    "id": tfds.features.Text(),
    "question": tfds.features.Text(),
    "golden_answers": tfds.features.Sequence(tfds.features.Text()),
    "data_source": tfds.features.Text(),
}


class MemsearcherPaperQa(tfds.core.GeneratorBasedBuilder):
    """NQ + HotpotQA train (Search-R1 merge) and the seven evaluation sets, from `source_dir`."""

    name = "memsearcher_paper_qa"
    VERSION = tfds.core.Version("1.0.0")
    code_path = _CODE_PATH
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=n, description=f"{n} ({s})")
                       for n, s in [(qa.TRAIN_SET, "train"), *qa.EVAL_SETS.items()]]

    def __init__(self, *, source_dir: str, **kwargs):
        self._source_dir = source_dir
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(dict(_QA_FEATURES)),
                                     description="MemSearcher QA data (FlashRAG jsonl / Search-R1 parquet).")

    def _split_generators(self, dl_manager):
        # Read everything up front so a malformed file fails before anything is written.
        splits = qa.load_paper_dataset(self._source_dir, self.builder_config.name)
        return {split: self._generate_examples(rows) for split, rows in splits.items()}

    def _generate_examples(self, rows: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
        for i, row in enumerate(rows):
            yield f"{i:09d}", {k: row[k] for k in _QA_FEATURES}


_SYNTHETIC_FEATURES = dict(
    _QA_FEATURES,
    hops=np.int32,
    gold_passage_ids=tfds.features.Sequence(tfds.features.Text()),
    intermediate=tfds.features.Text(),
    subject=tfds.features.Text(),
    relation=tfds.features.Text(),
    facts=tfds.features.Sequence(tfds.features.Text()),
    queries=tfds.features.Sequence(tfds.features.Text()),
)


class MemsearcherSyntheticQa(tfds.core.GeneratorBasedBuilder):
    """The synthetic world's questions (train / heldout) from a directory written by save_world."""

    name = "memsearcher_synthetic_qa"
    VERSION = tfds.core.Version("1.0.0")
    code_path = _CODE_PATH

    def __init__(self, *, world_dir: str, **kwargs):
        self._world_dir = world_dir
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(dict(_SYNTHETIC_FEATURES)),
                                     description="Synthetic closed-world 1-hop and 2-hop questions.")

    def _split_generators(self, dl_manager):
        world = load_world(self._world_dir)
        return {split: self._generate_examples(world.split(split)) for split in ("train", "heldout")}

    def _generate_examples(self, rows: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
        for i, row in enumerate(rows):
            ex = {k: row[k] for k in _SYNTHETIC_FEATURES if k != "data_source"}
            ex["data_source"] = "synthetic"
            yield f"{i:09d}", ex


def _fingerprint(paths: list[str]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        st = os.stat(p)
        h.update(f"{os.path.abspath(p)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def prepare_paper_qa(source_dir: str, dataset: str, data_dir: str) -> MemsearcherPaperQa:
    """Build (once) and return the builder for one paper dataset (`nq_hotpotqa_train` or an eval set)."""
    files = [p for ps in qa.paper_split_files(source_dir, dataset).values() for p in ps]
    builder = MemsearcherPaperQa(source_dir=source_dir, config=dataset,
                                 data_dir=os.path.join(data_dir, _fingerprint(files)), file_format="array_record")
    builder.download_and_prepare()
    return builder


def prepare_synthetic_qa(world_dir: str, data_dir: str) -> MemsearcherSyntheticQa:
    """Build (once) and return the builder for a saved synthetic world."""
    files = [os.path.join(world_dir, f) for f in ("train.jsonl", "heldout.jsonl")]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"{world_dir}: missing {missing}; expected a directory written by "
                                "memsearcher_jax.data.synthetic.save_world")
    builder = MemsearcherSyntheticQa(world_dir=world_dir, data_dir=os.path.join(data_dir, _fingerprint(files)),
                                     file_format="array_record")
    builder.download_and_prepare()
    return builder


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def read_split(builder: tfds.core.DatasetBuilder, split: str) -> list[dict[str, Any]]:
    """All rows of a prepared split as plain Python dicts (str, int, list), sorted by id."""
    if split not in builder.info.splits:
        raise KeyError(f"{builder.name}/{builder.builder_config.name if builder.builder_config else ''}: "
                       f"no split {split!r}; available: {sorted(builder.info.splits)}")
    source = builder.as_data_source(split)
    rows = [{k: _plain(v) for k, v in source[i].items()} for i in range(len(source))]
    return sorted(rows, key=lambda r: r["id"])
