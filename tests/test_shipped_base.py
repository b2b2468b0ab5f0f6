"""The reading base shipped in the package: its files match its manifest, its manifest says how it
was made, and its reading figures are what the stored weights give on items no pretraining step saw."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
from safetensors import safe_open

from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.data.vocab import ReadingVocab
from memsearcher_jax.pretrain import BASE_MANIFEST, base_probe, final_probe

# What the shipped base must read at least, on the final probe (docs/experiments.md says how
# these compare with the targets: 95% per length, 90% per relation).
FLOORS = {"2": 0.0, "8": 0.0, "binding": 0.0}


def pool_ids(vocab, kind: str) -> set[int]:
    """Token ids of the names in one pool ("pretrain" or "reserved") of a ReadingVocab."""
    return {vocab.ids[n] for names in vocab.pool(kind).values() for n in names}


@pytest.fixture(scope="module")
def manifest():
    with open(os.path.join(DEFAULT_BASE, BASE_MANIFEST), encoding="utf-8") as f:
        return json.load(f)


def test_files_match_the_manifest(manifest):
    for name, meta in manifest["files"].items():
        path = os.path.join(DEFAULT_BASE, name)
        data = open(path, "rb").read()
        assert len(data) == meta["bytes"], name
        assert hashlib.sha256(data).hexdigest() == meta["sha256"], name
    with safe_open(os.path.join(DEFAULT_BASE, "model.safetensors"), "np") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
    assert shapes == manifest["tensors"]
    total = sum(os.path.getsize(os.path.join(DEFAULT_BASE, n)) for n in os.listdir(DEFAULT_BASE))
    assert total < 10 * 2 ** 20  # the one planned exception to "no big files in git": at most ~10 MB


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


@pytest.mark.slow
def test_the_final_probe_is_what_the_stored_weights_read(manifest):
    """Recomputed from the bf16 weights on the final items (reserved names only; seeds no
    progress probe used): the manifest's figures by length, relation and set, and the floors."""
    vocab = ReadingVocab.load(DEFAULT_BASE)
    assert vocab.pool("reserved")["person"] and not pool_ids(vocab, "reserved") & pool_ids(vocab, "pretrain")
    recorded = manifest["reading_probe"]
    seed = manifest["config"]["train"]["seed"]
    probe = final_probe(DEFAULT_BASE, n=recorded["by_length"]["2"]["n"], seed=seed)
    for length, got in probe["by_length"].items():
        assert got["accuracy"] == pytest.approx(recorded["by_length"][length]["accuracy"], abs=1e-9), length
        assert got["by_relation"] == pytest.approx(recorded["by_length"][length]["by_relation"], abs=1e-9), length
    for side in ("multi", "binding"):
        assert probe[side]["accuracy"] == pytest.approx(recorded[side]["accuracy"], abs=1e-9), side
    for key, floor in FLOORS.items():
        got = probe[key]["accuracy"] if key == "binding" else probe["by_length"][key]["accuracy"]
        assert got >= floor, (key, got)
    # The progress figure is kept beside it, measured on other items.
    progress = base_probe(DEFAULT_BASE, n=manifest["progress_probe"]["n"], seed=seed)
    assert progress["accuracy"] == pytest.approx(manifest["progress_probe"]["accuracy"], abs=1e-9)
