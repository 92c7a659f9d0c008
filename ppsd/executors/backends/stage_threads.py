"""Where a slot's stages run on a CPU thread each, or all here: `StageThreads` and `HERE`.

Boundary: threads, their intra-op thread counts and their cores; what runs on them is the
runtime's. Both give `submit(k, fn, *args)` with a `.result()`, so a backend that spreads a slot's
stages over threads and one that runs them in turn are the same code with another pool (`OnPool`,
what such a backend shares).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch


class _Ran(NamedTuple):
    value: Any

    def result(self) -> Any:
        return self.value


class Here:
    """Every stage on the caller's thread, in the order submitted: the pool of stages in turn."""

    concurrent = False

    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass

    def close(self) -> None:
        pass

    def submit(self, k: int, fn, *args) -> _Ran:
        return _Ran(fn(*args))


HERE = Here()


class StageThreads:
    """A thread for each of stages 2..K and, while a run lasts, the caller's thread as stage 1's:
    each with one intra-op thread (torch releases the GIL inside its kernels, a compiled step's C++
    call releases it whole) and, where the process may use K cores, a core of its own. The runtime
    admits one run at a time, so `begin` and `end` need no lock of their own."""

    concurrent = True

    def __init__(self, num_stages: int) -> None:
        self.cores = _stage_cores(num_stages)
        self._stages = [ThreadPoolExecutor(1, f"ppsd-stage-{k + 1}", initializer=_pin, initargs=(self.cores, k))
                        for k in range(1, num_stages)]
        self._caller: tuple[int, set[int] | None] | None = None  # intra-op threads and cores to give back

    def begin(self) -> None:
        self._caller = (torch.get_num_threads(), _affinity())
        _pin(self.cores, 0)

    def end(self) -> None:
        if self._caller is not None:
            threads, cores = self._caller
            torch.set_num_threads(threads)
            if cores is not None:
                os.sched_setaffinity(0, cores)
            self._caller = None

    def submit(self, k: int, fn, *args):
        """`fn(*args)` on stage k's thread (stage 1: here), under the caller's inference and grad modes."""
        if k == 0:
            return _Ran(fn(*args))
        modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())  # thread-local: passed on
        return self._stages[k - 1].submit(_in_modes, modes, fn, *args)

    def close(self) -> None:
        for stage in self._stages:
            stage.shutdown(wait=True)


class OnPool:
    """What a `Where` that launches its stages from `pool`'s threads shares: a slot's jobs each
    launched (`launch`, the backend's) on its stage's thread when `anywhere`, else in turn here;
    the pool's lifetime is the run's and the executor's."""

    pool: Here | StageThreads
    remote = False  # every stage in this process

    def end(self) -> None:
        self.pool.end()

    def rollback(self, length: int) -> None:
        pass  # nothing of a run is kept where the stages run: the runtime's cache holds it all

    def close(self) -> None:
        self.pool.close()

    def at_once(self, jobs: list, anywhere: bool) -> list:
        pool = self.pool if anywhere else HERE
        running = [pool.submit(job.k, self.launch, job) for job in jobs]
        return [r.result() for r in running]


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

