"""The record of what was measured where: the machine, its load and software at the start, and
a digest of the weights. Read-only; it times nothing."""

from __future__ import annotations

import hashlib
import os
import platform
import time
from pathlib import Path

from ..model import StagedModel
from ..recording.write import cpu_model


def machine_info(model: StagedModel) -> dict:
    """The machine, its software and its load now: read before timing starts."""
    import torch
    import transformers

    device = model.info.device
    return {
        "cpu": cpu_model(), "cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "device": device, "dtype": model.info.dtype,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "distributed_executor": "available",  # ppsd.executors.distributed.pool ships with the package
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def weights_digest(name: str) -> str | None:
    """SHA-256 over a local model folder's safetensors files: which weights were measured
    (a folder can be overwritten later, for example by a training run)."""
    files = sorted(Path(name).glob("*.safetensors")) if Path(name).is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()
