"""Retrieval benchmark: encoder passages/s (ours vs transformers' PyTorch MiniLM), batched search
queries/s, HTTP latency under load.

    (from the repository root: it borrows the tests' offline assets and synthetic corpus)
    python -m bench.retriever [--wiki-passages 1024] [--repeats 3] [--passages 2000] [--requests 1000]
    python -m bench.retriever --encoder-only --wiki-passages 512 --repeats 2      # quick

Encoder: generated Wikipedia-lead-like paragraphs of ~100-200 MiniLM tokens (`wiki_paragraphs`),
encoded by our DenseEncoder and by transformers' AutoModel from the same MiniLM directory (mean
pooling + L2 norm, batches of 64, torch threads = CPU cores), in corpus order and in
length-sorted batches, interleaved round by round in this process; the table gives medians
over rounds and ours / torch. Without torch the torch rows are skipped with a message.
Search and HTTP use the short generated corpus (tests.synthetic_corpus); the HTTP part starts
`serve-retriever` in a separate process on 127.0.0.1 (so client and server do not share a
GIL) and drives it with an asyncio httpx client at a fixed concurrency.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from retrieval.bm25 import BM25Retriever
from retrieval.corpus import InMemoryDocs
from retrieval.dense import DenseRetriever
from retrieval.encoder import DenseEncoder
from retrieval.index import IndexConfig, build_index
from tests.assets import minilm_encoder_dir
from tests.synthetic_corpus import generate, recall_at_k

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SUBJECTS = ["The river", "The cathedral", "The county", "The regiment", "The album", "The railway",
             "The university", "The festival", "The treaty", "The species", "The dynasty", "The observatory",
             "The novel", "The harbour"]
_VERBS = ["was established", "was rebuilt", "was first recorded", "was renamed", "was expanded", "was restored",
          "was designated a national monument", "was described by naturalists", "was published", "was ratified"]
_PLACES = ["in northern Portugal", "near the Baltic coast", "in the province of Saskatchewan", "outside Kraków",
           "along the Mekong delta", "in the highlands of Ethiopia", "on the island of Hokkaido", "in Lower Saxony",
           "south of Valparaíso", "in the Thuringian Forest", "near Lake Titicaca", "in County Donegal"]
_PEOPLE = ["Johann Friedrich Herbart", "Maria Skłodowska", "the Marquis de Lafayette", "Sir Joseph Banks",
           "Emperor Meiji", "Ibn Battuta", "Ada Lovelace", "the Duke of Wellington", "Gustav Mahler",
           "Queen Liliʻuokalani", "Nikola Tesla", "Hernán Cortés"]
_CLAUSES = ["after a fire destroyed most of the original structure", "following a dispute over water rights",
            "with funding from the local merchant guild", "despite opposition from the regional parliament",
            "as part of a wider programme of modernisation", "during the reign of the third Habsburg emperor",
            "when the population had grown to about 14,500 inhabitants", "after the floods of the previous winter",
            "under the supervision of an Italian architect", "at a cost of roughly £2.3 million"]
_FACTS = ["It covers an area of {n} square kilometres and has a population of {m}.",
          "The name derives from the Old Norse word for a sheltered bay.",
          "Its collection includes {n} manuscripts, several of which date from the 12th century.",
          "The main building is {n} metres long and is constructed of local sandstone.",
          "In {y} it hosted the first international congress on {topic}.",
          "Critics praised its use of {topic}, although sales were initially modest.",
          "According to the {y} census, {n} people lived there, mostly employed in {topic}.",
          "It is served by a station on the line between {a} and {b}."]
_TOPICS = ["agriculture", "fisheries", "textile manufacturing", "orchestral colour", "maritime law", "astronomy",
           "medieval chant", "hydroelectric power", "folk architecture", "comparative linguistics"]
_TOWNS = ["Linz", "Tromsø", "Arequipa", "Bendigo", "Sapporo", "Tamale", "Cluj-Napoca", "Gdańsk", "Mérida",
          "Ulan-Ude"]


def wiki_paragraphs(n: int, seed: int = 0, min_words: int = 62, max_words: int = 128) -> list[str]:
    """n "Title\nparagraph" texts like Wikipedia leads: sentences until a word count drawn from
    [min_words, max_words] (about 80-200 MiniLM tokens, mean ~137), in random length order."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = rng.randint(min_words, max_words)
        title = f"{rng.choice(_TOWNS)} {rng.choice(['Abbey', 'Bridge', 'Museum', 'Charter', 'Symphony', 'Basin'])}"
        words, sents = 0, []
        while words < target:
            if rng.random() < 0.5:
                s = (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_PLACES)} in "
                     f"{rng.randrange(1050, 2020)} by {rng.choice(_PEOPLE)}, {rng.choice(_CLAUSES)}.")
            else:
                s = rng.choice(_FACTS).format(n=f"{rng.randrange(10, 99999):,}", m=f"{rng.randrange(100, 999999):,}",
                                              y=rng.randrange(1700, 2020), topic=rng.choice(_TOPICS),
                                              a=rng.choice(_TOWNS), b=rng.choice(_TOWNS))
            sents.append(s)
            words += len(s.split())
        out.append(f"{title}\n" + " ".join(sents))
    return out


def torch_encoder(model_dir: str, batch_size: int = 64):
    """transformers' AutoModel + mean pooling + L2 norm -> encode(texts, sort) -> [N, D]; None
    (with the reason) when torch or transformers cannot be imported."""
    try:
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError as e:
        return None, f"{type(e).__name__}: {e}"
    torch.set_num_threads(os.cpu_count() or 1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()

    def encode(texts: list[str], sort: bool = False) -> np.ndarray:
        order = np.argsort([len(t) for t in texts], kind="stable") if sort else np.arange(len(texts))
        out = np.empty((len(texts), model.config.hidden_size), np.float32)
        with torch.inference_mode():
            for s in range(0, len(texts), batch_size):
                rows = order[s: s + batch_size]
                b = tok([texts[i] for i in rows], padding=True, truncation=True, max_length=256,
                        return_tensors="pt")
                h = model(**b).last_hidden_state
                m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
                pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                out[rows] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
        return out

    return encode, f"torch {torch.__version__}, {torch.get_num_threads()} threads"


def bench_encoder(enc: DenseEncoder, n: int, repeats: int) -> tuple[list[tuple[str, str, str]], str]:
    """Ours vs torch on n wiki-like paragraphs, interleaved; -> (table rows, header line)."""
    texts = wiki_paragraphs(n, seed=1)
    lengths = np.array([len(x) for x in enc.tokenize(texts)])
    info = (f"wiki-like paragraphs: {n}, MiniLM tokens mean {lengths.mean():.0f}, "
            f"min {lengths.min()}, p50 {np.median(lengths):.0f}, max {lengths.max()}")
    runs = {"ours": lambda: enc.encode_passages(texts)}
    ours = enc.encode_passages(texts)  # compiles every shape this corpus uses
    torch_enc, torch_info = torch_encoder(enc.config.model_dir, batch_size=64)
    if torch_enc is None:
        print(f"torch rows skipped: PyTorch/transformers not importable ({torch_info})")
    else:
        for sort in (False, True):
            ref = torch_enc(texts[:128], sort)  # warm-up, and a check that both compute the same thing
            cos = float(np.min(np.sum(ours[:128] * ref, -1)))
            if cos < 0.9999:
                raise RuntimeError(f"ours and torch disagree: min cosine {cos}")
        runs["torch"] = lambda: torch_enc(texts, False)
        runs["torch_sorted"] = lambda: torch_enc(texts, True)
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            rates[k].append(n / (time.perf_counter() - t0))
    med = {k: float(np.median(v)) for k, v in rates.items()}
    per_round = lambda k: "/".join(f"{x:.1f}" for x in rates[k])
    rows = [(f"encoder ours (JAX, jit, fp32, batch {enc.config.batch_size}), wiki-like",
             f"{med['ours']:,.1f} passages/s", f"rounds {per_round('ours')}")]
    if torch_enc is not None:
        rows.append(("encoder torch (AutoModel, batch 64, corpus order)", f"{med['torch']:,.1f} passages/s",
                     f"ours/torch {med['ours'] / med['torch']:.2f}x; rounds {per_round('torch')}; {torch_info}"))
        rows.append(("encoder torch (AutoModel, batch 64, length-sorted)", f"{med['torch_sorted']:,.1f} passages/s",
                     f"ours/torch {med['ours'] / med['torch_sorted']:.2f}x; rounds {per_round('torch_sorted')}"))
    return rows, info


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
                raise RuntimeError("serve-retriever exited during start-up") from None
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
    ap.add_argument("--wiki-passages", type=int, default=1024,
                    help="wiki-like paragraphs (~100-200 tokens) for the ours-vs-torch encoder rows")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved timing rounds of the encoder rows")
    ap.add_argument("--encoder-only", action="store_true", help="only the encoder rows (no search, no HTTP)")
    args = ap.parse_args()

    import jax

    enc = DenseEncoder.from_pretrained(minilm_encoder_dir())
    rows, info = bench_encoder(enc, args.wiki_passages, args.repeats)
    errors = 0
    if not args.encoder_only:
        errors = _bench_search(enc, args, rows)
    info = f"{info}; micro-batches of <= {enc.max_batch_tokens or 'unlimited'} padded tokens"
    print(f"\ndevice: {jax.devices()[0].platform}, cpu cores: {os.cpu_count()}, {info}\n")
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    print(f"| {'measurement':<{w0}} | {'result':<{w1}} | notes")
    print(f"|{'-' * (w0 + 2)}|{'-' * (w1 + 2)}|------")
    for a, b, c in rows:
        print(f"| {a:<{w0}} | {b:<{w1}} | {c}")
    return 1 if errors else 0


def _bench_search(enc: DenseEncoder, args, rows: list) -> int:
    passages, queries, gold = generate(args.passages, seed=0)
    texts = [p["contents"] for p in passages]
    enc.encode_passages(texts[: enc.config.batch_size * 2])  # compile the common buckets
    vecs, t = _timed(lambda: enc.encode_passages(texts))
    rows.append(("encoder ours, short generated lines (~30 tokens)", f"{len(texts) / t:,.0f} passages/s",
                 f"{len(texts)} passages"))

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
    return errors


if __name__ == "__main__":
    sys.exit(main())
