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
from ..background import watching
from .pipeline import DistributedExecutor
from .spawner import SpawnFailed
from .wire import PING_SECONDS, PipelineBusy, PipelineError, PipelineSpec

__all__ = ["DistributedExecutor", "PipelineBusy", "PipelineError", "current_pool", "ready_pipeline", "shared_pipeline",
           "workers_unavailable"]

_current: DistributedExecutor | None = None  # the one `shared_pipeline` hands out


def current_pool() -> DistributedExecutor | None:
    """The pipeline `shared_pipeline` last started in this process, if it is still running."""
    return _current if _current is not None and _current.alive else None


def shared_pipeline(model: StagedModel, config: DecodeConfig, *, threads_per_worker: int = 1,
                    timeout: float = 30.0, progress: Callable[[str], None] | None = None) -> DistributedExecutor:
    """The process's pipeline for `model` and `config`'s stages: stage 1 runs here on `model`,
    stages 2..K in workers that load `model.info.name` (a local directory or hub id). Started
    once and reused while the settings and weights match (the exit head may change: only stage 1
    uses it) and every worker answers a ping within `wire.PING_SECONDS`; otherwise the old pool is
    closed (a frozen or silent worker killed, said to `progress`) and a new one started."""
    spec = PipelineSpec(model=model.info.name, partition=config.partition(model.num_layers),
                        device=model.info.device.split(":")[0], dtype=model.info.dtype,
                        threads_per_worker=threads_per_worker, timeout=timeout)
    global _current
    current = current_pool()
    if current is not None and current.spec == spec and current.model.hf_model is model.hf_model:
        silent = current.check_workers()  # a run never waits the call timeout on a frozen worker
        if silent is None:
            current.use(model)
            return current
        (progress or (lambda message: None))(f"A worker process did not answer within {PING_SECONDS:g} s "
                                             "(frozen or hung): starting fresh ones")
    if _current is not None:
        _current.close()  # other settings, or a worker died while idle: its group goes too
    _current = _started(spec, model, progress or (lambda message: None))
    return _current


def _started(spec: PipelineSpec, model: StagedModel, tell: Callable[[str], None]) -> DistributedExecutor:
    """A new pool, started; tried once more when the fork server froze or hung as it forked
    (it was replaced). A second failure is the caller's `PipelineError`."""
    try:
        return DistributedExecutor(spec, model).start()
    except SpawnFailed as error:
        tell(f"{str(error)[:1].upper()}{str(error)[1:]}: starting the worker processes again")
        return DistributedExecutor(spec, model).start()


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


def ready_pipeline(model: StagedModel, config: DecodeConfig, *, warm_up: Callable[..., None],
                   progress: Callable[[str], None] | None = None, threads_per_worker: int = 1,
                   timeout: float = 30.0) -> DistributedExecutor:
    """`shared_pipeline`, started and warmed up (untimed) on first use by `warm_up` (as
    `ppsd.generate.warm_up`, which decodes: it comes from the caller above), saying what it does to
    `progress` (it takes seconds). A worker that freezes while it warms up, or does not answer a
    ping after, is replaced (once): the run after never waits on it. ValueError says why it
    cannot run here or failed to start."""
    reason = workers_unavailable(config.num_stages, model.info.device)
    if reason is not None:
        raise ValueError(reason)
    tell = progress or (lambda message: None)
    options = {"threads_per_worker": threads_per_worker, "timeout": timeout}
    try:
        pipeline, silent = _warm(model, config, warm_up, tell, options)
        if silent is not None:
            tell("A worker process froze or fell silent while warming up: starting fresh ones")
            pipeline, silent = _warm(model, config, warm_up, tell, options)
        if silent is not None:
            raise PipelineError(silent)
    except PipelineError as error:
        raise ValueError(f"the worker processes failed: {error}") from None
    return pipeline


def _warm(model: StagedModel, config: DecodeConfig, warm_up: Callable[..., None], tell: Callable[[str], None],
          options: dict) -> tuple[DistributedExecutor, str | None]:
    """The shared pipeline, warmed up once, and None; or, when a worker froze during the warm-up
    or does not answer after it, why (the pool is then shut down)."""
    if current_pool() is None or current_pool().runs == 0:
        tell(f"Starting {config.num_stages} worker processes, one per stage, and loading the weights in each")
    pipeline = shared_pipeline(model, config, progress=tell, **options)
    if pipeline.runs > 0:
        return pipeline, None  # warm, and it has just answered its ping
    tell("Warming up the worker processes (untimed)")
    frozen: list[str] = []

    def abort_if_frozen() -> bool:
        """The warm-up is untimed, so no Stop watches it: a frozen (stopped) worker kills the pool
        (`abort`), so it fails at once instead of after the call timeout. A busy worker cannot
        answer a ping, so its process state is what is watched."""
        frozen.extend(filter(None, [pipeline.frozen()]))
        if frozen:
            pipeline.abort()
        return bool(frozen)

    with watching(0.1, abort_if_frozen, "ppsd-freeze-watch"):
        try:
            warm_up(model, [0], config, executor=pipeline)
        except PipelineError:
            if not frozen:
                raise
    if frozen:
        pipeline.close()
        return pipeline, frozen[0]
    return pipeline, pipeline.check_workers()
