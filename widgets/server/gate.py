"""What stands in front of Panel and Bokeh in ``workbench serve``: an allow-list, body limits, safe resources.

``Gate`` is a tornado rule placed before every route of the server. It answers 400, for everyone, to a
request malformed once percent-decoded (a control character in its path or query, a query argument that
is not UTF-8, a Bokeh argument Bokeh would choke on or one whose value could break the script Bokeh writes
it into, such as ``/autoload.js?bokeh-autoload-element=...``, a backslash or a ``..`` segment in its path). With
sign-in on, a request without a live session reaches only ``/login``, ``/logout`` and ``/favicon.ico``
(the login page loads nothing else); any other page is sent to the login form (302, the page kept in
``next``), and everything else (static files, component resources, the websocket, the JSON API, unknown
paths) gets 401, before Panel or Bokeh sees the request or its body. So nothing that imports a module,
reads a file by a name from the URL or might raise runs for a stranger.

Bodies: the gate's refusals read none; the server reads at most ``MAX_BODY_BYTES`` of any request (tornado
refuses a larger declared length before reading it); the login form and the JSON API stream their bodies
and answer 413 as soon as the declared or received length passes a few KB.

``ComponentHandler`` replaces Panel's ``/components/<module>/<class>/...`` route, which imported the module
a URL named: it serves only the listed resources of a Panel component class defined in a module the
server has already loaded, and answers 404 otherwise, signed in or not.
"""

from __future__ import annotations

import re
import sys
from typing import Any
from urllib.parse import unquote, urlencode

import param
from panel.io.resources import COMPONENT_PATH
from panel.io.server import ComponentResourceHandler
from tornado.routing import Matcher, Rule
from tornado.web import HTTPError, RequestHandler, stream_request_body

from widgets.server.sessions import Sessions

#: The most of a request body the server reads, for any route (websocket messages are not bodies).
MAX_BODY_BYTES = 64 * 1024
FORM_BODY_BYTES = 4 * 1024
JSON_BODY_BYTES = 8 * 1024
LOGIN_URL = "/login"
LOGOUT_URL = "/logout"
#: What answers without a session: the login form and what a browser fetches for it by itself.
PUBLIC_PATHS = frozenset({LOGIN_URL, LOGOUT_URL, "/favicon.ico"})


#: The Bokeh query arguments a URL may carry (never ``bokeh-token``: this server puts no token in a URL), each
#: with what it may hold. Bokeh takes a session id as it is (it makes 44 base62 characters; anything else may
#: raise) and writes the others unescaped into the script it serves (``/autoload.js``): an element id, a
#: path, a URL, without a character that could end a JavaScript string or the script.
BOKEH_ARGUMENTS = {
    "bokeh-session-id": re.compile(rb"[A-Za-z0-9_.\-]{1,256}"),
    "bokeh-autoload-element": re.compile(rb"[A-Za-z0-9_.:\-]{1,256}"),
    "bokeh-app-path": re.compile(rb"/[A-Za-z0-9_.~/\-]{0,1024}"),
    "bokeh-absolute-url": re.compile(rb"https?://[A-Za-z0-9_.~:/%@\[\]\-]{1,2048}"),
}


def _control(text: str | bytes) -> bool:
    return any(c < 0x20 or c == 0x7F for c in (text.encode() if isinstance(text, str) else text))


def bad_request(path: str, arguments: dict[str, list[bytes]] | None = None) -> bool:
    """Whether a request is malformed: once percent-decoded, a control character in its path or query
    arguments, an argument that is not UTF-8, a ``\\`` or a ``..`` segment in its path, or a Bokeh
    argument Bokeh would choke on or that could break the script it lands in (``bokeh-token``, a value
    ``BOKEH_ARGUMENTS`` does not allow)."""
    decoded = unquote(path, errors="replace")
    if _control(decoded) or "\\" in decoded or ".." in decoded.split("/"):
        return True
    arguments = arguments or {}
    # tornado keeps argument names as latin-1 text and values as bytes
    if not all(
        _text(name.encode("latin-1")) and all(map(_text, values)) for name, values in arguments.items()
    ):
        return True
    if any(name.startswith("bokeh-") and name not in BOKEH_ARGUMENTS for name in arguments):
        return True
    return not all(
        allowed.fullmatch(value)
        for name, allowed in BOKEH_ARGUMENTS.items()
        for value in arguments.get(name, [])
    )


def _text(value: bytes) -> bool:
    """Whether a query argument is UTF-8 text without control characters (what Panel and Bokeh decode)."""
    try:
        return not _control(value.decode())
    except UnicodeDecodeError:
        return False


@stream_request_body
class SmallBodyHandler(RequestHandler):
    """A handler whose body is read only up to ``max_body_bytes``; past that it answers 413 and stops."""

    max_body_bytes = FORM_BODY_BYTES

    def prepare(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self.refused = False
        length = self.request.headers.get("Content-Length", "0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            self.too_large()

    def data_received(self, chunk: bytes) -> None:
        if self.refused:
            return
        self._size += len(chunk)
        if self._size > self.max_body_bytes:
            self.too_large()
        else:
            self._chunks.append(chunk)

    def too_large(self) -> None:
        self.refused = True
        self.set_status(413)
        self.finish({"error": f"the request body is over {self.max_body_bytes} bytes"})

    @property
    def body(self) -> bytes:
        return b"".join(self._chunks)

    def check_xsrf_cookie(self) -> None:  # SameSite=Strict cookies and JSON-only operator requests instead
        pass


class RefusedHandler(SmallBodyHandler):
    """The gate's answer: 400 for a malformed request, to the login form for a page, else 401. Reads no body."""

    max_body_bytes = 0

    def initialize(self, verdict: str) -> None:
        self.verdict = verdict

    def prepare(self) -> None:
        self.refused = True
        self.set_header("Cache-Control", "no-store")
        if self.verdict == "malformed":
            self.set_status(400)
            self.finish({"error": "malformed request"})
        elif self.verdict == "login":
            self.redirect(f".{LOGIN_URL}?{urlencode({'next': self.request.uri})}")  # relative, as Bokeh's
        else:
            self.set_status(401)
            self.finish({"error": f"sign in first (at {LOGIN_URL})"})


class Gate(Matcher):
    """Matches the requests to refuse (see the module docstring); the others go on to their routes."""

    def __init__(self, sessions: Sessions | None) -> None:
        self.sessions = sessions

    def match(self, request: Any) -> dict[str, Any] | None:
        verdict = self.verdict(request)
        return None if verdict is None else {"target_kwargs": {"verdict": verdict}}

    def verdict(self, request: Any) -> str | None:
        if bad_request(request.path, request.query_arguments):
            return "malformed"
        if self.sessions is None or request.path in PUBLIC_PATHS or self.sessions.of_request(request):
            return None
        return "login" if request.method in ("GET", "HEAD") and request.path == "/" else "sign in"


def gate_rule(sessions: Sessions | None) -> Rule:
    """The rule to put in front of every route (``Application.add_handlers(".*", [gate_rule(...)])``)."""
    return Rule(Gate(sessions), RefusedHandler)


class ComponentHandler(ComponentResourceHandler):
    """Panel's component resources, for component classes already loaded: never imports what a URL names."""

    def parse_url_path(self, path: str) -> str:
        module_name, _, rest = path.partition("/")
        module = sys.modules.get(module_name)
        # the module's own namespace: no module-level __getattr__ (lazy imports) runs for a URL
        component = vars(module).get(rest.partition("/")[0]) if module is not None else None
        if not (
            isinstance(component, type)
            and issubclass(component, param.Parameterized)
            and component.__module__ == module_name
        ):
            raise HTTPError(404)
        try:
            return super().parse_url_path(path)
        except HTTPError:
            raise
        except Exception:  # a malformed resource path: not found, never a 500
            raise HTTPError(404) from None


def component_route() -> tuple[str, type, dict]:
    """The route that shadows Panel's own (``pn.serve(extra_patterns=...)`` come first)."""
    return (rf"/{COMPONENT_PATH}(.*)", ComponentHandler, {})
