"""What the server keeps of each visitor's session, and when it lets go.

Gradio keeps a `SessionState` per session (`Blocks.state_holder`): a copy of every component's
config (about 90 kB pickled for this page) and the session's `gr.State` values (the race
replay's data). It drops a session only when 10,000 more have come (`state_session_capacity`); a
browser tab that closes frees its `gr.State` values, not the session. An API script opens a
session per call and never closes one, so the server grew about 0.33 MB a run (65-68 MB over 200
runs, measured with the sweeper off). Here a sweeper forgets every session idle for
`idle_seconds`: a tab left that long loses its race replay and gets the page's defaults back, and
nothing else.

Boundary: Gradio's session store, read and trimmed from one daemon thread; no handlers.
"""

from __future__ import annotations

import datetime
import threading
import weakref
from typing import Any

SESSION_IDLE_SECONDS = 1800.0  # a session unused this long is forgotten


def forget_idle(holder: Any, idle_seconds: float) -> int:
    """Drop every session of `holder` (a Gradio `StateHolder`) unused for `idle_seconds`, after its
    `gr.State` values' delete callbacks ran (Gradio's own `delete_state`). Returns how many."""
    now = datetime.datetime.now()
    with holder.lock:
        idle = [s for s, used in list(holder.time_last_used.items())
                if (now - used).total_seconds() >= idle_seconds]
    for session in idle:
        holder.delete_state(session)
        with holder.lock:
            holder.session_data.pop(session, None)
            holder.time_last_used.pop(session, None)
    return len(idle)


def sweep_sessions(demo: Any, idle_seconds: float = SESSION_IDLE_SECONDS) -> threading.Thread:
    """Forget `demo`'s idle sessions (`forget_idle`) every `idle_seconds` / 4, on a daemon thread
    that ends with `demo` (it holds only a weak reference to it)."""
    page = weakref.ref(demo)
    every = max(0.05, idle_seconds / 4)

    def sweep() -> None:
        stopped = threading.Event()
        while not stopped.wait(every):
            blocks = page()
            if blocks is None:
                return
            holder = getattr(blocks, "state_holder", None)
            del blocks
            if holder is not None:
                forget_idle(holder, idle_seconds)

    thread = threading.Thread(target=sweep, name="session-sweeper", daemon=True)
    thread.start()
    return thread


LISTEN_GRACE_SECONDS = 10.0  # how long a run waits for its client to open its event stream


class Listeners:
    """Which sessions have an event stream open: Gradio runs an event whether or not anyone
    reads its results, so a client that joins and never listens would hold the device for
    nothing. `app.server.guard` counts each stream as it opens and closes; a run waits for its session
    to be listened to (`wait`). Until the guard has seen a request (`watched`), nothing is known
    and every session counts as listened to: a page served without the guard still runs."""

    def __init__(self, grace: float = LISTEN_GRACE_SECONDS) -> None:
        self.grace = grace
        self._open: dict[str, int] = {}
        self._changed = threading.Condition()
        self.watched = False

    def opened(self, session: str) -> None:
        with self._changed:
            self._open[session] = self._open.get(session, 0) + 1
            self._changed.notify_all()

    def closed(self, session: str) -> None:
        with self._changed:
            left = self._open.get(session, 0) - 1
            if left > 0:
                self._open[session] = left
            else:
                self._open.pop(session, None)

    def wait(self, session: str) -> bool:
        """Whether `session` has an event stream open, waiting up to `grace` seconds for one."""
        with self._changed:
            return self._changed.wait_for(lambda: not self.watched or session in self._open, timeout=self.grace)
