"""HTTP client `Retriever` for our server, MemSearcher/FlashRAG servers, or Search-R1's.

    from retrieval.client import HTTPRetriever
    r = HTTPRetriever("http://127.0.0.1:8000", api="memsearcher")   # POST /batch_search
    r = HTTPRetriever("http://127.0.0.1:8000", api="search-r1")     # POST /retrieve
    r.search(["who wrote hamlet"], top_n=5)

Never raises because search failed: after `max_retries` retries (exponential backoff with
jitter, on connection errors, timeouts and 5xx/429) each failed query gets one
`Hit(id=ERROR_HIT_ID, contents="search failed: ...")`, which the agent shows the model.
Other 4xx answers are not retried (the request itself is wrong). Empty queries are
answered locally with an error hit and not sent (the server would reject the whole batch).
"""
from __future__ import annotations

import random
import time

from memsearcher_jax.errors import UserInputError
from retrieval.base import ERROR_HIT_ID, Hit

APIS = ("memsearcher", "search-r1")


class SearchHTTPError(RuntimeError):
    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


class RetrieverUnreachable(UserInputError):
    """The retriever at the configured URL does not answer a probe search."""


class HTTPRetriever:
    def __init__(self, base_url: str, api: str = "memsearcher", *, timeout: float = 30.0, max_retries: int = 3,
                 backoff: float = 0.5, max_backoff: float = 8.0, max_batch: int = 512, client=None):
        import httpx

        if api not in APIS:
            raise ValueError(f"api {api!r}; expected one of {APIS}")
        if max_retries < 0 or timeout <= 0:
            raise ValueError(f"max_retries={max_retries} must be >= 0 and timeout={timeout} > 0")
        self.base_url = base_url.rstrip("/")
        self.api, self.timeout, self.max_retries = api, timeout, max_retries
        self.backoff, self.max_backoff, self.max_batch = backoff, max_backoff, max_batch
        self._client = client or httpx.Client(timeout=timeout)
        self.attempts = 0  # HTTP requests sent, retries included (observable in tests)

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def health(self) -> dict:
        resp = self._client.get(self.base_url + "/health", timeout=self.timeout)
        resp.raise_for_status()
        return resp.json()

    def check_reachable(self, timeout: float = 10.0) -> None:
        """One probe search, no retries (a start-up check, before any model is loaded):
        RetrieverUnreachable naming the URL when it fails."""
        saved, self.timeout = self.timeout, min(self.timeout, timeout)
        try:
            self._once(["health check"], 1)
        except SearchHTTPError as e:
            raise RetrieverUnreachable(
                f"retrieval.url={self.base_url} (api {self.api}) does not answer a search: {e}. Start the retriever "
                "(memsearcher-jax serve-retriever ...) or fix retrieval.url / retrieval.api") from None
        finally:
            self.timeout = saved

    def search(self, queries: list[str], top_n: int) -> list[list[Hit]]:
        out: list[list[Hit] | None] = [None] * len(queries)
        live = []
        for i, q in enumerate(queries):
            if not q or not q.strip():
                out[i] = [Hit(id=ERROR_HIT_ID, contents="search failed: the query is empty")]
            else:
                live.append(i)
        for s in range(0, len(live), self.max_batch):
            idx = live[s : s + self.max_batch]
            try:
                results = self._with_retries([queries[i] for i in idx], top_n)
            except SearchHTTPError as e:
                results = [[Hit(id=ERROR_HIT_ID, contents=f"search failed: {e}")] for _ in idx]
            for i, hits in zip(idx, results):
                out[i] = hits
        return out  # type: ignore[return-value]

    def _with_retries(self, queries: list[str], top_n: int) -> list[list[Hit]]:
        last: SearchHTTPError | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random() / 2))
            try:
                return self._once(queries, top_n)
            except SearchHTTPError as e:
                last = e
                if not e.retryable:
                    break
        assert last is not None
        raise SearchHTTPError(f"{last} (after {attempt + 1} attempt(s) to {self.base_url})", retryable=False)

    def _once(self, queries: list[str], top_n: int) -> list[list[Hit]]:
        import httpx

        if self.api == "memsearcher":
            path, body = "/batch_search", {"query": queries, "top_n": top_n, "return_score": True}
        else:
            path, body = "/retrieve", {"queries": queries, "topk": top_n, "return_scores": True}
        self.attempts += 1
        try:
            resp = self._client.post(self.base_url + path, json=body, timeout=self.timeout)
        except httpx.TimeoutException:
            raise SearchHTTPError(f"timed out after {self.timeout:g} s", retryable=True) from None
        except httpx.TransportError as e:
            raise SearchHTTPError(f"cannot reach the retriever ({type(e).__name__}: {e})", retryable=True) from None
        if resp.status_code != 200:
            retryable = resp.status_code >= 500 or resp.status_code == 429
            raise SearchHTTPError(f"HTTP {resp.status_code} from {path}: {resp.text[:300]}", retryable=retryable)
        try:
            return self._parse(resp.json(), len(queries))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise SearchHTTPError(f"unexpected response shape from {path}: {e}", retryable=False) from None

    def _parse(self, data, n: int) -> list[list[Hit]]:
        if self.api == "memsearcher":
            # return_score=true: [docs_per_query, scores_per_query]
            if not (isinstance(data, list) and len(data) == 2):
                raise ValueError("expected [documents, scores]")
            docs, scores = data
            results = [[_hit(d, s) for d, s in zip(ds, ss)] for ds, ss in zip(docs, scores)]
        else:
            results = [[_hit(item.get("document", item), item.get("score", 0.0)) for item in hits]
                       for hits in data["result"]]
        if len(results) != n:
            raise ValueError(f"{len(results)} result lists for {n} queries")
        return results


def _hit(doc: dict, score) -> Hit:
    contents = doc.get("contents")
    if contents is None and "title" in doc:  # some servers split title and text
        contents = f"{doc['title']}\n{doc.get('text', '')}"
    return Hit(id=str(doc.get("id", "")), contents=str(contents), score=float(score))
