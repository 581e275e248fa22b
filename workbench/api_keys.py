"""API keys (web search, hosted judges): read from the environment or a key file, and kept out of what is written.

``read_key(env, file)`` is the one way a key is read; ``url_hides_secrets`` finds a URL that must not be
stored or shown because a key may sit in it. ``redact(value, key)`` replaces a key, and the forms a URL
gives it (percent-encoded, ``+`` for spaces), with ``<redacted>`` in text and in JSON-like data, before
anything that may be stored (cache entries, error messages) is built. ``guard_http_logs(key)`` adds the key to
a logging filter on the HTTP client's loggers (``httpx``, ``httpcore.*``): httpx logs every request's URL at
INFO, and SerpAPI's URL carries the key, so a notebook that turns logging on would otherwise print it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit

REDACTED = "<redacted>"
#: The loggers of httpx and httpcore (httpcore's are per module; a parent's filter does not reach them).
HTTP_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)


class MissingKeyError(LookupError):
    """No key in the environment variable nor in the key file."""


def read_key(env: str | None = None, file: str | os.PathLike[str] | None = None) -> str:
    """The key in ``$env`` (if set and not blank), else the contents of ``file`` (stripped).

    Raises :class:`MissingKeyError` naming where it looked (never a key), or ``OSError`` for an
    unreadable file.
    """
    key = os.environ.get(env, "").strip() if env else ""
    if not key and file is not None:
        key = Path(file).expanduser().read_text(encoding="utf-8").strip()
    if not key:
        where = " or ".join([f"${env}"] * bool(env) + [str(file)] * (file is not None))
        raise MissingKeyError(f"no API key in {where or 'any source'}")
    return key


def url_hides_secrets(url: str) -> bool:
    """True when ``url`` carries credentials, a query or a fragment: where keys hide. Refuse such a URL
    without quoting it, and say to give the key in the environment or a key file."""
    parts = urlsplit(url)
    return bool(parts.username or parts.password or parts.query or parts.fragment)


def forms(key: str) -> list[str]:
    """``key`` as it may appear in text: as is, percent-encoded, and form-encoded (longest first)."""
    if not key:
        return []
    return sorted({key, quote(key, safe=""), quote_plus(key)}, key=len, reverse=True)


def redact(value: Any, keys: str | Iterable[str]) -> Any:
    """``value`` with every form of every key replaced by ``<redacted>`` in its strings (dicts, lists, tuples
    are copied through; other values are returned unchanged)."""
    patterns = [f for k in ([keys] if isinstance(keys, str) else keys) for f in forms(k)]
    return _redact(value, patterns) if patterns else value


def _redact(value: Any, patterns: list[str]) -> Any:
    if isinstance(value, str):
        for pattern in patterns:
            if pattern in value:
                value = value.replace(pattern, REDACTED)
        return value
    if isinstance(value, list | tuple):
        return type(value)(_redact(v, patterns) for v in value)
    if isinstance(value, dict):
        return {_redact(k, patterns): _redact(v, patterns) for k, v in value.items()}
    return value


class _RedactingFilter(logging.Filter):
    """Rewrites a log record whose message holds a guarded key (the record is formatted once, here)."""

    def __init__(self) -> None:
        super().__init__("workbench.api_keys")
        self.patterns: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        patterns = self.patterns
        if not patterns:
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is the logging module's problem to report
            return True
        cleaned = _redact(message, patterns)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


_filter = _RedactingFilter()
_lock = threading.Lock()


def guard_http_logs(key: str) -> None:
    """Redact ``key`` from every record the HTTP client's loggers emit from now on (idempotent)."""
    if not key:
        return
    with _lock:
        new = [f for f in forms(key) if f not in _filter.patterns]
        if new:
            _filter.patterns = sorted([*_filter.patterns, *new], key=len, reverse=True)
        for name in HTTP_LOGGERS:
            logger = logging.getLogger(name)
            if _filter not in logger.filters:
                logger.addFilter(_filter)
