"""`index` and `serve-retriever` subcommands, run as the user would."""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from retrieval.cli import main, register
from retrieval.index import read_manifest
from retrieval.loading import load_retriever
from tests.assets import minilm_encoder_dir
from tests.synthetic_corpus import generate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def corpus(tmp_path):
    passages, queries, gold = generate(60, seed=5)
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in passages), encoding="utf-8")
    return str(path), queries, gold


def test_register_adds_both_subcommands_with_funcs():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    a = parser.parse_args(["index", "--corpus", "c.jsonl", "--out", "o", "--index-type", "hnsw"])
    b = parser.parse_args(["serve-retriever", "--index", "o"])
    assert callable(a.func) and callable(b.func) and a.func is not b.func
    assert (a.index_type, b.host, b.port) == ("hnsw", "127.0.0.1", 8000)
    with pytest.raises(SystemExit):
        parser.parse_args(["index", "--corpus", "c", "--out", "o", "--index-type", "annoy"])


def test_help_mentions_formats(capsys):
    with pytest.raises(SystemExit):
        main(["index", "--help"])
    out = capsys.readouterr().out
    assert "--index-type" in out and "title\\ntext" in out and "bm25" in out
    with pytest.raises(SystemExit):
        main(["serve-retriever", "--help"])
    out = capsys.readouterr().out
    assert "/retrieve" in out and "127.0.0.1" in out


def test_index_dense_flat_then_search(corpus, tmp_path, capsys):
    path, queries, gold = corpus
    out = str(tmp_path / "dense")
    rc = main(["index", "--corpus", path, "--encoder", minilm_encoder_dir(), "--out", out, "--no-progress"])
    assert rc == 0 and "indexed 60 passages" in capsys.readouterr().out
    m = read_manifest(out)
    assert (m["kind"], m["index_type"], m["count"], m["dim"]) == ("dense", "flat", 60, 384)
    r = load_retriever(out)
    hits = r.search(queries[:10], 5)
    assert sum(g in [h.id for h in hs] for hs, g in zip(hits, gold)) >= 9
    # A second run into the same directory refuses rather than silently overwriting.
    assert main(["index", "--corpus", path, "--encoder", minilm_encoder_dir(), "--out", out]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_index_requires_encoder_for_dense(corpus, tmp_path, capsys):
    assert main(["index", "--corpus", corpus[0], "--out", str(tmp_path / "x")]) == 2
    assert "--encoder DIR is required" in capsys.readouterr().err


def test_bad_corpus_line_named_or_skipped(corpus, tmp_path, capsys):
    path = corpus[0]
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"id": "bad", "title": "no contents"}\n')
    assert main(["index", "--corpus", path, "--out", str(tmp_path / "a"), "--index-type", "bm25"]) == 2
    assert "corpus line 61: missing string field 'contents'" in capsys.readouterr().err
    assert main(["index", "--corpus", path, "--out", str(tmp_path / "b"), "--index-type", "bm25",
                 "--skip-bad-lines"]) == 0
    cap = capsys.readouterr()
    assert "indexed 60 passages" in cap.out and "skipped 1 bad line(s)" in cap.out and "line 61" in cap.err


# The dense case is slow (a second interpreter loads and warms up the encoder); in the fast lane
# the bm25 case runs the same server process, test_index_dense_flat_then_search the dense index's
# build, load and search, and tests/test_retrieval_encoder.py the warm-up.
@pytest.mark.parametrize("kind", ["bm25", pytest.param("dense", marks=pytest.mark.slow)])
def test_serve_retriever_subprocess(corpus, tmp_path, kind):
    path, queries, gold = corpus
    out = str(tmp_path / kind)
    if kind == "bm25":
        assert main(["index", "--corpus", path, "--out", out, "--index-type", "bm25"]) == 0
    else:  # the server loads the encoder named in the manifest and warms it up before serving
        assert main(["index", "--corpus", path, "--encoder", minilm_encoder_dir(), "--out", out,
                     "--no-progress"]) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "retrieval.cli", "serve-retriever", "--index", out,
                             "--port", str(port), "--log-level", "warning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url, health = f"http://127.0.0.1:{port}", None
        for _ in range(300):  # up to ~60 s for the interpreter to import, load and bind
            try:
                health = httpx.get(url + "/health", timeout=1).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.2)
        assert health is not None and health["status"] == "ok" and health["count"] == 60
        assert health["kind"] == ("bm25:bm25" if kind == "bm25" else "dense:flat"), health
        r = httpx.post(url + "/retrieve", json={"queries": queries[:2], "topk": 2, "return_scores": True})
        assert r.status_code == 200 and [len(x) for x in r.json()["result"]] == [2, 2]
        r = httpx.post(url + "/batch_search", json={"query": queries[:8], "top_n": 5})
        found = [g in [d["id"] for d in docs] for docs, g in zip(r.json(), gold)]
        assert r.status_code == 200 and sum(found) >= 7, found
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_retriever_passes_the_body_limit(monkeypatch):
    """--max-body-bytes reaches the server's limits; without it the limit is derived (issue 56, 13)."""
    import socket

    import retrieval.index
    import retrieval.loading
    import retrieval.server

    seen = []
    monkeypatch.setattr(retrieval.index, "read_manifest", lambda d: {"kind": "bm25", "index_type": "bm25", "count": 1})
    monkeypatch.setattr(retrieval.loading, "load_retriever", lambda *a, **k: object())
    monkeypatch.setattr(retrieval.server, "serve", lambda retriever, **kw: seen.append(kw["limits"]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    assert main(["serve-retriever", "--index", "i", "--port", port, "--max-body-bytes", "5000"]) == 0
    assert main(["serve-retriever", "--index", "i", "--port", port, "--max-batch", "4", "--max-query-chars", "10"]) == 0
    # 12 bytes a character: the JSON escape of one outside the BMP, "\\ud83d\\ude00" (issue 82, item 17)
    assert [lim.body_limit() for lim in seen] == [5000, 4 * (12 * 10 + 8) + 4096]
