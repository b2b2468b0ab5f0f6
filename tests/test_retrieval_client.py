"""HTTPRetriever against live local servers (127.0.0.1 only): both APIs, timeouts, 500s, a dead port."""
import socket
import threading
import time

import pytest

from retrieval.base import ERROR_HIT_ID, Hit, Retriever
from retrieval.bm25 import BM25Retriever
from retrieval.client import HTTPRetriever
from retrieval.server import BackgroundServer, ServerLimits, create_app
from tests.synthetic_corpus import generate

FAST = dict(backoff=0.01, max_backoff=0.05)


@pytest.fixture(scope="module")
def bm25_server():
    passages, queries, _ = generate(200, seed=3)
    local = BM25Retriever.from_passages(passages)
    with BackgroundServer(create_app(local, ServerLimits(max_query_chars=500))) as srv:
        yield srv, local, queries


@pytest.mark.parametrize("api", ["memsearcher", "search-r1"])
def test_client_matches_in_process_retriever(bm25_server, api):
    srv, local, queries = bm25_server
    with HTTPRetriever(srv.url, api=api, timeout=10) as remote:
        assert isinstance(remote, Retriever)
        assert remote.health()["count"] == 200
        got, want = remote.search(queries[:20], 4), local.search(queries[:20], 4)
        assert [[h.id for h in x] for x in got] == [[h.id for h in x] for x in want]
        assert [[h.contents for h in x] for x in got] == [[h.contents for h in x] for x in want]
        for x, y in zip(got, want):
            assert [h.score for h in x] == pytest.approx([h.score for h in y], rel=1e-6)
        assert remote.attempts == 1  # one batched request for all 20 queries


def test_empty_query_answered_locally_others_served(bm25_server):
    srv, local, queries = bm25_server
    with HTTPRetriever(srv.url, **FAST) as remote:
        res = remote.search([queries[0], "  ", queries[1]], 2)
    assert res[1] == [Hit(id=ERROR_HIT_ID, contents="search failed: the query is empty")]
    assert [h.id for h in res[0]] == [h.id for h in local.search([queries[0]], 2)[0]]
    assert res[2][0].id != ERROR_HIT_ID


def test_client_error_is_not_retried(bm25_server):
    srv, _, _ = bm25_server
    with HTTPRetriever(srv.url, max_retries=3, **FAST) as remote:
        (hits,) = remote.search(["x" * 600], 3)  # over the server's 500-character limit -> 413
    assert remote.attempts == 1
    assert hits[0].id == ERROR_HIT_ID and "HTTP 413" in hits[0].contents


class _Scripted:
    """Fails the first `fail` calls, then answers; `delay` seconds per call."""

    def __init__(self, fail=0, delay=0.0):
        self.fail, self.delay, self.calls = fail, delay, 0

    def search(self, queries, top_n):
        self.calls += 1
        time.sleep(self.delay)
        if self.calls <= self.fail:
            raise RuntimeError(f"transient failure {self.calls}")
        return [[Hit(id="ok", contents=f"T\n{q}", score=0.5)] for q in queries]


def test_server_returns_500_then_recovers():
    backend = _Scripted(fail=2)
    with BackgroundServer(create_app(backend)) as srv, HTTPRetriever(srv.url, max_retries=3, **FAST) as remote:
        res = remote.search(["who", "what"], 3)
    assert res == [[Hit(id="ok", contents="T\nwho", score=0.5)], [Hit(id="ok", contents="T\nwhat", score=0.5)]]
    assert remote.attempts == 3 and backend.calls == 3


def test_persistent_500_becomes_error_hits_after_bounded_retries():
    backend = _Scripted(fail=10**9)
    with BackgroundServer(create_app(backend)) as srv, HTTPRetriever(srv.url, max_retries=2, **FAST) as remote:
        res = remote.search(["a", "b"], 3)
    assert remote.attempts == 3
    for hits in res:
        assert len(hits) == 1 and hits[0].id == ERROR_HIT_ID
        assert "HTTP 500" in hits[0].contents and "after 3 attempt(s)" in hits[0].contents


def test_timeout_becomes_error_hit_in_bounded_time():
    backend = _Scripted(delay=1.5)
    with BackgroundServer(create_app(backend)) as srv:
        with HTTPRetriever(srv.url, timeout=0.2, max_retries=1, **FAST) as remote:
            t0 = time.monotonic()
            (hits,) = remote.search(["slow"], 1)
            elapsed = time.monotonic() - t0
        assert hits[0].id == ERROR_HIT_ID and "timed out after 0.2 s" in hits[0].contents
        assert remote.attempts == 2 and elapsed < 1.2
        # A patient client gets the answer from the same server.
        with HTTPRetriever(srv.url, timeout=10, max_retries=0) as patient:
            assert patient.search(["slow"], 1)[0][0].id == "ok"


def test_server_down_becomes_error_hit():
    with socket.socket() as s:  # a port nothing listens on once the socket closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with HTTPRetriever(f"http://127.0.0.1:{port}", timeout=1, max_retries=2, **FAST) as remote:
        t0 = time.monotonic()
        res = remote.search(["a", "b", "c"], 5)
        elapsed = time.monotonic() - t0
    assert remote.attempts == 3 and elapsed < 3
    assert all(len(h) == 1 and h[0].id == ERROR_HIT_ID and "cannot reach" in h[0].contents for h in res)


def test_concurrent_clients_all_served(bm25_server):
    """Many threads at once: the server batches them and every answer goes to its own caller."""
    srv, local, queries = bm25_server
    want = {q: [h.id for h in hits] for q, hits in zip(queries[:32], local.search(queries[:32], 3))}
    errors, got = [], {}

    def worker(q):
        with HTTPRetriever(srv.url, timeout=10, max_retries=0) as r:
            hits = r.search([q], 3)[0]
            if hits and hits[0].id == ERROR_HIT_ID:
                errors.append(hits[0].contents)
            got[q] = [h.id for h in hits]

    threads = [threading.Thread(target=worker, args=(q,)) for q in queries[:32]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == [] and got == want


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="api 'flashrag'"):
        HTTPRetriever("http://127.0.0.1:1", api="flashrag")
    with pytest.raises(ValueError, match="max_retries=-1"):
        HTTPRetriever("http://127.0.0.1:1", max_retries=-1)


def test_event_loop_stays_responsive_during_a_long_search():
    """Search runs on the batcher thread, so /health answers while a slow search is in flight."""
    backend = _Scripted(delay=1.0)
    with BackgroundServer(create_app(backend)) as srv:
        results = []
        t = threading.Thread(target=lambda: results.append(HTTPRetriever(srv.url, timeout=10).search(["q"], 1)))
        t.start()
        time.sleep(0.2)  # the search is now sleeping inside the retriever
        t0 = time.monotonic()
        import httpx

        assert httpx.get(srv.url + "/health", timeout=5).json()["status"] == "ok"
        assert time.monotonic() - t0 < 0.5
        t.join(10)
        assert results and results[0][0][0].id == "ok"
