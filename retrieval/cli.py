"""`memsearcher-jax index` and `memsearcher-jax serve-retriever`.

`register(subparsers)` adds both subcommands to an argparse subparsers object; each sets
`func(args) -> int`. `python -m retrieval.cli ...` runs them standalone.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from retrieval.index import INDEX_TYPES, MANIFEST, IndexConfig

_INDEX_EPILOG = """examples:
  # exact inner-product index with e5 (the paper's setup)
  memsearcher-jax index --corpus wiki-18.jsonl --encoder ./e5-base-v2 --out indexes/wiki18-e5
  # approximate index for corpora that do not fit exact search
  memsearcher-jax index --corpus wiki-18.jsonl --encoder ./e5-base-v2 --out idx --index-type ivf_pq \\
      --nlist 65536 --pq-m 64 --nprobe 64
  # no encoder: BM25
  memsearcher-jax index --corpus wiki-18.jsonl --out indexes/wiki18-bm25 --index-type bm25

corpus format: one JSON object per line, {"id": "...", "contents": "title\\ntext"}."""

_SERVE_EPILOG = """endpoints:
  POST /search        {"query": str, "top_n": 10, "return_score": false}
  POST /batch_search  {"query": [str, ...], "top_n": 10, "return_score": false}
  POST /retrieve      {"queries": [str, ...], "topk": 3, "return_scores": false}   (Search-R1)
  GET  /health"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and ends every option's help with its default (unless the
    help already says it, or the option is required)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required or not action.option_strings or "default" in text or action.default is argparse.SUPPRESS:
            return text
        if action.default is False and action.nargs == 0:
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, got {value}")
    return value


def register(subparsers) -> None:
    defaults = IndexConfig()
    p = subparsers.add_parser(
        "index", help="build a dense (FAISS) or BM25 index directory from a jsonl corpus",
        description="Stream a jsonl corpus into a saved index directory (manifest.json + index + doc store).",
        epilog=_INDEX_EPILOG, formatter_class=HelpFormatter)
    p.add_argument("--corpus", required=True, help="jsonl corpus, one {\"id\", \"contents\"} object per line")
    p.add_argument("--out", required=True, help="output directory: new or empty (or an index's, with --overwrite)")
    p.add_argument("--encoder", help="local Hugging Face BERT directory (required unless --index-type bm25; "
                                     "no default)")
    p.add_argument("--index-type", default="flat", choices=(*INDEX_TYPES, "bm25"),
                   help="flat = exact IndexFlatIP; ivf_flat / ivf_pq / hnsw approximate; bm25 needs no encoder")
    p.add_argument("--convention", default="auto", choices=("auto", "e5", "sentence-transformers"),
                   help="e5: 'query: '/'passage: ' prefixes + mean pooling; sentence-transformers: mean pooling; "
                        "auto: from the encoder's name")
    p.add_argument("--max-length", type=positive_int,
                   help="token limit per passage (default: the convention's, 512 for e5)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="encoder batch size")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="encoder compute dtype")
    p.add_argument("--chunk-size", type=positive_int, default=8192, help="passages read and encoded per chunk")
    p.add_argument("--nlist", type=positive_int, default=defaults.nlist, help="IVF cells")
    p.add_argument("--nprobe", type=positive_int, default=defaults.nprobe, help="IVF cells searched per query")
    p.add_argument("--pq-m", type=positive_int, default=defaults.pq_m,
                   help="PQ sub-quantizers (must divide the dimension)")
    p.add_argument("--pq-nbits", type=positive_int, default=defaults.pq_nbits, help="bits per PQ code")
    p.add_argument("--hnsw-m", type=positive_int, default=defaults.hnsw_m, help="HNSW neighbours per node")
    p.add_argument("--ef-construction", type=positive_int, default=defaults.ef_construction, help="HNSW build beam")
    p.add_argument("--ef-search", type=positive_int, default=defaults.ef_search, help="HNSW search beam")
    p.add_argument("--train-size", type=positive_int, default=defaults.train_size, help="vectors used to train IVF/PQ")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip (and count) corpus lines that are not UTF-8 or JSON or lack 'contents' text, "
                        "instead of stopping at the first")
    p.add_argument("--dedupe", action="store_true",
                   help="keep the first passage of each id and drop later ones (counted) instead of stopping")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the index in --out (its entries only; the new one is built beside --out and "
                        "moved in when whole, so a failed run leaves the old one as it was)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_index)

    s = subparsers.add_parser(
        "serve-retriever", help="serve an index directory over HTTP (MemSearcher and Search-R1 APIs)",
        description="Serve a saved index over HTTP; compatible with MemSearcher/FlashRAG and Search-R1 clients.",
        epilog=_SERVE_EPILOG, formatter_class=HelpFormatter)
    s.add_argument("--index", required=True, help="directory written by `memsearcher-jax index`")
    s.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 exposes it)")
    s.add_argument("--port", type=port_number, default=8000, help="TCP port, 1..65535")
    s.add_argument("--encoder", help="override the encoder directory (default: the one the manifest records)")
    s.add_argument("--nprobe", type=positive_int, help="override IVF nprobe at query time (default: the manifest's)")
    s.add_argument("--ef-search", type=positive_int,
                   help="override HNSW efSearch at query time (default: the manifest's)")
    s.add_argument("--max-query-chars", type=positive_int, default=4096, help="longer queries get 413")
    s.add_argument("--max-batch", type=positive_int, default=512, help="larger batches get 413")
    s.add_argument("--max-body-bytes", type=positive_int, default=None,
                   help="larger request bodies get 413 before they are read (default: room for the largest "
                        "batch the two limits above accept)")
    s.add_argument("--no-warmup", action="store_true",
                   help="skip compiling the encoder for query-sized shapes before accepting requests")
    s.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="uvicorn's log level")
    s.set_defaults(func=run_serve)


RUN_MARKER = ".memsearcher-run"  # retrieval stands apart: the name, not the module


def check_index_out(out: str, overwrite: bool) -> str:
    """Why `index --out` must not be written (before the corpus is read), "" when it may: a file
    (or a path under one), a non-empty directory that holds no index (the user's files), or an
    index without --overwrite. An index's directory holds only what `index` writes there."""
    path = os.path.abspath(os.path.expanduser(out))
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"--out {out!r}: {parent} is a file, not a directory; give a new directory"
    here = parent
    while True:  # a training run's directory (its marker, rules/run_dir.py's RUN_MARKER) holds only the run's
        if os.path.isfile(os.path.join(here, RUN_MARKER)):
            return f"--out {out!r} lies inside the training run directory {here}; give a directory outside it"
        if os.path.dirname(here) == here:
            break
        here = os.path.dirname(here)
    if not os.path.isdir(path) or not os.listdir(path):
        return ""
    if not os.path.exists(os.path.join(path, MANIFEST)):
        held = sorted(os.listdir(path))
        return (f"--out {out!r} is not empty and holds no index (it holds {os.path.join(path, held[0])}"
                f"{f' and {len(held) - 1} more' if len(held) > 1 else ''}); nothing was written. Give a new or "
                "empty directory")
    if not overwrite:
        return f"{out!r} already holds an index; pass --overwrite to replace it"
    return ""


def corpus_problem(path: str) -> str:
    """Why `index --corpus` cannot be read, "" when it can (checked with --out, before any work)."""
    expected = 'expected a jsonl file, one {"id", "contents"} object per line'
    if os.path.isdir(path):
        return f"--corpus {path!r} is a directory; {expected}"
    if not os.path.exists(path):
        return f"corpus file {path!r} not found"
    if not os.path.isfile(path):
        return f"--corpus {path!r} is not a regular file (a pipe or a device); {expected}"
    try:  # open, not os.access: it answers for root and for ACLs as the read will
        with open(path, "rb"):
            pass
    except OSError as e:
        return f"cannot read --corpus {path!r}: {e.strerror or e}; make it readable or give another file"
    return ""


def run_index(args) -> int:
    from memsearcher_jax.errors import UserInputError
    from retrieval.corpus import ReadStats
    from retrieval.staging import StagedIndex

    refused = corpus_problem(args.corpus) or check_index_out(args.out, args.overwrite)
    if not refused and args.index_type != "bm25" and not args.encoder:
        refused = "--encoder DIR is required for dense index types (or use --index-type bm25)"
    try:
        if refused:
            raise UserInputError(refused)
        staged = StagedIndex(args.out)
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stats = ReadStats()
    try:
        with staged:  # built beside --out, moved in only when whole; nothing of a failure stays
            count, desc = _build_index(args, staged.path, stats)
            staged.install()
    except (ValueError, OSError) as e:  # bad input, a full disk, an unwritable path: named, exit 2
        print(f"error: {e}" + (f"; {staged.outcome_of_failure()}" if staged.path else ""), file=sys.stderr)
        return 2
    skipped = f", skipped {stats.skipped} bad line(s)" if stats.skipped else ""
    skipped += f", dropped {stats.duplicates} duplicate id(s)" if stats.duplicates else ""
    print(f"indexed {count} passages into {args.out} [{desc}]{skipped}")
    for msg in stats.first_errors:
        print(f"  skipped: {msg}", file=sys.stderr)
    return 0


def _build_index(args, out_dir: str, stats) -> tuple[int, str]:
    """The index `args` ask for, written into `out_dir`: (passages indexed, a description)."""
    from memsearcher_jax.errors import UserInputError
    from retrieval.corpus import read_corpus

    passages = read_corpus(args.corpus, skip_bad=args.skip_bad_lines, dedupe=args.dedupe, stats=stats)
    if args.index_type == "bm25":
        from retrieval.bm25 import build_bm25_index

        return build_bm25_index(passages, out_dir), "bm25"
    from retrieval.dense import build_dense_index
    from retrieval.encoder import DenseEncoder

    cfg = IndexConfig(type=args.index_type, nlist=args.nlist, nprobe=args.nprobe, pq_m=args.pq_m,
                      pq_nbits=args.pq_nbits, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction,
                      ef_search=args.ef_search, train_size=args.train_size)
    encoder = DenseEncoder.from_pretrained(args.encoder, args.convention, max_length=args.max_length,
                                           batch_size=args.batch_size, dtype=args.dtype)
    if args.index_type == "ivf_pq" and encoder.dim % args.pq_m:  # before the corpus is encoded
        raise UserInputError(f"--pq-m {args.pq_m} does not divide the encoder's dimension {encoder.dim}; pick a "
                             f"divisor of {encoder.dim}")
    count = build_dense_index(passages, encoder, out_dir, cfg, chunk_size=args.chunk_size,
                              progress=not args.no_progress)
    return count, f"{args.index_type} ({encoder.config.name}, dim {encoder.dim})"


def run_serve(args) -> int:
    from retrieval.index import read_manifest
    from retrieval.loading import load_retriever
    from retrieval.server import ServerLimits, serve

    try:
        manifest = read_manifest(args.index)
        retriever = load_retriever(args.index, encoder_dir=args.encoder, nprobe=args.nprobe,
                                   ef_search=args.ef_search)
    except (FileNotFoundError, ValueError) as e:  # a missing or damaged index: bad input, named
        print(f"error: {e}", file=sys.stderr)
        return 2
    unbindable = bind_problem(args.host, args.port)
    if unbindable:
        print(f"error: {unbindable}", file=sys.stderr)
        return 2
    encoder = getattr(retriever, "encoder", None)
    if encoder is not None and not args.no_warmup:
        t0 = time.perf_counter()
        n = encoder.warmup()
        print(f"compiled the encoder for {n} query shapes in {time.perf_counter() - t0:.1f} s", flush=True)
    limits = ServerLimits(max_query_chars=args.max_query_chars, max_batch=args.max_batch,
                          max_body_bytes=args.max_body_bytes or 0)
    kind = f"{manifest['kind']}:{manifest['index_type']}"
    print(f"serving {manifest['count']} passages ({kind}) on http://{args.host}:{args.port}", flush=True)
    serve(retriever, host=args.host, port=args.port, limits=limits, log_level=args.log_level, kind=kind)
    return 0


def bind_problem(host: str, port: int) -> str:
    """Why (host, port) cannot be bound now, as the message to print, or "" (checked before the
    encoder warm-up, so a bad --host or a busy port is reported in a second, not after "serving on")."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn binds
    try:
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4]
    except (socket.gaierror, UnicodeError) as e:
        return (f"--host {host!r} is not a valid address or a host name this machine resolves "
                f"({getattr(e, 'strerror', None) or e}); give an IP address such as 127.0.0.1 or 0.0.0.0")
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                return (f"--host {host!r} is not an address of this machine ({e.strerror}); give one of its "
                        "own addresses, 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)")
            return f"cannot serve on {host}:{port}: {e.strerror or e}; choose another --port"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retrieval.cli", description="memsearcher-jax retrieval tools")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
