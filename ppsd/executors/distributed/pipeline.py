"""Real pipeline-parallel execution: one process per stage, over torch.distributed.

Boundary: where the stages run, for the one runtime (`ppsd.executors.runtime.Runtime`), which
plans every call, advances the host lengths (every layer's, the workers' too), builds the
`Output`s, runs ahead and rolls back, as for every kind. `Workers` is that where: rank 0 is the
calling process and computes stage 1 (the runtime's eager step, on a cache of stage 1's layers:
stage 1 is a PPSD slot's critical path, and computed in place it costs no message); worker k
(rank k, stage k+1) holds its layers and their cache (`worker`). A call sends each worker its part
of the plan and awaits its report (its times, and stage K's logits); a worker that dies or hangs
tears the pool down with a `PipelineError` naming it. `DistributedExecutor` is the runtime on it,
with the pool's lifecycle; the processes' lives are `processes`, their messages `wire`, their
cores and weights `placement`. docs/distributed.md describes the design.
"""

from __future__ import annotations

import math
import re
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ...model import StagedModel
from ...trace import Stopwatch
from .. import schedule
from ..backends import Job, Ran
from ..backends.cpu import EagerStep
from ..base import logit_width
from ..runtime import Runtime
from .placement import StageOnePinning, sync_device, weights_fingerprint
from .processes import OPEN, WorkerProcesses
from .wire import (GROUPS, PING, PING_SECONDS, ROLLBACK, SHUTDOWN, Control, Header, Outbox, PipelineError,
                   PipelineSpec, clock_offset, init_group, wire_tensor)


@dataclass(eq=False)
class _Report:
    """What worker `k` reports for one action, awaited: (start, end) as four float32, then the
    last stage's T x V logits; `taken`: the messages sent it before, which the report proves
    delivered."""

    k: int
    work: object
    buffer: torch.Tensor
    taken: int


class Workers:
    """Where stage 1 runs here and stages 2..K in worker processes: the runtime's `Where` for the
    K-process kind. A call's jobs go out at once (each worker's part of the plan in its control
    message, stage 2's input attached to rank 1's), stage 1 computes here meanwhile, and each
    worker's report is awaited when its times are read."""

    concurrent = True  # the stages compute at once, each in its own process
    remote = True

    def __init__(self, spec: PipelineSpec, model: StagedModel) -> None:
        self.spec, self.model, self.partition = spec, model, spec.partition
        self.processes = WorkerProcesses()
        self._control = Control(model.hf_model.config.hidden_size, next(model.hf_model.parameters()).dtype)
        self._outbox = Outbox(range(1, len(spec.partition)))
        self._offsets = [0.0] * len(spec.partition)  # rank k's clock minus ours
        self._unread: list[_Report] = []  # reports awaited and not read yet, oldest first
        self._discarded: list[_Report] = []  # reports of work a rollback dropped (run ahead), to await
        self._clock = Stopwatch()
        self._pinning = StageOnePinning(spec)
        self._state = "new"  # new, open, closed; broken: a failed group (kill the workers, send nothing)

    # Lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the K - 1 workers, wait until each has loaded its stage, join them in one group."""
        if self._state != "new":
            return
        if dist.is_initialized():
            raise PipelineError("torch.distributed is already initialised in this process: "
                                "close the other pipeline first (one pool per process)")
        self._open()
        store = dist.TCPStore("127.0.0.1", 0, len(self.partition), is_master=True,
                              timeout=timedelta(seconds=self.spec.startup_timeout), wait_for_workers=False)
        try:
            self.processes.start(self.spec, store.port)
            init_group(self.spec, rank=0, world=len(self.partition), store=store)
            self._hello()
        except BaseException:
            self.close()
            raise

    def rendezvous(self) -> None:
        """Become rank 0 of a group that torchrun started (env:// rendezvous)."""
        self._open()
        init_group(self.spec, rank=0, world=len(self.partition))
        self._hello()

    def close(self) -> None:
        """Stop every worker (politely, then by force) and leave torch.distributed as it was."""
        if self._state == "closed":
            return
        broken, self._state = self._state == "broken", "closed"
        OPEN.discard(self)
        if dist.is_initialized() and not broken and self.processes.all_alive():
            try:
                self._broadcast(Header(SHUTDOWN))
            except Exception:  # noqa: BLE001 - a broken pool is killed below anyway
                pass
        self.processes.stop(grace=0.0 if broken else 5.0)
        if dist.is_initialized():
            dist.destroy_process_group()
        GROUPS.clear()
        self._pinning.release()  # the run it broke ends later, and frees the run lock then

    def check(self, within: float) -> str | None:
        """None when every worker answers a ping within `within` seconds; else why not, and the
        pool is shut down, its workers killed (a frozen one never exits by itself)."""
        reason = self.processes.frozen() or self._ping(within)
        if reason is not None:
            self._state = "broken"  # no polite SHUTDOWN: a frozen worker would take its whole grace
            self.close()
        return reason

    @property
    def open(self) -> bool:
        return self._state == "open"

    # Where the runtime's stages run ------------------------------------------------------------

    def begin(self, stopwatch: Stopwatch) -> None:
        """A run starts on `stopwatch`; while it lasts, stage 1 (this process) gets the workers'
        thread count and, on CPU, every thread of this process (torch's, gloo's, the caller's own) is
        pinned to stage 1's cores, as each worker keeps to its own. Left free to roam, the scheduler
        parks them on a worker's core, and a slot then waits for a context switch there (a PPSD run
        took 1.9x as long; docs/distributed.md). `end()` gives the process its threads and cores
        back: between runs it is the caller's."""
        self._check_open()
        self._clock = stopwatch
        self._pinning.hold()

    def end(self) -> None:
        self._pinning.release()

    def at_once(self, jobs: list[Job], anywhere: bool) -> list[Ran]:
        """Every worker of `jobs` sent its part (they start first), then stage 1 computed here."""
        self._check_open()
        return self._guarded(lambda: self._launch(jobs))

    def _launch(self, jobs: list[Job]) -> list[Ran]:
        plan, hidden = schedule.Plan(tuple(j.action for j in jobs), ()), {j.k: j.hidden for j in jobs}
        for k in range(1, len(self.partition)):
            part = schedule.worker_part(plan, k)
            if part is not None:
                self._post_control(Header.work(part), k, hidden.get(k))
        ran = {j.k: self._awaited(j.action) for j in jobs if j.k > 0}
        return [ran[j.k] if j.k else self._here(j) for j in jobs]

    def _awaited(self, action: schedule.Action) -> Ran:
        """Worker k's report on `action`, received from now on; the last stage's logits are read
        out of it once it has come."""
        k, item = action.index, action.item
        last = k == len(self.partition) - 1
        buffer = torch.empty(4 + (self.model.info.vocab_size * logit_width(item.kind, item.width) if last else 0),
                             dtype=torch.float32)
        report = _Report(k, dist.irecv(buffer, src=k, group=GROUPS["calls"]), buffer, self._outbox.posted[k])
        self._unread.append(report)
        logits = buffer[4:].view(-1, self.model.info.vocab_size) if last else None
        return (None, logits, None), report, report

    def _here(self, job: Job) -> Ran:
        """Stage 1 here, timed in `time.perf_counter()` time."""
        start = time.perf_counter()
        out = job.compute()
        sync_device(self.model.info.device)
        return out, start, time.perf_counter()

    def join(self, done: list) -> None:
        pass  # a worker's output is awaited when its report is read (`times`)

    def read(self, bests: list[torch.Tensor]) -> list[int]:
        return torch.cat(bests).tolist() if bests else []  # stage 1's, computed here

    def times(self, done) -> tuple[float, float]:
        """`done`'s (start, end) on the run's clock; a worker's once its report has come."""
        start, end = self._guarded(lambda: self._stamps(done.start)) if isinstance(done.start, _Report) \
            else (done.start, done.end)
        return self._clock.at(start), self._clock.at(end)

    def _stamps(self, report: _Report) -> tuple[float, float]:
        for dropped in self._discarded:
            dropped.work.wait()
        self._discarded = []
        report.work.wait()
        self._unread.remove(report)
        self._outbox.delivered(report.k, report.taken)
        start, end = report.buffer[:4].view(torch.float64).tolist()
        return start - self._offsets[report.k], end - self._offsets[report.k]

    def rollback(self, length: int) -> None:
        self._guarded(lambda: self._rolled_back(length))

    def _rolled_back(self, length: int) -> None:
        """Every worker truncates its cache and empties its queue; the reports of work in flight
        (run ahead of a correction) are dropped, awaited unread."""
        self._discarded += self._unread
        self._unread = []
        self._broadcast(Header(ROLLBACK, length=length))

    # Messages ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":  # a dead worker is named by the exchange that finds it
            raise PipelineError("the pipeline is not running: start() it (or make a new one)")

    def _post_control(self, header: Header, k: int, hidden: torch.Tensor | None) -> None:
        """Send rank k its control message; rank 1's carries stage 2's input, what stage 1 made
        (in a slot one position; prefill and EESD drafts, merged, in a flow)."""
        if hidden is None:
            self._outbox.post(self._control.pack(header), k)
            return
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
            culprit = self.processes.culprit()
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
            waits = [(None, report.work) for report in self._discarded]
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
            return self.processes.culprit() or f"a pipeline worker did not answer a ping within {within:g} s"
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


class DistributedExecutor(Runtime):
    """Stage 1 here, stages 2..K in worker processes: the one runtime on `Workers`, its stage 1 the
    runtime's eager step on a cache of stage 1's layers. `model` (the caller's, on `spec.device`)
    computes stage 1; `use` swaps it between runs for one with another exit head over the same
    weights."""

    def __init__(self, spec: PipelineSpec, model: StagedModel) -> None:
        super().__init__(model, spec.partition, name="processes", stage_one_only=True)
        self.spec, self.busy_after = spec, spec.timeout
        self.where, self.how = Workers(spec, model), EagerStep(self.steps)

    def start(self) -> "DistributedExecutor":
        self.where.start()
        return self

    def join(self) -> "DistributedExecutor":
        """Become rank 0 of a group that torchrun started; ranks >= 1 call `worker.run_worker`. The
        workers are not our children: `close()` shuts them down by message."""
        self.where.rendezvous()
        return self

    def __enter__(self) -> "DistributedExecutor":
        return self.start()

    def use(self, model: StagedModel) -> None:
        self.model = self.steps.model = self.where.model = model

    def abort(self) -> None:
        """End the run in progress now, from another thread, however its workers are (frozen,
        or busy past the call timeout): kill them, so the call waiting on them fails at once, and
        the run's own thread closes the pool (`PipelineError`). The next run starts fresh ones."""
        self.where.processes.kill()

    def check_workers(self, within: float = PING_SECONDS) -> str | None:
        """Between runs: None when every worker answers a ping within `within` seconds; else why
        not (frozen, dead, silent), and the pool is shut down, so that the next run starts fresh
        ones rather than waiting the call timeout on it. While a run holds the pipeline nothing is
        sent (its own calls watch the workers: the call timeout, and a Stop's `abort`): None."""
        if not self.where.open:
            return "the pipeline is not running"
        if not self._run_lock.acquire(blocking=False):
            return None
        try:
            return self.where.check(within)
        finally:
            self._run_lock.release()

    def frozen(self) -> str | None:
        """Which worker is frozen (stopped), if one is (`WorkerProcesses.frozen`); safe from any thread."""
        return self.where.processes.frozen()

    @property
    def alive(self) -> bool:
        """Open, and every worker it started still running (one may die while the pool idles)."""
        return self.where.open and self.where.processes.all_alive()

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers for stages 2..K."""
        return self.where.processes.pids
