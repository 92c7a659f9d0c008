"""The process's shared pipeline: started on first use, reused by every run whose stages and
weights match, replaced when they do not or when a worker has died.

Boundary: the K-process pipeline as its callers (the CLI, the app, the benchmarks) see it:
whether worker processes can run here, the one they get, ready to use, and the error it raises.
The executor itself lives in `pipeline` (with `processes`); which kind of executor a front end
runs, and how it gets one, is `kinds`.
"""

from __future__ import annotations

import multiprocessing
from typing import Callable

from ...config import DecodeConfig
from ...model import StagedModel
from .. import host
from .pipeline import DistributedExecutor
from .wire import PipelineBusy, PipelineError, PipelineSpec

__all__ = ["DistributedExecutor", "PipelineBusy", "PipelineError", "current_pool", "ready_pipeline", "shared_pipeline",
           "workers_unavailable"]

_current: DistributedExecutor | None = None  # the one `shared_pipeline` hands out


def current_pool() -> DistributedExecutor | None:
    """The pipeline `shared_pipeline` last started in this process, if it is still running."""
    return _current if _current is not None and _current.alive else None


def shared_pipeline(model: StagedModel, config: DecodeConfig, *, threads_per_worker: int = 1,
                    timeout: float = 30.0) -> DistributedExecutor:
    """The process's pipeline for `model` and `config`'s stages: stage 1 runs here on `model`,
    stages 2..K in workers that load `model.info.name` (a local directory or hub id). Started
    once and reused while the settings and weights match (the exit head may change: only stage 1
    uses it); otherwise the old pool is closed and a new one started."""
    spec = PipelineSpec(model=model.info.name, partition=config.partition(model.num_layers),
                        device=model.info.device.split(":")[0], dtype=model.info.dtype,
                        threads_per_worker=threads_per_worker, timeout=timeout)
    global _current
    current = current_pool()
    if current is not None and current.spec == spec and current.model.hf_model is model.hf_model:
        current.model = model
        return current
    if _current is not None:
        _current.close()  # other settings, or a worker died while idle: its group goes too
    _current = DistributedExecutor(spec, model).start()
    return _current


def workers_unavailable(num_stages: int, device: str) -> str | None:
    """None when K worker processes can run here, else why not (said to the user)."""
    if multiprocessing.current_process().daemon:
        return "this process is daemonic (as a ZeroGPU call is) and cannot start worker processes"
    if device.startswith("cuda"):
        if not host.on_zerogpu():
            return None
        # ZeroGPU lends the GPU to one function call of one process, not to worker processes.
        return "on ZeroGPU the GPU is lent to one process for one call: worker processes cannot share it"
    cores = host.usable_cores()
    if cores < num_stages:
        return (f"K = {num_stages} worker processes need {num_stages} CPU cores, one each; this machine gives "
                f"{cores}: lower K, or run in one process (projected clock)")
    return None


def ready_pipeline(model: StagedModel, config: DecodeConfig, *, progress: Callable[[str], None] | None = None,
                   threads_per_worker: int = 1, timeout: float = 30.0) -> DistributedExecutor:
    """`shared_pipeline`, started and warmed up (untimed) on first use, saying what it does to
    `progress` (it takes seconds). ValueError says why it cannot run here or failed to start."""
    from ...generate import warm_up  # generate decodes on executors: imported when first needed

    reason = workers_unavailable(config.num_stages, model.info.device)
    if reason is not None:
        raise ValueError(reason)
    tell = progress or (lambda message: None)
    try:
        if current_pool() is None or current_pool().runs == 0:
            tell(f"Starting {config.num_stages} worker processes, one per stage, and loading the weights in each")
        pipeline = shared_pipeline(model, config, threads_per_worker=threads_per_worker, timeout=timeout)
        if pipeline.runs == 0:
            tell("Warming up the worker processes (untimed)")
            warm_up(model, [0], config, executor=pipeline)
    except PipelineError as error:
        raise ValueError(f"the worker processes failed: {error}") from None
    return pipeline
