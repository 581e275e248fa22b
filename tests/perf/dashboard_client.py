"""A browser-like client of the served dashboard: what one browser tab asks of the server, without a browser.

``Tab`` signs in from its own loopback address (``127.0.0.x``: Linux routes all of 127/8 to the loopback,
so each viewer is a distinct address to the server's throttle and log), asks for the page, takes the
session token out of it, opens ``/ws`` with it (the session cookie and an ``Origin``, as a browser sends),
waits for the server's ``ACK``, sends ``PULL-DOC-REQ``, and on the reply sends the ``document_ready``
event BokehJS sends once it has drawn the document (a ``PATCH-DOC`` carrying a ``MessageSent`` of the
``DocumentReady`` event): from then on the server treats the session as a loaded page (Panel's
``state._on_load``: its onload callbacks, its periodic callbacks, HoloViews' plot refreshes). The tab then
takes the server's patches and records when the monitor header (``wb-last-step``) first showed each step; on
a page without that header (a comparison, ``/?compare=...``) when a plot's new data first reached a step (the
largest ``x`` of the lines' data a comparison's plots are sent, ``widgets.compare_plots``: the live run's, as a
finished run's lines never change).

It keeps the document as JSON and never builds Bokeh's Python models: 20 tabs in one process cost little
CPU beside the server and the trainer on the same 2 cores, as browsers on other machines would. The
static files a browser loads (once, then from its cache) are not fetched. ``ready=False`` is the client
that pins a core without the server's fix: the document, then no ``document_ready``.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from typing import Any
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

_TOKEN = re.compile(r'"token"\s*:\s*"([^"]+)"')
_STEP = re.compile(r"data-step=(?:&quot;|\"|')(-?\d+)")
#: What BokehJS sends once the document is drawn: a DocumentReady event, as a MessageSent patch.
DOCUMENT_READY = {
    "events": [
        {
            "kind": "MessageSent",
            "msg_type": "bokeh_event",
            "msg_data": {"type": "event", "name": "document_ready", "values": {"type": "map"}},
        }
    ]
}


def find_header(node: Any) -> dict | None:
    """The monitor header's model (css class ``wb-last-step``) in a document's JSON."""
    if isinstance(node, dict):
        if "wb-last-step" in (node.get("attributes", {}).get("css_classes") or []):
            return node
        children = node.values()
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = find_header(child)
        if found is not None:
            return found
    return None


class Tab:
    """One browser tab on ``base_url`` (``http://127.0.0.1:PORT``), from ``source_ip``.

    Times are ``time.time()``: ``signed_in``, ``asked`` (page requested), ``first_doc`` (the document
    received); ``seen`` maps a step to when the header first showed it (or a later step)."""

    def __init__(self, base_url: str, source_ip: str = "127.0.0.1") -> None:
        self.base_url, self.source_ip = base_url.rstrip("/"), source_ip
        self.cookie: str | None = None
        self.sign_in_s: float | None = None
        self.asked: float | None = None
        self.first_doc: float | None = None
        self.seen: dict[int, float] = {}
        self.error: str | None = None
        self.patches = 0
        #: when (``time.time()``) each step of opening the page was done: page, websocket, ack, document
        self.phases: dict[str, float] = {}
        self._ws: WebSocketClientConnection | None = None
        self._header_id: str | None = None
        self._http = AsyncHTTPClient(force_instance=True)

    # ------------------------------------------------------------------ HTTP
    def _request(self, path: str, **kwargs: Any) -> HTTPRequest:
        headers = {"Cookie": self.cookie} if self.cookie else {}
        return HTTPRequest(
            self.base_url + path,
            network_interface=self.source_ip,
            follow_redirects=False,
            headers={**headers, **kwargs.pop("headers", {})},
            request_timeout=120,
            **kwargs,
        )

    async def sign_in(self, user: str, password: str) -> None:
        """POST the login form; keeps the session cookie."""
        start = time.time()
        body = urlencode({"username": user, "password": password, "next": "/"})
        try:
            response = await self._http.fetch(self._request("/login", method="POST", body=body))
        except HTTPClientError as error:
            if error.code != 302 or error.response is None:
                raise RuntimeError(f"sign-in of {user} refused: HTTP {error.code}") from error
            response = error.response
        cookie = response.headers.get("Set-Cookie", "")
        if not cookie.startswith("wb_user="):
            raise RuntimeError(f"sign-in of {user}: no session cookie (HTTP {response.code})")
        self.cookie = cookie.split(";", 1)[0]
        self.sign_in_s = time.time() - start

    # ------------------------------------------------------------------ Bokeh protocol
    async def _send(self, msgtype: str, content: dict | None = None) -> str:
        msgid = secrets.token_hex(8)
        assert self._ws is not None
        for part in ({"msgid": msgid, "msgtype": msgtype}, {}, content or {}):
            await self._ws.write_message(json.dumps(part))
        return msgid

    async def _receive(self) -> tuple[dict, dict] | None:
        """The next message (header, content); None once the socket closed. Buffers are read and dropped."""
        assert self._ws is not None
        parts = []
        while len(parts) < 3:
            fragment = await self._ws.read_message()
            if fragment is None:
                return None
            parts.append(fragment)
        header, content = json.loads(parts[0]), json.loads(parts[2])
        for _ in range(2 * int(header.get("num_buffers") or 0)):
            if await self._ws.read_message() is None:
                return None
        return header, content

    async def open(self, path: str = "/", ready: bool = True) -> dict:
        """The page, its websocket and its document (and ``document_ready`` unless ``ready=False``);
        returns the document's JSON."""
        self.asked = time.time()
        response = await self._http.fetch(self._request(path))
        self.phases["page"] = time.time()
        found = _TOKEN.search(response.body.decode(errors="replace"))
        if found is None:
            raise RuntimeError(f"no session token in the page {path} (HTTP {response.code})")
        ws_url = self.base_url.replace("http", "ws", 1) + "/ws"
        request = self._request("/ws", headers={"Origin": self.base_url})
        request.url = ws_url
        self._ws = await websocket_connect(request, subprotocols=["bokeh", found.group(1)])
        self.phases["websocket"] = time.time()
        ack = await self._receive()
        self.phases["ack"] = time.time()
        if ack is None or ack[0]["msgtype"] != "ACK":
            raise RuntimeError(f"no ACK on the websocket: {ack}")
        msgid = await self._send("PULL-DOC-REQ")
        while True:
            message = await self._receive()
            if message is None:
                raise RuntimeError("the websocket closed before the document came")
            header, content = message
            if header.get("reqid") == msgid:
                break
        if header["msgtype"] != "PULL-DOC-REPLY":
            raise RuntimeError(f"no document: {header['msgtype']} {content}")
        self.first_doc = self.phases["document"] = time.time()
        doc = content["doc"]
        header_model = find_header(doc)
        if header_model is not None:
            self._header_id = header_model["id"]
            self._show(header_model["attributes"].get("text", ""))
        if ready:
            await self._send("PATCH-DOC", DOCUMENT_READY)
        return doc

    def _show(self, text: Any) -> None:
        found = _STEP.search(str(text))
        if found:
            self.seen.setdefault(int(found.group(1)), time.time())

    def _show_lines(self, message: Any) -> None:
        """A comparison's message: the JSON text of its lines' new data ({source: {column: values}}); their
        last x, by step."""
        for text in _strings(message):
            try:
                lines = json.loads(text) if text.startswith("{") else None
            except ValueError:
                continue
            for columns in lines.values() if isinstance(lines, dict) else ():
                x = (
                    [v for v in columns.get("x", []) if isinstance(v, int | float)]
                    if isinstance(columns, dict)
                    else []
                )
                if x:
                    self.seen.setdefault(int(max(x)), time.time())

    async def follow(self, stop: asyncio.Event) -> None:
        """Take the server's patches until ``stop`` is set or the socket closes."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                receiving = asyncio.ensure_future(self._receive())
                await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not receiving.done():
                    receiving.cancel()
                    break
                message = receiving.result()
                if message is None:
                    break
                header, content = message
                if header["msgtype"] != "PATCH-DOC":
                    continue
                self.patches += 1
                for event in content.get("events", []):
                    model = event.get("model") or {}
                    if model.get("id") == self._header_id and event.get("attr") == "text":
                        self._show(event.get("new"))
                    elif self._header_id is None and event.get("kind") == "MessageSent":
                        self._show_lines(event.get("msg_data"))
        finally:
            stopping.cancel()

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        self._http.close()

    async def visit(
        self, user: str, password: str, path: str, stop: asyncio.Event, ready: bool = True
    ) -> None:
        """Sign in, open ``path`` and follow it until ``stop``; an error is kept in ``error``."""
        try:
            await self.sign_in(user, password)
            await self.open(path, ready=ready)
            await self.follow(stop)
        except Exception as error:  # noqa: BLE001 - counted and reported
            self.error = repr(error)
        finally:
            self.close()


def _strings(value: Any) -> list[str]:
    """Every string in a message's JSON (nested maps and lists)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [text for item in value for text in _strings(item)] if isinstance(value, list) else []
