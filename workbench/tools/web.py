"""Web search (Serper, SerpAPI) behind a record/replay cache, so runs that searched the web replay offline.

Every query is one cache entry, a JSON file under ``cache_dir/<backend>/<key[:2]>/<key>.json``, keyed by
the SHA-256 of the backend and the normalised request (query with case and spacing folded, and the
backend's options such as ``gl``, ``hl``, ``num``); the normalised request is also what is sent. Modes:

- ``replay`` (default): answer only from the cache; a miss is a tool error that names the query, the
  key and how to record it. Needs no key and no network.
- ``record``: always call the backend and (over)write the entry.
- ``auto``: use the cache, call the backend on a miss and store the answer.

The API key comes only from an environment variable (``SERPER_API_KEY`` / ``SERPAPI_API_KEY`` unless
``api_key_env`` names another) or a file (``api_key_file``); it is read when a call needs it, is never
part of a cache key, is scrubbed (as is and URL-encoded) from anything written to the cache or returned,
never appears in errors (an HTTP error is reported by status code, not by the request URL that SerpAPI
puts the key in, nor by the body, which may echo it), and is redacted from the HTTP client's log records
(httpx logs each request URL at INFO). ``base_url`` sends the requests to another host (a proxy, or a
local server standing in for the API in tests); the path of the API stays.

Results come back as ``{"query", "rank", "title", "url", "snippet"}`` records, like local BM25 search;
urls containing a ``blocklist`` substring (MATPO blocks ``huggingface.co/datasets``) are dropped.
The live HTTP requests are the two small functions ``_serper`` and ``_serpapi``; no test here reaches
the network, so they are exercised against an ``httpx.MockTransport`` and a local HTTP server.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from workbench.api_keys import MissingKeyError, guard_http_logs, read_key, redact, url_hides_secrets
from workbench.tools.base import Tool, ToolError, ToolOptionError, ToolResult
from workbench.tools.search import SEARCH_PARAMETERS, queries_of

MODES = ("replay", "record", "auto")
BACKENDS = {
    "serper": {"env": "SERPER_API_KEY", "url": "https://google.serper.dev/search", "results": "organic"},
    "serpapi": {
        "env": "SERPAPI_API_KEY",
        "url": "https://serpapi.com/search.json",
        "results": "organic_results",
    },
}
# Request options forwarded to the backend (and so part of the cache key); everything else is ignored.
FORWARDED = ("gl", "hl", "location", "tbs", "page", "autocorrect")


class WebSearchError(ToolError):
    """A web search could not be answered (no key, cache miss in replay mode, HTTP failure)."""


def default_cache_dir() -> Path:
    """``<workbench cache>/web_search`` (``$WORKBENCH_CACHE`` or the user cache directory)."""
    from workbench.models.cache import cache_root

    return Path(cache_root()) / "web_search"


def normalise_request(backend: str, query: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request as cached: the query lowercased with runs of spaces folded, plus set options."""
    request = {"q": " ".join(query.lower().split())}
    for name in (*FORWARDED, "num"):
        value = options.get(name)
        if value is not None and value != "":
            request[name] = value
    return request


def cache_key(backend: str, request: Mapping[str, Any]) -> str:
    """SHA-256 hex of the backend and the normalised request (never the API key)."""
    blob = json.dumps({"backend": backend, "request": dict(request)}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _scrub(value: Any, secret: str) -> Any:
    """``value`` with every occurrence of ``secret`` (as is or URL-encoded) in its strings replaced by
    ``<redacted>``."""
    return redact(value, secret) if secret else value


def endpoint(backend: str, base_url: str | None = None) -> str:
    """The backend's search URL, on ``base_url``'s scheme, host and path prefix when one is given."""
    default = BACKENDS[backend]["url"]
    if base_url is None:
        return default
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ToolOptionError(
            "web_search base_url must start with http:// or https://"
        )  # unquoted: keys hide
    if url_hides_secrets(base_url):
        raise ToolOptionError(
            "web_search base_url must not carry credentials, a query or a fragment (the API key comes only "
            f"from ${BACKENDS[backend]['env']} or api_key_file)"
        )
    return base_url.rstrip("/") + urlsplit(default).path


# ---------------------------------------------------------------- live requests (need a key and network)


async def _serper(client: Any, url: str, request: Mapping[str, Any], key: str) -> dict[str, Any]:
    response = await client.post(
        url,
        json=dict(request),
        headers={"X-API-KEY": key, "Content-Type": "application/json"},
    )
    return _json(response, "serper")


async def _serpapi(client: Any, url: str, request: Mapping[str, Any], key: str) -> dict[str, Any]:
    response = await client.get(url, params={"engine": "google", **request, "api_key": key})
    return _json(response, "serpapi")


def _json(response: Any, backend: str) -> dict[str, Any]:
    status = response.status_code
    if status != 200:  # neither the URL (SerpAPI's carries the key) nor the body (it may echo it) is quoted
        hint = {401: "check the key", 403: "check the key", 429: "over the quota or rate limit"}.get(
            status, "the service failed; try again later" if status >= 500 else "check the request"
        )
        raise WebSearchError(f"{backend} answered HTTP {status}: {hint}")
    try:
        data = response.json()
    except ValueError:
        raise WebSearchError(f"{backend} answered something that is not JSON") from None
    if not isinstance(data, dict):
        raise WebSearchError(f"{backend} answered JSON that is not an object")
    results = data.get(BACKENDS[backend]["results"])
    if results is not None and not isinstance(results, list):  # not cached: replay would repeat it
        raise WebSearchError(
            f"{backend} answered {BACKENDS[backend]['results']!r} as a {type(results).__name__}, not a list"
        )
    return data


_FETCH = {"serper": _serper, "serpapi": _serpapi}

# ---------------------------------------------------------------------------------------------------


class WebSearchTool(Tool):
    """Tool kind ``web_search``: Serper or SerpAPI search with a record/replay cache (see the module doc).

    Options: ``backend`` (``serper`` or ``serpapi``), ``mode`` (``replay``, ``record``, ``auto``),
    ``cache_dir``, ``api_key_env``, ``api_key_file``, ``top_k`` results per query, ``blocklist`` (url
    substrings to drop), ``gl``/``hl`` defaults, ``timeout`` (seconds per HTTP request), ``base_url``
    (another host for the API's requests: a proxy, or a local stand-in).
    """

    description = "Search the web; returns titles, urls and snippets for each query."
    parameters = {
        **SEARCH_PARAMETERS,
        "properties": {
            **SEARCH_PARAMETERS["properties"],
            "gl": {"type": "string", "description": "Region (ISO 3166-1 alpha-2)."},
            "hl": {"type": "string", "description": "Language (ISO 639-1)."},
        },
    }

    def __init__(
        self,
        backend: str = "serper",
        *,
        mode: str = "replay",
        cache_dir: str | os.PathLike[str] | None = None,
        api_key_env: str | None = None,
        api_key_file: str | os.PathLike[str] | None = None,
        top_k: int = 10,
        blocklist: Sequence[str] = (),
        gl: str | None = None,
        hl: str | None = None,
        timeout: float = 20.0,
        name: str = "web_search",
        base_url: str | None = None,
        transport: Any = None,
    ):
        if backend not in BACKENDS:
            raise ToolOptionError(f"unknown web search backend {backend!r}; use one of {', '.join(BACKENDS)}")
        if mode not in MODES:
            raise ToolOptionError(f"unknown web search mode {mode!r}; use one of {', '.join(MODES)}")
        if top_k < 1:
            raise ToolOptionError(f"web_search top_k must be >= 1, got {top_k}")
        self.name = name
        self.backend = backend
        self.mode = mode
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.api_key_env = api_key_env or BACKENDS[backend]["env"]
        self.api_key_file = Path(api_key_file) if api_key_file is not None else None
        self.top_k = top_k
        self.blocklist = (blocklist,) if isinstance(blocklist, str) else tuple(blocklist)
        self.defaults = {"gl": gl, "hl": hl}
        self.timeout = timeout
        self.base_url = base_url
        self.url = endpoint(backend, base_url)
        self._transport = transport  # tests pass an httpx.MockTransport; None means the real network

    def __repr__(self) -> str:  # never shows the key (base_url cannot hold one)
        where = f", base_url={self.base_url!r}" if self.base_url is not None else ""
        return f"WebSearchTool(backend={self.backend!r}, mode={self.mode!r}{where}, cache_dir='{self.cache_dir}')"

    # ------------------------------------------------------------------ cache

    def path_for(self, key: str) -> Path:
        return self.cache_dir / self.backend / key[:2] / f"{key}.json"

    def lookup(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """The cached response for ``request``, or None."""
        path = self.path_for(cache_key(self.backend, request))
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        response = entry.get("response") if isinstance(entry, dict) else None
        return response if isinstance(response, dict) else None

    def store(self, request: Mapping[str, Any], response: Mapping[str, Any], secret: str = "") -> Path:
        """Write a cache entry atomically (the key, if given, is scrubbed from it first)."""
        key = cache_key(self.backend, request)
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {
            "backend": self.backend,
            "key": key,
            "request": dict(request),
            "response": _scrub(dict(response), secret),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(entry, handle, ensure_ascii=False, indent=1)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    # ------------------------------------------------------------------ calls

    def _api_key(self) -> str:
        try:
            key = read_key(self.api_key_env, self.api_key_file)
        except MissingKeyError:
            where = f"${self.api_key_env}" + (f" or {self.api_key_file}" if self.api_key_file else "")
            raise WebSearchError(
                f"{self.backend} needs an API key in {where} to search (mode {self.mode!r})"
            ) from None
        except OSError:
            raise WebSearchError(f"cannot read the API key file {self.api_key_file}") from None
        guard_http_logs(key)
        return key

    async def _fetch(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        import httpx

        key = self._api_key()
        async with httpx.AsyncClient(timeout=self.timeout, transport=self._transport) as client:
            out = []
            for request in requests:
                try:
                    out.append(await _FETCH[self.backend](client, self.url, request, key))
                except WebSearchError:
                    raise
                except Exception as error:  # noqa: BLE001 - str(error) may quote the URL, and so the key
                    raise WebSearchError(f"{self.backend} request failed ({type(error).__name__})") from None
        for request, response in zip(requests, out, strict=True):
            self.store(request, response, secret=key)
        return [_scrub(r, key) for r in out]

    async def __call__(self, **arguments: Any) -> ToolResult:
        queries = queries_of(arguments)
        if not queries:
            return ToolResult.failure(f"{self.name}: no query given; pass 'queries' (a list) or 'q'")
        options = {
            **self.defaults,
            **{k: arguments.get(k) for k in FORWARDED if arguments.get(k) is not None},
        }
        options["num"] = min(int(arguments.get("num") or self.top_k), self.top_k)
        requests = [normalise_request(self.backend, q, options) for q in queries]
        keys = [cache_key(self.backend, r) for r in requests]
        responses: list[dict[str, Any] | None] = (
            [None] * len(requests) if self.mode == "record" else [self.lookup(r) for r in requests]
        )
        missing = [i for i, r in enumerate(responses) if r is None]
        if missing and self.mode == "replay":
            i = missing[0]
            return ToolResult.failure(
                f"{self.name}: no recorded {self.backend} result for {queries[i]!r} (cache key {keys[i]}) in "
                f"{self.cache_dir}; record it with mode='record' or 'auto' and ${self.api_key_env} set",
                missing=[keys[i] for i in missing],
            )
        try:
            fetched = await self._fetch([requests[i] for i in missing]) if missing else []
        except WebSearchError as error:
            return ToolResult.failure(f"{self.name}: {error}")
        for i, response in zip(missing, fetched, strict=True):
            responses[i] = response
        results = []
        for query, response in zip(queries, responses, strict=True):
            results += self._results(query, response or {}, options["num"])
        return ToolResult(
            ok=True,
            content=results,
            metadata={"backend": self.backend, "mode": self.mode, "keys": keys, "fetched": len(missing)},
        )

    def _results(self, query: str, response: Mapping[str, Any], k: int) -> list[dict[str, Any]]:
        items = response.get(BACKENDS[self.backend]["results"]) or []
        out = []
        for item in items:
            if not isinstance(item, Mapping):
                continue
            url = str(item.get("link") or item.get("url") or "")
            if any(pattern in url for pattern in self.blocklist):
                continue
            out.append(
                {
                    "query": query,
                    "rank": len(out) + 1,
                    "title": str(item.get("title") or ""),
                    "url": url,
                    "snippet": str(item.get("snippet") or ""),
                }
            )
            if len(out) == k:
                break
        return out
