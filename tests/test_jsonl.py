"""The one JSON Lines reader and writer (memsearcher_jax/runtime/jsonl.py): worlds and metrics logs use it."""
import pytest

from memsearcher_jax.app.curves import read_metrics
from memsearcher_jax.runtime.jsonl import read_jsonl, read_jsonl_if_exists, write_jsonl


def test_rows_round_trip_with_unicode_and_blank_lines_skipped(tmp_path):
    path = str(tmp_path / "rows.jsonl")
    rows = [{"id": "1", "text": "Zoë went to Kraków"}, {"id": "2", "n": [1, 2]}]
    write_jsonl(path, rows)
    raw = open(path, encoding="utf-8").read()
    assert "Zoë" in raw and raw.count("\n") == 2  # unicode as it is, one line a row
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n   \n")
    assert read_jsonl(path) == rows


def test_a_broken_line_is_named_by_file_and_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: not a JSON object per line"):
        read_jsonl(str(path))


def test_a_missing_log_reads_as_no_steps(tmp_path):
    assert read_jsonl_if_exists(str(tmp_path / "none.jsonl")) == []
    assert read_metrics(str(tmp_path)) == []
    (tmp_path / "logs").mkdir()
    write_jsonl(str(tmp_path / "logs" / "metrics.jsonl"), [{"step": 1, "em": 0.5}])
    assert read_metrics(str(tmp_path)) == [{"step": 1, "em": 0.5}]
    with pytest.raises(FileNotFoundError):
        read_jsonl(str(tmp_path / "none.jsonl"))
