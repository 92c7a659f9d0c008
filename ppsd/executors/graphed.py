"""`GraphedExecutor`: every stage in this process as one pure step on a static KV cache: replayed
as a CUDA graph on a GPU, compiled on a CPU.

Boundary: the same `schedule` plans and the same `Output`s as `InProcessExecutor`; what differs is
how a stage computes. A stage's step goes from its input (token ids for stage 1, hidden states
after that) and its positions, a device tensor, to its hidden output, plus the draft logits and
their argmax (stage 1 drafting) or the final logits and theirs (stage K). It reads nothing back to
the host and runs the same kernels at every position, for an accepted draft and a corrected one
alike; the attention covers a power-of-two length bucket (`ppsd.static_cache`).

On CUDA, a one-token step is captured once per (stage, bucket, drafting) as a CUDA graph, each
stage in a memory pool of its own (their graphs replay at once), and a slot replays its stages on
one stream per stage from this one thread. A call makes one pinned non-blocking copy in (the
token and the positions), one copy out (the argmax ids) and one host wait, and is timed by CUDA
events placed on the run's clock by one stamp per run. Pieces wider than one token (the prefill,
EESD's verification) run the same step eagerly. On a CPU, with `compiled`, each one-token step is
compiled by Inductor with its C++ wrapper and stages 2..K run on threads of their own (the C++
call releases the GIL, so the stages overlap); without it the steps run eagerly, in turn (the
tests' fast path; PPSD's overlap is then projected, as in process). What Inductor compiles is kept
on disk beside the converted models and checked before use (`ppsd.compile_cache`): a new process
loads it instead of compiling again.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import torch

from ..model import StagedModel
from ..static_cache import StaticKVCache, bucket_for, buckets_to
from ..trace import Stopwatch
from . import schedule
from .base import Feed, Output, final_position, logit_width
from .threads import StageThreads


@dataclass
class _Done:
    """One action's device results, not yet read: its hidden output, the logits it gives (draft
    or final) and their argmax, and its start and end (floats on a CPU, CUDA events on a GPU)."""

    action: schedule.Action
    hidden: torch.Tensor
    logits: torch.Tensor | None
    best: torch.Tensor | None
    start: object
    end: object
    replayed: bool = False  # the tensors are its graph's outputs, overwritten by the next replay


class GraphedExecutor:
    """All stages here, each a pure step on a static cache: CUDA graphs on a GPU; on a CPU compiled
    steps on stage threads (`compiled`), or eager steps in turn."""

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch | None = None, *,
                 compiled: bool = False, stage_threads: bool = True) -> None:
        if len(partition) < 2:
            raise ValueError("the graphed executor runs a pipeline of K >= 2 stages")
        self.model, self.partition = model, partition
        self.device = model.info.device
        self.cuda = self.device.startswith("cuda")
        if not (self.cuda or self.device == "cpu"):
            raise ValueError(f"the graphed executor runs on CPU or CUDA, not {self.device}")
        if compiled and self.cuda:
            raise ValueError("compiled steps are for a CPU: on CUDA the steps are captured as CUDA graphs")
        # At once: on a GPU a stream per stage; on a CPU a thread per stage, which pays only for
        # compiled steps (their C++ wrapper releases the GIL; eager steps hold it). Without
        # `stage_threads` compiled steps run in turn on the caller's thread, with its torch threads
        # (AR alone: one stage at a time, every core on it).
        self.compiled = compiled
        self.threads = StageThreads(len(partition)) if compiled and stage_threads else None
        self.concurrent = self.cuda or self.threads is not None
        if compiled:
            from .. import compile_cache

            compile_cache.use()  # torch keeps what it compiles beside the converted models, checked
            # Set for the whole process, once: the compiler's settings are part of what a compiled
            # step is checked against before each call, so switching them per call recompiles.
            torch._inductor.config.cpp_wrapper = True
            # Each (stage, bucket, drafting, buffer size, thread count) is a compile of its own: a
            # server's Runs of many lengths add up (64 was reached within a few page Runs).
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        self._compiled_keys: set[tuple[int, int, bool]] = set()
        self.cache = StaticKVCache.for_model(model.hf_model)
        self._clock = stopwatch or Stopwatch()
        self._queues = schedule.empty(len(partition))
        self._hidden: list[deque[torch.Tensor]] = [deque() for _ in partition]
        self._run_lock = threading.Lock()
        self.host_reads = 0  # calls that waited for the device: one per executor call
        hidden_size = model.hf_model.config.hidden_size
        with torch.inference_mode(False):  # static buffers outlive any one run's inference mode
            # Device inputs of one-token steps: [token, position of stage 1, ..., of stage K].
            self._dev_in = torch.zeros(1 + len(partition), dtype=torch.long, device=self.device)
            self._host_in = torch.zeros(1 + len(partition), dtype=torch.long, pin_memory=self.cuda)
            self._stage_in = [torch.zeros(1, 1, hidden_size, dtype=self.cache.dtype, device=self.device)
                              for _ in partition]
        self._host_values = self._host_in.numpy()  # written per call without a torch op each
        self._host_out = torch.zeros(0, dtype=torch.long)
        self._graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, tuple]] = {}
        if self.cuda:
            self._streams = [torch.cuda.Stream(self.device) for _ in partition]
            self._pools = [torch.cuda.graph_pool_handle() for _ in partition]
            self._marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                           for _ in partition]
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin_at = 0.0
            self._done = torch.cuda.Event()

    # The Executor protocol -------------------------------------------------------------------

    def begin(self, stopwatch: Stopwatch) -> None:
        """One run at a time (a second waits); on CUDA, one clock stamp places the run's events."""
        self._run_lock.acquire()
        if self.threads is not None:
            self.threads.begin()
        self._clock = stopwatch
        self.rollback(0)
        if self.cuda:
            self._origin.record()
            self._origin.synchronize()
            self._origin_at = stopwatch.now()

    def end(self) -> None:
        if self.threads is not None:
            self.threads.end()
        self._run_lock.release()

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        return self._execute(schedule.slot(self._queues, feed), feed, slot, at_once=True)

    def push(self, feed: Feed) -> Output:
        return self._execute(schedule.enter(self._queues, feed), feed, None, at_once=False)

    def flow(self) -> Output:
        return self._execute(schedule.flow(self._queues), None, None, at_once=False)

    def rollback(self, length: int) -> None:
        self._queues = schedule.empty(len(self.partition))
        self._hidden = [deque() for _ in self.partition]
        self.cache.truncate(length)

    def close(self) -> None:
        self._graphs.clear()
        if self.threads is not None:
            self.threads.close()

    def __enter__(self) -> "GraphedExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # One call ---------------------------------------------------------------------------------

    def _execute(self, plan: schedule.Plan, feed: Feed | None, slot: int | None, *, at_once: bool) -> Output:
        """`plan`'s actions: in a slot every stage takes what earlier calls queued, so all start
        at once (each on its stream); a push or flow chains them in recording order."""
        actions = plan.actions
        if self.cache.reserve(max(a.item.position + a.item.width for a in actions)):
            self._graphs.clear()  # captured against the old buffers
        graphed = [self._graph(a) if self.cuda and a.item.width == 1 else None for a in actions]
        for a in actions:
            self._host_values[1 + a.index] = a.item.position
        if feed is not None:
            self._host_values[0] = feed.tokens[0]
        self._dev_in.copy_(self._host_in, non_blocking=True)
        if at_once:
            work = [(a, self._take(a), g) for a, g in zip(actions, graphed)]
            if self.threads is not None and all(map(self._compiled_already, actions)):
                running = {i: self.threads.submit(a.index, self._launch, a, x, g, feed)
                           for i, (a, x, g) in enumerate(work) if a.index > 0}
                here = {i: self._launch(a, x, g, feed) for i, (a, x, g) in enumerate(work) if i not in running}
                done = [here[i] if i in here else running[i].result() for i in range(len(work))]
            else:  # on CUDA the launches return at once; a step compiled now compiles on this thread
                done = [self._launch(a, x, g, feed) for a, x, g in work]
            self._join(done)  # only now: a stream joined earlier would hold back the stages after it
            for d in done:
                self._pass_on(d)
        else:
            done = []
            for a, g in zip(actions, graphed):
                done.append(self._launch(a, self._take(a), g, feed))
                self._join(done[-1:])
                self._pass_on(done[-1])
        self._queues = plan.queues
        return self._read(done, feed, slot)

    def _take(self, action: schedule.Action) -> torch.Tensor | None:
        """Stage k's input, off its queue (None for stage 1: the feed is in `_dev_in`)."""
        if action.index == 0:
            return None
        taken = [self._hidden[action.index].popleft() for _ in range(action.take)]
        return taken[0] if len(taken) == 1 else torch.cat(taken, dim=1)

    def _launch(self, action: schedule.Action, hidden: torch.Tensor | None, graph, feed: Feed | None) -> _Done:
        """Start `action`'s step: its graph's replay on its stage's stream, or the step eagerly
        (on a CPU it is done when this returns; on CUDA once `_join` has joined its stream)."""
        k = action.index
        if not self.cuda:
            start = self._clock.now()
            out = self._eager(action, hidden, feed)
            return _Done(action, *out, start, self._clock.now())
        begun, ended = self._marks[k]
        stream = self._streams[k]
        if graph is not None and hidden is not None:
            self._stage_in[k].copy_(hidden)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            begun.record(stream)
            if graph is not None:
                graph[0].replay()
                out = graph[1]
            else:
                if hidden is not None:
                    hidden.record_stream(stream)  # made on another stream
                out = self._eager(action, hidden, feed)
            ended.record(stream)
        return _Done(action, *out, begun, ended, replayed=graph is not None)

    def _join(self, done: list[_Done]) -> None:
        """On CUDA, this thread's stream waits for the stages' streams, where their outputs are
        read next."""
        if not self.cuda:
            return
        caller = torch.cuda.current_stream()
        for d in done:
            caller.wait_stream(self._streams[d.action.index])
            if not d.replayed:
                for t in (d.hidden, d.logits, d.best):
                    if t is not None:
                        t.record_stream(caller)  # made on the stage's stream

    def _pass_on(self, done: _Done) -> None:
        """`done`'s hidden states onto the next stage's queue (a replayed graph's copied: its
        buffer is the graph's and is overwritten when it runs again)."""
        if done.action.index + 1 < len(self.partition):
            self._hidden[done.action.index + 1].append(done.hidden.clone() if done.replayed else done.hidden)

    def _read(self, done: list[_Done], feed: Feed | None, slot: int | None) -> Output:
        """The call's one host read: every argmax in one copy, after one wait; then its Output."""
        bests = [d.best for d in done if d.best is not None]
        values: list[int] = []
        self.host_reads += 1
        if self.cuda:
            packed = torch.cat(bests) if bests else None
            if packed is not None:
                if self._host_out.numel() < packed.numel():
                    self._host_out = torch.zeros(bucket_for(packed.numel()), dtype=torch.long, pin_memory=True)
                self._host_out[:packed.numel()].copy_(packed, non_blocking=True)
            self._done.record()
            self._done.synchronize()
            values = self._host_out[:packed.numel()].tolist() if packed is not None else []
        elif bests:
            values = torch.cat(bests).tolist()
        results: dict = {}
        events = []
        for d in done:
            a, ids = d.action, []
            events.append(a.event(*self._times(d), slot))
            if d.best is not None:
                ids, values = values[:d.best.numel()], values[d.best.numel():]
            if a.index == 0:
                results["exit_logits"] = d.logits if a.kind == "draft" else None
                results["exit_best"] = ids[0] if a.kind == "draft" else None
            if a.index + 1 == len(self.partition):
                results.update(final_logits=d.logits, final_position=final_position(a.item), final_best=tuple(ids))
        return Output(tuple(events), **results)

    def _times(self, done: _Done) -> tuple[float, float]:
        if not self.cuda:
            return done.start, done.end
        return (self._origin_at + self._origin.elapsed_time(done.start) / 1e3,
                self._origin_at + self._origin.elapsed_time(done.end) / 1e3)

    # The step ---------------------------------------------------------------------------------

    def _step(self, k: int, x: torch.Tensor, positions: torch.Tensor, bucket: int, *, draft: bool,
              logits_for: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Stage k's pure step: (hidden out, logits or None, their argmax or None). Stage 1 embeds
        token ids `x` and, drafting, gives the exit head's (V,) logits; stage K gives the final
        (logits_for, V) logits; positions (T,) and the cache's bucket are all it knows of where."""
        model = self.model
        view = self.cache.view(positions, bucket)
        hidden = model.embed(x) if k == 0 else x
        hidden = model.run_static(hidden, self.partition[k], positions=positions, cache=view)
        if k == 0 and draft:
            logits = model.exit_logits(hidden, position=positions, cache=view)
            return hidden, logits, logits.argmax().view(1)
        if k + 1 == len(self.partition):
            logits = model.final_logits(hidden[:, hidden.shape[1] - logits_for:])
            return hidden, logits, logits.argmax(-1)
        return hidden, None, None

    def _static_step(self, k: int, bucket: int, draft: bool):
        """The one-token step on the static inputs: what a graph captures and a CPU runs."""
        x = self._dev_in[0:1].view(1, 1) if k == 0 else self._stage_in[k]
        return self._step(k, x, self._dev_in[1 + k:2 + k], bucket, draft=draft, logits_for=1)

    def _eager(self, action: schedule.Action, hidden: torch.Tensor | None, feed: Feed | None):
        """`action`'s step run now; host lengths advance (and are checked) here."""
        k, item = action.index, action.item
        self.cache.advance(self.partition[k], item.position, item.width)
        bucket = bucket_for(item.position + item.width)
        draft = action.kind == "draft"
        if item.width == 1:
            if hidden is not None:
                self._stage_in[k].copy_(hidden)
            if self.compiled:
                return self._compiled_step(k, bucket, draft)
            return self._static_step(k, bucket, draft)
        positions = self._dev_in[1 + k] + self.cache.key_index[:item.width]
        x = hidden if k > 0 else torch.tensor([feed.tokens], dtype=torch.long, device=self.device)
        return self._step(k, x, positions, bucket, draft=draft, logits_for=logit_width(item.kind, item.width))

    def _compiled_already(self, action: schedule.Action) -> bool:
        return action.item.width > 1 or (action.index, bucket_for(action.item.position + 1),
                                          action.kind == "draft") in self._compiled_keys

    def _compiled_step(self, k: int, bucket: int, draft: bool):
        """`_static_step` compiled by Inductor with its C++ wrapper (the step then runs as one C++
        call, without the GIL): compiled on first use of each (stage, bucket, drafting), on the
        caller's thread (compiling is not thread-safe), which takes up to a minute or two each on a
        small CPU with a cold compiler cache."""
        out = _COMPILED_STEP(self, k, bucket, draft)
        self._compiled_keys.add((k, bucket, draft))
        return out

    def _graph(self, action: schedule.Action):
        """The captured one-token step for `action` (captured on first use), host lengths advanced."""
        k, item = action.index, action.item
        self.cache.advance(self.partition[k], item.position, item.width)
        key = (k, bucket_for(item.position + 1), action.kind == "draft")
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        return self._graphs[key]

    def prepare(self, length: int) -> None:
        """Room for positions [0, length) and, on CUDA, every stage's one-token step captured at
        every bucket a run writing them reads, drafting or not: no reallocation and no capture
        then lands in a timed run (a run past `length` still grows and captures as it goes)."""
        if self.cache.reserve(length):
            self._graphs.clear()  # captured against the old buffers
        if not self.cuda:
            return  # a CPU compiles its steps on first use (minutes each): only what runs is compiled
        for bucket in buckets_to(length):
            for k in range(len(self.partition)):
                for draft in (True, False):
                    if (k, bucket, draft) not in self._graphs:
                        self._graphs[(k, bucket, draft)] = self._capture(k, bucket, draft)

    def _capture(self, k: int, bucket: int, draft: bool):
        """Stage k's one-token step at `bucket`, captured in the stage's own memory pool."""
        torch.cuda.synchronize(self.device)
        # Warm-up runs write their keys at the bucket's last position: at or past stage k's
        # length, so stale (masked, and overwritten before any query reads it).
        self._dev_in[1 + k] = bucket - 1
        stream = self._streams[k]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # lazy initialisation (cuBLAS handles, workspaces) outside the capture
                self._static_step(k, bucket, draft)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pools[k], stream=stream):
            outputs = self._static_step(k, bucket, draft)
        torch.cuda.synchronize(self.device)
        return graph, outputs


_COMPILED_STEP = torch.compile(GraphedExecutor._static_step, fullgraph=True, dynamic=False)
