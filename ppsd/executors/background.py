"""An executor made ready in the background: a kind whose steps compile first (minutes on a small
CPU, `ExecutorKind.compiles`) is built on a thread of its own while the front end serves on a kind
that needs no compile, and says how far it is ("compiling the captured steps: 40 s so far") to
whoever asks, and to a terminal every few seconds (`ticking`).

Boundary: the state of one background build, the lines said while something long runs, and a
check a thread makes every few seconds while a block runs (`watching`: a frozen worker's); what
is built, and what is chosen once it is ready, is the caller's (`ppsd.choice`).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator

from .. import quiet
from .base import Executor

__all__ = ["Background", "ticking", "watching"]

Say = Callable[[str], None]


class Background:
    """`build()` run once on a daemon thread: "compiling" until it returns, then "ready" (its
    executor in `executor`) or "failed" (the error's first line in `error`). `what` names what
    compiles ("the captured steps"); `kept`: what compiled before is on disk, so this build loads
    it (seconds, not minutes) and says so; `build` may set `loaded` to what it found it did (False:
    it compiled after all); `clock` is injectable for tests."""

    def __init__(self, what: str, build: Callable[[], Executor], *, kept: bool = False,
                 clock: Callable[[], float] = time.monotonic, say: Say | None = None, every: float = 10.0) -> None:
        self.what, self._build, self._clock, self._say, self._every = what, build, clock, say, every
        self._doing = "loading the kept compile of" if kept else "compiling"
        self.loaded = kept  # the final line's word: loaded from the kept compile, or compiled
        self.executor: Executor | None = None
        self.error = ""
        self._began: float | None = None
        self._ended: float | None = None
        self._done = threading.Event()

    def start(self) -> "Background":
        self._began = self._clock()
        threading.Thread(target=self._run, name="background-compile", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            with ticking(self._say, self.words, self._every), quiet.yielding():  # timed Runs go first
                self.executor = self._build()
        except Exception as error:  # noqa: BLE001 - said on the page and in the log; the page serves on
            self.error = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        finally:
            self._ended = self._clock()
            self._done.set()
            if self._say is not None:
                self._say(self.words())

    @property
    def state(self) -> str:
        """"waiting" (not started), "compiling", "ready" or "failed"."""
        if self._began is None:
            return "waiting"
        if not self._done.is_set():
            return "compiling"
        return "failed" if self.error else "ready"

    @property
    def seconds(self) -> float:
        """Seconds compiling so far, or in all once done."""
        if self._began is None:
            return 0.0
        return (self._ended if self._ended is not None else self._clock()) - self._began

    def words(self) -> str:
        """Where it stands, in words, for the page and the terminal."""
        state = self.state
        if state == "compiling":
            return f"{self._doing} {self.what}: {self.seconds:.0f} s so far"
        if state == "ready":
            done = "loaded from the kept compile" if self.loaded else "compiled"
            return f"{self.what} ready ({done} in {self.seconds:.0f} s)"
        if state == "failed":
            return f"{self._doing} {self.what} failed after {self.seconds:.0f} s: {self.error}"
        return f"{self.what} not compiled"

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)


@contextmanager
def watching(every: float, check: Callable[[], bool], name: str) -> Iterator[None]:
    """While the block runs, `check()` every `every` seconds on a daemon thread of its own, until
    it returns True (then it looks no more)."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(every):
            if check():
                return

    watcher = threading.Thread(target=watch, name=name, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def ticking(say: Say | None, words: Callable[[], str], every: float):
    """While the block runs, `say(words())` every `every` seconds (none when `say` is None): a
    terminal never stays silent through a long compile."""
    if say is None:
        return nullcontext()

    def tick() -> bool:
        say(words())
        return False  # until the block ends

    return watching(every, tick, "ticking")
