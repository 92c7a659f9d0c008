"""The two helper processes multiprocessing starts worker processes through, watched like the
workers: the fork server (every worker is forked from it) and the resource tracker (each start
first checks it is alive). Either one stopped (SIGSTOP, a debugger) used to hang every later
start for ever: `Process.start()` waits for the fork server's answer with no timeout. Here a
stopped one is named (`frozen`) and replaced (`replace_frozen`: killed and forgotten, so the next
start launches a fresh one), and a worker's start has a deadline (`start_within`).

Boundary: the helpers' lives only, through multiprocessing's own module state (private, as
Python's own test suite uses it: `ForkServer._stop` is the one way to wait for the fork
server). The workers are `processes`.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing import forkserver, resource_tracker, util

from ..background import watching
from .wire import PipelineError

WATCH_SECONDS = 0.1  # how often a start looks whether a helper froze meanwhile
LOCK_SECONDS = 1.0  # a helper's lock is held by a start only while it launches or probes the helper


class SpawnFailed(PipelineError):
    """A worker's start failed because the fork server froze or hung; it was killed, and the
    next start launches a fresh one (so a start may be tried again at once)."""


FORK_SERVER = "the fork server that starts worker processes"
TRACKER = "multiprocessing's resource tracker"


def pids() -> dict[str, int]:
    """The running helpers this process started, by their names in words."""
    found = {FORK_SERVER: forkserver._forkserver._forkserver_pid, TRACKER: resource_tracker._resource_tracker._pid}
    return {name: pid for name, pid in found.items() if pid is not None}


def frozen() -> str | None:
    """Which helper is stopped, if one is: it answers nothing until it is continued."""
    for name, pid in pids().items():
        if state(pid) in ("T", "t"):
            return f"{name} (pid {pid}) is frozen (stopped)"
    return None


def replace_frozen() -> str | None:
    """Kill each stopped helper and forget it (the next start launches a fresh one); say which
    were, or None when none was. Workers forked from a killed fork server can no longer be
    waited for through it (they read as dead): kill them first."""
    reason = frozen()
    if reason is None:
        return None
    for name, pid in pids().items():
        if state(pid) in ("T", "t"):
            _forget(name)
    return reason


def start_within(process, seconds: float) -> None:
    """`process.start()`, with a deadline: a thread looks every `WATCH_SECONDS` whether a helper
    froze, and once one has, or `seconds` have passed (a fork server hung, not stopped), kills it,
    so the start fails at once (the fork server's pipe ends) with a `SpawnFailed` saying why.
    A fresh fork server imports torch and transformers before its first fork: `seconds` allows
    for that."""
    why: list[str] = []
    deadline = time.monotonic() + seconds

    def watch() -> bool:
        reason = frozen() or (time.monotonic() > deadline and
                              f"the fork server did not start a worker process within {seconds:g} s")
        if reason:
            why.append(reason)
            replace_frozen() or _forget(FORK_SERVER)  # a hung one, stopped or not: a waiting start fails at once
        return bool(reason)

    try:
        with watching(WATCH_SECONDS, watch, "ppsd-start-watch"):
            process.start()
    except (EOFError, OSError) as error:
        raise SpawnFailed(f"{why[0] if why else f'the fork server failed ({error})'}, so it was shut down") from None
    if why:  # it froze just as the fork came back: the worker cannot be waited for any more
        kill(process.pid)
        raise SpawnFailed(f"{why[0]}, so it was shut down")


def stop_fork_server() -> None:
    """At exit: stop the fork server and wait for it (a frozen helper is killed first, else the
    wait never ends)."""
    replace_frozen()
    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        server._stop()


def _forget(name: str) -> None:
    """Kill the helper `name` (`FORK_SERVER` or `TRACKER`), reap it, and clear multiprocessing's record of
    it. The kill comes first and needs no lock: a start blocked on the helper while holding the
    lock is freed by it."""
    if name == FORK_SERVER:
        server = forkserver._forkserver
        pid, lock = server._forkserver_pid, server._lock
    else:
        server = resource_tracker._resource_tracker
        pid, lock = server._pid, server._lock
    if pid is None:
        return
    kill(pid)
    _reap(pid)
    if not lock.acquire(timeout=LOCK_SECONDS):
        return  # a start holds it and will find the helper dead (and launch another) itself
    try:
        if name == FORK_SERVER:
            if server._forkserver_pid == pid:
                _close(server._forkserver_alive_fd)
                address = server._forkserver_address
                if address and not util.is_abstract_socket_namespace(address):
                    _unlink(address)
                server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
        elif server._pid == pid:
            _close(server._fd)
            server._fd = server._pid = None
    finally:
        lock.release()


def state(pid: int | None) -> str | None:
    """The process's state letter from /proc/PID/stat (R, S, T for stopped, Z, ...); None when
    it cannot be read (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def kill(pid: int | None) -> None:
    """SIGKILL `pid`, if it is still a process."""
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, TypeError):
        pass


def _reap(pid: int) -> None:
    """Wait for our own child `pid` to end (SIGKILL ends a stopped one too), at most a second."""
    deadline = time.monotonic() + LOCK_SECONDS
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)


def _close(fd: int | None) -> None:
    try:
        os.close(fd)
    except (OSError, TypeError):
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
