"""What a visitor may send the server, in bytes and files: the numbers, and the ledger of what
each address uploaded in the last hour. `app.server.guard` enforces them on every request, before
Gradio reads a byte of the body; the prompt's own cap, in characters, is `app.request`'s.

Plain data and arithmetic; no Gradio, no ASGI.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

MB = 2**20

# One uploaded file: the largest legitimate one is a recorded run (a JSON file of a few MB).
MAX_UPLOAD_BYTES = 8 * MB
MAX_UPLOAD_FILES = 20  # files in one upload request; a request with more keeps none of them
UPLOAD_BYTES_PER_HOUR = 64 * MB  # what one address may upload in an hour (eight of the largest recordings)
UPLOAD_FILES_PER_HOUR = 100  # and in how many files
# Every upload together, on disk; the disk itself keeps at least the model cache's room free
# (the converted default model is about 548 MB, and a model converted again needs as much more).
UPLOAD_DISK_BYTES = 256 * MB
DISK_RESERVE_BYTES = 1024 * MB
# An unopened upload is deleted (Gradio's `delete_cache`) once it is 10 minutes old, swept every
# minute; an opened one at once (`app.replay.read_upload`). So an upload holds room for at most
# `UPLOAD_HELD_SECONDS`.
UPLOAD_KEEP_SECONDS = 600
UPLOAD_SWEEP_SECONDS = 60
DELETE_UPLOADS = (UPLOAD_SWEEP_SECONDS, UPLOAD_KEEP_SECONDS)
UPLOAD_HELD_SECONDS = UPLOAD_KEEP_SECONDS + UPLOAD_SWEEP_SECONDS
# One address's share of the room: what it uploaded while that may still be held. Eight shares fill
# it, so the hourly budgets of four addresses (which once filled it in 2 s) leave half of it to others.
UPLOAD_SHARES = 8

# Any other request's body: the run's JSON carries a prompt of at most `MAX_PROMPT_CHARS`
# characters, each at most 12 bytes escaped (a surrogate pair, "\\ud83d\\ude00"), and 14 short values.
MAX_BODY_BYTES = 2 * MB
# A refused body up to this size is read and dropped before the answer: a client that writes its
# whole body before reading (most do) would otherwise find the connection reset, not the refusal.
DRAIN_BYTES = 64 * MB
DRAIN_SECONDS = 10.0


def megabytes(n: float) -> str:
    """Bytes in words: "8 MB", "0.3 MB", "12 MB" (binary megabytes, as the limits are set)."""
    value = round(n / MB, 1) if n < 10 * MB else round(n / MB)
    return f"{value:g} MB"


def minutes(seconds: float) -> str:
    """A wait in words, rounded up to whole minutes: "1 min", "42 min"."""
    return f"{max(1, -int(-seconds // 60))} min"


@dataclass(eq=False)  # two uploads alike in every number are still two
class Upload:
    """One upload request's charge: when it started, its bytes and files so far."""

    at: float
    bytes: int = 0
    files: int = 0


class UploadLedger:
    """What each address uploaded in the last `window` seconds. An upload is charged as its bytes
    arrive (`start`, then `charge`), so that two requests at once cannot both spend the same
    budget, and `refund`ed whole when it is refused or fails: only what was kept counts."""

    def __init__(self, window: float = 3600.0, clock=time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._uploads: dict[str, deque[Upload]] = {}
        self._lock = threading.Lock()

    def start(self, address: str) -> Upload:
        upload = Upload(self._clock())
        with self._lock:
            for other in list(self._uploads):  # an address that stopped uploading costs nothing
                self._recent(other)
            self._uploads.setdefault(address, deque()).append(upload)
        return upload

    def refund(self, address: str, upload: Upload) -> None:
        with self._lock:
            uploads = self._uploads.get(address)
            if uploads is not None and upload in uploads:
                uploads.remove(upload)
            if not uploads:
                self._uploads.pop(address, None)

    def used(self, address: str, within: float | None = None) -> tuple[int, int]:
        """Bytes and files `address` uploaded in the window, or in the last `within` seconds of it
        (the uploads in progress included)."""
        with self._lock:
            uploads = self._since(address, within)
            return sum(u.bytes for u in uploads), sum(u.files for u in uploads)

    def free_again_in(self, address: str, within: float | None = None) -> float:
        """Seconds until the oldest upload of `address` in the window (or in its last `within`
        seconds) leaves it."""
        with self._lock:
            uploads = self._since(address, within)
            span = self.window if within is None else within
            return max(0.0, uploads[0].at + span - self._clock()) if uploads else 0.0

    def _since(self, address: str, within: float | None) -> list[Upload]:
        uploads = self._recent(address)
        cutoff = -float("inf") if within is None else self._clock() - within
        return [u for u in uploads if u.at >= cutoff]

    def _recent(self, address: str) -> deque[Upload]:
        uploads = self._uploads.get(address, deque())
        cutoff = self._clock() - self.window
        while uploads and uploads[0].at < cutoff:
            uploads.popleft()
        if not uploads:
            self._uploads.pop(address, None)
        return uploads

    def __len__(self) -> int:
        """Addresses with an upload in the window (or one not yet swept out)."""
        return len(self._uploads)
