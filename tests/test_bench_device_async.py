"""bench/device_async.py, the prepared accelerator check of issue 85, runs end to end with --tiny."""
from __future__ import annotations

import pytest

from tests.bench_loader import load_bench


@pytest.mark.slow  # ~20 s: two trainers compile their programs
def test_the_device_check_runs_tiny_and_writes_its_table(tmp_path):
    out = tmp_path / "check.md"
    text = load_bench("device_async").main(["--tiny", "--warmup", "1", "--out", str(out)])
    assert out.read_text(encoding="utf-8") == text
    assert text.startswith("device: cpu") and "tokens/s" in text
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert [int(r[0]) for r in rows] == [0, 1]
    assert [int(r[5]) for r in rows] == [0, 1]  # max staleness: none in line, one step ahead at K = 1
    assert all(float(r[1]) > 0 for r in rows)  # the timed step's wall time
