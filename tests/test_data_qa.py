"""QA loading: FlashRAG jsonl and Search-R1 parquet layouts, TFDS builders, named errors."""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memsearcher_jax.data import qa
from memsearcher_jax.data.synthetic import generate_world, save_world

# Module-level import of TFDS is slow-ish but shared by all tests here.
tfb = pytest.importorskip("memsearcher_jax.data.tfds_builders")


def _write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def _search_r1_row(i, question, answers, source):
    # The Search-R1 preprocessing layout: answers only inside reward_model.ground_truth.target.
    return {"id": f"{source}_{i}", "question": question, "data_source": source,
            "prompt": [{"role": "user", "content": f"Answer the given question. Question: {question}"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"split": "train", "index": i}}


@pytest.fixture()
def root(tmp_path):
    r = tmp_path / "data"
    _write_jsonl(str(r / "nq" / "test.jsonl"), [
        {"id": "test_0", "question": "who got the first nobel prize in physics",
         "golden_answers": ["Wilhelm Conrad Röntgen"]},
        {"id": "test_1", "question": "  when is the next deadpool movie being released?  ",
         "golden_answers": ["May 18, 2018", "2018"], "metadata": {"x": 1}},
    ])
    _write_jsonl(str(r / "hotpotqa" / "dev.jsonl"), [
        {"id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
         "golden_answers": ["yes"]},
    ])
    train = [_search_r1_row(0, "total number of death row inmates in the us", ["2,718"], "nq"),
             _search_r1_row(1, "Which magazine was started first, Arthur's Magazine or First for Women?",
                            ["Arthur's Magazine"], "hotpotqa")]
    os.makedirs(r / "nq_hotpotqa_train")
    pq.write_table(pa.Table.from_pylist(train), str(r / "nq_hotpotqa_train" / "train.parquet"))
    test = [_search_r1_row(0, "Who was president when the first Star Wars film was released", ["Jimmy Carter"],
                           "bamboogle"),
            _search_r1_row(1, "who sings does he love me with reba", ["Linda Davis"], "nq")]
    pq.write_table(pa.Table.from_pylist(test), str(r / "nq_hotpotqa_train" / "test.parquet"))
    return str(r)


def test_normalize_question():
    assert qa.normalize_question("  who is x  ") == "who is x?"
    assert qa.normalize_question("who is x?\n") == "who is x?"


def test_load_qa_flashrag_jsonl(root):
    rows = qa.load_qa(os.path.join(root, "nq"), "test")
    assert rows == [
        {"id": "test_0", "question": "who got the first nobel prize in physics?",
         "golden_answers": ["Wilhelm Conrad Röntgen"], "data_source": "nq"},
        {"id": "test_1", "question": "when is the next deadpool movie being released?",
         "golden_answers": ["May 18, 2018", "2018"], "data_source": "nq"},
    ]
    # A file path works too, split ignored.
    assert qa.load_qa(os.path.join(root, "nq", "test.jsonl")) == rows


def test_load_qa_search_r1_parquet(root):
    rows = qa.load_qa(os.path.join(root, "nq_hotpotqa_train"), "train")
    assert [r["question"] for r in rows] == [
        "total number of death row inmates in the us?",
        "Which magazine was started first, Arthur's Magazine or First for Women?"]
    assert [r["golden_answers"] for r in rows] == [["2,718"], ["Arthur's Magazine"]]
    assert [r["data_source"] for r in rows] == ["nq", "hotpotqa"]


def test_parquet_with_golden_answers_column_and_no_id(tmp_path):
    path = str(tmp_path / "popqa" / "test.parquet")
    os.makedirs(os.path.dirname(path))
    pq.write_table(pa.Table.from_pylist([{"question": "What is Ada's occupation",
                                          "golden_answers": ["writer", "poet"]}]), path)
    rows = qa.load_qa(path)
    assert rows == [{"id": "popqa_0", "question": "What is Ada's occupation?", "golden_answers": ["writer", "poet"],
                     "data_source": "popqa"}]


def test_paper_dataset_resolution(root):
    assert qa.load_paper_dataset(root, "hotpotqa")["dev"][0]["golden_answers"] == ["yes"]
    # Bamboogle has no own dir here: it comes from the Search-R1 merged test file by data_source.
    bam = qa.load_paper_dataset(root, "bamboogle")["test"]
    assert [r["question"] for r in bam] == ["Who was president when the first Star Wars film was released?"]
    # NQ's own FlashRAG file wins over the merged file.
    assert len(qa.load_paper_dataset(root, "nq")["test"]) == 2
    with pytest.raises(qa.QADataError, match=r"no rows with data_source == 'musique', and no musique/dev\.jsonl"):
        qa.load_paper_dataset(root, "musique")
    with pytest.raises(qa.QADataError, match="unknown paper dataset"):
        qa.load_paper_dataset(root, "squad")


def test_train_falls_back_to_flashrag_merge(tmp_path):
    r = tmp_path / "fr"
    _write_jsonl(str(r / "nq" / "train.jsonl"), [{"id": "train_0", "question": "q1", "golden_answers": ["a"]}])
    _write_jsonl(str(r / "hotpotqa" / "train.jsonl"), [{"id": "train_0", "question": "q2", "golden_answers": ["b"]}])
    rows = qa.load_paper_dataset(str(r), "nq_hotpotqa_train")["train"]
    assert [(r["id"], r["question"], r["data_source"]) for r in rows] == [
        ("nq_train_0", "q1?", "nq"), ("hotpotqa_train_0", "q2?", "hotpotqa")]  # clashing ids prefixed


@pytest.mark.parametrize("content, match", [
    ('{"id": "1", "golden_answers": ["a"]}', "missing or empty 'question'"),
    ('{"id": "1", "question": "q"}', "no 'golden_answers'"),
    ('{"id": "1", "question": "q", "golden_answers": []}', "non-empty list"),
    ('{"id": "1", "question": "q", "golden_answers": ["a"]', "not valid JSON"),
    ('["q", ["a"]]', "must be a JSON object"),
])
def test_bad_jsonl_named(tmp_path, content, match):
    path = str(tmp_path / "nq" / "test.jsonl")
    _write_jsonl(path, [content])
    with pytest.raises(qa.QADataError, match=match) as e:
        qa.load_qa(path)
    assert path in str(e.value) and "expected FlashRAG jsonl" in str(e.value)


def test_bad_parquet_and_missing_files_named(tmp_path):
    bad_cols = str(tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pylist([{"query": "q", "answer": "a"}]), bad_cols)
    with pytest.raises(qa.QADataError, match=r"a\.parquet: columns .* lack 'question'"):
        qa.load_qa(bad_cols)
    corrupt = tmp_path / "b.parquet"
    corrupt.write_bytes(b"not parquet at all")
    with pytest.raises(qa.QADataError, match=r"b\.parquet: not a readable parquet"):
        qa.load_qa(str(corrupt))
    with pytest.raises(qa.QADataError, match=r"no dev\.jsonl or dev\.parquet"):
        qa.load_qa(str(tmp_path), "dev")
    with pytest.raises(qa.QADataError, match=r"no training data.*nq_hotpotqa_train/train\.parquet"):
        qa.paper_split_files(str(tmp_path), "nq_hotpotqa_train")
    with pytest.raises(qa.QADataError, match=r"no triviaqa/test\.jsonl"):
        qa.paper_split_files(str(tmp_path), "triviaqa")


def test_tfds_paper_builder_both_layouts(root, tmp_path):
    data_dir = str(tmp_path / "tfds")
    nq = tfb.prepare_paper_qa(root, "nq", data_dir)
    assert list(nq.info.splits) == ["test"]
    assert tfb.read_split(nq, "test") == qa.load_paper_dataset(root, "nq")["test"]
    assert any(f.name.startswith(nq.name) and "array_record" in f.name for f in nq.data_path.iterdir())
    train = tfb.read_split(tfb.prepare_paper_qa(root, "nq_hotpotqa_train", data_dir), "train")
    assert {r["question"]: r["golden_answers"] for r in train} == {
        "total number of death row inmates in the us?": ["2,718"],
        "Which magazine was started first, Arthur's Magazine or First for Women?": ["Arthur's Magazine"]}
    with pytest.raises(KeyError, match="no split 'train'"):
        tfb.read_split(nq, "train")


def test_tfds_rebuilds_when_source_changes(root, tmp_path):
    data_dir = str(tmp_path / "tfds")
    first = tfb.read_split(tfb.prepare_paper_qa(root, "hotpotqa", data_dir), "dev")
    _write_jsonl(os.path.join(root, "hotpotqa", "dev.jsonl"),
                 [{"id": "x", "question": "new question", "golden_answers": ["no"]}])
    second = tfb.read_split(tfb.prepare_paper_qa(root, "hotpotqa", data_dir), "dev")
    assert first[0]["golden_answers"] == ["yes"] and second == [
        {"id": "x", "question": "new question?", "golden_answers": ["no"], "data_source": "hotpotqa"}]


def test_tfds_bad_file_fails_with_name(tmp_path):
    _write_jsonl(str(tmp_path / "src" / "popqa" / "test.jsonl"), ['{"id": "1", "question": ""}'])
    with pytest.raises(qa.QADataError, match=r"popqa/test\.jsonl:1: missing or empty 'question'"):
        tfb.prepare_paper_qa(str(tmp_path / "src"), "popqa", str(tmp_path / "tfds"))


def test_tfds_synthetic_builder(tmp_path):
    world = generate_world(seed=5, num_entities=30)
    save_world(world, str(tmp_path / "world"))
    builder = tfb.prepare_synthetic_qa(str(tmp_path / "world"), str(tmp_path / "tfds"))
    for split in ("train", "heldout"):
        rows = tfb.read_split(builder, split)
        expected = sorted(world.split(split), key=lambda r: r["id"])
        assert len(rows) == len(expected) > 0
        for got, want in zip(rows, expected):
            assert got["data_source"] == "synthetic"
            assert {k: got[k] for k in want} == want
    with pytest.raises(FileNotFoundError, match="save_world"):
        tfb.prepare_synthetic_qa(str(tmp_path), str(tmp_path / "tfds2"))


def test_evaluation_sets_folder_file_and_one_set(root, tmp_path):
    import pathlib

    root = pathlib.Path(root)
    _write_jsonl(str(root / "mine" / "test.jsonl"), [{"question": "q", "golden_answers": ["a"]}])
    sets, missing = qa.evaluation_sets(str(root))
    assert {"nq", "hotpotqa", "mine"} <= set(sets) and set(missing) == set(qa.EVAL_SETS) - set(sets)
    assert sets["nq"][1]["question"] == "when is the next deadpool movie being released?"
    assert list(qa.evaluation_sets(str(root), only="nq")[0]) == ["nq"]
    with pytest.raises(qa.QADataError, match="no evaluation set found.*nosuch"):
        qa.evaluation_sets(str(root), only="nosuch")
    one, _ = qa.evaluation_sets(str(root / "nq" / "test.jsonl"))
    assert list(one) == ["nq"] and len(one["nq"]) == 2  # a split-named file takes its folder's name
    _write_jsonl(str(tmp_path / "custom.jsonl"), [{"question": "q?", "golden_answers": ["a"]}])
    assert list(qa.evaluation_sets(str(tmp_path / "custom.jsonl"))[0]) == ["custom"]
    with pytest.raises(qa.QADataError, match="one file, evaluated as the set 'custom'"):
        qa.evaluation_sets(str(tmp_path / "custom.jsonl"), only="nq")


def test_training_questions_file_dataset_dir_and_root(root, tmp_path):
    root = str(root)
    _write_jsonl(str(tmp_path / "t.jsonl"), [{"question": "q", "golden_answers": ["a"]}])
    assert qa.training_questions(str(tmp_path / "t.jsonl"))[0]["question"] == "q?"
    _write_jsonl(str(tmp_path / "ds" / "train.jsonl"), [{"question": "r", "golden_answers": ["b"]}])
    assert qa.training_questions(str(tmp_path / "ds"))[0]["golden_answers"] == ["b"]
    assert qa.training_questions(root) == qa.load_paper_dataset(root, qa.TRAIN_SET)["train"]
    os.makedirs(tmp_path / "empty")
    with pytest.raises(qa.QADataError, match="no training data"):
        qa.training_questions(str(tmp_path / "empty"))
    with pytest.raises(qa.QADataError, match="no such file or directory"):
        qa.training_questions(str(tmp_path / "absent"))


def test_every_user_input_error_shares_one_base():
    from memsearcher_jax.app.experiment import TrainConfigError
    from memsearcher_jax.errors import UserInputError
    from memsearcher_jax.models.hf_io import CheckpointError
    from memsearcher_jax.models.safetensors_io import SafetensorsError
    from memsearcher_jax.plan.planner import PlanError
    from memsearcher_jax.settings.config_utils import ConfigError
    from retrieval.corpus import CorpusFormatError

    for cls in (ConfigError, CheckpointError, SafetensorsError, PlanError, TrainConfigError, CorpusFormatError,
                qa.QADataError):
        assert issubclass(cls, UserInputError), cls
