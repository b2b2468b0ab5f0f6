"""bench/paper_targets.py: each claim read off a hand-made report, met, missed and not measured."""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import paper_targets as tg  # noqa: E402


def _m(em, peak=100, by_turn=None):
    d = {"em": em / 100, "peak_tokens": peak}
    if by_turn:
        d["prompt_tokens_by_turn"] = [{"turn": t, "mean": x, "max": x, "n": 10} for t, x in by_turn.items()]
    return d


def _report(ms_pairs=60.0, rft_pairs=50.0, react_pairs=61.0, budgets=None):
    """Everything met unless an argument says otherwise (the keys as results.json writes them: strings)."""
    return {"workflows": {
        "memsearcher": {"warm_start": {"2": _m(30)}, "rft": {"2": _m(rft_pairs)},
                        "grpo": {"1": _m(80), "2": _m(ms_pairs), "4": _m(50, by_turn={1: 100, 6: 120}),
                                 "8": _m(45, peak=150)}},
        "react": {"warm_start": {"2": _m(30)},
                  "grpo": {"1": _m(90), "2": _m(react_pairs), "4": _m(40, by_turn={1: 100, 6: 350}),
                           "8": _m(20, peak=900)}},
        "mem1": {"warm_start": {"2": _m(20)},
                 "grpo": {"1": _m(60), "2": _m(45), "4": _m(40), "8": _m(31, peak=200)}},
        "summary": {"warm_start": {"2": _m(30)}, "grpo": {"1": _m(89), "2": _m(60), "8": _m(25, peak=400)}},
        "fold": {"warm_start": {"2": _m(30)}, "grpo": {"1": _m(90), "2": _m(62), "8": _m(30, peak=300)}}},
        "budgets": budgets if budgets is not None else {"16": _m(20), "32": _m(40), "64": _m(45), "128": _m(46)}}


def test_every_claim_met_reads_met():
    lines = tg.target_lines(_report())
    assert len(lines) == 11 and all(line.startswith("- **met**") for line in lines), lines
    assert "(summary 0.44x, fold 0.33x)" in lines[9]
    assert "summary 1q 89.0 (react 90.0, memsearcher 80.0); summary 2q 60.0 (react 61.0, memsearcher 60.0)" in lines[10]
    assert "memsearcher +30.0, react +31.0, mem1 +25.0" in lines[0]
    assert "(60.0 against 50.0)" in lines[1] and "(60.0 against 61.0)" in lines[2]
    assert "memsearcher 62%" in lines[3] and "mem1 67%" in lines[3]
    assert "memsearcher 0.17x" in lines[5] and "(1.20x)" in lines[6] and "(3.50x)" in lines[7]
    assert "16: 20.0, 32: 40.0, 64: 45.0, 128: 46.0; flat from 64 tokens" in lines[8]


def test_each_claim_can_miss():
    lines = tg.target_lines(_report(ms_pairs=48.0, rft_pairs=40.0, react_pairs=49.0))
    assert lines[0].startswith("- **missed**") and "memsearcher +18.0, react +19.0" in lines[0]  # mem1 +25 alone
    assert lines[1].startswith("- **met**") and lines[2].startswith("- **met**")
    lines = tg.target_lines(_report(ms_pairs=49.0, react_pairs=52.0))
    assert lines[0].startswith("- **missed**") and lines[1].startswith("- **missed**")  # 49 < 50 + 5
    assert lines[2].startswith("- **missed**")  # 49 < 52 - 2
    r = _report()
    r["workflows"]["mem1"]["grpo"]["8"] = _m(29, peak=400)  # 29 / 60 < 50%; 400 / 900 > 1/3
    r["workflows"]["memsearcher"]["grpo"]["4"] = _m(50, by_turn={1: 100, 6: 130})
    r["workflows"]["react"]["grpo"]["4"] = _m(40, by_turn={1: 100, 6: 250})
    lines = tg.target_lines(r)
    assert lines[4].startswith("- **missed**") and "mem1 48%" in lines[4]
    assert lines[5].startswith("- **missed**") and "mem1 0.44x" in lines[5]
    assert lines[6].startswith("- **missed**") and lines[7].startswith("- **missed**")


def test_the_newer_designs_can_miss_and_without_them_are_not_measured():
    r = _report()
    r["workflows"]["summary"]["grpo"]["8"] = _m(25, peak=500)   # 500 / 900 > 1/2
    r["workflows"]["fold"]["grpo"]["2"] = _m(58)                # 58 < 61 - 2
    peak, em = tg.newer_designs(r)
    assert peak.startswith("- **missed**") and "summary 0.56x" in peak
    assert em.startswith("- **missed**") and "fold 2q 58.0 (react 61.0" in em
    for w in tg.NEWER_WORKFLOWS:
        del r["workflows"][w]
    assert all(line.startswith("- not measured") for line in tg.newer_designs(r))


def test_a_budget_curve_that_never_rises_or_never_flattens_misses():
    falls = tg.budget_curve({"16": _m(40), "32": _m(30), "64": _m(30), "128": _m(30)})
    assert falls.startswith("- **missed**") and "flat from 32" in falls
    climbs = tg.budget_curve({"16": _m(10), "32": _m(20), "64": _m(30), "128": _m(40)})
    assert climbs.startswith("- **missed**") and "no flat end" in climbs
    assert tg.budget_curve({"16": _m(10), "32": _m(20)}).startswith("- not measured")


def test_what_did_not_run_is_not_measured_never_met():
    r = {"workflows": {"memsearcher": {"warm_start": {"2": _m(30)}, "grpo": {"1": _m(80), "2": _m(55)}}}}
    lines = tg.target_lines(r)
    assert lines[0].startswith("- **met**")  # the only workflow that ran gained 25
    assert all(line.startswith("- not measured") for line in lines[1:]), lines
    assert tg.target_lines({"workflows": {}})[0].startswith("- not measured")


def test_the_tables_end_with_the_targets():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import paper_tables as pt

    report = {"date": "2026-11-30", "command": "c", "train_objectives": 2, "eval_questions": 100,
              "objectives": [1, 2, 4, 8], **_report()}
    text = pt.tables_markdown(report)
    tail = text[text.index("## The papers' claims as targets"):]
    assert tail.count("- **met**") == 11
