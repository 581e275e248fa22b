"""Local HTTP servers that play the paid APIs the workbench calls: Serper/SerpAPI web search and an
OpenAI-compatible completions endpoint (a hosted judge). They listen on 127.0.0.1 only.

Each answers like the real service, and misbehaves on request: the query (web search) or the prompt
(completions) names the fault with a marker, ``api=<fault>``. Faults: ``500``, ``badjson`` (a body that is
not JSON), ``list`` (JSON that is not an object), ``organicstring`` (results that are not a list),
``hang`` (no answer until the server closes), ``echo401`` (a 401 whose body quotes the key and the request
URL, as some gateways do), ``echo`` (a good answer that quotes the key and the request URL in its metadata,
as SerpAPI's ``search_metadata`` does, and in a result).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

MARKER = re.compile(r"api=(\w+)")
HANG_LIMIT_S = 120.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that gave up (timeouts)
        pass


class _Base:
    """A ThreadingHTTPServer on a free port; ``release`` ends every hanging request (set on ``close``)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.requests: list[dict[str, Any]] = []
        self.httpd = _Server(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reply(handler: BaseHTTPRequestHandler, status: int, body: Any, raw: bool = False) -> None:
    payload = body.encode() if raw else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "text/html" if raw else "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


class SearchAPI(_Base):
    """Serper (``POST /search``, key in ``X-API-KEY``) and SerpAPI (``GET /search.json``, key in ``api_key``)."""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # Serper
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.answer(self, "serper", body.get("q", ""), self.headers.get("X-API-KEY"))

            def do_GET(self):  # SerpAPI
                params = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                server.answer(self, "serpapi", params.get("q", ""), params.get("api_key"))

        return Handler

    def answer(self, handler: BaseHTTPRequestHandler, backend: str, query: str, key: str | None) -> None:
        self.requests.append({"backend": backend, "q": query, "key": key, "path": handler.path})
        found = MARKER.search(query)
        fault = found.group(1) if found else "ok"
        requested = f"{self.url}{handler.path}"
        results_key = "organic" if backend == "serper" else "organic_results"
        results = [
            {"title": f"Result for {query}", "link": "https://example.org/a", "snippet": "A useful fact."},
            {"title": "Second", "link": "https://example.org/b", "snippet": "Another fact."},
        ]
        if fault == "hang":
            self.release.wait(HANG_LIMIT_S)
            return _reply(handler, 200, {results_key: results})
        if fault == "500":
            return _reply(handler, 500, "<html><body>500 Internal Server Error</body></html>", raw=True)
        if fault == "badjson":
            return _reply(handler, 200, '{"organic": [{"title": "cut off', raw=True)
        if fault == "list":
            return _reply(handler, 200, [1, 2, 3])
        if fault == "organicstring":
            return _reply(handler, 200, {results_key: "no results, and not a list"})
        if fault == "echo401":
            return _reply(handler, 401, {"error": f"Invalid API key {key} for {requested}"})
        body: dict[str, Any] = {results_key: results}
        if fault == "echo":
            body["search_metadata"] = {"json_endpoint": requested, "api_key_used": key}
            results.append(
                {"title": f"Key {key}", "link": requested, "snippet": f"you searched with key {key}"}
            )
        return _reply(handler, 200, body)


class CompletionsAPI(_Base):
    """An OpenAI-style ``/v1/completions`` (plain: text and log-probs, no token ids). ``verdict`` is the text
    a good answer carries; a prompt with ``api=<fault>`` gets that fault (``echo401`` quotes the bearer key)."""

    def __init__(self, verdict: str = "correct: yes") -> None:
        self.verdict = verdict
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization") or ""
                server.requests.append({"path": self.path, "auth": auth, "body": body})
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    return _reply(self, 400, {"error": {"message": "prompt must be a string"}})
                unknown = {"return_token_ids", "include_stop_str_in_output"} & body.keys()
                if unknown:
                    return _reply(
                        self, 400, {"error": {"message": f"Unrecognized argument: {sorted(unknown)}"}}
                    )
                found = MARKER.search(prompt)
                fault = found.group(1) if found else "ok"
                if fault == "hang":
                    server.release.wait(HANG_LIMIT_S)
                if fault == "500":
                    return _reply(self, 500, {"error": {"message": "the model crashed"}})
                if fault == "echo401":
                    key = auth.removeprefix("Bearer ")
                    message = f"Incorrect API key provided: {key}. Header was: {auth}"
                    return _reply(self, 401, {"error": {"message": message}})
                choice = {
                    "index": 0,
                    "text": server.verdict,
                    "finish_reason": "stop",
                    "logprobs": {"tokens": [server.verdict], "token_logprobs": [-0.5]},
                }
                return _reply(
                    self, 200, {"choices": [dict(choice, index=i) for i in range(body.get("n", 1))]}
                )

        return Handler
