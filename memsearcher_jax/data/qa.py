"""Read the paper's QA data from local files (no TFDS needed): FlashRAG jsonl and Search-R1 parquet.

Layouts accepted (docs/method.md §5):

- FlashRAG jsonl: `<root>/<dataset>/<split>.jsonl`, one object per line with `id`, `question`,
  `golden_answers` (a list of aliases). E.g. `nq/test.jsonl`, `hotpotqa/dev.jsonl`.
- Search-R1 parquet: `<root>/<dataset>/<split>.parquet` with columns `question` and either
  `golden_answers` or `reward_model` (a struct whose `ground_truth.target` is the alias list),
  plus `data_source` (e.g. "nq", "hotpotqa") and optionally `id`. The training merge lives in
  `nq_hotpotqa_train/train.parquet`; its `test.parquet` merges the seven evaluation sets, told
  apart by `data_source`.

Every row comes back as {"id", "question", "golden_answers", "data_source"} with the question
normalised as the recipe does: stripped, "?" appended if missing.
"""
from __future__ import annotations

import json
import os
from typing import Any

from memsearcher_jax.errors import UserInputError

# The paper's evaluation sets and the split each is evaluated on (docs/method.md §5).
EVAL_SETS: dict[str, str] = {
    "nq": "test", "triviaqa": "test", "popqa": "test", "bamboogle": "test",
    "hotpotqa": "dev", "2wikimultihopqa": "dev", "musique": "dev",
}
TRAIN_SET = "nq_hotpotqa_train"  # the Search-R1 merge of NQ + HotpotQA train
TRAIN_SOURCES = ("nq", "hotpotqa")

LAYOUT_HELP = (
    "expected FlashRAG jsonl `<root>/<dataset>/<split>.jsonl` with one JSON object per line "
    "{'id', 'question', 'golden_answers': [..]}, or Search-R1 parquet `<root>/<dataset>/<split>.parquet` "
    "with columns 'question', 'golden_answers' or 'reward_model'.ground_truth.target, and 'data_source'"
)


class QADataError(UserInputError):
    """A QA file is missing or does not have the expected layout (the message names the file)."""


def normalize_question(question: str) -> str:
    q = question.strip()
    if not q.endswith("?"):
        q += "?"
    return q


def _answers(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if hasattr(value, "tolist"):  # numpy arrays from parquet readers
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        raise QADataError(f"{where}: gold answers must be a non-empty list of strings, got {value!r}; {LAYOUT_HELP}")
    out = [str(a) for a in value if a is not None and str(a).strip() != ""]
    if not out:
        raise QADataError(f"{where}: gold answers are all empty ({value!r}); {LAYOUT_HELP}")
    return out


def _row(raw: dict[str, Any], where: str, default_id: str, default_source: str) -> dict[str, Any]:
    question = raw.get("question")
    if not isinstance(question, str) or not question.strip():
        raise QADataError(f"{where}: missing or empty 'question' (keys: {sorted(raw)}); {LAYOUT_HELP}")
    if raw.get("golden_answers") is not None:
        answers = raw["golden_answers"]
    else:
        gt = (raw.get("reward_model") or {}).get("ground_truth")
        answers = gt.get("target") if isinstance(gt, dict) else gt
        if answers is None:
            raise QADataError(f"{where}: no 'golden_answers' and no 'reward_model.ground_truth.target' "
                              f"(keys: {sorted(raw)}); {LAYOUT_HELP}")
    rid = raw.get("id")
    return {
        "id": str(rid) if rid is not None and str(rid) != "" else default_id,
        "question": normalize_question(question),
        "golden_answers": _answers(answers, where),
        "data_source": str(raw.get("data_source") or default_source),
    }


def read_jsonl(path: str, source: str = "") -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise QADataError(f"{where}: not valid JSON ({e}); {LAYOUT_HELP}") from e
            if not isinstance(raw, dict):
                raise QADataError(f"{where}: a line must be a JSON object, got {type(raw).__name__}; {LAYOUT_HELP}")
            rows.append(_row(raw, where, default_id=f"{source or 'row'}_{len(rows)}", default_source=source))
    if not rows:
        raise QADataError(f"{path}: no rows; {LAYOUT_HELP}")
    return rows


def read_parquet(path: str, source: str = "") -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise QADataError(f"{path}: not a readable parquet file ({e}); {LAYOUT_HELP}") from e
    cols = set(table.column_names)
    if "question" not in cols or not ({"golden_answers", "reward_model"} & cols):
        raise QADataError(f"{path}: columns {sorted(cols)} lack 'question' and 'golden_answers'/'reward_model'; "
                          f"{LAYOUT_HELP}")
    keep = [c for c in ("id", "question", "golden_answers", "reward_model", "data_source") if c in cols]
    rows = []
    for i, raw in enumerate(table.select(keep).to_pylist()):
        rows.append(_row(raw, f"{path} row {i}", default_id=f"{source or 'row'}_{i}", default_source=source))
    if not rows:
        raise QADataError(f"{path}: no rows; {LAYOUT_HELP}")
    return rows


def read_file(path: str, source: str = "") -> list[dict[str, Any]]:
    """One .jsonl or .parquet file -> rows."""
    if not os.path.isfile(path):
        raise QADataError(f"{path}: no such file; {LAYOUT_HELP}")
    if path.endswith(".jsonl"):
        return read_jsonl(path, source)
    if path.endswith(".parquet"):
        return read_parquet(path, source)
    raise QADataError(f"{path}: unknown extension (want .jsonl or .parquet); {LAYOUT_HELP}")


def find_split_file(dataset_dir: str, split: str) -> str | None:
    for ext in (".jsonl", ".parquet"):
        path = os.path.join(dataset_dir, split + ext)
        if os.path.isfile(path):
            return path
    return None


def load_qa(path_or_dir: str, split: str | None = None) -> list[dict[str, Any]]:
    """Rows of one split. `path_or_dir` is a .jsonl/.parquet file (split ignored) or a dataset
    directory holding `<split>.jsonl` or `<split>.parquet`."""
    if os.path.isfile(path_or_dir):
        return read_file(path_or_dir, source=os.path.basename(os.path.dirname(os.path.abspath(path_or_dir))))
    if not os.path.isdir(path_or_dir):
        raise QADataError(f"{path_or_dir}: no such file or directory; {LAYOUT_HELP}")
    if split is None:
        raise QADataError(f"{path_or_dir}: is a directory, so a split name is needed; {LAYOUT_HELP}")
    path = find_split_file(path_or_dir, split)
    if path is None:
        raise QADataError(f"{path_or_dir}: no {split}.jsonl or {split}.parquet; {LAYOUT_HELP}")
    return read_file(path, source=os.path.basename(os.path.normpath(path_or_dir)))


def paper_split_files(root: str, dataset: str) -> dict[str, list[str]]:
    """The source files of one paper dataset under `root`, by split name (no reading yet).

    Train: `nq_hotpotqa_train/train.{parquet,jsonl}`, else FlashRAG `nq/train.jsonl` +
    `hotpotqa/train.jsonl` merged. Eval set X: `X/<split>.{jsonl,parquet}`, else the Search-R1
    merged `nq_hotpotqa_train/test.parquet` filtered to data_source == X.
    """
    if dataset == TRAIN_SET:
        path = find_split_file(os.path.join(root, TRAIN_SET), "train")
        if path:
            return {"train": [path]}
        parts = [find_split_file(os.path.join(root, s), "train") for s in TRAIN_SOURCES]
        if all(parts):
            return {"train": parts}
        raise QADataError(
            f"{root}: no training data; looked for {TRAIN_SET}/train.parquet|jsonl (Search-R1 merge) and "
            f"{' + '.join(s + '/train.jsonl' for s in TRAIN_SOURCES)} (FlashRAG); {LAYOUT_HELP}")
    if dataset not in EVAL_SETS:
        raise QADataError(f"unknown paper dataset {dataset!r}; expected one of {[TRAIN_SET, *EVAL_SETS]}")
    split = EVAL_SETS[dataset]
    path = find_split_file(os.path.join(root, dataset), split)
    if path:
        return {split: [path]}
    merged = os.path.join(root, TRAIN_SET, "test.parquet")
    if os.path.isfile(merged):
        return {split: [merged]}
    raise QADataError(f"{root}: no {dataset}/{split}.jsonl, {dataset}/{split}.parquet or {merged} "
                      f"(Search-R1 merged test set); {LAYOUT_HELP}")


def load_paper_dataset(root: str, dataset: str) -> dict[str, list[dict[str, Any]]]:
    """All rows of one paper dataset under `root`, by split (see `paper_split_files`)."""
    out = {}
    for split, paths in paper_split_files(root, dataset).items():
        rows: list[dict[str, Any]] = []
        for path in paths:
            source = os.path.basename(os.path.dirname(os.path.abspath(path)))
            part = read_file(path, source=source)
            if dataset != TRAIN_SET and source == TRAIN_SET:  # Search-R1 merged test file
                part = [r for r in part if r["data_source"] == dataset]
                if not part:
                    raise QADataError(f"{path}: no rows with data_source == {dataset!r}, and no "
                                      f"{dataset}/{split}.jsonl or .parquet under {root}; {LAYOUT_HELP}")
            rows.extend(part)
        ids = [r["id"] for r in rows]
        if len(set(ids)) != len(ids):  # merged files may reuse ids; prefix with the source
            for r in rows:
                r["id"] = f"{r['data_source']}_{r['id']}"
        out[split] = rows
    return out


SPLIT_NAMES = ("test", "dev", "validation", "train")


def set_name(path: str) -> str:
    """The name of a single-file evaluation set: the file's stem, or its folder's name when the
    stem is only a split name (`bamboogle/test.jsonl` -> "bamboogle")."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.basename(os.path.dirname(os.path.abspath(path))) if stem in SPLIT_NAMES else stem


def evaluation_sets(path: str, only: str | None = None) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Named evaluation sets from `data.eval_path`, and the paper sets not found (name -> why).

    - a .jsonl / .parquet file: one set, named by `set_name`;
    - a directory: each of the paper's seven sets it holds (`<name>/<split>.jsonl|parquet`, or
      the Search-R1 merged `nq_hotpotqa_train/test.parquet`), plus any other `<name>/` folder
      with a test or dev file (a user's own set).
    only: keep just this set (QADataError naming the sets there are when it is absent).
    """
    if os.path.isfile(path):
        name = set_name(path)
        if only not in (None, name):
            raise QADataError(f"--split {only!r}: data.eval_path={path} is one file, evaluated as the set {name!r}")
        return {name: read_file(path, source=name)}, {}
    if not os.path.isdir(path):
        raise QADataError(f"data.eval_path={path}: no such file or directory; {LAYOUT_HELP}")
    sets: dict[str, list[dict[str, Any]]] = {}
    missing: dict[str, str] = {}
    for name in EVAL_SETS:
        if only not in (None, name):
            continue
        try:
            sets[name] = next(iter(load_paper_dataset(path, name).values()))
        except QADataError as e:
            missing[name] = str(e)
    for name in sorted(os.listdir(path)):
        if name in EVAL_SETS or name == TRAIN_SET or only not in (None, name):
            continue
        found = [f for f in (find_split_file(os.path.join(path, name), s) for s in ("test", "dev")) if f]
        if os.path.isdir(os.path.join(path, name)) and found:
            sets[name] = read_file(found[0], source=name)
    if not sets:
        wanted = only or ", ".join(EVAL_SETS)
        raise QADataError(f"data.eval_path={path}: no evaluation set found (looked for {wanted}); {LAYOUT_HELP}")
    return sets, missing


def training_questions(path: str) -> list[dict[str, Any]]:
    """`data.train_path`: a .jsonl/.parquet file, a dataset folder with train.jsonl|parquet, or a
    data root holding the Search-R1 merge (`nq_hotpotqa_train/`) or FlashRAG nq/ + hotpotqa/."""
    if os.path.isfile(path):
        return read_file(path, source=set_name(path))
    if os.path.isdir(path) and find_split_file(path, "train"):
        return load_qa(path, "train")
    if os.path.isdir(path):
        return load_paper_dataset(path, TRAIN_SET)["train"]
    raise QADataError(f"data.train_path={path}: no such file or directory; {LAYOUT_HELP}")
