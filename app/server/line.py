"""Waiting, visibly: the line of runs for the one device, work on a thread that a page can stop
waiting for (Stop) while it shows what happens, and each session's Stop, which reaches a run
also in a forked process (a ZeroGPU call).

Plain threading; no Gradio, no models.
"""

from __future__ import annotations

import math
import mmap
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

from ppsd.model_source import Progress

from ..words import OPEN_RECORDED


class Background:
    """`work(tell)` on a daemon thread, for waits a page must be able to leave (Stop) while
    showing what happens: `progress` yields the latest `tell` message twice a second, `value`
    returns the result or raises the work's exception."""

    def __init__(self, work: Callable[[Progress], object], name: str) -> None:
        self._messages: list[str] = []
        self._result: object = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._result = work(self._messages.append)
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread in value()
                self._error = error

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def progress(self, stop: Stop, doing: str, every: float = 0.5) -> Iterator[str]:
        """'<latest message>… N s' while the work runs, until it ends or `stop` is set."""
        started = time.perf_counter()
        while self._thread.is_alive() and not stop.is_set():
            yield f"{(self._messages or [doing])[-1]}… {time.perf_counter() - started:.0f} s"
            self._thread.join(every)

    def value(self) -> object:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


PER_CLIENT = 2  # runs one client (an address, `app.server.visitors`) may have in line: the one decoding and one waiting


@dataclass(frozen=True, eq=False)
class Ticket:
    """A place in line: whose it is, how many of that client's runs were in line before it, and
    its turn: the seconds it may hold the device while others wait (`DeviceLine.turn`)."""

    client: str
    round: int
    seconds: float = 0.0


def wait_text(seconds: float) -> str:
    """A wait in words, rounded up: "40 s" under two minutes, else whole minutes ("12 min")."""
    return f"{max(1, math.ceil(seconds))} s" if seconds < 120 else f"{math.ceil(seconds / 60)} min"


class DeviceLine:
    """The device decodes one comparison at a time: visitors queue here, at most `max_waiting`
    of them (more are told to come back), and can see how many are ahead. Fair by client (an
    address, `app.server.visitors`, not a session a script can multiply): one client may have at most
    `per_client` runs in line, and the line is served round-robin, a client's first run ahead of
    any other client's second, so a newcomer waits for at most the run in progress and one run of
    each client already waiting, however many sessions a script opens; and while others wait, the
    run in progress gives its turn up after a shorter time (`turn`). Loading a model happens
    before joining, so it never holds the device."""

    def __init__(self, max_waiting: int, per_client: int = PER_CLIENT) -> None:
        self.max_waiting = max_waiting
        self.per_client = per_client
        self._line: list[Ticket] = []  # the first holds the device
        self._changed = threading.Condition()

    @contextmanager
    def place(self, client: str = "", seconds: float = 0.0) -> Iterator[Ticket]:
        """A place in line for `client`, whose run may hold the device `seconds` while others wait
        (its turn), left on exit (also on Stop and on error). ValueError when the line is full,
        saying how long it may take, or when `client` has `per_client` runs in line already."""
        with self._changed:
            if len(self._line) > self.max_waiting:
                longest = sum(t.seconds for t in self._line)
                raise ValueError(f"the demo is busy (one run decoding, {len(self._line) - 1} waiting, the most it "
                                 f"queues): while others wait each run may hold the device for its turn, so the "
                                 f"line may take up to {wait_text(longest)}. Please come back in a few minutes "
                                 f"(runs often end sooner), or in {wait_text(longest)} at the latest. Meanwhile, "
                                 f"\"{OPEN_RECORDED}\" under Run replays a run recorded earlier, with no wait")
            mine = sum(t.client == client for t in self._line)
            if mine >= self.per_client:
                raise ValueError(f"you have {mine} runs in line already, the most one visitor may: wait for one "
                                 "to finish, or press Stop")
            ticket = Ticket(client, mine, seconds)
            # After every run of an earlier or equal round, never ahead of the one decoding.
            after = [i for i, t in enumerate(self._line) if t.round <= ticket.round]
            self._line.insert(max(after[-1] + 1 if after else 0, 1 if self._line else 0), ticket)
            self._changed.notify_all()  # a run in progress may now have to give its turn up (`turn`)
        try:
            yield ticket
        finally:
            with self._changed:
                self._line.remove(ticket)
                self._changed.notify_all()

    @contextmanager
    def turn(self, ticket: Ticket, stop: "Stop", seconds: float | None = None) -> Iterator[None]:
        """While `ticket` holds the device (call it once its turn has come): once it has held it
        `seconds` (default: the ticket's turn) and another client's run waits, its turn is over,
        and `stop.hand_over()` (a `StopFlag`) ends it as the time limit does. Leaving the block
        ends the watch."""
        seconds = ticket.seconds if seconds is None else seconds
        left = threading.Event()

        def watch() -> None:
            until = time.monotonic() + seconds
            with self._changed:
                while not left.is_set():
                    remaining = until - time.monotonic()
                    if remaining <= 0 and any(t.client != ticket.client for t in self._line[1:]):
                        stop.hand_over()
                        return
                    self._changed.wait(remaining if remaining > 0 else None)

        watcher = threading.Thread(target=watch, name="device-turn", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            with self._changed:
                left.set()
                self._changed.notify_all()
            watcher.join()

    def __len__(self) -> int:
        """Runs in line, the one holding the device included."""
        with self._changed:
            return len(self._line)

    def ahead(self, ticket: Ticket, *, wait: float = 0.0) -> int:
        """How many runs are ahead of `ticket` (0: the device is its), after waiting up to
        `wait` seconds for that to change."""
        with self._changed:
            if self._line.index(ticket) > 0 and wait > 0:
                self._changed.wait(wait)
            return self._line.index(ticket)

    def longest_wait(self, ticket: Ticket) -> float:
        """The most `ticket` may still wait: the turns of the runs ahead of it, each of which is
        cut at its turn while `ticket` waits."""
        with self._changed:
            return sum(t.seconds for t in self._line[:self._line.index(ticket)])


class Stop(Protocol):
    """What a run reads to know it should stop: a `threading.Event` or a `StopFlag`."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...


HANDED_OVER = 2  # a StopFlag's byte when the run gave its turn to a waiting visitor (1: Stop or the limit)
STOP_SLOTS = 256  # runs whose Stop may be in flight at once; slots are reused round-robin


class StopFlag:
    """One run's Stop, seen by every process forked from the one that made the registry: a byte
    of an anonymous shared mapping. A ZeroGPU call decodes in a child forked from the server's
    main process, and Stop arrives in the main process, where a `threading.Event` of the child's
    copy would never hear it. The byte only ever goes from 0 to 1 or 2, so no lock is needed."""

    def __init__(self, flags: mmap.mmap, slot: int) -> None:
        self._flags = flags
        self.slot = slot

    def set(self) -> None:
        if self._flags[self.slot] == 0:
            self._flags[self.slot] = 1

    def hand_over(self) -> None:
        """Stop, because another visitor waits for the device (`DeviceLine.turn`)."""
        if self._flags[self.slot] == 0:
            self._flags[self.slot] = HANDED_OVER

    def is_set(self) -> bool:
        return self._flags[self.slot] != 0

    @property
    def handed_over(self) -> bool:
        return self._flags[self.slot] == HANDED_OVER


class StopRegistry:
    """The Stop of every run in progress, by session. Stop arrives as a request of its own, so it
    finds the runs' flags here by session and stops them all: a client may have several runs
    going (the page allows one, the API any number), and none of them may be left unstoppable.

    Each run's flag is a slot of a shared mapping made with the registry (at start-up, before
    any fork): a forked call finds its run's flag by the slot number (`flag`), the one thing of
    it that crosses the fork."""

    def __init__(self, slots: int = STOP_SLOTS) -> None:
        self._flags = mmap.mmap(-1, slots)  # anonymous and MAP_SHARED: forked children share it
        self._next = 0
        self._stops: dict[str, set[StopFlag]] = {}
        self._lock = threading.Lock()  # a run's end removes its flag while Stop may be reading the set

    @contextmanager
    def running(self, session: str) -> Iterator[StopFlag]:
        """A fresh Stop for one run of `session`, held here until the run leaves the block."""
        with self._lock:
            stop = self.flag(self._next)
            self._next = (self._next + 1) % len(self._flags)  # the least recently used slot
            self._flags[stop.slot] = 0
            self._stops.setdefault(session, set()).add(stop)
        try:
            yield stop
        finally:
            stop.set()  # whatever still reads this slot (a call its client left) stops too
            with self._lock:
                runs = self._stops.get(session, set())
                runs.discard(stop)
                if not runs:
                    self._stops.pop(session, None)

    def flag(self, slot: int) -> StopFlag:
        """The Stop in `slot`, in this process or a forked one."""
        if not 0 <= slot < len(self._flags):
            raise ValueError(f"stop slot {slot} is out of range: 0 <= slot < {len(self._flags)}")
        return StopFlag(self._flags, slot)

    def stop(self, session: str) -> None:
        """Set the Stop of each run `session` has going."""
        with self._lock:
            runs = list(self._stops.get(session, ()))
        for stop in runs:
            stop.set()
