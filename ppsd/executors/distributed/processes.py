"""The lives of a pipeline's worker processes: started from a fork server (each start with a
deadline), awaited until each has loaded its stage, stopped (politely first, then by force),
named when one dies or freezes (or the fork server or resource tracker they come through does);
and the process-wide register of open pipelines, closed at exit.

Boundary: processes only; what they say to each other is `wire`, what they do is `worker`, the
helper processes they are started through `spawner`. torch.distributed has one default group
per process, hence the register.
"""

from __future__ import annotations

import atexit
import multiprocessing.connection
import os
import signal
import time

import torch

from . import spawner
from .wire import PipelineError, PipelineSpec
from .worker import spawned_worker

OPEN: set = set()  # the pipelines started in this process and not yet closed (each has .close())
# How long one worker's start may wait for the fork server to fork it. A running server forks a
# preloaded worker in milliseconds; a fresh one first imports torch and transformers (8.5 s cold
# on an idle 2-core machine, several times that under load).
FORK_SECONDS = 10.0
FIRST_FORK_SECONDS = 60.0


class WorkerProcesses:
    """Stages 2..K of one pipeline, each its own local process (none under torchrun)."""

    def __init__(self) -> None:
        self.processes: list = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def all_alive(self) -> bool:
        return all(p.is_alive() and _exists(p.pid) for p in self.processes)

    def start(self, spec: PipelineSpec, port: int) -> None:
        """Start a worker per stage 2..K that meets rank 0 at `port`; return once each has loaded."""
        context = _process_context()
        spawner.replace_frozen()  # a stopped fork server would never answer: a fresh one will
        pipes = []
        for k in range(1, len(spec.partition)):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=spawned_worker, name=f"ppsd-stage-{k + 1}", daemon=True,
                                      args=(k, spec, port, sender))
            running = spawner.FORK_SERVER in spawner.pids()
            try:
                spawner.start_within(process, FORK_SECONDS if running else FIRST_FORK_SECONDS)
            except PipelineError:
                receiver.close()
                raise
            finally:
                sender.close()
            self.processes.append(process)
            pipes.append(receiver)
        self._await_loaded(pipes, spec.startup_timeout)

    def stop(self, *, grace: float) -> None:
        """Give the workers `grace` seconds to exit (after their SHUTDOWN), then kill the rest.
        A worker's end is heard through the fork server: with it frozen, each wait would take
        its whole timeout, so then the workers are killed and the helpers replaced first."""
        if spawner.frozen() is not None:
            self.kill()
            spawner.replace_frozen()
        deadline = time.monotonic() + grace
        for process in self.processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        # `_exists` too: one forked from a fork server killed since reads as dead, but runs on
        rest = [process for process in self.processes if process.is_alive() or _exists(process.pid)]
        self.kill()
        for process in rest:
            process.join(timeout=5.0)

    def kill(self) -> None:
        """SIGKILL every worker now, from any thread, without waiting: a frozen one (SIGSTOP) ends
        too, its sockets close, and whoever waits on it fails at once (and reaps it)."""
        for process in self.processes:
            spawner.kill(process.pid)

    def frozen(self) -> str | None:
        """Which worker is stopped (SIGSTOP, a debugger), if one is: it answers nothing until it
        is continued, however long a call waits, and it cannot be seen by waiting alone, since a
        busy worker is silent too; else which helper it came through is (`spawner.frozen`): the
        pool is then replaced with them. Read from /proc (Linux); elsewhere None."""
        for k, process in enumerate(self.processes, start=2):
            if spawner.state(process.pid) in ("T", "t"):
                return f"pipeline worker for stage {k} (pid {process.pid}) is frozen (stopped)"
        return spawner.frozen()

    def culprit(self) -> str | None:
        """Which worker died, and how, if one did."""
        time.sleep(0.2)  # let a dying worker finish dying, so it is named rather than its neighbour
        dead = [(k, p) for k, p in enumerate(self.processes, start=2) if not p.is_alive()]
        dead.sort(key=lambda item: item[1].exitcode == 1)  # a neighbour exits with 1 when its link breaks
        if not dead:
            return None
        k, process = dead[0]
        return f"pipeline worker for stage {k} (pid {process.pid}) died ({exit_text(process.exitcode)})"

    def _await_loaded(self, pipes: list, timeout: float) -> None:
        """Wait for every worker's 'loaded' (or its load error), watching that it stays alive and
        does not freeze (a frozen one would hold the start for the whole `timeout`)."""
        deadline = time.monotonic() + timeout
        waiting = dict(enumerate(pipes, start=1))  # rank -> pipe
        while waiting:
            for k, pipe in list(waiting.items()):
                if pipe.poll():
                    self._loaded(k, pipe)
                    del waiting[k]
            if time.monotonic() > deadline:
                raise PipelineError(f"pipeline workers did not load within {timeout:g} s")
            frozen = self.frozen()
            if frozen is not None:
                raise PipelineError(f"{frozen} while the workers load")
            multiprocessing.connection.wait(list(waiting.values()), timeout=0.2)

    def _loaded(self, k: int, pipe) -> None:
        try:
            message = pipe.recv()
        except EOFError:
            message = None
        if message == "loaded":
            return
        if isinstance(message, str) and message.startswith("error: "):
            raise ValueError(message.removeprefix("error: "))
        process = self.processes[k - 1]
        process.join(timeout=1.0)
        raise PipelineError(f"pipeline worker for stage {k + 1} died while loading ({exit_text(process.exitcode)})")


def exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def close_all() -> None:
    """Stop every pipeline this process started (also run at interpreter exit)."""
    for pool in list(OPEN):
        pool.close()


@atexit.register
def _shutdown() -> None:
    """At exit: stop the pipelines, then the forkserver their workers came from, and wait for it.
    Left alone it exits only once it notices this process is gone, and is re-parented to PID 1
    meanwhile; so a command returns only after every process it started has exited."""
    close_all()
    spawner.stop_fork_server()


def _process_context():
    """Workers fork from a clean server process that has imported torch and transformers once
    (not from the caller, whose threads make fork unsafe): a new pool starts in the time it
    takes to load the weights, not K times the imports."""
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ppsd.executors.distributed.worker", "torch.distributed",
                                    "transformers.models.llama.modeling_llama", "transformers.models.auto.modeling_auto"])
    return context


def _exists(pid: int) -> bool:
    """Whether `pid` is still a process: `is_alive` alone says yes when someone else has already
    reaped a dead child (its waitpid then fails and multiprocessing reads that as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
