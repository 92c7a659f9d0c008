"""Executors run stage work for the decoders; the decoders decide what runs.

A pipeline of K stages: stage 1 is layers [0, E) plus the exit head, stage K ends with the final
head. `base` holds the protocol and the compute at both ends, `schedule` which stage computes
what in each call (as data), `waiting` the hidden states queued before each stage.

`runtime` is the one interpreter of the schedule in this process, on one static KV cache
(`ppsd.static_cache`) and one pure step per stage (`stage_steps`). A kind is *where* the stages
run times *how* a step runs, two small objects from `backends` chosen when it is built:
`InProcessExecutor` (eager, in turn), `ThreadedExecutor` (eager, a thread per stage; a stream
each on a GPU), `GraphedExecutor` (compiled on stage threads on a CPU, CUDA graphs on streams on
a GPU). `stacked` (experimental) is the runtime too, its one-token slots one chain of stacked
layers (`stacked_step`, on `ppsd.llama_step`) on slot backends of their own. `kinds` is the
registry every front end chooses from, `background` a kind built on a thread, and `host` what the
host gives (its usable cores, whether it is a ZeroGPU Space). The K-process pipeline is the
package `distributed` (`pipeline`, the coordinator; `worker`, `wire`, `placement`, `processes`;
and `pool`, what callers use), its stages on the same static cache and forward
(`base.stage_forward`); import it only when wanted (it brings torch.distributed).
docs/engine.md describes the runtime.
"""

from .base import Executor, Feed, Output, PipelineError
from .runtime import InProcessExecutor

__all__ = ["Executor", "Feed", "InProcessExecutor", "Output", "PipelineError"]
