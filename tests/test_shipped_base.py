"""The reading base shipped in the package (`bases.DEFAULT_BASE`, the default's): its files match its manifest,
the manifest says how it was made and what it gave the main job, and its reading figures are what
the stored weights give on items no pretraining step saw."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from safetensors import safe_open

from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.data.vocab import ReadingVocab
from memsearcher_jax.models import from_pretrained
from memsearcher_jax.pretrain import BASE_MANIFEST, SIDE_SETS, base_probe, final_probe_sets, reading_probe, unpack_hits

# What reading_v8 must read at least on its final probe (measured 2026-11-29, 1024 items a set: 99.6% /
# 97.5% / 93.7% at 2 / 8 / 16 passages, binding 98.4%; every relation >= 98.3% at 2 passages and >= 92.2%
# at 8). Issue 24's targets: 95% overall and 90% on every relation, at 2 and at 8 passages.
FLOORS = {"2": 0.99, "8": 0.97, "binding": 0.98}
RELATION_FLOOR = {"2": 0.90, "8": 0.90}   # every relation, at these lengths


def pool_ids(vocab, kind: str) -> set[int]:
    """Token ids of the names in one pool ("pretrain" or "reserved") of a ReadingVocab."""
    return {vocab.ids[n] for names in vocab.pool(kind).values() for n in names}


@pytest.fixture(scope="module")
def manifest():
    with open(os.path.join(DEFAULT_BASE, BASE_MANIFEST), encoding="utf-8") as f:
        return json.load(f)


def test_files_match_the_manifest(manifest):
    base = DEFAULT_BASE
    for name, meta in manifest["files"].items():
        path = os.path.join(base, name)
        data = open(path, "rb").read()
        assert len(data) == meta["bytes"], name
        assert hashlib.sha256(data).hexdigest() == meta["sha256"], name
    with safe_open(os.path.join(base, "model.safetensors"), "np") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
    assert shapes == manifest["tensors"]


def test_the_shipped_base_stays_small_and_is_the_default():
    """The one planned exception to "no big files in git": the shipped bases at most ~10 MB."""
    root = os.path.dirname(DEFAULT_BASE)
    total = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)
    assert total < 10 * 2 ** 20
    assert sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)) and n != "__pycache__") == [
        os.path.basename(DEFAULT_BASE)]  # one base shipped, the default's: the old one is removed


def test_the_manifest_records_how_the_base_was_made(manifest):
    """A command that reproduces it from scratch, every phase with its steps, curriculum and
    learning rate, the pretraining time and machine."""
    assert manifest["command"].startswith("memsearcher-jax pretrain --config configs/")
    phases = manifest["phases"]
    steps = [tuple(map(int, p["steps"].split("-"))) for p in phases]
    assert steps[0][0] == 0 and steps[-1][1] == manifest["config"]["train"]["steps"]
    assert all(a[1] == b[0] for a, b in zip(steps, steps[1:]))          # phases tile the run
    for p in phases:
        assert sum(p["curriculum"].values()) > 0 and p["learning_rate"]["peak"] > 0 and p["batch_size"] > 0
    assert manifest["pretraining"]["seconds"] > 0 and manifest["pretraining"]["machine"]["cores"] >= 1
    assert [h["step"] for h in manifest["history"]] == sorted(h["step"] for h in manifest["history"])


def test_the_manifest_figures_are_what_the_code_computes_from_its_records(manifest):
    """The figures export_base wrote are recomputed here from what it recorded beside them: the
    pretraining time from the logged intervals, each probe figure from its per-item results (the
    phases against the config that makes the base: test_pretrain.py's
    test_base_v8_phases_are_the_shipped_manifests). A figure typed in by hand, or edited after the
    export, fails."""
    assert manifest["pretraining"]["seconds"] == pytest.approx(
        round(sum(h.get("seconds", 0) for h in manifest["history"]), 1), abs=0.05)
    recorded = manifest["reading_probe"]
    for name, figures in [*recorded["by_length"].items(), *((k, recorded[k]) for k in SIDE_SETS if k in recorded)]:
        assert unpack_hits(figures["hits"], figures["n"]).mean() == pytest.approx(figures["accuracy"], abs=1e-9), name
    assert recorded["worst_relation"] == min(a for r in recorded["by_length"].values()
                                             for a in r["by_relation"].values())


def test_the_main_job_and_the_learning_bench_measured_the_same_run(manifest):
    """Provenance of the two benches' figures (measured in one session, not recomputable here in
    minutes): the learning bench's seed 0 is the default job, which bench/main_job.py ran too, so
    both record the same held-out EM before and after; each bench's command is its own script's,
    with as many seeds as it asked for."""
    bench, job = manifest["learning_bench"], manifest["main_job"]
    seeds = bench["seeds"]
    asked = bench["command"].split("--seeds")[1].split()[0]
    assert bench["command"].startswith("python bench/learning.py ") and int(asked) == len(seeds)
    assert [r["seed"] for r in seeds] == list(range(len(seeds)))
    assert job["command"].startswith("python bench/main_job.py ")
    assert job["new_em_before_after"] == [seeds[0]["em_before"], seeds[0]["em_after"]]


def test_a_sample_of_the_final_probe_is_what_the_stored_weights_read(manifest):
    """The fast lane's recomputation (the slow test below covers a sixteenth of every set): the
    bf16 weights give exactly the recorded per-item results on the first items at 2 passages."""
    recorded = manifest["reading_probe"]
    # A set of n items begins with the items of any smaller set of the same seed: the first few are
    # built alone, in a second instead of the full sets' fifteen.
    builder, sets = final_probe_sets(DEFAULT_BASE, FAST_SAMPLE, manifest["config"]["train"]["seed"])
    model = from_pretrained(DEFAULT_BASE)
    items, figures = sets["2"], recorded["by_length"]["2"]  # the shortest contexts: one small program
    got = reading_probe(model, items, builder.pad_id)
    recorded_hits = unpack_hits(figures["hits"], figures["n"])[:FAST_SAMPLE]
    assert unpack_hits(got["hits"], len(items)).tolist() == recorded_hits.tolist()


FAST_SAMPLE = 8  # items in the fast lane


# The slow test recomputes every SAMPLE_EVERY-th final item exactly (the manifest keeps each item's
# result): any change to the weights, the items or the probe flips some of them. reading_v3's 2,560
# items took ~190 s of the suite on 2 cores, every 8th ~25 s; reading_v7 and v8 have 1024 a set (5,120), and
# every 16th (64 per set, 320 in all) keeps the ~25 s.
SAMPLE_EVERY = 16


@pytest.mark.slow
def test_the_final_probe_is_what_the_stored_weights_read(manifest):
    """The manifest's per-item results on the final items (reserved names only; seeds no progress
    probe used) add up to its figures by length, relation and set; the bf16 weights give exactly
    those results on a sample of every set; and the figures clear the floors."""
    vocab = ReadingVocab.load(DEFAULT_BASE)
    assert vocab.pool("reserved")["person"] and not pool_ids(vocab, "reserved") & pool_ids(vocab, "pretrain")
    recorded = manifest["reading_probe"]
    seed = manifest["config"]["train"]["seed"]
    builder, sets = final_probe_sets(DEFAULT_BASE, recorded["by_length"]["2"]["n"], seed)
    model = from_pretrained(DEFAULT_BASE)
    figures_of = lambda name: recorded[name] if name in SIDE_SETS else recorded["by_length"][name]
    for k, (name, items) in enumerate(sets.items()):
        figures = figures_of(name)
        hits = unpack_hits(figures["hits"], len(items))
        assert figures["n"] == len(items) and hits.mean() == pytest.approx(figures["accuracy"], abs=1e-9), name
        if name not in SIDE_SETS:
            relations = np.asarray([rel for _, _, rel in items])
            by_relation = {r: float(hits[relations == r].mean()) for r in sorted(set(relations))}
            assert by_relation == pytest.approx(figures["by_relation"], abs=1e-9), name
        sample = slice(k % SAMPLE_EVERY, None, SAMPLE_EVERY)  # a different sixteenth of each set (1024 items: 64 a set)
        got = reading_probe(model, items[sample], builder.pad_id)
        assert unpack_hits(got["hits"], len(items[sample])).tolist() == hits[sample].tolist(), name
    for key, floor in FLOORS.items():
        assert figures_of(key)["accuracy"] >= floor, (key, figures_of(key)["accuracy"])
    for length, floor in RELATION_FLOOR.items():
        by_relation = recorded["by_length"][length]["by_relation"]
        assert min(by_relation.values()) >= floor, (length, by_relation)
    per_relation = [a for r in recorded["by_length"].values() for a in r["by_relation"].values()]
    assert recorded["worst_relation"] == min(per_relation)
    # The progress figure is kept beside it, measured on other items.
    progress = base_probe(DEFAULT_BASE, n=manifest["progress_probe"]["n"], seed=seed)
    assert progress["accuracy"] == pytest.approx(manifest["progress_probe"]["accuracy"], abs=1e-9)
