"""What the processes of a pipeline share: its spec and error, the control message, the
process groups, placement on cores, and how a stage's weights are loaded and checked.

Boundary: no decoding and no process management here; `ppsd.distributed` (the coordinator,
rank 0) and `ppsd.pipeline_worker` (ranks 1..K-1) both build on it.

Control message (bytes, one fixed size): a `Header` of int64 fields, then room for one hidden
state. Stage 1's output rides to rank 1 *attached* to rank 1's next control message
(inline when it is one position wide, else in a message right after it), not sent on its own
the moment stage 1 finishes: measured on 2 cores, a message that crosses stage K's report on the
wire made gloo's I/O threads spin, and that cost a PPSD slot 1.2 ms on top of its 1.3 (docs/distributed.md).
A report (float32) is [start, end (two float64 as four float32), final logits...].
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from .model import StagedModel, default_dtype, load_weights

WORK, ROLLBACK, PING, SHUTDOWN = 1, 2, 3, 4
KINDS = ("prefill", "draft", "verify")
FOREVER = timedelta(days=365)  # an idle worker waits for its next request as long as it takes
GROUPS: dict = {}  # this process's groups ("calls", "hidden") and whether GPU tensors go via host ("staged")


class PipelineError(RuntimeError):
    """A worker died, hung or failed; the pool has been shut down."""


@dataclass(frozen=True)
class PipelineSpec:
    """What every worker loads and how the workers are placed.

    `device` "cpu": rank k is pinned to cores [k t, (k+1) t) of the caller's, t =
    `threads_per_worker` (wrapping round when there are fewer cores than K t); rank 0 (the
    caller, stage 1) only while a run lasts, with t torch threads. "cuda": rank
    k gets cuda:k mod the GPU count; on one GPU every rank shares cuda:0 as a separate process.
    """

    model: str  # path or hub id the workers load (stage 1 uses the caller's StagedModel)
    stages: tuple[range, ...]
    device: str = "cpu"
    dtype: str | None = None  # None: the library default for the device
    threads_per_worker: int = 1
    timeout: float = 30.0  # seconds one call may wait for a worker
    startup_timeout: float = 300.0  # seconds to load the model and meet


def init_group(spec: PipelineSpec, *, rank: int, world: int, store=None) -> None:
    """Default group: control messages (waits forever while idle). `calls`: hidden states and
    reports (each wait bounded by `spec.timeout`). `hidden`: NCCL between distinct GPUs."""
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=FOREVER)
    GROUPS["calls"] = dist.new_group(backend="gloo", timeout=timedelta(seconds=spec.timeout))
    gpus = torch.cuda.device_count() if spec.device == "cuda" else 0
    nccl = gpus >= world > 1  # NCCL needs a GPU per rank
    hidden = dist.new_group(backend="nccl", timeout=timedelta(seconds=spec.timeout)) if nccl else None
    GROUPS["hidden"] = hidden or GROUPS["calls"]
    GROUPS["staged"] = hidden is None and spec.device == "cuda"  # through host memory


class Header(NamedTuple):
    """The int64 fields that open every control message (`_replace` to fill them in)."""

    op: int  # WORK, ROLLBACK, PING or SHUTDOWN
    run: int = 0  # WORK: compute the head of the queue (or all of it, `merge`d)
    merge: int = 0
    incoming: int = 0  # the previous worker's output arrives: 0 not, 1 after the run (a slot), 2 before (a flow)
    in_position: int = 0
    in_width: int = 0
    in_kind: int = 0  # index into KINDS
    length: int = 0  # ROLLBACK: positions to keep
    att_position: int = 0  # stage 1's output attached to this message (rank 1): where, how wide, what
    att_width: int = 0
    att_kind: int = 0


HEADER = len(Header._fields)  # int64 fields


@dataclass(frozen=True)
class Control:
    """The fixed-size control message: the header, then room for one position's hidden state."""

    hidden_size: int
    dtype: torch.dtype

    @property
    def size(self) -> int:
        return HEADER * 8 + self.hidden_size * self.dtype.itemsize

    def pack(self, header: Header, hidden: torch.Tensor | None = None) -> torch.Tensor:
        # Built as bytes: a tenth of the time of tensor slicing, and this is on every slot's path.
        message = bytearray(self.size)
        message[: HEADER * 8] = struct.pack(f"{HEADER}q", *header)
        if hidden is not None:
            message[HEADER * 8:] = hidden.detach().reshape(-1).to("cpu", self.dtype).view(torch.uint8).numpy().tobytes()
        return torch.frombuffer(message, dtype=torch.uint8)

    def header(self, message: torch.Tensor) -> Header:
        return Header(*message[: HEADER * 8].view(torch.long).tolist())

    def hidden(self, message: torch.Tensor) -> torch.Tensor:
        """The inline hidden state, (1, 1, hidden), a copy (the buffer is reused)."""
        return message[HEADER * 8:].view(self.dtype).view(1, 1, self.hidden_size).clone()


@dataclass
class Sent:
    """An isend and the tensor it reads from, which must outlive it."""

    work: object
    tensor: torch.Tensor

    def wait(self) -> None:
        self.work.wait()


def sync_device(device: str) -> None:
    """Wait for queued GPU work, so a timestamp says when the work ended, not when it was queued."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def load_stage_weights(spec: PipelineSpec, device: str) -> StagedModel:
    """The model's weights alone (workers need no tokenizer), as `load_model` loads them."""
    dtype = getattr(torch, spec.dtype) if spec.dtype else default_dtype(spec.device)
    return load_weights(spec.model, device=device, dtype=dtype)


def weights_fingerprint(model: StagedModel, layers: range) -> float:
    """Sum of |w| over the decoder layers `layers` (and the LM head's, seen by the last stage
    and by the caller alike): equal weights give equal sums, up to summation order."""
    total = sum(p.detach().double().abs().sum().item() for i in layers for p in model.layers[i].parameters())
    if layers.stop == model.num_layers:
        total += model.hf_model.lm_head.weight.detach().double().abs().sum().item()
    return total


def usable_cores(cgroup: str = "/sys/fs/cgroup") -> int:
    """CPU cores this process may really use: its affinity, capped by a cgroup CPU quota (a
    container on a big host sees every core but may be given two)."""
    cores = len(os.sched_getaffinity(0))
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            with open(os.path.join(cgroup, quota_file)) as f:
                fields = f.read().split()
            if period_file is not None:
                with open(os.path.join(cgroup, period_file)) as f:
                    fields.append(f.read().strip())
            quota, period = fields[0], float(fields[1])
        except (OSError, IndexError, ValueError):
            continue
        if quota not in ("max", "-1") and period > 0:
            return max(1, min(cores, math.ceil(float(quota) / period)))
        return cores
    return cores


def cores_of(rank: int, threads: int, cores: list[int]) -> set[int]:
    """Rank `rank`'s cores: [rank t, (rank+1) t) of `cores`, wrapping round when there are too few."""
    return {cores[(rank * threads + i) % len(cores)] for i in range(threads)}


def pin_threads(cores: set[int]) -> None:
    """Set the affinity of every thread of this process (sched_setaffinity(0) moves only the caller's)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # the thread ended meanwhile
            pass
