"""HTTP retrieval service (FastAPI): the MemSearcher/FlashRAG API and Search-R1's `/retrieve`.

MemSearcher (FlashRAG-style) API
    POST /search        {"query": str, "top_n": 10, "return_score": false}
        -> [{"id", "contents"}, ...]                      (return_score=false)
        -> [[{"id", "contents"}, ...], [score, ...]]      (return_score=true: documents, scores)
    POST /batch_search  {"query": [str, ...], "top_n": 10, "return_score": false}
        -> [[{"id", "contents"}, ...], ...]               one list per query
        -> [[[docs...], ...], [[scores...], ...]]         (return_score=true)
    GET  /health        -> {"status": "ok", "kind", "count"}
Search-R1 API
    POST /retrieve      {"queries": [str, ...], "topk": 3, "return_scores": true}
        -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}
        -> {"result": [[{"id", "contents"}, ...], ...]}   (return_scores=false)

Errors: empty/whitespace query -> 400; top_n/topk outside 1..max_top_n -> 422; a query over
`max_query_chars` or a batch over `max_batch` -> 413; a request body over `max_body_bytes` -> 413
before the body is read (from its Content-Length, or as a chunked body passes the limit);
malformed JSON -> 422; retriever failure -> 500.

Concurrency: handlers never search on the event loop. They enqueue their queries with a
`SearchBatcher`, whose single worker thread merges whatever requests are waiting into one
`retriever.search` call (one encoder forward + one FAISS search) and resolves their futures.
"""

# No `from __future__ import annotations`: FastAPI must see the request models made in
# _request_models as real classes, not strings it cannot resolve in create_app's local scope.
import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import queue
import threading
from typing import Any

from retrieval.base import Hit

log = logging.getLogger(__name__)

# The most bytes JSON may spend on one character of a query: a character outside the BMP (an
# emoji) counts once in `max_query_chars` but is escaped as a surrogate pair, "\ud83d\ude00".
JSON_ESCAPE_BYTES = 12


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_top_n: int = 100
    max_query_chars: int = 4096
    max_batch: int = 512
    # The worker merges pending requests up to this many queries per retriever call.
    max_merged_queries: int = 256
    # A request body over this many bytes gets 413 unread; 0: room for the largest batch the
    # limits above accept, every character in its longest JSON escape, ~25.2 MB by default.
    max_body_bytes: int = 0

    def body_limit(self) -> int:
        return self.max_body_bytes or self.max_batch * (JSON_ESCAPE_BYTES * self.max_query_chars + 8) + 4096



class BodyLimit:
    """ASGI middleware: a request whose body is over `max_bytes` gets 413 without the body being
    read, at once when its Content-Length says so, or as soon as a chunked body passes the limit.
    A body within it is passed on whole."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send, f"{int(declared)} bytes")
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                return await self._refuse(send, f"over {self.max_bytes} bytes")
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send, size: str) -> None:
        detail = (f"request body of {size} exceeds the limit of {self.max_bytes} bytes "
                  "(serve-retriever --max-body-bytes)")
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


class SearchBatcher:
    """Queue of (queries, top_n, future); one worker thread runs merged batches."""

    def __init__(self, retriever, max_merged_queries: int = 256):
        self.retriever = retriever
        self.max_merged = max_merged_queries
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="search-batcher", daemon=True)
        self._stopped = False
        self._thread.start()
        self.batches = 0  # retriever calls made (observable in tests)

    def submit(self, queries: list[str], top_n: int) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._q.put((queries, top_n, fut))
        return fut

    def close(self) -> None:
        self._stopped = True
        self._q.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            pending, n = [item], len(item[0])
            while n < self.max_merged:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)  # finish this batch, then stop
                    break
                pending.append(nxt)
                n += len(nxt[0])
            self._serve(pending)

    def _serve(self, pending) -> None:
        merged = [q for qs, _, _ in pending for q in qs]
        top = max(t for _, t, _ in pending)
        try:
            results = self.retriever.search(merged, top)
            if len(results) != len(merged):
                raise RuntimeError(f"retriever returned {len(results)} result lists for {len(merged)} queries")
        except BaseException as e:  # every waiting request learns of the failure
            log.exception("search failed")
            for _, _, fut in pending:
                if not fut.done():
                    fut.set_exception(e)
            return
        finally:
            self.batches += 1
        i = 0
        for qs, t, fut in pending:
            fut.set_result([hits[:t] for hits in results[i : i + len(qs)]])
            i += len(qs)


def _doc(h: Hit) -> dict[str, str]:
    return {"id": h.id, "contents": h.contents}


def _request_models(limits: ServerLimits):
    """The three request bodies (pydantic), with top_n / topk bounded by `limits.max_top_n`."""
    from pydantic import AliasChoices, BaseModel, Field

    def top():  # one FieldInfo per model
        return Field(default=10, ge=1, le=limits.max_top_n)

    class SearchRequest(BaseModel):
        query: str
        top_n: int = top()
        return_score: bool = False

    class BatchSearchRequest(BaseModel):
        # FlashRAG's field is `query` (a list); `queries` is accepted too.
        query: list[str] = Field(validation_alias=AliasChoices("query", "queries"))
        top_n: int = top()
        return_score: bool = False

    class RetrieveRequest(BaseModel):
        queries: list[str]
        topk: int = Field(default=3, ge=1, le=limits.max_top_n)
        return_scores: bool = False

    return SearchRequest, BatchSearchRequest, RetrieveRequest


def check_queries(queries: list[str], limits: ServerLimits) -> None:
    """A 413 for a batch or a query over the limits, a 400 for an empty one, before any search."""
    from fastapi import HTTPException

    if len(queries) > limits.max_batch:
        raise HTTPException(413, f"batch of {len(queries)} queries exceeds the limit of {limits.max_batch}")
    if not queries:
        raise HTTPException(400, "no queries given; expected a non-empty list of query strings")
    for i, q in enumerate(queries):
        if not q.strip():
            raise HTTPException(400, f"query {i} is empty or whitespace; expected non-empty text")
        if len(q) > limits.max_query_chars:
            raise HTTPException(413, f"query {i} has {len(q)} characters; the limit is {limits.max_query_chars}")
        try:  # JSON may carry a lone surrogate ("\ud800"), which no tokenizer can encode
            q.encode("utf-8")
        except UnicodeEncodeError as e:
            raise HTTPException(400, f"query {i} is not valid Unicode text (character {e.start}: "
                                     f"{q[e.start]!r}); send UTF-8 text") from None


async def _validation_error(request, exc):
    """FastAPI's 422 for malformed JSON / schema errors, with a message that names the field."""
    from fastapi.responses import JSONResponse

    errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
              for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": errors})


def create_app(retriever, limits: ServerLimits | None = None, *, kind: str | None = None):
    """A FastAPI app serving `retriever` (anything with `search(queries, top_n)`)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, HTTPException
    from fastapi.exceptions import RequestValidationError

    limits = limits or ServerLimits()
    SearchRequest, BatchSearchRequest, RetrieveRequest = _request_models(limits)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app):
        state["batcher"] = SearchBatcher(retriever, limits.max_merged_queries)
        try:
            yield
        finally:
            state.pop("batcher").close()

    app = FastAPI(title="memsearcher-jax retriever", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(BodyLimit, max_bytes=limits.body_limit())

    async def run(queries: list[str], top_n: int) -> list[list[Hit]]:
        check_queries(queries, limits)
        try:
            return await asyncio.wrap_future(state["batcher"].submit(queries, top_n))
        except Exception as e:
            raise HTTPException(500, f"search failed: {type(e).__name__}: {e}") from None

    @app.get("/health")
    async def health():
        return {"status": "ok", "kind": kind or type(retriever).__name__,
                "count": len(retriever) if hasattr(retriever, "__len__") else None}

    @app.post("/search")
    async def search(req: SearchRequest):
        (hits,) = await run([req.query], req.top_n)
        docs = [_doc(h) for h in hits]
        return [docs, [h.score for h in hits]] if req.return_score else docs

    @app.post("/batch_search")
    async def batch_search(req: BatchSearchRequest):
        results = await run(req.query, req.top_n)
        docs = [[_doc(h) for h in hits] for hits in results]
        if req.return_score:
            return [docs, [[h.score for h in hits] for hits in results]]
        return docs

    @app.post("/retrieve")
    async def retrieve(req: RetrieveRequest):
        results = await run(req.queries, req.topk)
        if req.return_scores:
            return {"result": [[{"document": _doc(h), "score": h.score} for h in hits] for hits in results]}
        return {"result": [[_doc(h) for h in hits] for hits in results]}

    return app


def serve(retriever, host: str = "127.0.0.1", port: int = 8000, limits: ServerLimits | None = None,
          log_level: str = "info", kind: str | None = None) -> None:
    """Run the service with uvicorn (blocking). Binds loopback unless `host` says otherwise."""
    import uvicorn

    uvicorn.run(create_app(retriever, limits, kind=kind), host=host, port=port, log_level=log_level)


class BackgroundServer:
    """Run the app in a daemon thread on 127.0.0.1 (tests, benchmarks, in-process agents).

        with BackgroundServer(app) as srv:
            httpx.post(srv.url + "/search", json={...})
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import socket

        import uvicorn

        if port == 0:  # pick a free port up front so the URL is known before start
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.url = f"http://{host}:{port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> "BackgroundServer":
        import time

        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server at {self.url} did not start within 20 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
