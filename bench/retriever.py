"""Retrieval benchmark: encoder passages/s, batched search queries/s, HTTP latency under load.

    python bench/retrieval.py [--passages 2000] [--requests 1000] [--concurrency 32]

Uses the generated corpus (retrieval.synthetic) and the MiniLM encoder; the HTTP part
starts `serve-retriever` in a separate process on 127.0.0.1 (so client and server do not
share a GIL) and drives it with an asyncio httpx client at a fixed concurrency.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from memsearcher_jax.assets import minilm_encoder_dir  # noqa: E402
from retrieval.bm25 import BM25Retriever  # noqa: E402
from retrieval.corpus import InMemoryDocs  # noqa: E402
from retrieval.dense import DenseRetriever  # noqa: E402
from retrieval.encoder import DenseEncoder  # noqa: E402
from retrieval.index import IndexConfig, build_index  # noqa: E402
from retrieval.synthetic import generate, recall_at_k  # noqa: E402


def _timed(fn, repeat=1):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


async def _load(url: str, queries: list[str], n: int, concurrency: int, top_n: int):
    import httpx

    lat, errors, next_i = [], 0, 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        async def worker():
            nonlocal errors, next_i
            while next_i < n:
                i = next_i
                next_i += 1
                t0 = time.perf_counter()
                try:
                    r = await client.post(url + "/search", json={"query": queries[i % len(queries)], "top_n": top_n})
                    ok = r.status_code == 200 and len(r.json()) == top_n
                except httpx.HTTPError:
                    ok = False
                lat.append(time.perf_counter() - t0)
                errors += not ok

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return np.asarray(lat), errors, wall


def _start_server(index_dir: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "retrieval.cli", "serve-retriever", "--index", index_dir,
                             "--port", str(port), "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(url + "/health", timeout=1)
            return proc, url
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError("serve-retriever exited during start-up")
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("serve-retriever did not answer /health within 60 s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--top-n", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256, help="queries per batched search call")
    args = ap.parse_args()

    import jax

    rows = []
    passages, queries, gold = generate(args.passages, seed=0)
    texts = [p["contents"] for p in passages]
    enc = DenseEncoder.from_pretrained(minilm_encoder_dir())
    enc.encode_passages(texts[: enc.config.batch_size * 2])  # compile the common buckets
    vecs, t = _timed(lambda: enc.encode_passages(texts))
    rows.append(("encoder (MiniLM-L6, jit, fp32)", f"{len(texts) / t:,.0f} passages/s", f"{len(texts)} passages"))

    q = queries[: args.batch]
    docs = InMemoryDocs(passages)
    for cfg in (IndexConfig(), IndexConfig("hnsw"), IndexConfig("ivf_flat", nlist=32, nprobe=8)):
        r = DenseRetriever(build_index(vecs, cfg), docs, enc, cfg)
        r.search(q, args.top_n)  # warm-up / compile
        res, t = _timed(lambda: r.search(q, args.top_n), repeat=3)
        rows.append((f"dense {cfg.type} search, batch {len(q)}", f"{len(q) / t:,.0f} queries/s",
                     f"recall@5 {recall_at_k(res, gold[: len(q)], 5):.3f}"))
    qv = enc.encode_queries(q)
    flat = build_index(vecs)
    _, t = _timed(lambda: flat.search(qv, args.top_n), repeat=5)
    rows.append((f"FAISS flat only (pre-encoded), batch {len(q)}", f"{len(q) / t:,.0f} queries/s",
                 f"{len(texts)} x {vecs.shape[1]}"))
    bm = BM25Retriever.from_passages(passages)
    res, t = _timed(lambda: bm.search(q, args.top_n), repeat=3)
    rows.append((f"bm25 search, batch {len(q)}", f"{len(q) / t:,.0f} queries/s",
                 f"recall@5 {recall_at_k(res, gold[: len(q)], 5):.3f}"))

    with tempfile.TemporaryDirectory() as tmp:
        DenseRetriever(flat, docs, enc).save(tmp)
        proc, url = _start_server(tmp)
        try:
            asyncio.run(_load(url, queries, 64, args.concurrency, args.top_n))  # warm-up: compile buckets
            lat, errors, wall = asyncio.run(_load(url, queries, args.requests, args.concurrency, args.top_n))
        finally:
            proc.terminate()
            proc.wait(10)
    p50, p99 = np.percentile(lat, [50, 99]) * 1000
    rows.append((f"HTTP /search dense flat, {args.requests} req @ conc {args.concurrency}",
                 f"p50 {p50:.1f} ms / p99 {p99:.1f} ms", f"{args.requests / wall:,.0f} req/s, {errors} errors"))

    print(f"\ndevice: {jax.devices()[0].platform}, cpu cores: {os.cpu_count()}, corpus: {len(texts)} passages\n")
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    print(f"| {'measurement':<{w0}} | {'result':<{w1}} | notes")
    print(f"|{'-' * (w0 + 2)}|{'-' * (w1 + 2)}|------")
    for a, b, c in rows:
        print(f"| {a:<{w0}} | {b:<{w1}} | {c}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
