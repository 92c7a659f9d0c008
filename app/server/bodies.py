"""A request's body as the app reads it, counted before any of it is parsed or stored: `Body`
(its bytes, and the rest read and dropped so a refusal is seen), `Parts` (a multipart body's
parts, by their delimiters) and `Refused` (a limit's status and one sentence). `app.server.guard`
decides the limits and answers with these.

Boundary: raw ASGI messages and bytes; no Gradio, no limits of its own.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Awaitable, Callable

from python_multipart.multipart import parse_options_header
from starlette.datastructures import Headers
from starlette.formparsers import MultiPartException

from .limits import DRAIN_BYTES, DRAIN_SECONDS

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Refused(MultiPartException):
    """A request over a limit: its status and its one sentence. A MultiPartException, so that
    raised from the body inside Gradio's upload parser it deletes the files it wrote."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after

    async def answer(self, send: Send) -> None:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(max(1, round(self.retry_after))).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.message.encode("utf-8")})


class Body:
    """The request's body as the app reads it (`receive`), counted: past `limit` bytes, or when
    `check` refuses a chunk, the read raises `Refused` and the refusal is kept for the answer.
    `rest` reads what the app left unread, so that the client, writing its body to the end
    before it reads, sees the answer."""

    def __init__(self, receive: Receive, limit: int, over: Callable[[], Refused],
                 check: Callable[[bytes], Refused | None] | None = None, cut_off: bool = False) -> None:
        self._receive, self.limit, self.over, self._check, self._cut_off = receive, limit, over, check, cut_off
        self.read, self.done = 0, False
        self.refusal: Refused | None = None

    async def receive(self) -> Message:
        if self.refusal is not None:
            raise self.refusal
        message = await self._receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            self.read += len(chunk)
            self.done = not message.get("more_body", False)
            refusal = self.over() if self.read > self.limit else self._check(chunk) if self._check else None
            if refusal is not None:
                self.refusal = refusal
                raise refusal
        elif message["type"] == "http.disconnect":
            self.done = True
            if self._cut_off:  # an upload cut short: raised in the parser, it deletes what it wrote
                self.refusal = Refused(400, "the upload was cut off before its end: nothing of it was kept")
                raise self.refusal
        return message

    async def rest(self) -> None:
        """Read and drop the unread body, up to `DRAIN_BYTES` and `DRAIN_SECONDS`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_SECONDS
        while not self.done and self.read <= DRAIN_BYTES:
            try:
                message = await asyncio.wait_for(self._receive(), max(0.0, deadline - loop.time()))
            except (asyncio.TimeoutError, TimeoutError):
                return
            if message["type"] != "http.request":
                return
            self.read += len(message.get("body", b""))
            self.done = not message.get("more_body", False)


class Parts:
    """Counts the parts of a multipart body as it streams, by their delimiters ("--" boundary),
    which no part's content may hold (RFC 2046): `check` refuses the chunk that brings part
    `most + 1`, before the parser reads it. It never counts fewer parts than the parser sees,
    only more when a client puts its own delimiter inside a part, which refuses that client alone."""

    def __init__(self, content_type: str, most: int, refusal: Callable[[], Refused]) -> None:
        _, options = parse_options_header(content_type)
        boundary = options.get(b"boundary", b"")
        self._delimiter = b"--" + boundary if boundary else b""
        self._tail = b""
        self.most, self._refusal = most, refusal
        self.delimiters = 0

    def check(self, chunk: bytes) -> Refused | None:
        if not self._delimiter:
            return None  # Gradio refuses a multipart body without a boundary before storing any of it
        seen = self._tail + chunk
        self.delimiters += seen.count(self._delimiter)
        self._tail = seen[-(len(self._delimiter) - 1):]
        return self._refusal() if self.files > self.most else None

    @property
    def files(self) -> int:
        """Parts so far: each delimiter after the first ends one (the last closes the body)."""
        return max(0, self.delimiters - 1)


def log(refusal: Refused) -> None:
    print(f"refused a request ({refusal.status}): {refusal.message}", file=sys.stderr, flush=True)


def content_length(scope: dict) -> int | None:
    """The request's Content-Length, or None when it sends none (chunked) or an unreadable one."""
    value = Headers(scope=scope).get("content-length")
    return int(value) if value is not None and value.isascii() and value.isdigit() else None
