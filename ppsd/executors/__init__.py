"""Executors run stage work for the decoders; the decoders decide what runs.

A pipeline of K stages: stage 1 is layers [0, E) plus the exit head, stage K ends with the final
head. `base` holds the protocol and the compute at both ends, `schedule` which stage computes
what in each call (as data), `local` the in-process executor (stages in turn), `threads` the
same with a slot's stages at once on a thread each, `graphed` each stage as one pure step on a
static KV cache (`graphed_steps`: CUDA graphs on a stream each, or compiled steps on stage threads
on a CPU), `stacked` a slot's stages as one chain of stacked layers (`stacked_step`, on
`ppsd.llama_step`), the next slot launched before this one is read; those two run their steps on
one backend each, chosen when built (`backends`: `cpu`, `cuda`); `waiting` the hidden states
queued before each stage, `kinds` the registry every front end chooses from, and `host`
what the host gives (its usable cores, whether it is a ZeroGPU Space). The
K-process pipeline is the package `distributed` (`pipeline`, the coordinator; `worker`, `wire`,
`placement`, `processes`; and `pool`, what callers use); import it only when wanted (it brings
torch.distributed).
"""

from .base import Executor, Feed, Output, PipelineError
from .runtime import InProcessExecutor

__all__ = ["Executor", "Feed", "InProcessExecutor", "Output", "PipelineError"]
