"""The OpenAI-compatible backend's fallbacks and errors, against small local HTTP servers.

vLLM's own server is covered by the conformance suite (``test_backends.py``). No other
OpenAI-compatible server runs here, so a plain one (no vLLM extensions, text and logprobs only) is
played by a stdlib HTTP server that answers like the OpenAI completions API.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from workbench.backends import BackendError
from workbench.backends.base import GenerationRequest
from workbench.backends.openai import OpenAIBackend

KEY = "sk-test-0123456789abcdef"
VLLM_EXTENSIONS = {"include_stop_str_in_output", "return_token_ids", "return_tokens_as_token_ids", "top_k"}


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that gave up (the timeout test)
        pass


class PlainServer:
    """An OpenAI-style ``/v1/completions`` that refuses vLLM's extensions and returns text only."""

    def __init__(self, *, accepts_token_ids: bool, status: int = 200, delay: float = 0.0):
        self.accepts_token_ids, self.status, self.delay = accepts_token_ids, status, delay
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                server.auth.append(self.headers.get("Authorization"))
                time.sleep(server.delay)
                if server.status != 200:
                    return self.reply(server.status, {"error": {"message": "the model is overloaded\nretry"}})
                unknown = sorted(VLLM_EXTENSIONS & body.keys())
                if unknown:
                    return self.reply(
                        400, {"error": {"message": f"Unrecognized request argument: {unknown[0]}"}}
                    )
                if isinstance(body["prompt"], list) and not server.accepts_token_ids:
                    return self.reply(400, {"error": {"message": "prompt must be a string"}})
                choice = {
                    "index": 0,
                    "text": " 42 apples",
                    "finish_reason": "length",
                    "logprobs": {"tokens": [" 42", " apples"], "token_logprobs": [-0.5, -1.5]},
                }
                self.reply(200, {"choices": [dict(choice, index=i) for i in range(body.get("n", 1))]})

            def reply(self, status, data):
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(**kwargs) -> PlainServer:
        servers.append(PlainServer(**kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def make(tiny_model_path):
    backends = []

    def build(url: str, **kwargs) -> OpenAIBackend:
        backends.append(OpenAIBackend(url, "tiny", tokenizer=str(tiny_model_path), **kwargs))
        return backends[-1]

    yield build
    for backend in backends:
        backend.close()


def generate(backend, request):
    return asyncio.run(backend.generate(request))


def test_a_plain_server_gets_text_and_its_samples_are_flagged_retokenized(serve, make):
    server = serve(accepts_token_ids=False)
    backend = make(server.url, api_key=KEY)
    prompt = backend.tokenizer("How many apples?", add_special_tokens=False)["input_ids"]
    (gen,) = generate(backend, GenerationRequest(prompt, max_tokens=4, temperature=0.5, top_k=5))
    assert gen.retokenized and gen.finish_reason == "length"
    assert gen.text == " 42 apples"
    assert gen.completion_ids == backend.tokenizer(" 42 apples", add_special_tokens=False)["input_ids"]
    assert len(gen.logprobs) == len(gen.completion_ids)
    if len(gen.completion_ids) != 2:  # the server's two tokens do not map onto ours
        assert all(math.isnan(lp) for lp in gen.logprobs)
    # asked with vLLM's extensions, then plain with token ids, then with the prompt as text
    assert [type(b["prompt"]).__name__ for b in server.bodies] == ["list", "list", "str"]
    assert server.bodies[-1]["prompt"] == backend.tokenizer.decode(prompt)
    assert backend.mode == "text"
    server.bodies.clear()  # the accepted form is remembered
    generate(backend, GenerationRequest(prompt, max_tokens=4, n=2, temperature=1.0))
    assert len(server.bodies) == 1 and isinstance(server.bodies[0]["prompt"], str)
    assert set(server.auth) == {f"Bearer {KEY}"}


def test_a_server_taking_token_ids_gets_them_without_extensions(serve, make):
    server = serve(accepts_token_ids=True)
    backend = make(server.url)
    (*gens,) = generate(backend, GenerationRequest([5, 6, 7], max_tokens=4, n=3, temperature=1.0))
    assert len(gens) == 3 and all(g.retokenized for g in gens)
    assert server.bodies[-1]["prompt"] == [5, 6, 7] and backend.mode == "ids"


def test_http_errors_name_the_url_never_the_key(serve, make, tmp_path):
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    server = serve(accepts_token_ids=True, status=503)
    backend = make(server.url + "/v1/", api_key=key_file)
    with pytest.raises(BackendError) as error:
        generate(backend, GenerationRequest([5, 6], max_tokens=2))
    message = str(error.value)
    assert f"{server.url}/v1/completions answered HTTP 503: the model is overloaded retry" == message
    assert KEY not in message and KEY not in repr(backend)
    assert server.auth == [f"Bearer {KEY}"]  # read from the file


def test_the_key_comes_from_the_environment(serve, make, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = serve(accepts_token_ids=True)
    generate(make(server.url), GenerationRequest([5], max_tokens=1))
    assert server.auth and set(server.auth) == {f"Bearer {KEY}"}


def test_a_refused_connection_is_a_backend_error(make):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    backend = make(f"http://127.0.0.1:{port}")
    with pytest.raises(
        BackendError, match=rf"cannot reach http://127.0.0.1:{port}/v1/completions .*server running"
    ):
        generate(backend, GenerationRequest([5], max_tokens=1))


def test_a_server_that_does_not_answer_in_time_is_a_backend_error(serve, make):
    server = serve(accepts_token_ids=True, delay=2.0)
    backend = make(server.url, timeout=0.3)
    with pytest.raises(BackendError, match=r"did not answer within 0.3 s"):
        generate(backend, GenerationRequest([5], max_tokens=1))


def test_bad_settings_are_refused_with_the_fix(tmp_path, tiny_model_path):
    with pytest.raises(BackendError, match="must start with http"):
        OpenAIBackend("localhost:8000", "tiny", tokenizer=str(tiny_model_path))
    empty = tmp_path / "empty-key"
    empty.write_text("\n")
    with pytest.raises(BackendError, match="is empty"):
        OpenAIBackend("http://localhost:8000", "tiny", api_key=empty, tokenizer=str(tiny_model_path))
    with pytest.raises(BackendError, match=r"needs a local tokenizer.*tokenizer="):
        OpenAIBackend("http://localhost:8000", "gpt-something", tokenizer=str(tmp_path / "nothing"))
