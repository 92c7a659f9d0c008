"""Stop for a decoding run that may block where it cannot look at its Stop: waiting on a
pipeline worker that froze (SIGSTOP) or hangs. The comparison (`ppsd.compare`) wraps each
decode in one; the executor's `abort` is what tears a frozen pipeline down.

Plain threading; no models, no UI.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

__all__ = ["STOP_GRACE", "StopGuard"]


class Stop(Protocol):
    def is_set(self) -> bool: ...


STOP_GRACE = 1.0  # seconds a stopped run has to reach its next step before its workers are torn down


class StopGuard:
    """Stop for a run that may block where it cannot look at its Stop: waiting on a pipeline
    worker that froze (SIGSTOP) or hangs. While the block lasts, a watching thread sees `stop`;
    once it is set and the run has not left within `grace` seconds, it calls `abort` (which
    tears the pipeline down, so the wait fails at once) and records that it did (`fired`). Time
    the run spends `handing` a snapshot to its caller is not the run's: it never counts. With no
    `abort`, nothing watches."""

    def __init__(self, stop: Stop, abort: Callable[[], None] | None, grace: float = STOP_GRACE,
                 every: float = 0.05) -> None:
        self.stop, self.abort, self.grace, self.every = stop, abort, grace, every
        self.fired = False
        self._left = threading.Event()
        self._handing = False
        self._watch = threading.Thread(target=self._run, name="stop-guard", daemon=True)

    def _run(self) -> None:
        stopped_at = None
        while not self._left.wait(self.every):
            if self._handing or not self.stop.is_set():
                stopped_at = None
            elif stopped_at is None:
                stopped_at = time.monotonic()
            elif time.monotonic() - stopped_at >= self.grace:
                self.fired = True
                self.abort()
                return

    @contextmanager
    def handing(self) -> Iterator[None]:
        self._handing = True
        try:
            yield
        finally:
            self._handing = False

    def __enter__(self) -> "StopGuard":
        if self.abort is not None:
            self._watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._left.set()
        if self._watch.is_alive():
            self._watch.join()
