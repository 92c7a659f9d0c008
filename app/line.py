"""Waiting, visibly: the line of runs for the one device, work on a thread that a page can stop
waiting for (Stop) while it shows what happens, and each session's Stop.

Plain threading; no Gradio, no models.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from ppsd.model_source import Progress


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

    def progress(self, stop: threading.Event, doing: str, every: float = 0.5) -> Iterator[str]:
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


PER_CLIENT = 2  # runs one client (session) may have in line: the one decoding and one waiting


@dataclass(frozen=True, eq=False)
class Ticket:
    """A place in line: whose it is, and how many of that client's runs were in line before it."""

    client: str
    round: int


class DeviceLine:
    """The device decodes one comparison at a time: visitors queue here, at most `max_waiting`
    of them (more are told to come back), and can see how many are ahead. Fair by client: one
    client may have at most `per_client` runs in line, and a client's first run waits ahead of
    any other client's second, so a newcomer waits for at most the run in progress and one run of
    each client already waiting, however many an API script submits. Loading a model happens
    before joining, so it never holds the device."""

    def __init__(self, max_waiting: int, per_client: int = PER_CLIENT) -> None:
        self.max_waiting = max_waiting
        self.per_client = per_client
        self._line: list[Ticket] = []  # the first holds the device
        self._changed = threading.Condition()

    @contextmanager
    def place(self, client: str = "") -> Iterator[Ticket]:
        """A place in line for `client`, left on exit (also on Stop and on error). ValueError when
        the line is full, or when `client` has `per_client` runs in line already."""
        with self._changed:
            if len(self._line) > self.max_waiting:
                raise ValueError(f"the demo is busy (one run decoding, {len(self._line) - 1} waiting, the most "
                                 "it queues): please try again in a moment")
            mine = sum(t.client == client for t in self._line)
            if mine >= self.per_client:
                raise ValueError(f"you have {mine} runs in line already, the most one visitor may: wait for one "
                                 "to finish, or press Stop")
            ticket = Ticket(client, mine)
            # After every run of an earlier or equal round, never ahead of the one decoding.
            after = [i for i, t in enumerate(self._line) if t.round <= ticket.round]
            self._line.insert(max(after[-1] + 1 if after else 0, 1 if self._line else 0), ticket)
        try:
            yield ticket
        finally:
            with self._changed:
                self._line.remove(ticket)
                self._changed.notify_all()

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


class StopRegistry:
    """The Stop of every run in progress, by session. Stop arrives as a request of its own, so it
    finds the runs' Events here by session and stops them all: a client may have several runs
    going (the page allows one, the API any number), and none of them may be left unstoppable."""

    def __init__(self) -> None:
        self._stops: dict[str, set[threading.Event]] = {}
        self._lock = threading.Lock()  # a run's end removes its Event while Stop may be reading the set

    @contextmanager
    def running(self, session: str) -> Iterator[threading.Event]:
        """A fresh Stop for one run of `session`, held here until the run leaves the block."""
        stop = threading.Event()
        with self._lock:
            self._stops.setdefault(session, set()).add(stop)
        try:
            yield stop
        finally:
            with self._lock:
                runs = self._stops.get(session, set())
                runs.discard(stop)
                if not runs:
                    self._stops.pop(session, None)

    def stop(self, session: str) -> None:
        """Set the Stop of each run `session` has going."""
        with self._lock:
            runs = list(self._stops.get(session, ()))
        for stop in runs:
            stop.set()
