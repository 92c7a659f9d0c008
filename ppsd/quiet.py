"""Timed rounds kept clean of compiles: whether anything compiled in this process during a round
(torch's own counters), and a gate between timed rounds and work that can wait (a background
build, on a thread marked `yielding`).

A round during which a step compiled measured the compile as much as the decoder: a fresh
server's first Runs overlapped the background compile of the captured steps and came out
"stalled" even at load 2-3, and "auto" once chose from a speed measured under it (issue 56).
So the gate works both ways: a yielding thread's compile (`compiling`, around each step's compile
in `ppsd.kept_steps`) does not start while rounds are timed, and timed rounds do not start while
such a compile is under way (one step's compile, seconds): they wait for it first, at most
`WAIT_FOR_COMPILE`. A compile that outlasts that wait is counted, and the counter names its round.

Other programs are watched as well: `others_cpu` gives the cores that processes outside this one
and its children used while a round ran (a browser, a build, another server). Such work slows a
round evenly, so the stalls inside its trace need not show it (a default Run took 28.4 s against
11-14 s for the others and still read as clean, issue 56).

Boundary: the gate, the counter and the watch; which rounds are timed is `ppsd.compare`'s, what compiles is
`ppsd.kept_steps`'.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import psutil

__all__ = ["CROWDED_CORES", "compiles", "compiling", "crowded", "compiling_now", "others_cpu", "timing", "wait_for_quiet", "yielding"]

WAIT_AT_MOST = 120.0  # seconds work waits for timed rounds: a stuck round never stops it for good
WAIT_FOR_COMPILE = 60.0  # seconds timed rounds wait for a yielding compile under way (one step: 2-20 s measured)

_changed = threading.Condition()
_timed = 0  # rounds being timed now, by threads that do not yield
_compiling = 0  # compiles under way on yielding threads
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
    """The block is timed rounds: a yielding compile under way finishes first (at most
    `WAIT_FOR_COMPILE` s), and work that yields waits until the block ends (a yielding thread's
    own rounds hold nobody)."""
    global _timed
    counted = not getattr(_mark, "on", False)
    with _changed:
        _timed += counted
        if counted:
            _changed.wait_for(lambda: not _compiling, WAIT_FOR_COMPILE)
    try:
        yield
    finally:
        with _changed:
            _timed -= counted
            _changed.notify_all()


@contextmanager
def compiling() -> Iterator[None]:
    """The block compiles a step. On a yielding thread it starts once no round is timed (at most
    `WAIT_AT_MOST` s), and timed rounds wait for it to end; elsewhere (a Run's own compile) it
    runs at once, and the counter names the round it ran in."""
    global _compiling
    counted = getattr(_mark, "on", False)
    if counted:
        with _changed:
            _changed.wait_for(lambda: not _timed, WAIT_AT_MOST)
            _compiling += 1
    try:
        yield
    finally:
        if counted:
            with _changed:
                _compiling -= 1
                _changed.notify_all()


def compiling_now() -> bool:
    """Is a yielding compile under way (so timed rounds starting now wait for it)?"""
    return _compiling > 0


def wait_for_quiet(timeout: float = WAIT_AT_MOST) -> bool:
    """On a yielding thread, wait (at most `timeout` s) while a round is timed; elsewhere return
    at once. True when no round was being timed at the end."""
    if not getattr(_mark, "on", False):
        return True
    with _changed:
        return _changed.wait_for(lambda: not _timed, timeout)


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (every core; the hypervisor's steal too)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)


def _own_seconds(me: psutil.Process) -> dict[int, float]:
    """CPU seconds used so far by this process and each of its children (the worker processes), by
    pid; this process's own count includes its children that ended."""
    used = {}
    for process in (me, *me.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.Error:  # it ended between the listing and the reading
            continue
        used[process.pid] = times.user + times.system
    mine = me.cpu_times()  # children that ended and were waited for: their time moved here
    used[me.pid] += mine.children_user + mine.children_system
    return used


CROWDED_CORES = 0.3  # other programs using this many cores through a round make it unclean (a 2-core machine)


def crowded(others: "tuple[float, ...]") -> dict[int, float]:
    """The rounds (0-based) other programs crowded, by `others_cpu`'s reading of each: no clean
    number comes from them, nor a speed for "auto" to compare."""
    return {i: cores for i, cores in enumerate(others) if cores >= CROWDED_CORES}


def others_cpu() -> Callable[[], float]:
    """Start a watch; calling it gives the cores (CPU seconds per second of wall time) that
    processes outside this one and its children used since: 0 on a quiet machine, 1 when another
    program held a whole core throughout."""
    me = psutil.Process()
    t0, busy0, own0 = time.perf_counter(), _busy_seconds(), _own_seconds(me)

    def cores() -> float:
        wall, busy, own = time.perf_counter() - t0, _busy_seconds() - busy0, _own_seconds(me)
        mine = sum(seconds - own0.get(pid, 0.0) for pid, seconds in own.items())
        return max(0.0, busy - mine) / wall if wall > 0 else 0.0

    return cores
