"""Real pipeline-parallel execution: one process per stage, over torch.distributed.

Boundary: `DistributedExecutor` implements the `Executor` protocol of ppsd/executor.py with K
processes; it knows nothing of drafts or acceptance (the decoders, unchanged, decide).

- Rank 0 is the calling process (the coordinator): it runs the decoder's state machine and
  computes stage 1 itself (embeddings, layers [0, E), exit head) with the caller's `StagedModel`.
  Why stage 1 here and not in a worker: in a PPSD slot the coordinator must see stage 1's exit
  logits before it can feed the next draft, so stage 1 *is* the critical path; computed in
  place it costs no message and no process wake-up, and stage K's work (started by a message
  sent before stage 1 computes) hides behind it. It also means exactly K processes compute
  (on this 2-core machine no third process competes for the cores), a trained exit head needs
  no shipping (only stage 1 drafts), and under torchrun the world is just the K stages.
- Worker k (rank k, stage k+1) loads the weights from the same path and dtype, keeps only its
  layers (plus the final norm and LM head on stage K) and its own `KVCache`, and is pinned to
  its own cores (or GPU). Hidden states flow rank k -> k+1 by point-to-point send/recv (gloo on
  CPU; NCCL between distinct GPUs; gloo through host memory when the ranks share one GPU).
  Stage K's final logits come back to rank 0 with each worker's timestamps.
- The coordinator mirrors what is queued before each stage (position, token, kind, width), so
  it builds the same events as the in-process executor; only their times differ (measured where
  each stage ran, on one clock, seconds since the run began: the trace is `concurrent`).
- Run-ahead: once stage 1 has computed in a slot, the next slot's worker work (which depends on
  the queues alone) is launched before this slot's reports are read; a rollback drops it.
- `begin`/`end` bracket a run: caches emptied, the run's stopwatch, and (CPU) every thread of the
  caller's process pinned to stage 1's cores for the run's length.
- Lifecycle: workers start once and serve many runs; `close()` (also at exit, and on any error)
  stops them. A worker that dies breaks its sockets, so the waiting rank fails at once; one that
  hangs trips the per-call timeout. Either way the pool is torn down, no process is left, and a
  `PipelineError` names the stage.

Messages (`ppsd.pipeline_wire`) and the worker's side (`ppsd.pipeline_worker`) live apart.
"""

from __future__ import annotations

import atexit
import math
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from .config import DecodeConfig, stage_layers
from .executor import Feed, Output, logit_width
from .model import KVCache, StagedModel, model_config
from .pipeline_wire import (GROUPS, KINDS, PING, ROLLBACK, SHUTDOWN, WORK, Control, Header, PipelineError,
                            PipelineSpec, Sent, cores_of, init_group, pin_threads, sync_device, weights_fingerprint)
from .pipeline_worker import run_worker, spawned_worker
from .steps import Event
from .trace import Stopwatch


@dataclass
class _Queued:
    """The coordinator's record of an item waiting before a stage (its hidden state is on the worker)."""

    position: int
    token_id: int
    kind: str
    width: int


@dataclass
class _Call:
    """What one executor call asks of each stage (index k = stage k+1 = rank k; k = 0 is here)."""

    headers: list[Header | None]
    ran: list[int] = field(default_factory=list)  # stages that compute, in recording order
    items: dict[int, _Queued] = field(default_factory=dict)  # what each of them computes
    reports: dict[int, tuple[object, torch.Tensor]] = field(default_factory=dict)  # rank -> (irecv, buffer)
    taken: dict[int, int] = field(default_factory=dict)  # rank -> messages sent it before this call's report
    launched: bool = False  # control messages sent and reports awaited


class DistributedExecutor:
    """Stage 1 here, stages 2..K in worker processes; the stages of one `slot` compute at once.

    `model` (the caller's, on `spec.device`) computes stage 1; it may be swapped between runs
    for one with another exit head over the same weights.
    """

    concurrent = True

    def __init__(self, spec: PipelineSpec, model: StagedModel) -> None:
        self.spec = spec
        self.model = model
        self.stages = spec.stages
        self.device = spec.device
        self.lock = threading.Lock()  # one run at a time: callers hold it around a whole generate
        self.cache = KVCache()  # stage 1's layers and a stateful exit head's entries
        self._processes: list = []
        self._offsets = [0.0] * len(spec.stages)  # rank k's clock minus ours
        self._queues: list[list[_Queued]] = [[] for _ in spec.stages]
        self._attached: list[tuple[_Queued, torch.Tensor]] = []  # stage 1's output rank 1 has not got yet
        self._control = Control(model.hf_model.config.hidden_size, next(model.hf_model.parameters()).dtype)
        self._outbox: dict[int, deque[Sent]] = {k: deque() for k in range(1, len(spec.stages))}
        self._posted = {k: 0 for k in range(1, len(spec.stages))}  # messages ever sent to rank k
        self._released = {k: 0 for k in range(1, len(spec.stages))}  # of which known delivered
        self._ahead: _Call | None = None  # the next slot's worker work, launched early (`slot`)
        self._discarded: list[tuple[object, torch.Tensor]] = []  # reports of run-ahead work a rollback dropped
        self._started = False
        self._closed = False
        self._broken = False  # a failed group: kill the workers, send them nothing
        self._clock = Stopwatch()
        self.runs = 0  # runs begun on this pool
        self._caller: tuple[int, set[int]] | None = None  # torch threads and cores outside runs

    # Lifecycle -----------------------------------------------------------------------------

    def start(self) -> "DistributedExecutor":
        """Start the K - 1 workers, wait until each has loaded its stage, join them in one group."""
        if self._started:
            return self
        if dist.is_initialized():
            raise PipelineError("torch.distributed is already initialised in this process: "
                                "close the other pipeline first (one pool per process)")
        self._started = True
        _POOLS.add(self)
        store = dist.TCPStore("127.0.0.1", 0, len(self.stages), is_master=True,
                              timeout=timedelta(seconds=self.spec.startup_timeout), wait_for_workers=False)
        context = _process_context()
        pipes = []
        try:
            for k in range(1, len(self.stages)):
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=spawned_worker, name=f"ppsd-stage-{k + 1}", daemon=True,
                                          args=(k, self.spec, store.port, sender))
                process.start()
                sender.close()
                self._processes.append(process)
                pipes.append(receiver)
            self._await_loaded(pipes)
            init_group(self.spec, rank=0, world=len(self.stages), store=store)
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
                self._broadcast(Header(SHUTDOWN))
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
        GROUPS.clear()
        self.end()

    @property
    def alive(self) -> bool:
        return self._started and not self._closed

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers for stages 2..K."""
        return [p.pid for p in self._processes]

    def join(self) -> "DistributedExecutor":
        """Become rank 0 of a group that torchrun started (env:// rendezvous); ranks >= 1 call
        `run_worker`. The workers are not our children: `close()` shuts them down by message."""
        self._started = True
        _POOLS.add(self)
        init_group(self.spec, rank=0, world=len(self.stages))
        self._hello()
        return self

    def begin(self, stopwatch: Stopwatch) -> None:
        """A run starts: empty every cache and queue, stamp on `stopwatch`, and while it lasts
        give stage 1 (this process) the workers' thread count and, on CPU, pin every thread of
        this process (torch's, gloo's, the caller's own) to stage 1's cores, as each worker keeps
        to its own. Left free to roam, the scheduler parks them on a worker's core, and a slot
        then waits for a context switch there (measured: a PPSD run took 1.9x as long).
        `end()` gives the process its threads and cores back (between runs it is the caller's)."""
        self._check_alive()
        self._clock = stopwatch
        self.rollback(0)
        self.runs += 1
        if self._caller is None:
            self._caller = torch.get_num_threads(), os.sched_getaffinity(0)
            torch.set_num_threads(self.spec.threads_per_worker)
            if self.device == "cpu":
                pin_threads(cores_of(0, self.spec.threads_per_worker, sorted(self._caller[1])))

    def end(self) -> None:
        if self._caller is not None:
            threads, cores = self._caller
            self._caller = None
            torch.set_num_threads(threads)
            if self.device == "cpu":
                pin_threads(cores)

    def __enter__(self) -> "DistributedExecutor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # The Executor protocol ---------------------------------------------------------------

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        call, self._ahead = self._ahead or self._plan_workers(), None
        if feed is not None:
            self._plan_stage1(call, feed)  # after the workers: later stages first, in recording order
        return self._run(call, feed, slot=slot)

    def push(self, feed: Feed) -> Output:
        self._expect_no_run_ahead()
        call = _Call(headers=[None] * len(self.stages))
        self._plan_stage1(call, feed)
        return self._run(call, feed, slot=None)

    def flow(self) -> Output:
        self._expect_no_run_ahead()
        call = _Call(headers=[None] * len(self.stages))
        for k in range(1, len(self.stages)):
            queued, self._queues[k] = self._queues[k], []
            if queued:
                self._plan(call, k, queued, merge=True)
        return self._run(call, None, slot=None)

    def rollback(self, length: int) -> None:
        if self._ahead is not None:  # run-ahead work behind a correction: flushed, its reports dropped
            self._discarded.extend(self._ahead.reports.values())
            self._ahead = None
        self._queues = [[] for _ in self.stages]
        self._attached = []
        self.cache.truncate(length)
        self._guarded(lambda: self._broadcast(Header(ROLLBACK, length=length)))

    def _broadcast(self, header: Header) -> None:
        for k in range(1, len(self.stages)):
            self._post(self._control.pack(header), k)

    def _post(self, tensor: torch.Tensor, k: int, group=None) -> None:
        """Send without waiting: a gloo send completes only once the receiver takes it, so a hung
        worker would block us forever; its silence shows as a late report instead."""
        self._outbox[k].append(Sent(dist.isend(tensor, dst=k, group=group), tensor))
        self._posted[k] += 1

    def _delivered(self, k: int, count: int) -> None:
        """Worker k reported, so it took the first `count` messages we ever sent it: release them.
        (Not those sent since: waiting for their transfer would put it on the critical path.)"""
        while self._released[k] < count:
            self._outbox[k].popleft().wait()
            self._released[k] += 1

    def _plan_workers(self) -> _Call:
        """A slot's worker work: every worker runs the head of its queue, later stages first."""
        call = _Call(headers=[None] * len(self.stages))
        for k in reversed(range(1, len(self.stages))):
            if self._queues[k]:
                self._plan(call, k, [self._queues[k].pop(0)], merge=False)
        return call

    def _expect_no_run_ahead(self) -> None:
        if self._ahead is not None:
            raise RuntimeError("push/flow after slot without a rollback: no decoder does this")

    # Planning: the coordinator's mirror of the queues -------------------------------------

    def _plan_stage1(self, call: _Call, feed: Feed) -> None:
        """Stage 1 computes here; its output, queued before rank 1, is attached to rank 1's next
        control message (`_stage1`, `_post_control`)."""
        call.ran.append(0)
        kind = "prefill" if feed.kind == "prefill" else "verify"
        call.items[0] = _Queued(feed.position, feed.tokens[0], kind, len(feed.tokens))
        self._queues[1].append(call.items[0])

    def _plan(self, call: _Call, k: int, items: list[_Queued], *, merge: bool) -> None:
        """Worker k runs `items`; its output goes to worker k+1, which receives it after its own
        work in a slot, before it in a flow (where it then runs over everything queued)."""
        self._set(call, k, run=1, merge=int(merge))
        call.ran.append(k)
        item = call.items[k] = _Queued(items[0].position, items[0].token_id, items[0].kind,
                                       sum(i.width for i in items))
        if k + 1 < len(self.stages):
            self._queues[k + 1].append(item)
            self._set(call, k + 1, incoming=2 if merge else 1, in_position=item.position, in_width=item.width,
                      in_kind=KINDS.index(item.kind))

    @staticmethod
    def _set(call: _Call, k: int, **fields: int) -> None:
        call.headers[k] = (call.headers[k] or Header(WORK))._replace(**fields)

    # Running a call --------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if not self.alive:
            raise PipelineError("the pipeline is not running: start() it (or make a new one)")

    def _run(self, call: _Call, feed: Feed | None, *, slot: int | None) -> Output:
        self._check_alive()
        return self._guarded(lambda: self._exchange(call, feed, slot))

    def _launch(self, call: _Call) -> _Call:
        """Send the workers of `call` their control messages and await their reports."""
        for k, header in enumerate(call.headers[1:], start=1):
            if header is not None:
                self._post_control(header, k)
        for k in call.ran:
            if k:
                call.taken[k] = self._posted[k]  # what its report proves delivered
                report = torch.empty(4 + self._payload(call, k), dtype=torch.float32)
                call.reports[k] = (dist.irecv(report, src=k, group=GROUPS["calls"]), report)
        call.launched = True
        return call

    def _exchange(self, call: _Call, feed: Feed | None, slot: int | None) -> Output:
        if not call.launched:  # the workers start first...
            self._launch(call)
        results: dict = {}
        times: dict[int, tuple[float, float]] = {}
        if 0 in call.ran:  # ...then stage 1 computes here, while they do
            times[0] = self._stage1(feed, results)
        if slot is not None and any(self._queues[1:]):
            # Run ahead: the next slot's worker work depends on nothing the decoder has yet to
            # decide (a correction flushes it, as it flushes all work in flight), so it starts now,
            # and each worker goes from one slot's work to the next without waiting for a message.
            self._ahead = self._launch(self._plan_workers())
        for work, _ in self._discarded:
            work.wait()
        self._discarded = []
        for k, (work, report) in call.reports.items():
            work.wait()
            self._delivered(k, call.taken[k])
            start, end = report[:4].view(torch.float64).tolist()
            times[k] = (start - self._offsets[k], end - self._offsets[k])
            if k == len(self.stages) - 1:
                logits = report[4:].view(-1, self.model.info.vocab_size)
                results["final_position"] = call.items[k].position + call.items[k].width - len(logits)
                results["final_logits"] = logits
        events = tuple(self._event(call, k, feed, self._clock.at(times[k][0]), self._clock.at(times[k][1]), slot)
                       for k in call.ran)  # recording order: later stages first in a slot
        return Output(events=events, **results)

    def _stage1(self, feed: Feed, results: dict) -> tuple[float, float]:
        """Embeddings, layers [0, E) and (for a draft) the exit head, here; the hidden state goes
        on to rank 1. Returns (start, end) in `time.perf_counter()` time."""
        start = time.perf_counter()
        model = self.model
        hidden = model.embed(list(feed.tokens))
        hidden = model.run_layers(hidden, self.stages[0], position=feed.position, cache=self.cache)
        if feed.kind == "draft":
            results["exit_logits"] = model.exit_logits(hidden, position=feed.position, cache=self.cache)
        sync_device(self.device)
        end = time.perf_counter()
        self._attached.append((self._queues[1][-1], hidden))
        return start, end

    def _post_control(self, header: Header, k: int) -> None:
        """Send rank k its control message; rank 1's carries what stage 1 produced since its last
        one (in a slot at most one position; prefill and EESD drafts, contiguous, in a flow)."""
        attached: list[tuple[_Queued, torch.Tensor]] = []
        if k == 1:
            attached, self._attached = self._attached, []
        if not attached:
            self._post(self._control.pack(header), k)
            return
        first = attached[0][0]
        hidden = attached[0][1] if len(attached) == 1 else torch.cat([tensor for _, tensor in attached], dim=1)
        header = header._replace(att_position=first.position, att_width=hidden.shape[1],
                                 att_kind=KINDS.index(first.kind))
        if hidden.shape[1] == 1:
            self._post(self._control.pack(header, hidden), k)
            return
        self._post(self._control.pack(header), k)
        self._post(hidden.contiguous().cpu() if GROUPS["staged"] else hidden.contiguous(), k,
                   group=GROUPS["hidden"])

    def _payload(self, call: _Call, k: int) -> int:
        """Number of logits in rank k's report: T x V at the last stage, else none."""
        if k < len(self.stages) - 1:
            return 0
        item = call.items[k]
        return self.model.info.vocab_size * logit_width(item.kind, item.width)

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
        dead = [(k, p) for k, p in enumerate(self._processes, start=2) if not p.is_alive()]
        # A neighbour of the culprit exits with 1 when its connection breaks: name the culprit.
        dead.sort(key=lambda item: item[1].exitcode == 1)
        if dead:
            k, process = dead[0]
            return (f"pipeline worker for stage {k} (pid {process.pid}) died "
                    f"({_exit_text(process.exitcode)}); the pipeline was shut down")
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        return (f"a pipeline worker did not answer within {self.spec.timeout:g} s or failed ({first}); "
                f"the pipeline was shut down")

    # Startup ---------------------------------------------------------------------------------

    def _await_loaded(self, pipes: list) -> None:
        """Wait for every worker's 'loaded' (or its load error), watching that it stays alive."""
        deadline = time.monotonic() + self.spec.startup_timeout
        waiting = dict(enumerate(pipes, start=1))  # rank -> pipe
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
                        raise PipelineError(f"pipeline worker for stage {k + 1} died while loading "
                                            f"({_exit_text(process.exitcode)})")
                    del waiting[k]
            if time.monotonic() > deadline:
                raise PipelineError(f"pipeline workers did not load within {self.spec.startup_timeout:g} s")
            multiprocessing.connection.wait(list(waiting.values()), timeout=0.2)

    def _hello(self) -> None:
        """Check every worker holds the caller's weights; measure remote hosts' clock offsets."""
        hellos: list = [None] * len(self.stages)
        dist.all_gather_object(hellos, {"host": socket.gethostname()})
        for k in range(1, len(self.stages)):
            mine = weights_fingerprint(self.model, self.stages[k])
            if not math.isclose(hellos[k]["weights"], mine, rel_tol=1e-6):
                raise PipelineError(
                    f"stage {k + 1} loaded other weights from {self.spec.model!r} than the caller's model "
                    f"(fingerprint {hellos[k]['weights']:.6g} vs {mine:.6g}): was the checkpoint rewritten, "
                    f"or the model changed in memory?")
            if hellos[k]["host"] != socket.gethostname():
                self._offsets[k] = _clock_offset(self._control, k)


# Process-wide bookkeeping: torch.distributed has one default group per process. --------------

_POOLS: set[DistributedExecutor] = set()
_current: DistributedExecutor | None = None  # the one `make_executor` hands out


def close_all() -> None:
    """Stop every pipeline this process started (also run at interpreter exit)."""
    for pool in list(_POOLS):
        pool.close()


@atexit.register
def _shutdown() -> None:
    """At exit: stop the pipelines, then the forkserver their workers came from, and wait for it.
    Left alone it exits only once it notices this process is gone, and is re-parented to PID 1
    meanwhile; so a command returns only after every process it started has exited."""
    close_all()
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        server._stop()  # private, but the one way to wait for it (Python's own tests use it)


def current_pool() -> DistributedExecutor | None:
    """The pipeline `make_executor` last started in this process, if it is still running."""
    return _current if _current is not None and _current.alive else None


def make_executor(model: StagedModel, config: DecodeConfig, *, threads_per_worker: int = 1,
                  timeout: float = 30.0) -> DistributedExecutor:
    """The process's pipeline for `model` and `config`'s stages: stage 1 runs here on `model`,
    stages 2..K in workers that load `model.info.name` (a local directory or hub id). Started
    once and reused while the settings and weights match (the exit head may change: only stage 1
    uses it); otherwise the old pool is closed and a new one started."""
    config = config.resolved(model.num_layers)
    spec = PipelineSpec(
        model=model.info.name, stages=stage_layers(model.num_layers, config.exit_layer, config.stages),
        device=model.info.device.split(":")[0], dtype=model.info.dtype, threads_per_worker=threads_per_worker,
        timeout=timeout,
    )
    global _current
    current = current_pool()
    if current is not None and current.spec == spec and current.model.hf_model is model.hf_model:
        current.model = model
        return current
    if current is not None:
        current.close()
    _current = DistributedExecutor(spec, model).start()
    return _current


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _clock_offset(control: Control, k: int, rounds: int = 8) -> float:
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


def _process_context():
    """Workers fork from a clean server process that has imported torch and transformers once
    (not from the caller, whose threads make fork unsafe): a new pool starts in the time it
    takes to load the weights, not K times the imports."""
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ppsd.pipeline_worker", "torch.distributed",
                                    "transformers.models.llama.modeling_llama", "transformers.models.auto.modeling_auto"])
    return context


# Command line: local pipeline, or one rank of a torchrun launch -------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m ppsd.distributed --prompt TEXT`: one generation on a K-stage pipeline.

    Plain: K - 1 local workers are started. Under torchrun (RANK set): the world is the K
    stages; rank 0 loads the model and tokenizer, decodes and prints; ranks >= 1 serve.
    """
    import argparse

    from .chat import check_text, encode_prompt, use_chat
    from .config import METHODS
    from .generate import generate
    from .heads import AUTO_HEAD, choose_exit_head, exit_layer_for
    from .model import DEFAULT_MODEL, load_model

    from .cli import Parser, thread_count

    parser = Parser(prog="python -m ppsd.distributed", description=main.__doc__.splitlines()[0])
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a path every host can read, or a hub id")
    parser.add_argument("--method", default="ppsd", choices=METHODS)
    parser.add_argument("--stages", type=int, default=2, help="K (under torchrun: the world size)")
    parser.add_argument("--exit-layer", type=int, default=None,
                        help="E (default: the shipped head's for this model and K, else L/K)")
    parser.add_argument("--exit-head", default=AUTO_HEAD, help="auto (default), shared, or a train-head directory")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="the prompt through the chat template (default: on when the model has one)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads-per-worker", type=thread_count, default=1)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    check_text(args.prompt)  # every rank checks every value before any group forms: all exit 2 alike
    rank = int(os.environ.get("RANK", "0"))
    torchrun = "RANK" in os.environ
    stages = int(os.environ["WORLD_SIZE"]) if torchrun else args.stages
    layers = model_config(args.model).num_hidden_layers
    config = DecodeConfig(method=args.method, stages=stages,
                          exit_layer=exit_layer_for(args.model, layers, stages, args.exit_layer),
                          max_new_tokens=args.max_new_tokens).resolved(layers)
    # Every torchrun rank builds the same spec (dtype: the device's default, as load_model's).
    spec = PipelineSpec(model=args.model, stages=stage_layers(layers, config.exit_layer, stages), device=args.device,
                        threads_per_worker=args.threads_per_worker, timeout=args.timeout)
    if rank > 0:
        run_worker(spec, rank, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        return 0
    model, tokenizer = load_model(args.model, device=args.device)
    model = model.with_exit_head(choose_exit_head(model, config.exit_layer, args.exit_head).head)
    if torchrun:
        executor = DistributedExecutor(spec, model).join()
    else:
        executor = make_executor(model, config, threads_per_worker=args.threads_per_worker, timeout=args.timeout)
    with executor:
        ids = encode_prompt(tokenizer, args.prompt, chat=use_chat(tokenizer, args.chat))
        result = generate(model, ids, config, executor=executor)
    m = result.metrics()
    rate = "n/a" if m.acceptance_rate is None else f"{m.acceptance_rate:.2f}"
    print(tokenizer.decode(result.token_ids, skip_special_tokens=True))
    print(f"[{config.method}, {stages}-stage pipeline, {args.device}] {m.tokens} tokens, "
          f"{m.tokens_per_second:.1f} tok/s ({m.clock} clock), acceptance {rate}, "
          f"stage utilization {', '.join(f'{u:.2f}' for u in m.stage_utilization)}")
    return 0


if __name__ == "__main__":
    from ppsd.cli import guarded
    from ppsd.distributed import main as _main  # the importable module, not a __main__ copy of it

    sys.exit(guarded(_main))
