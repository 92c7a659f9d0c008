"""Plain AR, the baseline a comparison puts PPSD against: the fastest AR here with no pipeline,
whatever kind PPSD runs on. This module lists the ways it may run; the comparison times each and
keeps the faster (`ppsd.compare`), as which is faster is the machine's to say.

Boundary: the ways plain AR may run on this device, each warmed up at its thread count; timing
them and keeping one is `ppsd.compare`'s, the kinds themselves `ppsd.executors.kinds`'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .executors import Executor, host
from .executors.kinds import KINDS, Setup, WarmUp

__all__ = ["PlainAR", "fastest_ar"]


@dataclass(frozen=True)
class PlainAR:
    """One way to run plain AR here: on `executor` (None: in process), on `threads` torch threads,
    described in `words` ("in this one process on 1 thread with no pipeline")."""

    executor: Executor | None
    threads: int
    words: str


def fastest_ar(setup: Setup, kind: str, pipeline: Executor | None, *, warm_up: WarmUp) -> tuple[PlainAR, ...]:
    """The ways the fastest plain AR here may run, beside a pipeline of `kind` (`pipeline`,
    reused where it serves; one built here is warmed up by `warm_up`). On a GPU: the captured
    steps (eager AR there pays about 1,300 kernel launches a token and runs 5-6x slower:
    docs/benchmarks.md). On a CPU, whatever kind PPSD runs on: in-process AR on 1 thread and on
    every core, each warmed up at its thread count. On a busy 2-core machine torch on 2 threads
    ran 3.5x slower than on 1 (issue 34), on a quiet one faster; plain AR on the captured steps
    had no 1-thread trial (a second thread count compiles again, for minutes) and was timed 3-10x
    too slow beside them (issue 56). The caller closes what it did not pass in, and gives the
    process its threads back."""
    graphed, cores = KINDS["graphed"], host.usable_cores()
    if setup.model.info.device.startswith("cuda"):
        executor = pipeline if kind == graphed.name else graphed.ready(setup, warm_up=warm_up)
        return (PlainAR(executor, 1, f"on the {graphed.noun} in this one process (a CUDA graph a stage, "
                                     "each on its own stream)"),)
    ways, threads = [], torch.get_num_threads()
    try:
        for n in sorted({1, cores}):
            torch.set_num_threads(n)
            warm_up(setup.model, [0], setup.config)  # first calls at this thread count stay out of the timed rounds
            ways.append(PlainAR(None, n, f"in this one process on {n} thread{'s' * (n != 1)} with no pipeline"))
    finally:
        torch.set_num_threads(threads)
    return tuple(ways)
