"""The process's shared pipeline: started on first use, reused by every run whose stages and
weights match, replaced when they do not.

Boundary: which `DistributedExecutor` a caller gets (the CLI, the app, the benchmarks); the
executor itself and its processes live in `pipeline` and `processes`.
"""

from __future__ import annotations

from ..config import DecodeConfig
from ..model import StagedModel
from .pipeline import DistributedExecutor
from .wire import PipelineSpec

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
    if current is not None:
        current.close()
    _current = DistributedExecutor(spec, model).start()
    return _current
