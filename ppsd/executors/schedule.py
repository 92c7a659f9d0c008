"""The pipeline schedule as data: which stage computes what in one executor call.

`slot`, `enter` (stage 1 alone) and `flow` are pure functions of what waits before each stage
(`Queues`) and what enters stage 1 (a `Feed`); each returns a `Plan`: the actions in recording
order and the queues after them. The runtime (`runtime.Runtime`, every kind's) computes the
actions; where stages 2..K run in worker processes it sends each worker its part (`worker_part`)
in the control header, and the worker replays that part on its own queue. So they agree by
construction, and the table tests check the schedule itself.

A slot runs the stages back to front (each stage takes its queue's head, which the stage
before it produced in an earlier slot): stage k's output reaches stage k+1 only for the next
slot, which is what lets K tokens be in flight. A flow runs them front to back, each stage
merging everything queued before it, so one flow carries a prefill or a block of drafts
through the whole pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..steps import Event, Kind
from .base import Feed

ITEM_KINDS: tuple[Kind, ...] = ("prefill", "verify")  # what waits before stages 2..K


@dataclass(frozen=True)
class Item:
    """Hidden states of `width` positions from `position` waiting before a stage."""

    position: int
    token_id: int  # the token at `position` (what the trace shows)
    kind: Kind  # one of ITEM_KINDS
    width: int = 1


@dataclass(frozen=True)
class Action:
    """The stage at `index` (stage `index + 1`: stages count from 1, as in `Event`, indices from
    0) computes `item`: for stage 1 the feed, else the first `take` items of its queue, merged.
    Its output joins the next stage's queue (none after the last stage, which gives the final
    logits)."""

    index: int
    item: Item
    take: int
    kind: Kind  # the event's kind: stage 1 drafts, later stages verify or prefill
    from_final: bool = False

    def event(self, start: float, end: float, slot: int | None) -> Event:
        i = self.item
        return Event(stage=self.index + 1, position=i.position, kind=self.kind, start=start, end=end,
                     token_id=i.token_id, width=i.width, slot=slot, from_final=self.from_final)


Queues = tuple[tuple[Item, ...], ...]  # index k: what waits before stage k + 1 (index 0 stays empty)


@dataclass(frozen=True)
class Plan:
    """One call's actions, in recording order (a stage's input is always recorded before
    it), and what waits before each stage afterwards."""

    actions: tuple[Action, ...]
    queues: Queues

    def then(self, other: "Plan") -> "Plan":
        """This plan followed by `other` (which must start from this plan's queues)."""
        return Plan(self.actions + other.actions, other.queues)


def empty(num_stages: int) -> Queues:
    return ((),) * num_stages


def enter(queues: Queues, feed: Feed) -> Plan:
    """Stage 1 computes `feed`; its output waits before stage 2."""
    item = Item(feed.position, feed.tokens[0], "prefill" if feed.kind == "prefill" else "verify", len(feed.tokens))
    action = Action(0, item, take=0, kind=feed.kind, from_final=feed.from_final)
    return Plan((action,), (queues[0], (*queues[1], item), *queues[2:]))


def advance(queues: Queues) -> Plan:
    """Stages 2..K of a slot: each runs its queue's head, the last stage first. It depends on
    the queues alone, so the runtime starts it in worker processes before the decoder's next feed."""
    actions, queues = [], list(queues)
    for k in reversed(range(1, len(queues))):
        if queues[k]:
            item, queues[k] = queues[k][0], queues[k][1:]
            actions.append(Action(k, item, take=1, kind=item.kind))
            if k + 1 < len(queues):
                queues[k + 1] = (*queues[k + 1], item)
    return Plan(tuple(actions), tuple(queues))


def slot(queues: Queues, feed: Feed | None) -> Plan:
    """Every stage advances by one token: stages 2..K on what they hold, then stage 1 on `feed`."""
    plan = advance(queues)
    return plan if feed is None else plan.then(enter(plan.queues, feed))


def flow(queues: Queues) -> Plan:
    """Stages 2..K, front to back, each over everything queued before it (merged into one piece)."""
    actions, queues = [], list(queues)
    for k in range(1, len(queues)):
        if queues[k]:
            taken, queues[k] = queues[k], ()
            first = taken[0]
            item = Item(first.position, first.token_id, first.kind, sum(i.width for i in taken))
            actions.append(Action(k, item, take=len(taken), kind=item.kind))
            if k + 1 < len(queues):
                queues[k + 1] = (*queues[k + 1], item)
    return Plan(tuple(actions), tuple(queues))


@dataclass(frozen=True)
class WorkerPart:
    """Stage `stage`'s share of a plan, as its worker sees it: what it runs (None: nothing), over
    the first `run.width` positions it holds, and how many positions the previous worker sends
    it (0: none), received before or after its own run. The worker keeps hidden states only;
    what they are comes with each part."""

    run: Item | None = None
    incoming: int = 0
    before: bool = False


def worker_part(plan: Plan, stage: int) -> WorkerPart | None:
    """What the worker of `stage` (>= 1) does in `plan`; None when nothing. Stage 1's output
    (computed by the coordinator) is not part of it: it travels attached to the next message."""
    order = {a.index: i for i, a in enumerate(plan.actions)}
    mine = plan.actions[order[stage]] if stage in order else None
    producer = plan.actions[order[stage - 1]] if stage > 1 and stage - 1 in order else None
    if mine is None and producer is None:
        return None
    return WorkerPart(run=mine.item if mine else None, incoming=producer.item.width if producer else 0,
                      before=producer is not None and mine is not None and order[stage - 1] < order[stage])


def check(before: Queues, plan: Plan) -> None:
    """The schedule's invariants (ValueError on a broken one):
    1. each stage acts at most once per call;
    2. a stage takes only what waited before it, oldest first, and positions stay contiguous;
    3. the queues after are the queues before, minus what was taken, plus what was produced."""
    indices = [a.index for a in plan.actions]
    if len(set(indices)) != len(indices):
        raise ValueError(f"a stage acts twice: {indices}")
    waiting = [list(q) for q in before]
    for a in plan.actions:
        if a.index > 0:
            taken, waiting[a.index] = waiting[a.index][:a.take], waiting[a.index][a.take:]
            if len(taken) != a.take or not taken:
                raise ValueError(f"stage {a.index + 1} takes {a.take} of {len(taken)} waiting")
            ends = [i.position + i.width for i in taken]
            if [i.position for i in taken[1:]] != ends[:-1] or a.item.position != taken[0].position:
                raise ValueError(f"stage {a.index + 1} merges non-contiguous positions")
        if a.index + 1 < len(before):
            waiting[a.index + 1].append(a.item)
    if tuple(map(tuple, waiting)) != plan.queues:
        raise ValueError("the queues after the plan are not what its actions leave")


def describe(plan: Plan) -> list[str]:
    """One line per action, e.g. "3: verify 12+1": for tests, docs and debugging."""
    return [f"{a.index + 1}: {a.kind} {a.item.position}+{a.item.width}" for a in plan.actions]
