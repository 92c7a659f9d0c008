"""Executors run stage work for the decoders; the decoders decide what runs.

A pipeline of K stages: stage 1 is layers [0, E) plus the exit head, stage K ends with the final
head. `base` holds the protocol and the compute at both ends, `schedule` which stage computes
what in each call (as data), `waiting` the hidden states queued before each stage. `runtime` is
the one interpreter of the schedule, for every kind (docs/engine.md): where the stages run and how
a step runs are `backends` (and, for K worker processes, the package `distributed`, imported only
when wanted: it brings torch.distributed); `stage_steps` and `stacked_step` are what a step
computes. `kinds` is the registry every front end chooses from, `background` a kind built on a
thread, and `host` what the host gives (its usable cores, whether it is a ZeroGPU Space).
"""

from .base import Executor, Feed, Output, PipelineError
from .runtime import InProcessExecutor

__all__ = ["Executor", "Feed", "InProcessExecutor", "Output", "PipelineError"]
