"""The pipeline schedule as data: table tests of what each call runs, its invariants over random
call sequences, and the worker's replay of its header part giving the same work."""

from __future__ import annotations

import random

import pytest

from ppsd.executors.base import Feed
from ppsd.executors.schedule import Item, advance, check, describe, empty, enter, flow, slot, worker_part


def plan_of(queues, call):
    """The plan of one call: "flow", a Feed (stage 1 alone, `enter`), or ("slot", Feed | None)."""
    if call == "flow":
        return flow(queues)
    if isinstance(call, Feed):
        return enter(queues, call)
    return slot(queues, call[1])


def run(num_stages: int, calls: list) -> list[list[str]]:
    """Apply `calls` from empty queues, checking every plan; the described actions of each call."""
    queues, seen = empty(num_stages), []
    for call in calls:
        plan = plan_of(queues, call)
        check(queues, plan)
        seen.append(describe(plan))
        queues = plan.queues
    return seen


def draft(position: int) -> Feed:
    return Feed(position, (position,), "draft")


PREFILL = [Feed(0, (1, 2, 3), "prefill"), "flow"]

TABLE = {
    # K=2: the prefill flows through; each slot verifies the last draft while stage 1 drafts the next.
    "K=2 prefill, then PPSD slots": (2, PREFILL + [("slot", draft(3)), ("slot", draft(4)), ("slot", None)], [
        ["1: prefill 0+3"], ["2: prefill 0+3"],
        ["1: draft 3+1"], ["2: verify 3+1", "1: draft 4+1"], ["2: verify 4+1"]]),
    # K=3: back to front, so a token needs K slots from stage 1 to the final logits.
    "K=3 fill and drain": (3, PREFILL + [("slot", draft(3)), ("slot", draft(4)), ("slot", None), ("slot", None)], [
        ["1: prefill 0+3"], ["2: prefill 0+3", "3: prefill 0+3"],
        ["1: draft 3+1"], ["2: verify 3+1", "1: draft 4+1"], ["3: verify 3+1", "2: verify 4+1"],
        ["3: verify 4+1"]]),
    # EESD: stage 1 drafts alone, then one flow verifies the block merged, stage by stage.
    "K=3 EESD block": (3, PREFILL + [draft(3), draft(4), draft(5), "flow"], [
        ["1: prefill 0+3"], ["2: prefill 0+3", "3: prefill 0+3"],
        ["1: draft 3+1"], ["1: draft 4+1"], ["1: draft 5+1"], ["2: verify 3+3", "3: verify 3+3"]]),
    # K=4 full pipeline: every stage busy in one slot, last stage recorded first.
    "K=4 full": (4, [("slot", draft(0)), ("slot", draft(1)), ("slot", draft(2)), ("slot", draft(3))], [
        ["1: draft 0+1"], ["2: verify 0+1", "1: draft 1+1"], ["3: verify 0+1", "2: verify 1+1", "1: draft 2+1"],
        ["4: verify 0+1", "3: verify 1+1", "2: verify 2+1", "1: draft 3+1"]]),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_the_schedule_table(name):
    num_stages, calls, expected = TABLE[name]
    assert run(num_stages, calls) == expected


def test_a_slot_is_the_workers_advance_then_stage_1():
    queues = flow(enter(empty(3), Feed(0, (1, 2), "prefill")).queues).queues
    queues = slot(queues, draft(2)).queues
    whole = slot(queues, draft(3))
    first = advance(queues)
    assert whole == first.then(enter(first.queues, draft(3)))


def test_a_restart_after_a_correction_is_marked_on_stage_1():
    plan = slot(empty(2), Feed(7, (42,), "verify", from_final=True))
    (action,) = plan.actions
    event = action.event(0.0, 1.0, slot=3)
    assert (event.stage, event.kind, event.from_final, event.token_id, event.slot) == (1, "verify", True, 42, 3)
    assert plan.queues[1] == (Item(7, 42, "verify", 1),)


def random_calls(rng: random.Random, count: int) -> list:
    """Slots (with a draft or empty), lone stage-1 drafts and flows, mixed; positions
    contiguous, as a decoder feeds them."""
    calls, position = [], 0
    for _ in range(count):
        choice = rng.random()
        feed = draft(position) if choice < 0.8 and (choice >= 0.5 or rng.random() < 0.8) else None
        calls.append("flow" if choice >= 0.8 else feed if choice >= 0.5 else ("slot", feed))
        position += feed is not None
    return calls


class Worker:
    """The positions a worker holds, oldest first, as the wire delivers them."""

    def __init__(self) -> None:
        self.held: list[int] = []

    def replay(self, part, attached: list[Item], incoming: Item | None) -> tuple[int, int] | None:
        """The worker's side of one call: attached stage-1 output, the previous worker's piece
        (`part.incoming` wide) before or after, and a run over the first positions it holds,
        which must be the ones the part names."""
        self.held += [p for i in attached for p in range(i.position, i.position + i.width)]
        arriving = [] if incoming is None else list(range(incoming.position, incoming.position + incoming.width))
        assert len(arriving) == part.incoming
        if part.before:
            self.held += arriving
        ran = None
        if part.run is not None:
            taken, self.held = self.held[:part.run.width], self.held[part.run.width:]
            assert taken == list(range(part.run.position, part.run.position + part.run.width))
            ran = (part.run.position, part.run.width)
        if not part.before:
            self.held += arriving
        return ran


@pytest.mark.parametrize("num_stages", [2, 3, 4, 5])
@pytest.mark.parametrize("seed", range(6))
def test_every_plan_keeps_the_invariants_and_workers_replaying_their_parts_run_its_actions(num_stages, seed):
    rng = random.Random(seed)
    queues, workers, attached = empty(num_stages), [Worker() for _ in range(num_stages)], []
    for call in random_calls(rng, 60):
        plan = plan_of(queues, call)
        check(queues, plan)
        for k in range(1, num_stages):
            part = worker_part(plan, k)
            expected = next(((a.item.position, a.item.width) for a in plan.actions if a.index == k), None)
            if part is None:
                assert expected is None
                continue
            producer = next((a.item for a in plan.actions if a.index == k - 1 and k > 1), None)
            ran = workers[k].replay(part, attached if k == 1 else [], producer)
            if k == 1:
                attached = []
            assert ran == expected
        attached += [a.item for a in plan.actions if a.index == 0]
        queues = plan.queues
        if rng.random() < 0.1:  # a rollback empties everything
            queues, workers, attached = empty(num_stages), [Worker() for _ in range(num_stages)], []


def test_check_names_a_broken_plan():
    queues = enter(empty(2), draft(0)).queues
    plan = slot(queues, None)
    broken = type(plan)(plan.actions + plan.actions, plan.queues)
    with pytest.raises(ValueError, match="acts twice"):
        check(queues, broken)
    with pytest.raises(ValueError, match="queues after"):
        check(queues, type(plan)(plan.actions, queues))
