"""Timed rounds kept clean of compiles: whether anything compiled in this process during a round
(torch's own counters), and a gate that work which can wait (a background build, on a thread
marked `yielding`) waits at while a round is timed.

A round during which a step compiled measured the compile as much as the decoder: a fresh
server's first Runs overlapped the background compile of the captured steps and came out
"stalled" even at load 2-3, and "auto" once chose from a speed measured under it (issue 56).
The gate is checked before each step compiles (`ppsd.kept_steps`), so a compile already under
way finishes first; the counter then names the round that overlapped it.

Boundary: the gate and the counter; which rounds are timed is `ppsd.compare`'s, what compiles is
`ppsd.kept_steps`'.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["compiles", "timing", "wait_for_quiet", "yielding"]

WAIT_AT_MOST = 120.0  # seconds work waits for timed rounds: a stuck round never stops it for good

_changed = threading.Condition()
_timed = 0  # rounds being timed now, by threads that do not yield
_mark = threading.local()  # `on`: this thread's work waits for timed rounds (a background build)


def compiles() -> int:
    """Graphs dynamo compiled in this process so far (every thread's): a round is clean when this
    did not move while it was timed."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextmanager
def yielding() -> Iterator[None]:
    """Work on this thread (a background build: its compiles and its untimed decoding) waits at
    `wait_for_quiet` while a round is timed elsewhere. Only a thread that runs its work itself
    can yield: a generator's rounds may resume on any thread of a server's pool."""
    _mark.on = True
    try:
        yield
    finally:
        _mark.on = False


@contextmanager
def timing() -> Iterator[None]:
    """The block is a timed round: work that yields waits until it ends (a yielding thread's own
    rounds hold nobody)."""
    global _timed
    counted = not getattr(_mark, "on", False)
    with _changed:
        _timed += counted
    try:
        yield
    finally:
        with _changed:
            _timed -= counted
            _changed.notify_all()


def wait_for_quiet(timeout: float = WAIT_AT_MOST) -> bool:
    """On a yielding thread, wait (at most `timeout` s) while a round is timed; elsewhere return
    at once. True when no round was being timed at the end."""
    if not getattr(_mark, "on", False):
        return True
    with _changed:
        return _changed.wait_for(lambda: not _timed, timeout)
