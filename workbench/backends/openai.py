"""Generation from any OpenAI-compatible server (a served vLLM, a hosted judge) through ``/v1/completions``.

The engine hands over exact prompt token ids, so this backend uses the completions endpoint with the
prompt as token ids, never the chat endpoint. Against vLLM it asks for the engine's token ids
(``return_token_ids``, and ``return_tokens_as_token_ids`` in the log-probs), the stop string kept in
the output (``include_stop_str_in_output``) and ``top_k``, so a sample is as exact as from the in-process
engine. A server that refuses those extensions is asked again with the plain OpenAI fields, then with
the prompt as text; where the answer carries no token ids the completion text is re-tokenised with the
local tokenizer and the generation is flagged ``retokenized=True`` (training refuses such samples).
The first request form a server accepts is remembered. A plain server does not get ``top_k``.

Requests run on the backend's own event loop with one ``httpx.AsyncClient`` (at most
``max_concurrency`` in flight), so ``generate`` can be awaited from any loop. The API key comes from
``api_key`` (the key, or a file holding it) or ``$OPENAI_API_KEY``; it is sent as a bearer token and
never appears in messages or ``repr``: a server's error text that echoes it is redacted, it is redacted
from the HTTP client's log records, and a ``base_url`` carrying credentials or a query string (where
keys hide) is refused.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import weakref
from pathlib import Path
from typing import Any

from workbench.api_keys import guard_http_logs, redact
from workbench.backends.base import BackendError, Generation, GenerationRequest
from workbench.backends.loop_thread import LoopThread

#: Request forms, most exact first: vLLM's extensions, plain OpenAI with token-id prompt, text prompt.
MODES = ("vllm", "ids", "text")


class _Refused(Exception):
    """The server refused the request form (HTTP 400/422): a plainer form may work."""


class OpenAIBackend:
    """A model served behind an OpenAI-compatible ``/v1/completions`` endpoint.

    ``model`` is the served model name (a LoRA adapter served by vLLM is its own model name, which is
    what ``GenerationRequest.adapter`` selects). ``tokenizer`` is a tokenizer object, a registry name
    or a checkpoint path (``workbench.models.resolve``); it defaults to ``model``.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | Path | None = None,
        tokenizer: Any = None,
        timeout: float = 300.0,
        max_concurrency: int = 64,
    ):
        import httpx

        if max_concurrency < 1:
            raise BackendError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.base_url = _api_root(base_url)
        self.url = f"{self.base_url}/completions"
        self.model = model
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self.tokenizer = _load_tokenizer(tokenizer if tokenizer is not None else model, model)
        self.policy_version = 0
        self.mode = MODES[0]
        key = _read_api_key(api_key)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if key:
            guard_http_logs(key)
        self._scrub = _scrubber(key)

        async def start() -> tuple[Any, asyncio.Semaphore]:
            limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
            client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout), limits=limits)
            return client, asyncio.Semaphore(max_concurrency)

        self._loop = LoopThread("openai")
        self._client, self._semaphore = self._loop.run(start())
        self._finalizer = weakref.finalize(self, _stop, self._loop, self._client)

    def __repr__(self) -> str:
        return f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r})"

    # --- generation ---------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        self._check_open()
        return await self._loop.submit(self._generate(request))

    async def _generate(self, request: GenerationRequest) -> list[Generation]:
        """Runs on the backend's loop."""
        # vLLM refuses n > 1 with greedy sampling: send n single requests (all alike) instead.
        greedy = request.temperature == 0.0
        copies, n = (request.n, 1) if greedy and request.n > 1 else (1, request.n)
        results = await asyncio.gather(*(self._complete(request, n) for _ in range(copies)))
        return [g for generations in results for g in generations]

    async def _complete(self, request: GenerationRequest, n: int) -> list[Generation]:
        refused: _Refused | None = None
        for mode in MODES[MODES.index(self.mode) :]:
            started = time.perf_counter()
            try:
                data = await self._post(self._body(request, n, mode))
            except _Refused as error:
                refused = error
                continue
            self.mode = mode
            elapsed = time.perf_counter() - started
            choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
            if len(choices) != n:
                raise BackendError(f"{self.url} returned {len(choices)} choices for n={n}")
            return [self._generation(choice, elapsed) for choice in choices]
        raise BackendError(str(refused))

    def _body(self, request: GenerationRequest, n: int, mode: str) -> dict[str, Any]:
        prompt: list[int] | str = list(request.prompt_ids)
        if mode == "text":
            prompt = self.tokenizer.decode(prompt, skip_special_tokens=False)
        body: dict[str, Any] = {
            "model": request.adapter or self.model,
            "prompt": prompt,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "n": n,
            "logprobs": 1,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        if mode == "vllm":
            body.update(
                include_stop_str_in_output=True,
                return_token_ids=True,
                return_tokens_as_token_ids=True,
                skip_special_tokens=True,
            )
            if request.top_k:
                body["top_k"] = request.top_k
            if request.ignore_eos:
                body["ignore_eos"] = True
        return body

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        async with self._semaphore:
            try:
                response = await self._client.post(self.url, json=body)
            except httpx.TimeoutException as error:
                raise BackendError(
                    f"{self.url} did not answer within {self.timeout:g} s ({type(error).__name__}): "
                    "raise timeout= or check the server"
                ) from error
            except httpx.HTTPError as error:
                raise BackendError(
                    self._scrub(
                        f"cannot reach {self.url} ({type(error).__name__}: {error}): is the server running?"
                    )
                ) from error
        if response.status_code in (400, 422):
            raise _Refused(
                f"{self.url} refused the request (HTTP {response.status_code}): {self._message(response)}"
            )
        if response.status_code >= 400:
            raise BackendError(f"{self.url} answered HTTP {response.status_code}: {self._message(response)}")
        try:
            return response.json()
        except ValueError as error:
            raise BackendError(f"{self.url} answered with something that is not JSON: {error}") from error

    def _generation(self, choice: dict[str, Any], elapsed: float) -> Generation:
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise BackendError(f"{self.url} ended a completion with finish reason {finish!r}")
        text = choice.get("text") or ""
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        token_logprobs = logprobs.get("token_logprobs") or []
        ids = choice.get("token_ids")
        if ids is None and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            ids = [int(t.removeprefix("token_id:")) for t in tokens]
        retokenized = ids is None
        if retokenized:
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        ids = [int(t) for t in ids]
        if len(token_logprobs) == len(ids):
            values = [math.nan if lp is None else float(lp) for lp in token_logprobs]
        elif retokenized:
            values = [math.nan] * len(ids)
        else:
            raise BackendError(
                f"{self.url} returned {len(ids)} token ids but {len(token_logprobs)} logprobs: "
                "the server must support logprobs on /v1/completions"
            )
        stop_reason = choice.get("stop_reason")
        return Generation(
            completion_ids=ids,
            logprobs=values,
            text=text if retokenized else self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish,
            stop_reason=stop_reason if isinstance(stop_reason, str) else None,
            policy_version=self.policy_version,
            timings={"generate_s": elapsed},
            retokenized=retokenized,
        )

    # --- server information -------------------------------------------------------------------

    def models(self) -> list[str]:
        """The model names the server serves (``GET /v1/models``)."""
        self._check_open()

        async def fetch() -> list[str]:
            import httpx

            url = f"{self.base_url}/models"
            try:
                response = await self._client.get(url)
            except httpx.HTTPError as error:
                raise BackendError(
                    self._scrub(f"cannot reach {url} ({type(error).__name__}: {error})")
                ) from error
            if response.status_code >= 400:
                raise BackendError(f"{url} answered HTTP {response.status_code}: {self._message(response)}")
            return [m.get("id") for m in response.json().get("data", [])]

        return self._loop.run(fetch())

    def _message(self, response: Any) -> str:
        """The server's error message on one short line, any echo of the key redacted."""
        return self._scrub(_message(response))

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if self.closed:
            raise BackendError("this openai backend is closed: create a new one")

    def close(self) -> None:
        """Close the HTTP client and the backend's loop; the server itself keeps running."""
        self._finalizer()

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(loop: LoopThread, client: Any) -> None:
    loop.stop(client.aclose())


def _api_root(base_url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1`` -> ``http://host:port/v1``."""
    from urllib.parse import urlsplit

    from workbench.api_keys import url_hides_secrets

    url = base_url.rstrip("/")
    parts = urlsplit(url)
    if url_hides_secrets(url):  # the message must not quote it
        raise BackendError(
            f"base_url for {parts.hostname or 'the server'} carries credentials, a query or a fragment; give "
            "scheme://host:port[/path] and the key in $OPENAI_API_KEY or api_key=<key file>"
        )
    if not url.startswith(("http://", "https://")):
        shown = repr(base_url) if "@" not in url and "?" not in url else "(not quoted: it may hold a key)"
        raise BackendError(f"base_url {shown} must start with http:// or https://")
    return url if url.endswith("/v1") else f"{url}/v1"


def _scrubber(key: str | None) -> Any:
    """A function redacting ``key`` from text (a closure, so that no attribute or repr shows the key)."""

    def scrub(text: str) -> str:
        return redact(text, key) if key else text

    return scrub


def _read_api_key(api_key: str | Path | None) -> str | None:
    """The key itself, the contents of a file holding it, or ``$OPENAI_API_KEY``."""
    if api_key is None:
        return os.environ.get("OPENAI_API_KEY") or None
    try:
        path = Path(api_key).expanduser()
        is_file = path.is_file()
    except (OSError, ValueError):
        is_file = False
    if is_file:
        key = path.read_text().strip()
        if not key:
            raise BackendError(f"the API key file {path} is empty: write the key into it")
        return key
    if isinstance(api_key, Path):
        raise BackendError(f"the API key file {api_key} does not exist")
    return str(api_key).strip() or None


def _load_tokenizer(tokenizer: Any, model: str) -> Any:
    if not isinstance(tokenizer, str | Path):
        return tokenizer
    try:
        from transformers import AutoTokenizer

        from workbench.models import resolve

        return AutoTokenizer.from_pretrained(resolve(str(tokenizer)))
    except Exception as error:
        raise BackendError(
            f"the openai backend for '{model}' needs a local tokenizer, and '{tokenizer}' did not load "
            f"({type(error).__name__}): pass tokenizer=<registry name or checkpoint path>"
        ) from error


def _message(response: Any) -> str:
    """The server's error message on one short line."""
    try:
        data = response.json()
        error = data.get("error", data) if isinstance(data, dict) else data
        text = error.get("message", str(error)) if isinstance(error, dict) else str(error)
    except ValueError:
        text = response.text
    text = " ".join(str(text).split())
    return text[:300] + ("..." if len(text) > 300 else "")
