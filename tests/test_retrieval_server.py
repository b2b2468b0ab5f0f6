"""HTTP contract: exact request/response JSON shapes of both APIs, and every bad input."""
import threading
import time

import pytest
from fastapi.testclient import TestClient

from retrieval.base import Hit
from retrieval.bm25 import BM25Retriever
from retrieval.server import SearchBatcher, ServerLimits, create_app

PASSAGES = [
    {"id": "p0", "contents": "Paris\nParis is the capital of France."},
    {"id": "p1", "contents": "Berlin\nBerlin is the capital of Germany."},
    {"id": "p2", "contents": "Cats\nCats are small domesticated mammals."},
    {"id": "p3", "contents": "Rome\nRome is the capital of Italy."},
]


@pytest.fixture(scope="module")
def client():
    app = create_app(BM25Retriever.from_passages(PASSAGES), ServerLimits(max_query_chars=200, max_batch=8))
    with TestClient(app) as c:
        yield c


def _is_doc(d):
    return isinstance(d, dict) and set(d) == {"id", "contents"} and isinstance(d["contents"], str)


def test_health(client):
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "kind": "BM25Retriever", "count": 4}


def test_search_documents_only(client):
    r = client.post("/search", json={"query": "capital of germany", "top_n": 2})
    assert r.status_code == 200
    body = r.json()
    assert isinstance(body, list) and len(body) == 2 and all(_is_doc(d) for d in body)
    assert body[0] == {"id": "p1", "contents": "Berlin\nBerlin is the capital of Germany."}


def test_search_default_top_n_and_scores(client):
    r = client.post("/search", json={"query": "capital", "return_score": True})
    docs, scores = r.json()
    assert len(docs) == 3 and len(scores) == 3  # 3 passages contain "capital"; default top_n 10
    assert all(_is_doc(d) for d in docs) and all(isinstance(s, float) for s in scores)
    assert scores == sorted(scores, reverse=True)


def test_batch_search_shapes(client):
    r = client.post("/batch_search", json={"query": ["capital of italy", "cats"], "top_n": 1})
    assert r.json() == [[{"id": "p3", "contents": "Rome\nRome is the capital of Italy."}],
                        [{"id": "p2", "contents": "Cats\nCats are small domesticated mammals."}]]
    r = client.post("/batch_search", json={"queries": ["capital of italy", "cats"], "top_n": 2, "return_score": True})
    docs, scores = r.json()
    assert [len(d) for d in docs] == [2, 1] and [len(s) for s in scores] == [2, 1]
    assert docs[0][0]["id"] == "p3" and scores[0][0] > scores[0][1]


def test_search_r1_retrieve_with_and_without_scores(client):
    r = client.post("/retrieve", json={"queries": ["capital of france", "mammals"], "topk": 1, "return_scores": True})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"result"} and len(body["result"]) == 2
    item = body["result"][0][0]
    assert set(item) == {"document", "score"} and isinstance(item["score"], float)
    assert item["document"] == {"id": "p0", "contents": "Paris\nParis is the capital of France."}
    r = client.post("/retrieve", json={"queries": ["capital of france"], "topk": 2, "return_scores": False})
    res = r.json()["result"]
    assert len(res) == 1 and len(res[0]) == 2 and all(_is_doc(d) for d in res[0]) and res[0][0]["id"] == "p0"


@pytest.mark.parametrize("path, body, status, needle", [
    ("/search", {"query": ""}, 400, "empty"),
    ("/search", {"query": "   \n\t"}, 400, "empty"),
    ("/batch_search", {"query": ["ok", " "]}, 400, "query 1 is empty"),
    ("/batch_search", {"query": []}, 400, "no queries"),
    ("/retrieve", {"queries": [""], "topk": 3}, 400, "empty"),
    ("/search", {"query": "x", "top_n": 0}, 422, "top_n"),
    ("/search", {"query": "x", "top_n": 101}, 422, "top_n"),
    ("/batch_search", {"query": ["x"], "top_n": -3}, 422, "top_n"),
    ("/retrieve", {"queries": ["x"], "topk": 1000}, 422, "topk"),
    ("/search", {"query": "x" * 201}, 413, "limit is 200"),
    ("/retrieve", {"queries": ["x" * 201]}, 413, "limit is 200"),
    ("/batch_search", {"query": ["x"] * 9}, 413, "limit of 8"),
    ("/retrieve", {"queries": ["x"] * 9}, 413, "limit of 8"),
    ("/search", {"top_n": 3}, 422, "query"),
    ("/search", {"query": ["not", "a", "string"]}, 422, "query"),
    ("/retrieve", {"queries": "a string, not a list"}, 422, "queries"),
])
def test_bad_inputs(client, path, body, status, needle):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert needle in r.text


@pytest.mark.parametrize("path", ["/search", "/batch_search", "/retrieve"])
def test_malformed_json_is_422(client, path):
    r = client.post(path, content=b'{"query": "paris", "top_n": ', headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert "json" in r.text.lower()


def test_retriever_failure_is_500_and_server_keeps_serving():
    class Flaky:
        calls = 0

        def search(self, queries, top_n):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("index shard offline")
            return [[Hit(id="x", contents="t\nx", score=1.0)] for _ in queries]

    with TestClient(create_app(Flaky())) as c:
        r = c.post("/search", json={"query": "q"})
        assert r.status_code == 500 and "index shard offline" in r.text
        assert c.post("/search", json={"query": "q"}).json() == [{"id": "x", "contents": "t\nx"}]


def test_batcher_merges_concurrent_requests_and_splits_results():
    """Requests waiting while a search runs are served by one merged retriever call."""
    gate = threading.Event()

    class Slow:
        sizes = []

        def search(self, queries, top_n):
            gate.wait(5)
            Slow.sizes.append((len(queries), top_n))
            return [[Hit(id=f"{q}-{i}", contents=q) for i in range(top_n)] for q in queries]

    b = SearchBatcher(Slow())
    try:
        first = b.submit(["a"], 1)  # occupies the worker until the gate opens
        time.sleep(0.05)
        later = [b.submit([f"q{i}", f"r{i}"], 1 + i % 3) for i in range(5)]
        gate.set()
        assert first.result(5) == [[Hit(id="a-0", contents="a")]]
        for i, f in enumerate(later):
            got = f.result(5)
            assert [[h.id for h in hits] for hits in got] == [
                [f"q{i}-{j}" for j in range(1 + i % 3)], [f"r{i}-{j}" for j in range(1 + i % 3)]]
        assert Slow.sizes == [(1, 1), (10, 3)]  # 5 requests, 10 queries, one call at the largest top_n
    finally:
        b.close()


@pytest.mark.parametrize("path,key", [("/search", "query"), ("/batch_search", "query"), ("/retrieve", "queries")])
def test_lone_surrogate_query_is_400_naming_it(client, path, key):
    one = '"bad \\ud800 text"'  # valid JSON, but no UTF-8 text: a dense encoder's tokenizer fails on it
    body = f'{{"{key}": {one if path == "/search" else "[" + chr(34) + "ok" + chr(34) + ", " + one + "]"}}}'
    r = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "not valid Unicode" in r.text and f"query {0 if path == '/search' else 1}" in r.text


# ---------------------------------------------------------------- request body limit (issue 56, item 13)

def _raw_request(url: str, head: bytes, chunks=(), timeout: float = 10.0) -> bytes:
    """Send `head` (and then `chunks`, stopping early once the server answers) over loopback;
    return what the server sent back (bounded: at most 64 KiB read)."""
    import select
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        s.sendall(head)
        for chunk in chunks:
            if select.select([s], [], [], 0.02)[0]:
                break  # the server has answered
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        data = b""
        try:
            while len(data) < 65536:  # the refusal closes the connection
                part = s.recv(4096)
                if not part:
                    break
                data += part
        except (ConnectionResetError, TimeoutError, OSError):
            pass
        return data


def _server(limits):
    from retrieval.server import BackgroundServer

    return BackgroundServer(create_app(BM25Retriever.from_passages(PASSAGES), limits))


def test_a_declared_large_body_gets_413_before_it_is_sent():
    """A 200 MB Content-Length with no body sent: the default limit answers at once (before, the
    server waited for the body, then read all of it)."""
    with _server(ServerLimits()) as srv:
        head = (b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 200000000\r\n\r\n")
        reply = _raw_request(srv.url, head, timeout=10.0)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert b"exceeds the limit of" in reply and b"--max-body-bytes" in reply
        import httpx  # and the server goes on serving

        assert httpx.post(srv.url + "/search", json={"query": "capital", "top_n": 1}, timeout=10).status_code == 200


def test_a_chunked_body_is_cut_off_at_the_limit():
    limits = ServerLimits(max_body_bytes=4096)
    with _server(limits) as srv:
        head = (b"POST /batch_search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"400\r\n" + b" " * 1024 + b"\r\n"  # 1 KiB of (valid JSON) whitespace per chunk
        sent = []

        def chunks():
            for _ in range(256):  # at most 256 KiB offered; the server must stop it near 4 KiB
                sent.append(1)
                yield chunk

        reply = _raw_request(srv.url, head, chunks())
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert len(sent) < 64, f"the server read {len(sent)} KiB before refusing a 4 KiB limit"


def test_the_default_body_limit_takes_the_largest_batch_the_other_limits_accept():
    import json

    limits = ServerLimits(max_query_chars=200, max_batch=8)
    # The worst escape: a character outside the BMP is one character of a query but a surrogate
    # pair in JSON, "\\ud83d\\ude00", 12 bytes (issue 82, item 17); "é" is 6.
    emoji = json.dumps({"query": ["\U0001F600" * 200] * 8, "top_n": 2, "return_score": True})
    bmp = json.dumps({"query": ["é" * 200] * 8, "top_n": 2, "return_score": True})
    assert len(emoji.encode()) > 12 * 200 * 8 and len(bmp.encode()) > 6 * 200 * 8  # every char escaped
    assert len(emoji.encode()) <= limits.body_limit() < 64 * 1024
    with TestClient(create_app(BM25Retriever.from_passages(PASSAGES), limits)) as c:
        for body in (emoji, bmp):  # each the largest batch the query limits accept: searched, not 413
            r = c.post("/batch_search", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 200 and len(r.json()[0]) == 8, r.text[:200]
        body = emoji
        over = c.post("/batch_search", content=b" " * (limits.body_limit() + 1) + body.encode(),
                      headers={"content-type": "application/json"})
        assert over.status_code == 413 and "exceeds the limit" in over.json()["detail"]
