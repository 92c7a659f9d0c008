"""The server's door: an ASGI middleware in front of Gradio that bounds what a request may send
before any of it is read, parsed or stored (`app.server.limits` has the numbers), and notes who
listens for results.

- Any request's body: at most `MAX_BODY_BYTES`, by its Content-Length and by the bytes it really
  streams (a chunked body has no length): a 50 MB prompt is refused before Gradio parses it.
- The upload route (`/gradio_api/upload`, open whether or not the page has a file input): at most
  `MAX_UPLOAD_FILES` files a request, each at most `MAX_UPLOAD_BYTES` (Gradio's own
  `max_file_size`, said in these words), within what the address may upload an hour, what the
  uploads may hold together on disk, and what the disk must keep free for the model cache. A
  refused upload keeps nothing: the refusal is raised inside Gradio's parser, which deletes what
  it had written. A kept upload's files each get a path of their own (`app.server.uploads`) before the
  paths go back: Gradio stores by content, and one visitor's open deleted another's same file.
- A poll of a session the queue does not know is answered 404 in one line, where Gradio would
  write a 76-line traceback to the log for each.
- An event stream that opens or closes is counted for its session (`app.server.sessions.Listeners`),
  so that a run starts only once its client listens.

Every refusal is one status (413 too large, 429 too many for now) and one sentence. Who sent a
request is its address, as the device line counts visitors (`app.server.visitors`).

Boundary: raw ASGI messages and Gradio's upload folder and queue, read; no handlers, no models.
`create_demo` hands the page's `Guard` to its Blocks (`attach`); `launch_kwargs` installs
`RequestLimits`, which finds it there for each request.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gradio import utils as gradio_utils
from starlette.datastructures import Headers
from starlette.requests import Request

from ..request import MAX_PROMPT_CHARS
from .bodies import Body, Message, Parts, Receive, Refused, Send, content_length, log
from .limits import (DISK_RESERVE_BYTES, DRAIN_BYTES, MAX_BODY_BYTES, MAX_UPLOAD_BYTES, MAX_UPLOAD_FILES,
                     UPLOAD_BYTES_PER_HOUR, UPLOAD_DISK_BYTES, UPLOAD_FILES_PER_HOUR, UPLOAD_HELD_SECONDS,
                     UPLOAD_SHARES, UPLOAD_SWEEP_SECONDS, UploadLedger, megabytes, minutes)
from .sessions import Listeners
from .uploads import own_paths
from .visitors import visitor

ATTRIBUTE = "ppsd_guard"  # where a page's Blocks carries its Guard
UPLOAD = re.compile(r"/gradio_api/upload/?$")
POLL = re.compile(r"/gradio_api/queue/data/?$")
CALL_STREAM = re.compile(r"/gradio_api/call/[^/]+/([^/]+)/?$")  # the plain-HTTP API's result stream
PART_SLACK = 16 * 1024  # a part's headers and delimiters, beyond its file's bytes


class Guard:
    """One page's limits and their state: the proxies in front (who a visitor is), each address's
    uploads of the last hour, and who listens for results."""

    def __init__(self, proxy_hops: int = 0, listeners: Listeners | None = None,
                 ledger: UploadLedger | None = None) -> None:
        self.proxy_hops = proxy_hops
        self.listeners = listeners or Listeners()
        self.ledger = ledger or UploadLedger()
        self.in_flight = 0  # bytes of uploads being received
        self.landed = 0  # bytes of every upload kept so far (`overflow` counts those since an upload began)

    def attach(self, blocks: Any) -> Any:
        setattr(blocks, ATTRIBUTE, self)
        return blocks

    def upload_room(self, blocks: Any, folder: str, address: str) -> Room:
        """What an upload from `address` may bring now, or Refused (429) when it may bring nothing."""
        used, files = self.ledger.used(address)
        if used >= UPLOAD_BYTES_PER_HOUR or files >= UPLOAD_FILES_PER_HOUR:
            wait = self.ledger.free_again_in(address)
            raise Refused(429, f"you have uploaded {megabytes(used)} in {files} files in the last hour, the most one "
                               f"visitor may ({megabytes(UPLOAD_BYTES_PER_HOUR)}, {UPLOAD_FILES_PER_HOUR} files): "
                               f"try again in {minutes(wait)}", wait)
        share, mine = UPLOAD_DISK_BYTES // UPLOAD_SHARES, self.ledger.used(address, UPLOAD_HELD_SECONDS)[0]
        share_free_in = self.ledger.free_again_in(address, UPLOAD_HELD_SECONDS)
        if mine >= share:
            raise Refused(429, f"you have uploaded {megabytes(mine)} in the last {minutes(UPLOAD_HELD_SECONDS)}, your "
                               f"share of the demo's room for uploads ({megabytes(share)}; an upload is kept at most "
                               f"{minutes(UPLOAD_HELD_SECONDS)}): try again in {minutes(share_free_in)}", share_free_in)
        kept = _stats(getattr(blocks, "upload_file_set", ()))
        held, room_free_in = sum(s.st_size for s in kept), free_again_in(kept)
        space = min(UPLOAD_DISK_BYTES - held, free_disk(Path(folder)) - DISK_RESERVE_BYTES) - self.in_flight
        if space <= 0:
            raise Refused(429, f"the demo's room for uploads is full for now (an upload is kept at most "
                               f"{minutes(UPLOAD_HELD_SECONDS)}, and the disk keeps room for the model cache): try "
                               f"again in {minutes(room_free_in)}", room_free_in)
        limits = [(MAX_UPLOAD_FILES * (MAX_UPLOAD_BYTES + PART_SLACK),
                   f"the most one upload may carry ({MAX_UPLOAD_FILES} files of {megabytes(MAX_UPLOAD_BYTES)})", (None, 0)),
                  (UPLOAD_BYTES_PER_HOUR - used, f"what you may still upload this hour "
                                                 f"({megabytes(UPLOAD_BYTES_PER_HOUR - used)})",
                   (self.ledger.free_again_in(address), UPLOAD_BYTES_PER_HOUR)),
                  (share - mine, f"what is left of your share of the room for uploads ({megabytes(share - mine)})",
                   (share_free_in, share)),
                  (space, f"the room uploads have now ({megabytes(space)})", (room_free_in, UPLOAD_DISK_BYTES))]
        most, why, (wait, ceiling) = min(limits, key=lambda limit: limit[0])
        return Room(most, why, min(MAX_UPLOAD_FILES, UPLOAD_FILES_PER_HOUR - files), held, self.landed, wait, ceiling)

    def overflow(self, room: Room, address: str, folder: str) -> Refused | None:
        """Whether the uploads in progress, this one's bytes so far included, went past a room as
        it is now: the address's hour (its other uploads at once count too), the uploads' room on
        disk (uploads that landed since `room` was measured count too), or the disk's reserve."""
        used, files = self.ledger.used(address)
        mine = self.ledger.used(address, UPLOAD_HELD_SECONDS)[0]
        held = room.held + self.landed - room.landed
        if used > UPLOAD_BYTES_PER_HOUR or files > UPLOAD_FILES_PER_HOUR or mine > UPLOAD_DISK_BYTES // UPLOAD_SHARES \
                or held + self.in_flight > UPLOAD_DISK_BYTES or free_disk(Path(folder)) < DISK_RESERVE_BYTES:
            return room.refusal()
        return None


@dataclass(frozen=True)
class Room:
    """The most an upload may bring, as measured when it began: bytes, what set that number (in
    words), files; what the uploads held on disk then, and had landed (`Guard.landed`); and when
    that number grows again (seconds; None for a cap of every request), and the most it grows to."""

    bytes: int
    why: str
    files: int
    held: int
    landed: int
    retry_after: float | None = None
    ceiling: int = 0

    def refusal(self, length: int | None = None) -> Refused:
        """The refusal of an upload past `bytes` (of `length` bytes, when it said): when to try
        again, unless it would not fit even then."""
        wait = self.retry_after if length is None or length <= self.ceiling else None
        later = "" if wait is None else f"; try again in {minutes(wait)}"
        return Refused(413, f"this upload is larger than {self.why}: nothing of it was kept{later}", wait)


def free_disk(folder: Path) -> int:
    """Free bytes on the disk that holds `folder` (made on the first upload: its nearest existing
    parent until then); 0 when none can be read."""
    for place in (folder, *folder.parents):
        try:
            return shutil.disk_usage(place).free
        except OSError:
            continue
    return 0


def _stats(files: Any) -> list[os.stat_result]:
    """The uploads the page keeps, as they are on disk now (deleted ones left out)."""
    found = []
    for path in list(files):
        try:
            found.append(os.stat(path))
        except OSError:
            continue
    return found


def free_again_in(kept: list[os.stat_result]) -> float:
    """Seconds until the oldest of the `kept` uploads is deleted (Gradio's sweep counts from a
    file's ctime), at least one sweep: when the room for uploads grows again."""
    oldest = min((s.st_ctime for s in kept), default=time.time())
    return max(float(UPLOAD_SWEEP_SECONDS), oldest + UPLOAD_HELD_SECONDS - time.time())


class RequestLimits:
    """The ASGI middleware (`launch_kwargs` installs it in Gradio's app): each HTTP request
    checked against its page's `Guard`, found on the Blocks the app serves."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        blocks = _blocks(scope)
        guard = getattr(blocks, ATTRIBUTE, None) or Guard()
        guard.listeners.watched = True
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if method == "GET" and POLL.search(path):
            session = Request(scope).query_params.get("session_hash") or None  # the one Gradio reads
            return await self._listen(guard, blocks, session, scope, receive, send)
        if method == "GET" and (found := CALL_STREAM.search(path)):
            return await self._listen(guard, blocks, _event_session(blocks, found.group(1)), scope, receive, send)
        if method == "POST" and UPLOAD.search(path):
            return await self._upload(guard, blocks, scope, receive, send)
        body = Body(receive, MAX_BODY_BYTES, lambda: Refused(413,
            f"a request may send at most {megabytes(MAX_BODY_BYTES)} (a prompt at most "
            f"{MAX_PROMPT_CHARS:,} characters): this one sent more"))
        await self._guarded(scope, body, send)

    async def _listen(self, guard: Guard, blocks: Any, session: str | None, scope: dict, receive: Receive,
                      send: Send) -> None:
        """An event stream: counted open for its session while it is; a poll of a session the
        queue does not know is answered 404 at once."""
        queue = getattr(blocks, "_queue", None)
        if blocks is not None and session is not None and queue is not None \
                and session not in queue.pending_messages_per_session:
            return await Refused(404, "no such session: join an event first").answer(send)
        if session is None:
            return await self.app(scope, receive, send)
        guard.listeners.opened(session)
        try:
            await self.app(scope, receive, send)
        finally:
            guard.listeners.closed(session)

    async def _upload(self, guard: Guard, blocks: Any, scope: dict, receive: Receive, send: Send) -> None:
        """The upload route, within the address's, the folder's and the disk's room; what it
        keeps is charged to the address, what it refuses is refunded."""
        request = Request(scope)
        address = visitor(request, guard.proxy_hops)
        folder = getattr(scope.get("app"), "uploaded_file_dir", None) or gradio_utils.get_upload_folder()
        upload = guard.ledger.start(address)
        kept = False
        try:
            try:
                room = guard.upload_room(blocks, folder, address)
            except Refused as refusal:
                return await self._answer(scope, Body(receive, 0, lambda: refusal), send, refusal)
            parts = Parts(request.headers.get("content-type", ""), room.files, lambda: Refused(413,
                (f"an upload may carry at most {MAX_UPLOAD_FILES} files" if room.files == MAX_UPLOAD_FILES else
                 f"you may upload {room.files} more files this hour ({UPLOAD_FILES_PER_HOUR} an hour)")
                + ": nothing of this one was kept"))

            def check(chunk: bytes) -> Refused | None:
                upload.bytes += len(chunk)
                guard.in_flight += len(chunk)
                refusal = parts.check(chunk)
                upload.files = parts.files
                return refusal or guard.overflow(room, address, folder)

            body = Body(receive, room.bytes, lambda: room.refusal(content_length(scope)), check, cut_off=True)
            try:
                status = await self._guarded(scope, body, send, rewrite=lambda status, text: _stored(
                    status, text, getattr(blocks, "upload_file_set", set()), folder))
            finally:
                guard.in_flight -= upload.bytes
            kept = body.refusal is None and status == 200
            if kept:
                guard.landed += upload.bytes
        finally:
            if not kept:
                guard.ledger.refund(address, upload)

    async def _guarded(self, scope: dict, body: Body, send: Send,
                       rewrite: Callable[[int, bytes], Refused | bytes | None] | None = None) -> int:
        """The app on `body`; a body over its limit (by its length, or as it streams) answered
        with its refusal instead of whatever the app made of it. With `rewrite`, an answer of 200
        or 413 is held whole and handed to it: what it returns (a refusal, or another body) goes
        out instead. Returns the status sent."""
        length = content_length(scope)
        if length is not None and length > body.limit:
            return await self._answer(scope, body, send, body.over())
        sent: dict[str, Any] = {}

        async def guarded_send(message: Message) -> None:
            if body.refusal is not None or sent.get("replaced"):
                return  # the app's answer to a body cut short (its refusal goes out instead), or one replaced
            if message["type"] == "http.response.start":
                if not body.done:
                    await body.rest()
                if rewrite is not None and message["status"] in (200, 413):
                    sent["held"], sent["text"] = message, b""  # perhaps reworded below
                    return
                sent["status"] = message["status"]
            elif message["type"] == "http.response.body" and "held" in sent:
                sent["text"] += message.get("body", b"")
                if not message.get("more_body", False):
                    await self._rewritten(sent, rewrite, send)
                return
            await send(message)

        try:
            await self.app(scope, body.receive, guarded_send)
        except Refused:
            pass  # raised from the body and not caught on the way: answered below
        if body.refusal is not None and "status" not in sent:
            return await self._answer(scope, body, send, body.refusal)
        return sent.get("status", 500)

    @staticmethod
    async def _rewritten(sent: dict, rewrite: Callable[[int, bytes], Refused | bytes | None], send: Send) -> None:
        """The held answer (`sent`), as `rewrite` has it: its refusal, or its body."""
        held, text = sent.pop("held"), sent.pop("text")
        answer = rewrite(held["status"], text)
        if isinstance(answer, Refused):
            await answer.answer(send)
            log(answer)
            sent["status"], sent["replaced"] = answer.status, True
            return
        text = text if answer is None else answer
        headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
        sent["status"] = held["status"]
        await send({**held, "headers": [*headers, (b"content-length", str(len(text)).encode())]})
        await send({"type": "http.response.body", "body": text})

    @staticmethod
    async def _answer(scope: dict, body: Body, send: Send, refusal: Refused) -> int:
        """`refusal` sent, after the body it refused is read to its end where that is cheap: not
        past `DRAIN_BYTES`, and not where the client waits to be told to send it (Expect:
        100-continue, which reading would tell it)."""
        body.refusal = refusal
        length = content_length(scope)
        waits = body.read == 0 and Headers(scope=scope).get("expect", "").lower() == "100-continue"
        if not waits and (length is None or length <= DRAIN_BYTES):
            await body.rest()
        await refusal.answer(send)
        log(refusal)
        return refusal.status


def _stored(status: int, text: bytes, kept: set, folder: str) -> Refused | bytes | None:
    """Gradio's answer to an upload: its refusal of a file past `max_file_size`, said in this
    page's words; the paths it stored, each made the upload's own (`app.server.uploads`)."""
    if status == 413:
        if not text.startswith(b"File size exceeded"):
            return None
        return Refused(413, f"a file may be at most {megabytes(MAX_UPLOAD_BYTES)} (a recorded run is well under "
                            "that): nothing of this upload was kept")
    try:
        return own_paths(text, kept, folder)
    except OSError as error:
        print(f"an upload could not be given its own path: {error}", file=sys.stderr, flush=True)
        return Refused(503, "the upload could not be kept (the same file arrived twice at once): send it again",
                       1)


def _blocks(scope: dict) -> Any:
    try:
        return scope["app"].get_blocks()
    except Exception:  # noqa: BLE001 - not Gradio's app (a test's), or no page yet: the defaults hold
        return None


def _event_session(blocks: Any, event_id: str) -> str | None:
    """The session of the plain-HTTP API's event `event_id`, found as Gradio finds it: the event's
    own, else the session still holding its id (a finished event), else the id itself."""
    queue = getattr(blocks, "_queue", None)
    if queue is None:
        return None
    event = queue.event_ids_to_events.get(event_id)
    if event is not None:
        return event.session_hash
    return next((s for s, ids in list(queue.pending_event_ids_session.items()) if event_id in ids), event_id)
