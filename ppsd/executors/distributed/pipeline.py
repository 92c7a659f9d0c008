"""Real pipeline-parallel execution: one process per stage, over torch.distributed.

Boundary: `DistributedExecutor` is the coordinator (rank 0). It implements the `Executor`
protocol with K processes, executing the same `schedule` as the in-process executor; it knows
nothing of drafts or acceptance (the decoders decide). The processes' lives are `processes`,
their messages `wire`, their cores and weights `placement`, the worker's side `worker`.

- Rank 0 is the calling process: it runs the decoder's state machine and computes stage 1
  itself (embeddings, layers [0, E), exit head) with the caller's `StagedModel`. In a PPSD slot
  the coordinator must see stage 1's exit logits before it can feed the next draft, so stage 1
  *is* the critical path; computed in place it costs no message and no process wake-up, and
  stage K's work (started by a message sent before stage 1 computes) hides behind it. Exactly K
  processes compute, a trained exit head needs no shipping, and under torchrun the world is just
  the K stages.
- Worker k (rank k, stage k+1) loads the weights from the same path and dtype, keeps only its
  layers (plus the final norm and LM head on stage K) and a static KV cache of its layers, and is pinned to its
  own cores (or GPU). Hidden states flow rank k -> k+1 by point-to-point send/recv; stage K's
  final logits come back to rank 0 with each worker's timestamps.
- The coordinator keeps the schedule's queues (positions, tokens, kinds, widths: the hidden
  states are on the workers), so it builds the same events as the in-process executor; only
  their times differ (measured where each stage ran, on one clock: the trace is `concurrent`).
- Run-ahead: once stage 1 has computed in a slot, the next slot's worker work (`schedule.advance`,
  which depends on the queues alone) is launched before this slot's reports are read; a
  rollback drops it.
- One run at a time: `begin` takes the pipeline (a second run waits up to the call timeout,
  then gets `PipelineBusy`), `end` gives it back; callers hold no lock.
- Lifecycle: workers start once and serve many runs; `close()` (also at exit, and on any error)
  stops them. A worker that dies breaks its sockets, so the waiting rank fails at once; one that
  hangs trips the per-call timeout. Either way the pool is torn down, no process is left, and a
  `PipelineError` names the stage.
"""

from __future__ import annotations

import math
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ...model import StagedModel
from ...static_cache import StaticKVCache
from ...trace import Stopwatch
from .. import schedule
from ..base import Feed, Output, final_position, logit_width, stage_forward
from .placement import StageOnePinning, sync_device, weights_fingerprint
from .processes import OPEN, WorkerProcesses
from .wire import (GROUPS, PING, PING_SECONDS, ROLLBACK, SHUTDOWN, Control, Header, Outbox, PipelineBusy, PipelineError,
                   PipelineSpec, clock_offset, init_group, wire_tensor)


@dataclass
class _Call:
    """The workers' part of one executor call: the plan, and the reports it awaits."""

    plan: schedule.Plan
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
        self.spec, self.model = spec, model
        self.partition, self.device = spec.partition, spec.device
        self._run_lock = threading.Lock()  # held from `begin` to `end`: one run at a time
        self.cache = StaticKVCache.for_model(model.hf_model, spec.partition[0])  # stage 1's layers
        self.runs = 0  # runs begun on this pool
        self._workers = WorkerProcesses()
        self._control = Control(model.hf_model.config.hidden_size, next(model.hf_model.parameters()).dtype)
        self._outbox = Outbox(range(1, len(spec.partition)))
        self._offsets = [0.0] * len(spec.partition)  # rank k's clock minus ours
        self._queues = schedule.empty(len(spec.partition))
        self._attached: list[torch.Tensor] = []  # stage 1's output rank 1 has not got yet
        self._ahead: _Call | None = None  # the next slot's worker work, launched early (`slot`)
        self._discarded: list[tuple[object, torch.Tensor]] = []  # reports of run-ahead work a rollback dropped
        self._clock = Stopwatch()
        self._pinning = StageOnePinning(spec)
        self.aborted = False  # `abort` killed the workers (a Stop that could not wait), not a fault
        self._state = "new"  # new, open, closed; broken: a failed group (kill the workers, send nothing)

    # Lifecycle -----------------------------------------------------------------------------

    def start(self) -> "DistributedExecutor":
        """Start the K - 1 workers, wait until each has loaded its stage, join them in one group."""
        if self._state != "new":
            return self
        if dist.is_initialized():
            raise PipelineError("torch.distributed is already initialised in this process: "
                                "close the other pipeline first (one pool per process)")
        self._open()
        store = dist.TCPStore("127.0.0.1", 0, len(self.partition), is_master=True,
                              timeout=timedelta(seconds=self.spec.startup_timeout), wait_for_workers=False)
        try:
            self._workers.start(self.spec, store.port)
            init_group(self.spec, rank=0, world=len(self.partition), store=store)
            self._hello()
        except BaseException:
            self.close()
            raise
        return self

    def join(self) -> "DistributedExecutor":
        """Become rank 0 of a group that torchrun started (env:// rendezvous); ranks >= 1 call
        `worker.run_worker`. The workers are not our children: `close()` shuts them down by message."""
        self._open()
        init_group(self.spec, rank=0, world=len(self.partition))
        self._hello()
        return self

    def close(self) -> None:
        """Stop every worker (politely, then by force) and leave torch.distributed as it was."""
        if self._state == "closed":
            return
        broken, self._state = self._state == "broken", "closed"
        OPEN.discard(self)
        if dist.is_initialized() and not broken and self._workers.all_alive():
            try:
                self._broadcast(Header(SHUTDOWN))
            except Exception:  # noqa: BLE001 - a broken pool is killed below anyway
                pass
        self._workers.stop(grace=0.0 if broken else 5.0)
        if dist.is_initialized():
            dist.destroy_process_group()
        GROUPS.clear()
        self._pinning.release()  # the run it broke ends later, and frees the run lock then

    def abort(self) -> None:
        """End the run in progress now, from another thread, however its workers are (frozen,
        or busy past the call timeout): kill them, so the call waiting on them fails at once, and
        the run's own thread closes the pool (`PipelineError`). The next run starts fresh ones."""
        self.aborted = True
        self._workers.kill()

    def check_workers(self, within: float = PING_SECONDS) -> str | None:
        """Between runs: None when every worker answers a ping within `within` seconds; else why
        not (frozen, dead, silent), and the pool is shut down, its workers killed (a frozen one
        never exits by itself), so that the next run starts fresh ones rather than waiting the
        call timeout on it. While a run holds the pipeline nothing is sent (its own calls watch
        the workers: the call timeout, and a Stop's `abort`), and None is returned."""
        if self._state != "open":
            return "the pipeline is not running"
        if not self._run_lock.acquire(blocking=False):
            return None
        try:
            reason = self.frozen() or self._ping(within)
        finally:
            self._run_lock.release()
        if reason is not None:
            self._state = "broken"  # no polite SHUTDOWN: a frozen worker would take its whole grace
            self.close()
        return reason

    def frozen(self) -> str | None:
        """Which worker is frozen (stopped), if one is (`WorkerProcesses.frozen`); safe from any thread."""
        return self._workers.frozen()

    @property
    def alive(self) -> bool:
        """Open, and every worker it started still running (one may die while the pool idles)."""
        return self._state == "open" and self._workers.all_alive()

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers for stages 2..K."""
        return self._workers.pids

    def begin(self, stopwatch: Stopwatch) -> None:
        """A run starts: wait (at most the call timeout) until no other run holds the pipeline,
        else raise `PipelineBusy`; empty every cache and queue, stamp on `stopwatch`, and while it
        lasts give stage 1 (this process) the workers' thread count and, on CPU, pin every thread
        of this process (torch's, gloo's, the caller's own) to stage 1's cores, as each worker
        keeps to its own. Left free to roam, the scheduler parks them on a worker's core, and a
        slot then waits for a context switch there (a PPSD run took 1.9x as long;
        docs/distributed.md). `end()` gives the process its threads and cores back (between runs
        it is the caller's) and lets the next run in."""
        if not self._run_lock.acquire(timeout=self.spec.timeout):
            raise PipelineBusy("the worker processes are busy with another run: try again in a moment")
        try:
            self._check_alive()
            self._clock = stopwatch
            self.rollback(0)
            self.runs += 1
            self._pinning.hold()
        except BaseException:
            self._run_lock.release()  # no run began, so no `end` will come
            raise

    def end(self) -> None:
        self._pinning.release()
        self._run_lock.release()

    def __enter__(self) -> "DistributedExecutor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # The Executor protocol ---------------------------------------------------------------

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        call, self._ahead = self._ahead or self._plan(schedule.advance), None
        return self._run(call, feed, slot)

    def push(self, feed: Feed) -> Output:
        self._expect_no_run_ahead()
        return self._run(_Call(schedule.Plan((), self._queues)), feed, None)

    def flow(self) -> Output:
        self._expect_no_run_ahead()
        return self._run(self._plan(schedule.flow), None, None)

    def rollback(self, length: int) -> None:
        self._guarded(lambda: self._rolled_back(length))

    def _rolled_back(self, length: int) -> None:
        if self._ahead is not None:  # run-ahead work behind a correction: flushed, its reports dropped
            self._discarded.extend(self._ahead.reports.values())
            self._ahead = None
        self._queues = schedule.empty(len(self.partition))
        self._attached = []
        self.cache.truncate(length)
        self._broadcast(Header(ROLLBACK, length=length))

    def _plan(self, step) -> _Call:
        """The workers' call `step(queues)` plans; the queues then hold what it leaves."""
        plan = step(self._queues)
        self._queues = plan.queues
        return _Call(plan)

    def _expect_no_run_ahead(self) -> None:
        if self._ahead is not None:
            raise RuntimeError("push/flow after slot without a rollback: no decoder does this")

    # Running a call --------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._state != "open":  # a dead worker is named by the exchange that finds it
            raise PipelineError("the pipeline is not running: start() it (or make a new one)")

    def _run(self, call: _Call, feed: Feed | None, slot: int | None) -> Output:
        self._check_alive()
        return self._guarded(lambda: self._exchange(call, feed, slot))

    def _exchange(self, call: _Call, feed: Feed | None, slot: int | None) -> Output:
        if not call.launched:  # the workers start first...
            self._launch(call)
        actions, times, results = list(call.plan.actions), {}, {}
        if feed is not None:  # ...then stage 1 computes here, while they do (recorded last)
            actions += self._plan(lambda queues: schedule.enter(queues, feed)).plan.actions
            times[0] = self._stage1(feed, results)
        if slot is not None and any(self._queues[1:]):
            # Run ahead: the next slot's worker work depends on nothing the decoder has yet to
            # decide (a correction flushes it, as it flushes all work in flight), so it starts now,
            # and each worker goes from one slot's work to the next without waiting for a message.
            self._ahead = self._launch(self._plan(schedule.advance))
        self._collect(call, times, results)
        events = tuple(a.event(self._clock.at(times[a.index][0]), self._clock.at(times[a.index][1]), slot)
                       for a in actions)
        return Output(events=events, **results)

    def _launch(self, call: _Call) -> _Call:
        """Send the workers of `call` their parts of its plan and await their reports."""
        for k in range(1, len(self.partition)):
            part = schedule.worker_part(call.plan, k)
            if part is not None:
                self._post_control(Header.work(part), k)
        for action in call.plan.actions:
            k, item = action.index, action.item
            call.taken[k] = self._outbox.posted[k]  # what its report proves delivered
            # (start, end) as four float32, then the last stage's T x V logits
            last = k == len(self.partition) - 1
            logits = self.model.info.vocab_size * logit_width(item.kind, item.width) if last else 0
            report = torch.empty(4 + logits, dtype=torch.float32)
            call.reports[k] = (dist.irecv(report, src=k, group=GROUPS["calls"]), report)
        call.launched = True
        return call

    def _collect(self, call: _Call, times: dict, results: dict) -> None:
        """Wait for `call`'s reports: each worker's (start, end) on our clock into `times`, the
        final logits into `results`."""
        for work, _ in self._discarded:
            work.wait()
        self._discarded = []
        last = len(self.partition) - 1
        for action in call.plan.actions:
            k = action.index
            work, report = call.reports[k]
            work.wait()
            self._outbox.delivered(k, call.taken[k])
            start, end = report[:4].view(torch.float64).tolist()
            times[k] = (start - self._offsets[k], end - self._offsets[k])
            if k == last:
                results["final_position"] = final_position(action.item)
                results["final_logits"] = report[4:].view(-1, self.model.info.vocab_size)

    def _stage1(self, feed: Feed, results: dict) -> tuple[float, float]:
        """Stage 1 here; its hidden state goes on to rank 1 with rank 1's next control message.
        Returns (start, end) in `time.perf_counter()` time."""
        start = time.perf_counter()
        view = self.cache.at(self.partition[0], feed.position, len(feed.tokens))
        hidden, results["exit_logits"] = stage_forward(self.model, self.partition, 0, list(feed.tokens), view,
                                                       draft=feed.kind == "draft", logits_for=0)
        sync_device(self.device)
        end = time.perf_counter()
        self._attached.append(hidden)
        return start, end

    def _post_control(self, header: Header, k: int) -> None:
        """Send rank k its control message; rank 1's carries what stage 1 produced since its last
        one (in a slot at most one position; prefill and EESD drafts, contiguous, in a flow)."""
        attached: list[torch.Tensor] = []
        if k == 1:
            attached, self._attached = self._attached, []
        if not attached:
            self._outbox.post(self._control.pack(header), k)
            return
        hidden = attached[0] if len(attached) == 1 else torch.cat(attached, dim=1)
        header = header._replace(attached=hidden.shape[1])
        if hidden.shape[1] == 1:
            self._outbox.post(self._control.pack(header, hidden), k)
            return
        self._outbox.post(self._control.pack(header), k)
        self._outbox.post(wire_tensor(hidden), k, group=GROUPS["hidden"])

    def _broadcast(self, header: Header) -> None:
        for k in range(1, len(self.partition)):
            self._outbox.post(self._control.pack(header), k)

    def _guarded(self, action):
        """Run `action`; any failure of the group tears the pool down and names the culprit."""
        try:
            return action()
        except Exception as error:  # noqa: BLE001 - gloo raises RuntimeError subclasses
            culprit = self._workers.culprit()
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            first = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", first)[:200]  # gloo's source file: not the user's business
            reason = culprit or (f"a pipeline worker did not answer within {self.spec.timeout:g} s "
                                 f"or failed ({first})")
            self._state = "broken"
            self.close()
            raise PipelineError(f"{reason}; the pipeline was shut down") from error

    def _ping(self, within: float) -> str | None:
        """Every worker's answer to a PING within `within` seconds (None), else why not. The
        workers answer in order, so the reports of run-ahead work a Stop left are awaited first,
        and an answer proves every earlier message delivered. A wait that times out breaks
        gloo's connection: the caller shuts the pool down."""
        deadline = time.monotonic() + within
        try:
            self._rolled_back(0)  # as `begin` does: the run-ahead work a Stop left is dropped
            waits = [(None, work) for work, _ in self._discarded]
            self._discarded = []
            answers = [torch.empty(1, dtype=torch.float64) for _ in self.partition]  # live until answered
            for k in range(1, len(self.partition)):
                self._outbox.post(self._control.pack(Header(PING)), k)
                waits.append((k, dist.irecv(answers[k], src=k, group=GROUPS["calls"])))
            for k, work in waits:
                work.wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
                if k is not None:
                    self._outbox.delivered(k, self._outbox.posted[k])
        except Exception:  # noqa: BLE001 - gloo raises RuntimeError subclasses; the pool goes either way
            return self._workers.culprit() or f"a pipeline worker did not answer a ping within {within:g} s"
        return None

    # Startup ---------------------------------------------------------------------------------

    def _open(self) -> None:
        self._state = "open"
        OPEN.add(self)

    def _hello(self) -> None:
        """Check every worker holds the caller's weights; measure remote hosts' clock offsets."""
        hellos: list = [None] * len(self.partition)
        dist.all_gather_object(hellos, {"host": socket.gethostname()})
        for k in range(1, len(self.partition)):
            mine = weights_fingerprint(self.model, self.partition[k])
            if not math.isclose(hellos[k]["weights"], mine, rel_tol=1e-6):
                raise PipelineError(
                    f"stage {k + 1} loaded other weights from {self.spec.model!r} than the caller's model "
                    f"(fingerprint {hellos[k]['weights']:.6g} vs {mine:.6g}): was the checkpoint rewritten, "
                    f"or the model changed in memory?")
            if hellos[k]["host"] != socket.gethostname():
                self._offsets[k] = clock_offset(self._control, k)

