"""One pipeline stage in its own process: rank k >= 1 holds stage k+1's layers (and, last, the
final norm and LM head) with its own KV cache, pinned to its own cores or GPU, and serves the
coordinator's control messages until it is told to stop, its peers go away, or its parent dies.

Boundary: started by `processes` (locally, from a fork server) or by torchrun; speaks the
messages of `wire`; replays its part of the `schedule` as each WORK header gives it; knows
nothing of drafts or acceptance.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist

from ...static_cache import StaticKVCache
from ..base import logit_width, stage_forward
from .placement import keep_stage, load_stage_weights, place, sync_device, weights_fingerprint
from ..schedule import ITEM_KINDS
from .wire import (GROUPS, PING, ROLLBACK, SHUTDOWN, Control, Header, PipelineSpec, Sent, init_group,
                   wire_tensor)


def spawned_worker(rank: int, spec: PipelineSpec, port: int, pipe) -> None:
    """Entry point of a locally started worker: pin, load, report, then serve until shut down."""
    # Ctrl-C in a terminal reaches the whole process group: the coordinator shuts its workers
    # down (or they die with it), so a worker printing its own KeyboardInterrupt only adds noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(os.getppid())
    try:
        worker = _Worker(spec, rank, len(spec.partition))
    except ValueError as error:  # a bad model path or head: the coordinator shows the reason
        pipe.send(f"error: {error}")
        sys.exit(1)
    pipe.send("loaded")
    pipe.close()
    store = dist.TCPStore("127.0.0.1", port, len(spec.partition), is_master=False,
                          timeout=timedelta(seconds=spec.startup_timeout))
    init_group(spec, rank=rank, world=len(spec.partition), store=store)
    _serve_quietly(worker, rank)


def _serve_quietly(worker: "_Worker", rank: int) -> None:
    """Serve; on failure (mostly: the coordinator or a neighbour went away) say so in one line
    with where it happened, and exit 1: the coordinator raises the PipelineError."""
    try:
        worker.serve()
    except Exception as error:  # noqa: BLE001
        where = traceback.extract_tb(error.__traceback__)[-1]
        first = (str(error).strip().splitlines() or [""])[0][:300]
        print(f"ppsd pipeline stage {rank + 1} stopped: {type(error).__name__}: {first} "
              f"(at {os.path.basename(where.filename)}:{where.lineno})", file=sys.stderr)
        sys.exit(1)


def run_worker(spec: PipelineSpec, rank: int, *, local_rank: int) -> None:
    """Entry point of torchrun rank k >= 1, stage k+1 (rank 0 is the coordinator, `join`);
    `local_rank` (this host's) picks the GPU or the cores."""
    worker = _Worker(spec, rank, len(spec.partition), local_rank=local_rank)
    init_group(spec, rank=rank, world=len(spec.partition))
    _serve_quietly(worker, rank)


class _Worker:
    """Stage k+1 (rank k >= 1): its layers, its KV cache, the hidden states waiting for it."""

    def __init__(self, spec: PipelineSpec, rank: int, num_stages: int, *, local_rank: int | None = None) -> None:
        from transformers.utils import logging

        logging.disable_progress_bar()  # K workers drawing bars over each other helps nobody
        self.k, self.last = rank, rank == num_stages - 1
        self.partition, self.layers = spec.partition, spec.partition[rank]
        self.device = place(spec, rank if local_rank is None else local_rank)
        model = load_stage_weights(spec, self.device)
        self.weights = weights_fingerprint(model, self.layers)
        keep_stage(model, self.layers, last=self.last)
        self.model = model
        self.cache = StaticKVCache.for_model(model.hf_model, self.layers)  # our layers' alone
        self.queue: deque[torch.Tensor] = deque()  # (1, T, hidden) pieces, oldest first
        self.hidden_size = model.hf_model.config.hidden_size
        self.dtype = next(model.hf_model.parameters()).dtype
        self.control = Control(self.hidden_size, self.dtype)

    def serve(self) -> None:
        dist.all_gather_object([None] * dist.get_world_size(),
                               {"host": socket.gethostname(), "weights": self.weights})
        message = torch.empty(self.control.size, dtype=torch.uint8)
        with torch.inference_mode():
            while True:
                dist.recv(message, src=0)
                header = self.control.header(message)
                if header.op == SHUTDOWN:
                    break
                if header.op == ROLLBACK:
                    self.queue.clear()
                    self.cache.truncate(header.length)
                elif header.op == PING:
                    dist.send(torch.tensor([time.perf_counter()], dtype=torch.float64), dst=0, group=GROUPS["calls"])
                else:
                    self._attach(header, message)
                    self._work(header)
        dist.destroy_process_group()

    def _attach(self, h: Header, message: torch.Tensor) -> None:
        """Queue stage 1's output that came with this control message (rank 1 only)."""
        if h.attached == 1:
            self.queue.append(self.control.hidden(message).to(self.device))
        elif h.attached > 1:
            self.queue.append(self._receive(h.attached))

    def _work(self, h: Header) -> None:
        """One call's part: the previous worker's output joins our queue (before our run in a
        flow, after it in a slot), we run what the header says, and report to rank 0."""
        if h.receive == 2:
            self.queue.append(self._receive(h.in_width))
        pending = self._post_receive(h.in_width) if h.receive == 1 else None
        sent = self._run(h) if h.width else None
        if pending is not None:
            work, buffer = pending
            work.wait()
            self.queue.append(buffer.to(self.device))
        if sent is not None:
            sent.wait()

    def _run(self, h: Header) -> Sent | None:
        """Our layers over the first `h.width` positions we hold; the timestamps (and, last, the
        final logits) go to rank 0, the output to the next worker (returned: it must be waited)."""
        start = time.perf_counter()
        view = self.cache.at(self.layers, h.position, h.width)
        hidden, logits = stage_forward(self.model, self.partition, self.k, self._take(h.width), view, draft=False,
                                       logits_for=logit_width(ITEM_KINDS[h.kind], h.width))
        sync_device(self.device)
        end = time.perf_counter()
        sent = None if self.last else self._send_hidden(hidden)  # after the stamp: the next stage may start at once
        report = torch.tensor([start, end], dtype=torch.float64).view(torch.float32)
        if logits is not None:
            report = torch.cat([report, logits.reshape(-1).cpu()])
        dist.send(report, dst=0, group=GROUPS["calls"])
        return sent

    def _take(self, width: int) -> torch.Tensor:
        """The first `width` positions held, as one (1, width, hidden) tensor: whole pieces, as the
        schedule takes its items (stage 2's input comes merged as stage 2 takes it)."""
        pieces = [self.queue.popleft()]
        while sum(piece.shape[1] for piece in pieces) < width:
            pieces.append(self.queue.popleft())
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)

    def _send_hidden(self, hidden: torch.Tensor) -> Sent:
        tensor = wire_tensor(hidden)
        return Sent(dist.isend(tensor, dst=self.k + 1, group=GROUPS["hidden"]), tensor)

    def _post_receive(self, width: int) -> tuple[object, torch.Tensor]:
        """Start receiving the previous rank's (1, width, hidden) output: (the irecv, its buffer)."""
        buffer = torch.empty((1, width, self.hidden_size), dtype=self.dtype,
                             device="cpu" if GROUPS["staged"] else self.device)
        return dist.irecv(buffer, src=self.k - 1, group=GROUPS["hidden"]), buffer

    def _receive(self, width: int) -> torch.Tensor:
        work, buffer = self._post_receive(width)
        work.wait()
        return buffer.to(self.device)


def _die_with_parent(parent: int) -> None:
    """No orphans: exit as soon as the parent (the fork server, which itself exits with the
    coordinator) is gone. The coordinator's death also breaks our sockets (the blocked receive
    fails), but a worker busy elsewhere is caught by this watchdog.
    (PR_SET_PDEATHSIG is not used: it fires when the parent *thread* ends, and a web app may
    start the pool from a short-lived request thread.)"""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="ppsd-parent-watch").start()
    if os.getppid() != parent:
        sys.exit(1)
