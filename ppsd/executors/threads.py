"""`ThreadedExecutor`: every stage in this process, each on a thread of its own, at once.

Boundary: the same `schedule` plans as `InProcessExecutor`, on the same model and KV cache (each
stage writes only its own layers), with one difference: in a `slot` the stages compute at the same
time, stage 1 on the caller's thread and stage k on a thread kept for it, each with one intra-op
thread (torch releases the GIL inside its kernels) and, where the OS allows, on a core of its own.
So its trace is measured and concurrent, with nothing sent between processes. It starts no child
process, so it runs where worker processes cannot (a daemonic process, as a ZeroGPU call is).
`push` and `flow` chain stages within one call, so they run as in `InProcessExecutor`.

CPU only for now: on one GPU, stages overlap only as kernels on separate CUDA streams, which this
executor does not yet give them.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from ..model import StagedModel
from ..trace import Stopwatch
from . import schedule
from .base import Feed, Output
from .local import InProcessExecutor


class ThreadedExecutor(InProcessExecutor):
    """All stages here; within a slot, at once, each on its own thread (and core, where it can)."""

    concurrent = True

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch | None = None) -> None:
        if not model.info.device.startswith("cpu"):
            raise ValueError(f"the threads executor runs on CPU only for now, not {model.info.device}: "
                             "on a GPU, use one process (projected clock) or K worker processes")
        super().__init__(model, partition, stopwatch or Stopwatch())
        self.cores = _stage_cores(len(partition))
        self._stages = [ThreadPoolExecutor(1, f"ppsd-stage-{k + 1}", initializer=_pin, initargs=(self.cores, k))
                        for k in range(1, len(partition))]
        self._run_lock = threading.Lock()
        self._caller: tuple[int, set[int] | None] | None = None  # intra-op threads and cores to give back

    def begin(self, stopwatch: Stopwatch) -> None:
        """One run at a time: a second waits. The caller's thread becomes stage 1's (one intra-op
        thread, its core) until `end`."""
        self._run_lock.acquire()
        try:
            super().begin(stopwatch)
            self._caller = (torch.get_num_threads(), _affinity())
            torch.set_num_threads(1)
            _pin(self.cores, 0)
        except BaseException:
            self._run_lock.release()
            raise

    def end(self) -> None:
        if self._caller is not None:
            threads, cores = self._caller
            torch.set_num_threads(threads)
            if cores is not None:
                os.sched_setaffinity(0, cores)
            self._caller = None
        self._run_lock.release()

    def close(self) -> None:
        for stage in self._stages:
            stage.shutdown(wait=True)

    def __enter__(self) -> "ThreadedExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        plan = schedule.slot(self._queues, feed)
        # A slot's stages take what earlier calls queued for them, so every input is taken
        # before any stage runs, and every output delivered after all have run.
        work = [(action, self._input(action)) for action in plan.actions]
        modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())  # thread-local: passed on
        running = {action.index: self._stages[action.index - 1].submit(_in_modes, modes, self._compute, action,
                                                                        hidden, feed, slot)
                   for action, hidden in work if action.index > 0}
        here = {action.index: self._compute(action, hidden, feed, slot) for action, hidden in work if action.index == 0}
        done = {**here, **{k: future.result() for k, future in running.items()}}
        results: dict = {}
        events = [self._deliver(action, done[action.index], results) for action, _ in work]
        self._queues = plan.queues
        return Output(tuple(events), **results)


def _in_modes(modes: tuple[bool, bool], compute, *args):
    """`compute(*args)` under the caller's inference and grad modes, which torch keeps per thread."""
    inference, grad = modes
    with torch.inference_mode(inference), torch.set_grad_enabled(grad):
        return compute(*args)


def _stage_cores(num_stages: int) -> list[set[int]] | None:
    """A core for each stage when this process may use at least K, else None (threads roam)."""
    cores = sorted(_affinity() or ())
    if len(cores) < num_stages:
        return None
    return [{cores[k]} for k in range(num_stages)]


def _affinity() -> set[int] | None:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def _pin(cores: list[set[int]] | None, k: int) -> None:
    """Keep the calling thread to stage k's core (Linux: affinity is per thread) with one intra-op
    thread: two stages on one core would take turns instead of overlapping."""
    torch.set_num_threads(1)
    if cores is not None:
        os.sched_setaffinity(0, cores[k])
