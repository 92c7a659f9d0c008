"""What the processes of a pipeline say to each other: the spec every rank builds, the errors
(`PipelineError`, `PipelineBusy`, defined in `..base`), the process groups, the control message and its header,
the coordinator's outbox, and a remote worker's clock offset measured by pings.

Boundary: messages only, no decoding, no placement, no process management; the coordinator
(`pipeline`, rank 0) and the workers (`worker`, ranks 1..K-1) both build on it.

Control message (bytes, one fixed size): a `Header` of int64 fields, then room for one hidden
state. A WORK header carries one worker's part of the schedule (`schedule.WorkerPart`). Stage
1's output rides to rank 1 *attached* to rank 1's next control message (inline when it is one
position wide, else in a message right after it), not sent on its own the moment stage 1
finishes: a message that crosses stage K's report on the wire makes gloo's I/O threads spin,
which cost a PPSD slot almost as much again (docs/distributed.md).
A report (float32) is [start, end (two float64 as four float32), final logits...].
"""

from __future__ import annotations

import struct
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..base import PipelineBusy, PipelineError  # noqa: F401 - the errors of these messages' pool, importable from here
from ..schedule import ITEM_KINDS, Item, WorkerPart

WORK, ROLLBACK, PING, SHUTDOWN = 1, 2, 3, 4
PING_SECONDS = 1.0  # an idle worker answers a PING in well under a millisecond; a frozen one never
FOREVER = timedelta(days=365)  # an idle worker waits for its next request as long as it takes
GROUPS: dict = {}  # this process's groups ("calls", "hidden") and whether GPU tensors go via host ("staged")


@dataclass(frozen=True)
class PipelineSpec:
    """What every worker loads and how the workers are placed.

    `device` "cpu": rank k is pinned to cores [k t, (k+1) t) of the caller's, t =
    `threads_per_worker` (wrapping round when there are fewer cores than K t); rank 0 (the
    caller, stage 1) only while a run lasts, with t torch threads. "cuda": rank
    k gets cuda:k mod the GPU count; on one GPU every rank shares cuda:0 as a separate process.
    """

    model: str  # path or hub id the workers load (stage 1 uses the caller's StagedModel)
    partition: tuple[range, ...]
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


def wire_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as it goes on the wire: via host memory when the GPUs cannot talk directly."""
    return tensor.contiguous().cpu() if GROUPS["staged"] else tensor.contiguous()


class Header(NamedTuple):
    """The int64 fields that open every control message (`_replace` to fill them in)."""

    op: int  # WORK, ROLLBACK, PING or SHUTDOWN
    position: int = 0  # WORK: run the first `width` positions held (0: do not run), which start here
    width: int = 0
    kind: int = 0  # and are of this kind (index into ITEM_KINDS)
    receive: int = 0  # the previous worker's output arrives: 0 not, 1 after the run, 2 before it
    in_width: int = 0  # its positions
    length: int = 0  # ROLLBACK: positions to keep
    attached: int = 0  # positions of stage 1's output attached to this message (rank 1)

    @classmethod
    def work(cls, part: WorkerPart) -> "Header":
        run = part.run or Item(0, 0, ITEM_KINDS[0], 0)
        return cls(WORK, position=run.position, width=run.width, kind=ITEM_KINDS.index(run.kind),
                   receive=0 if not part.incoming else 2 if part.before else 1, in_width=part.incoming)


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


class Outbox:
    """The coordinator's sends to each worker, never waited on when posted (a gloo send
    completes only once the receiver takes it, so a hung worker would block us; its silence
    shows as a late report instead), and released once a report proves them delivered."""

    def __init__(self, workers: range) -> None:
        self._sent: dict[int, deque[Sent]] = {k: deque() for k in workers}
        self.posted = {k: 0 for k in workers}  # messages ever sent to rank k
        self._released = {k: 0 for k in workers}  # of which known delivered

    def post(self, tensor: torch.Tensor, k: int, group=None) -> None:
        self._sent[k].append(Sent(dist.isend(tensor, dst=k, group=group), tensor))
        self.posted[k] += 1

    def delivered(self, k: int, count: int) -> None:
        """Worker k reported, so it took the first `count` messages we ever sent it: release them.
        (Not those sent since: waiting for their transfer would put it on the critical path.)"""
        while self._released[k] < count:
            self._sent[k].popleft().wait()
            self._released[k] += 1


def clock_offset(control: Control, k: int, rounds: int = 8) -> float:
    """Worker k's clock minus ours, from the ping with the shortest round trip (NTP-style)."""
    best = (float("inf"), 0.0)
    answer = torch.empty(1, dtype=torch.float64)
    for _ in range(rounds):
        sent = time.perf_counter()
        dist.send(control.pack(Header(PING)), dst=k)  # blocks until k takes it: startup only
        dist.recv(answer, src=k, group=GROUPS["calls"])
        back = time.perf_counter()
        best = min(best, (back - sent, float(answer) - (sent + back) / 2))
    return best[1]
