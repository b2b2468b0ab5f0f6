"""The reading base shipped in the package: its files match its manifest, and it reads."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
from safetensors import safe_open

from memsearcher_jax.bases import DEFAULT_BASE
from memsearcher_jax.data.vocab import ReadingVocab
from memsearcher_jax.pretrain import BASE_MANIFEST, base_probe


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
    assert manifest["command"].startswith("memsearcher-jax pretrain")


def test_reserved_names_never_appear_in_pretraining_and_the_base_reads(manifest):
    vocab = ReadingVocab.load(DEFAULT_BASE)
    assert vocab.pool("reserved")["person"] and not pool_ids(vocab, "reserved") & pool_ids(vocab, "pretrain")
    probe = base_probe(DEFAULT_BASE, n=manifest["reading_probe"]["n"], seed=manifest["config"]["train"]["seed"])
    # The same items as the manifest's: the stored weights give the recorded accuracy.
    assert probe["accuracy"] == pytest.approx(manifest["reading_probe"]["accuracy"], abs=1e-9)
    assert probe["accuracy"] >= 0.8, probe
