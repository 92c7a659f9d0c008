"""Real pipeline-parallel execution: one worker process per stage, over torch.distributed.

Boundary: `DistributedExecutor` implements the `Executor` protocol of ppsd/executor.py with K
worker processes; it knows nothing of drafts or acceptance (the decoders, unchanged, decide).

- The calling process is the coordinator, rank 0. It holds no weights: it runs the decoder's
  state machine and sends each worker a small control message per call. Why no stage there:
  the caller (CLI, web app) stays unpinned and responsive, every stage runs the same worker
  code pinned the same way, and under torchrun rank 0 can live on any host. The cost is two
  small messages per slot (feed out, exit logits back).
- Worker k (rank k) loads the model, keeps only stage k's layers (plus embeddings and exit head
  for stage 1, final norm and LM head for stage K) and its own `KVCache`. Hidden states flow
  worker k -> k+1 by point-to-point send/recv (gloo on CPU; NCCL between distinct GPUs; gloo
  through host memory when the workers share one GPU). Stage 1's exit logits and stage K's final
  logits come back to rank 0 together with each worker's timestamps.
- The coordinator mirrors what is queued before each stage (position, token, kind, width), so
  it builds the same events as the in-process executor; only their times differ (measured where
  each stage ran, on one clock, seconds since the run began: the trace is `concurrent`).
- Lifecycle: workers start once and serve many runs; `close()` (also at exit, and on any error)
  stops them. A worker that dies breaks its sockets, so the waiting rank fails at once; one that
  hangs trips the per-call timeout. Either way the pool is torn down, no process is left, and a
  `PipelineError` names the stage.

Control message (int64): [op, run, merge, incoming, in_position, in_width, in_kind, position,
n_tokens, kind, token]. A report (float64) is [start, end, logits...].
"""

from __future__ import annotations

import atexit
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from .config import DecodeConfig, stage_layers
from .executor import Feed, Output
from .model import KVCache, StagedModel
from .steps import Event

WORK, ROLLBACK, PING, SHUTDOWN = 1, 2, 3, 4
KINDS = ("prefill", "draft", "verify")
HEADER = 11
FOREVER = timedelta(days=365)  # an idle worker waits for its next request as long as it takes


class PipelineError(RuntimeError):
    """A worker died, hung or failed; the pool has been shut down."""


@dataclass(frozen=True)
class PipelineSpec:
    """What every worker loads and how the workers are placed.

    `device` "cpu": worker k gets `threads_per_worker` cores of its own (wrapping round when there
    are fewer cores than K * threads). "cuda": worker k gets cuda:(k-1) mod the GPU count; on one
    GPU all workers share cuda:0 as separate processes.
    """

    model: str
    stages: tuple[range, ...]
    device: str = "cpu"
    dtype: str | None = None  # None: the library default for the device
    exit_head: str | None = None  # a trained head directory (ppsd.heads), loaded by stage 1
    threads_per_worker: int = 1
    timeout: float = 30.0  # seconds one call may wait for a worker
    startup_timeout: float = 300.0  # seconds to load the model and meet


@dataclass
class _Queued:
    """The coordinator's record of an item waiting before a stage (its hidden state is on the worker)."""

    position: int
    token_id: int
    kind: str
    width: int


@dataclass
class _Call:
    """What one executor call asks of each worker (index k = stage k+1)."""

    headers: list[list[int] | None]
    tokens: tuple[int, ...] = ()
    ran: list[int] = field(default_factory=list)  # stages that compute, in recording order
    items: dict[int, _Queued] = field(default_factory=dict)  # what each of them computes


class DistributedExecutor:
    """K worker processes, one per stage; the stages of one `slot` compute at the same time."""

    concurrent = True

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self.stages = spec.stages
        self.device = spec.device
        self.lock = threading.Lock()  # one run at a time: callers hold it around a whole generate
        self.vocab_size = 0
        self._processes: list = []
        self._offsets = [0.0] * (len(spec.stages) + 1)  # worker clock minus coordinator clock
        self._origin = time.monotonic()
        self._queues: list[list[_Queued]] = [[] for _ in spec.stages]
        self._outbox: dict[int, list[_Sent]] = {k: [] for k in range(1, len(spec.stages) + 1)}
        self._started = False
        self._closed = False
        self._broken = False  # a failed group: kill the workers, send them nothing

    # Lifecycle -----------------------------------------------------------------------------

    def start(self) -> "DistributedExecutor":
        """Spawn the K workers, wait until each has loaded its stage, and join them in one group."""
        if self._started:
            return self
        if dist.is_initialized():
            raise PipelineError("torch.distributed is already initialised in this process: "
                                "close the other pipeline first (one pool per process)")
        self._started = True
        _POOLS.add(self)
        store = dist.TCPStore("127.0.0.1", 0, len(self.stages) + 1, is_master=True,
                              timeout=timedelta(seconds=self.spec.startup_timeout), wait_for_workers=False)
        context = _process_context()
        pipes = []
        try:
            for k in range(1, len(self.stages) + 1):
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_spawned_worker, name=f"ppsd-stage-{k}", daemon=True,
                                          args=(k, self.spec, store.port, sender))
                process.start()
                sender.close()
                self._processes.append(process)
                pipes.append(receiver)
            self._await_loaded(pipes)
            _init_group(self.spec, rank=0, world=len(self.stages) + 1, store=store)
            self._hello()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every worker (politely, then by force) and leave torch.distributed as it was."""
        if self._closed:
            return
        self._closed = True
        _POOLS.discard(self)
        if dist.is_initialized() and not self._broken and all(p.is_alive() for p in self._processes):
            try:
                self._broadcast(_header(SHUTDOWN))
            except Exception:  # noqa: BLE001 - a broken pool is killed below anyway
                pass
        deadline = time.monotonic() + (0.0 if self._broken else 5.0)  # a broken pool is killed at once
        for process in self._processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self._processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        if dist.is_initialized():
            dist.destroy_process_group()
        _GROUPS.clear()

    @property
    def alive(self) -> bool:
        return self._started and not self._closed

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def __enter__(self) -> "DistributedExecutor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # The Executor protocol ---------------------------------------------------------------

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        call = _Call(headers=[None] * len(self.stages))
        for k in reversed(range(len(self.stages))):  # later stages take their input first
            if k == 0 and feed is not None:
                self._plan_stage1(call, feed)
            elif k > 0 and self._queues[k]:
                self._plan(call, k, [self._queues[k].pop(0)], merge=False)
        return self._run(call, feed, slot=slot)

    def push(self, feed: Feed) -> Output:
        if feed.position == 0:
            self.reset()  # a prefill from position 0 begins a new run
        call = _Call(headers=[None] * len(self.stages))
        self._plan_stage1(call, feed)
        return self._run(call, feed, slot=None)

    def flow(self) -> Output:
        call = _Call(headers=[None] * len(self.stages))
        for k in range(1, len(self.stages)):
            queued, self._queues[k] = self._queues[k], []
            if queued:
                self._plan(call, k, queued, merge=True)
        return self._run(call, None, slot=None)

    def rollback(self, length: int) -> None:
        self._queues = [[] for _ in self.stages]
        self._guarded(lambda: self._broadcast(_header(ROLLBACK, position=length)))

    def _broadcast(self, header: list[int]) -> None:
        for k in range(1, len(self.stages) + 1):
            self._post(header, k)

    def _post(self, message: list[int] | tuple[int, ...], k: int) -> None:
        """Send a control message without waiting: a gloo send completes only once the receiver
        takes it, so a hung worker would block us forever; its silence shows as a late report."""
        tensor = torch.tensor(message, dtype=torch.long)
        self._outbox[k].append(_Sent(dist.isend(tensor, dst=k), tensor))

    def _delivered(self, k: int) -> None:
        """Worker k reported, so it took every message we sent it before: release them."""
        for sent in self._outbox[k]:
            sent.wait()
        self._outbox[k].clear()

    def reset(self) -> None:
        """Empty every cache and queue and restart the clock: the next call begins a run."""
        self.rollback(0)
        self._origin = time.monotonic()

    # Planning: the coordinator's mirror of the queues -------------------------------------

    def _plan_stage1(self, call: _Call, feed: Feed) -> None:
        header = self._header_for(call, 0)
        header[1] = 1
        header[7:11] = [feed.position, len(feed.tokens), KINDS.index(feed.kind), feed.tokens[0]]
        call.tokens = feed.tokens
        call.ran.append(0)
        kind = "prefill" if feed.kind == "prefill" else "verify"
        call.items[0] = _Queued(feed.position, feed.tokens[0], kind, len(feed.tokens))
        self._emit(call, 0, call.items[0], after=True)

    def _plan(self, call: _Call, k: int, items: list[_Queued], *, merge: bool) -> None:
        header = self._header_for(call, k)
        header[1:3] = [1, int(merge)]
        call.ran.append(k)
        call.items[k] = _Queued(items[0].position, items[0].token_id, items[0].kind, sum(i.width for i in items))
        self._emit(call, k, call.items[k], after=not merge)

    def _emit(self, call: _Call, k: int, item: _Queued, *, after: bool) -> None:
        """Stage k's output goes to stage k+1: it receives it after its own work in a slot
        (`after`), before it in a flow (where it then runs over everything queued)."""
        if k + 1 < len(self.stages):
            self._queues[k + 1].append(item)
            header = self._header_for(call, k + 1)
            header[3:7] = [1 if after else 2, item.position, item.width, KINDS.index(item.kind)]

    @staticmethod
    def _header_for(call: _Call, k: int) -> list[int]:
        if call.headers[k] is None:
            call.headers[k] = _header(WORK)
        return call.headers[k]

    # Running a call --------------------------------------------------------------------------

    def _run(self, call: _Call, feed: Feed | None, *, slot: int | None) -> Output:
        if not self.alive:
            raise PipelineError("the pipeline is not running: start() it (or make a new one)")
        return self._guarded(lambda: self._exchange(call, feed, slot))

    def _exchange(self, call: _Call, feed: Feed | None, slot: int | None) -> Output:
        for k, header in enumerate(call.headers):
            if header is not None:
                self._post(header, k + 1)
                if k == 0 and header[8] > 1:
                    self._post(call.tokens, 1)
        reports = {}
        for k in call.ran:
            reports[k] = torch.empty(2 + self._payload(call, k), dtype=torch.float64)
            _recv(reports[k], src=k + 1, group=_GROUPS["calls"])
            self._delivered(k + 1)
        results: dict = {"events": []}
        for k in call.ran:  # recording order: later stages first in a slot, earlier first in a flow
            report = reports[k]
            start, end = (float(t) - self._offsets[k + 1] - self._origin for t in report[:2])
            results["events"].append(self._event(call, k, feed, start, end, slot))
            payload = report[2:].float()
            if k == 0 and feed.kind == "draft":
                results["exit_logits"] = payload
            elif k == len(self.stages) - 1:
                logits = payload.view(-1, self.vocab_size)
                results["final_position"] = call.items[k].position + call.items[k].width - len(logits)
                results["final_logits"] = logits
        return Output(events=tuple(results.pop("events")), **results)

    def _payload(self, call: _Call, k: int) -> int:
        """Number of logits in stage k's report: V for a draft, T x V at the last stage."""
        if k == 0:
            return self.vocab_size if call.headers[0][9] == KINDS.index("draft") else 0
        if k < len(self.stages) - 1:
            return 0
        item = call.items[k]
        return self.vocab_size * (1 if item.kind == "prefill" else item.width)

    @staticmethod
    def _event(call: _Call, k: int, feed: Feed | None, start: float, end: float, slot: int | None) -> Event:
        if k == 0:
            return Event(stage=1, position=feed.position, kind=feed.kind, start=start, end=end,
                         token_id=feed.tokens[0], width=len(feed.tokens), slot=slot, from_final=feed.from_final)
        item = call.items[k]
        return Event(stage=k + 1, position=item.position, kind=item.kind, start=start, end=end,
                     token_id=item.token_id, width=item.width, slot=slot)

    def _guarded(self, action):
        """Run `action`; any failure of the group tears the pool down and names the culprit."""
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - gloo raises RuntimeError subclasses
            reason = self._diagnose(error)
            self._broken = True
            self.close()
            raise PipelineError(reason) from error

    def _diagnose(self, error: Exception) -> str:
        time.sleep(0.2)  # let a dying worker finish dying, so it is named rather than its neighbour
        for k, process in enumerate(self._processes, start=1):
            if not process.is_alive():
                return (f"pipeline worker for stage {k} (pid {process.pid}) died "
                        f"({_exit_text(process.exitcode)}); the pipeline was shut down")
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        return (f"a pipeline worker did not answer within {self.spec.timeout:g} s or failed ({first}); "
                f"the pipeline was shut down")

    # Startup ---------------------------------------------------------------------------------

    def _await_loaded(self, pipes: list) -> None:
        """Wait for every worker's 'loaded' (or its load error), watching that it stays alive."""
        deadline = time.monotonic() + self.spec.startup_timeout
        waiting = dict(enumerate(pipes, start=1))
        while waiting:
            for k, pipe in list(waiting.items()):
                if pipe.poll():
                    try:
                        message = pipe.recv()
                    except EOFError:
                        message = None
                    if message != "loaded":
                        if isinstance(message, str) and message.startswith("error: "):
                            raise ValueError(message.removeprefix("error: "))
                        process = self._processes[k - 1]
                        process.join(timeout=1.0)
                        raise PipelineError(f"pipeline worker for stage {k} died while loading "
                                            f"({_exit_text(process.exitcode)})")
                    del waiting[k]
            if time.monotonic() > deadline:
                raise PipelineError(f"pipeline workers did not load within {self.spec.startup_timeout:g} s")
            multiprocessing.connection.wait(list(waiting.values()), timeout=0.2)

    def _hello(self) -> None:
        """Learn the workers' vocabulary and hosts; measure remote clocks' offsets."""
        hellos: list = [None] * (len(self.stages) + 1)
        dist.all_gather_object(hellos, {"host": socket.gethostname(), "vocab": 0})
        self.vocab_size = hellos[1]["vocab"]
        for k in range(1, len(self.stages) + 1):
            if hellos[k]["host"] != socket.gethostname():
                self._offsets[k] = _clock_offset(k)


# Process-wide bookkeeping: torch.distributed has one default group per process. --------------

_POOLS: set[DistributedExecutor] = set()
_GROUPS: dict = {}
_SHARED: dict = {}


@atexit.register
def close_all() -> None:
    """Stop every pipeline this process started (also run at interpreter exit)."""
    for pool in list(_POOLS):
        pool.close()


def make_executor(model: StagedModel, config: DecodeConfig, *, exit_head: str | None = None,
                  threads_per_worker: int = 1, timeout: float = 30.0) -> DistributedExecutor:
    """The process's pipeline for `model` (loaded by each worker from `model.info.name`) and
    `config`'s stages, started once and reused while the settings match; otherwise the old pool
    is closed and a new one started."""
    config = config.resolved(model.num_layers)
    spec = PipelineSpec(
        model=model.info.name, stages=stage_layers(model.num_layers, config.exit_layer, config.stages),
        device=model.info.device.split(":")[0], dtype=model.info.dtype, exit_head=exit_head,
        threads_per_worker=threads_per_worker, timeout=timeout,
    )
    current = _SHARED.get("pool")
    if current is not None and current.alive and current.spec == spec:
        return current
    if current is not None:
        current.close()
    _SHARED["pool"] = DistributedExecutor(spec).start()
    return _SHARED["pool"]


def _init_group(spec: PipelineSpec, *, rank: int, world: int, store=None) -> None:
    """Default group: control messages (waits forever while idle). `calls`: hidden states and
    reports (each wait bounded by `spec.timeout`). `hidden`: NCCL between distinct GPUs."""
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=FOREVER)
    _GROUPS["calls"] = dist.new_group(backend="gloo", timeout=timedelta(seconds=spec.timeout))
    gpus = torch.cuda.device_count() if spec.device == "cuda" else 0
    nccl = gpus >= world - 1 and gpus > 1
    workers = list(range(1, world))
    hidden = dist.new_group(workers, backend="nccl", timeout=timedelta(seconds=spec.timeout)) if nccl else None
    _GROUPS["hidden"] = hidden or _GROUPS["calls"]
    _GROUPS["staged"] = hidden is None and spec.device == "cuda"  # through host memory


def _recv(tensor: torch.Tensor, *, src: int, group) -> None:
    dist.recv(tensor, src=src, group=group)


def _header(op: int, *, position: int = 0) -> list[int]:
    header = [op] + [0] * (HEADER - 1)
    header[7] = position
    return header


def _send_header(header: list[int], k: int) -> None:
    dist.send(torch.tensor(header, dtype=torch.long), dst=k)  # blocks until k takes it: startup only


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _clock_offset(k: int, rounds: int = 8) -> float:
    """Worker k's clock minus ours, from the ping with the shortest round trip (NTP-style)."""
    best = (float("inf"), 0.0)
    answer = torch.empty(1, dtype=torch.float64)
    for _ in range(rounds):
        sent = time.monotonic()
        _send_header(_header(PING), k)
        _recv(answer, src=k, group=_GROUPS["calls"])
        back = time.monotonic()
        best = min(best, (back - sent, float(answer) - (sent + back) / 2))
    return best[1]


# The worker ----------------------------------------------------------------------------------


def _process_context():
    """Workers fork from a clean server process that has imported torch and transformers once
    (not from the caller, whose threads make fork unsafe): a new pool starts in the time it
    takes to load the weights, not K times the imports."""
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ppsd.distributed", "transformers.models.llama.modeling_llama",
                                    "transformers.models.auto.modeling_auto"])
    return context


def _spawned_worker(rank: int, spec: PipelineSpec, port: int, pipe) -> None:
    """Entry point of a locally started worker: pin, load, report, then serve until shut down."""
    _die_with_parent(os.getppid())
    try:
        worker = _Worker(spec, rank, len(spec.stages))
    except ValueError as error:  # a bad model path or head: the coordinator shows the reason
        pipe.send(f"error: {error}")
        sys.exit(1)
    pipe.send("loaded")
    pipe.close()
    store = dist.TCPStore("127.0.0.1", port, len(spec.stages) + 1, is_master=False,
                          timeout=timedelta(seconds=spec.startup_timeout))
    _init_group(spec, rank=rank, world=len(spec.stages) + 1, store=store)
    _serve_quietly(worker, rank)


def _serve_quietly(worker: "_Worker", rank: int) -> None:
    """Serve; on failure (mostly: the coordinator or a neighbour went away) say so in one line
    with where it happened, and exit 1: the coordinator raises the PipelineError."""
    try:
        worker.serve()
    except Exception as error:  # noqa: BLE001
        where = traceback.extract_tb(error.__traceback__)[-1]
        first = (str(error).strip().splitlines() or [""])[0][:300]
        print(f"ppsd pipeline stage {rank} stopped: {type(error).__name__}: {first} "
              f"(at {os.path.basename(where.filename)}:{where.lineno})", file=sys.stderr)
        sys.exit(1)


def run_worker(spec: PipelineSpec) -> None:
    """Entry point of a torchrun rank k >= 1 (rank 0 is the coordinator): env:// rendezvous."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    worker = _Worker(spec, rank, world - 1)
    _init_group(spec, rank=rank, world=world)
    _serve_quietly(worker, rank)


class _Worker:
    """Stage `rank` of `stages`: its layers, its KV cache, its queue of incoming hidden states."""

    def __init__(self, spec: PipelineSpec, rank: int, stages: int) -> None:
        from transformers.utils import logging

        logging.disable_progress_bar()  # K workers drawing bars over each other helps nobody
        self.k, self.last = rank - 1, rank == stages
        self.layers = spec.stages[self.k]
        self.device = _place(spec, rank)
        model = _load_weights(spec, self.device)
        if spec.exit_head and self.k == 0:
            from .heads import load_exit_head

            model = model.with_exit_head(load_exit_head(spec.exit_head, model, self.layers.stop))
        _keep_stage(model, self.layers, first=self.k == 0, last=self.last)
        if self.k > 0:
            model.exit_head = None  # only stage 1 drafts
        self.model = model
        self.cache = KVCache()
        self.queue: deque[tuple[int, str, torch.Tensor]] = deque()  # (position, kind, (1, T, hidden))
        self.hidden_size = model.hf_model.config.hidden_size
        self.dtype = next(model.hf_model.parameters()).dtype

    def serve(self) -> None:
        dist.all_gather_object([None] * dist.get_world_size(),
                               {"host": socket.gethostname(), "vocab": self.model.info.vocab_size})
        header = torch.empty(HEADER, dtype=torch.long)
        with torch.inference_mode():
            while True:
                dist.recv(header, src=0)
                op = int(header[0])
                if op == SHUTDOWN:
                    break
                if op == ROLLBACK:
                    self.queue.clear()
                    self.cache.truncate(int(header[7]))
                elif op == PING:
                    dist.send(torch.tensor([time.monotonic()], dtype=torch.float64), dst=0, group=_GROUPS["calls"])
                else:
                    self._work(header.tolist())
        dist.destroy_process_group()

    def _work(self, h: list[int]) -> None:
        run, merge, incoming = h[1], h[2], h[3]
        if incoming == 2:  # a flow: the previous stage's output joins this stage's work
            self.queue.append(self._receive(h))
        pending = self._post_receive(h) if incoming == 1 else None
        sends = []
        if run:
            start = time.monotonic()
            hidden, position, kind, logits = self._compute(h, merge)
            if not self.last:
                sends.append(self._send_hidden(hidden))
            if self.device.startswith("cuda"):
                torch.cuda.synchronize(self.device)
            end = time.monotonic()
            report = torch.tensor([start, end], dtype=torch.float64)
            if logits is not None:
                report = torch.cat([report, logits.reshape(-1).double().cpu()])
            dist.send(report, dst=0, group=_GROUPS["calls"])
        if pending is not None:
            work, buffer, position, kind = pending
            work.wait()
            self.queue.append((position, kind, buffer.to(self.device)))
        for work in sends:
            work.wait()

    def _compute(self, h: list[int], merge: bool):
        """Run this stage on its input; return (hidden, position, kind, logits to report)."""
        if self.k == 0:
            position, count, kind = h[7], h[8], KINDS[h[9]]
            tokens = [h[10]]
            if count > 1:
                buffer = torch.empty(count, dtype=torch.long)
                dist.recv(buffer, src=0)
                tokens = buffer.tolist()
            hidden = self.model.embed(tokens)
            hidden = self.model.run_layers(hidden, self.layers, position=position, cache=self.cache)
            logits = None
            if kind == "draft":
                logits = self.model.exit_logits(hidden, position=position, cache=self.cache)
            return hidden, position, kind, logits
        if merge:
            items = list(self.queue)
            self.queue.clear()
            position, kind = items[0][0], items[0][1]
            hidden = torch.cat([item[2] for item in items], dim=1)
        else:
            position, kind, hidden = self.queue.popleft()
        hidden = self.model.run_layers(hidden, self.layers, position=position, cache=self.cache)
        return hidden, position, kind, self._final(hidden, kind) if self.last else None

    def _final(self, hidden: torch.Tensor, kind: str) -> torch.Tensor:
        # Prefill only needs the last position's logits: skip the LM head on the rest.
        return self.model.final_logits(hidden[:, -1:] if kind == "prefill" else hidden)

    def _send_hidden(self, hidden: torch.Tensor):
        group = _GROUPS["hidden"]
        tensor = hidden.contiguous().cpu() if _GROUPS["staged"] else hidden.contiguous()
        return _Sent(dist.isend(tensor, dst=self.k + 2, group=group), tensor)

    def _post_receive(self, h: list[int]):
        position, width, kind = h[4], h[5], KINDS[h[6]]
        on_device = not _GROUPS["staged"]
        buffer = torch.empty((1, width, self.hidden_size), dtype=self.dtype,
                             device=self.device if on_device else "cpu")
        return dist.irecv(buffer, src=self.k, group=_GROUPS["hidden"]), buffer, position, kind

    def _receive(self, h: list[int]) -> tuple[int, str, torch.Tensor]:
        work, buffer, position, kind = self._post_receive(h)
        work.wait()
        return position, kind, buffer.to(self.device)


@dataclass
class _Sent:
    """An isend and the tensor it reads from, which must outlive it."""

    work: object
    tensor: torch.Tensor

    def wait(self) -> None:
        self.work.wait()


def _load_weights(spec: PipelineSpec, device: str) -> StagedModel:
    """The model's weights alone (workers need no tokenizer), as `load_model` loads them."""
    from transformers import AutoModelForCausalLM

    from .model import default_dtype

    dtype = getattr(torch, spec.dtype) if spec.dtype else default_dtype(spec.device)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            spec.model, dtype=dtype, trust_remote_code=False, attn_implementation="sdpa").to(device)
    except Exception as error:  # noqa: BLE001 - every loader failure becomes one clear message
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise ValueError(f"cannot load model {spec.model!r}: {first}") from None
    return StagedModel(hf_model, name=spec.model)  # raises ValueError on an unsupported architecture


def _keep_stage(model: StagedModel, layers: range, *, first: bool, last: bool) -> None:
    """Free every decoder layer outside `layers`; embeddings only on stage 1, heads where used."""
    decoder = model.hf_model.model
    for index in range(len(decoder.layers)):
        if index not in layers:
            decoder.layers[index] = torch.nn.Identity()
    if not first:
        decoder.embed_tokens = None
    shared_exit = first and getattr(model.exit_head, "lm_head", None) is model.hf_model.lm_head
    if not (last or shared_exit):
        model.hf_model.lm_head = torch.nn.Identity()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _place(spec: PipelineSpec, rank: int) -> str:
    """Pin this worker: its own cores (CPU) or its own GPU (cuda:(rank-1) mod count)."""
    if spec.device == "cuda":
        device = f"cuda:{(rank - 1) % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
        torch.set_num_threads(spec.threads_per_worker)
        return device
    cores = sorted(os.sched_getaffinity(0))
    t = spec.threads_per_worker
    mine = {cores[((rank - 1) * t + i) % len(cores)] for i in range(t)}
    os.sched_setaffinity(0, mine)
    torch.set_num_threads(t)
    return "cpu"


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
