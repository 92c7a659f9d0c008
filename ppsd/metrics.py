"""Metrics of a run and the ideal speedup formulas, each defined once (spec: Metrics).

Computed from the record of a run (tokens, drafts, trace); nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .steps import Draft, Token
from .trace import Trace

DEFINITIONS = {
    "acceptance_rate": "accepted / (accepted + rejected) drafts; flushed drafts never reached verification",
    "tokens_per_second": "generated tokens / wall seconds on the named clock (prefill included)",
    "stage_utilization": "per stage: busy time / makespan",
    "bubble_fraction": "1 - mean stage utilization",
    "wasted_stage_slots": "stage-token slots spent on work later flushed",
    "ideal_speedup": "speedup of the ideal model at the measured acceptance a. PPSD: 1 / (1 - a (1 - s)), "
                     "s = the largest stage's share of the layers (every layer costs the same, so the largest "
                     "stage sets the slot, AR pays all L layers per token; s = 1/K only when the stages are "
                     "equal); EESD: tau / (g E/L + 1 - E/L)",
    "slot_fraction": "s: layers of the largest stage of this run's partition / all layers",
    "cost_slot_fraction": "s at the stages' measured costs: the costliest stage's seconds of decode work / all "
                          "stages' seconds of decode work, in AR's run (every token passes every stage once)",
    "speedup": "AR wall time / method wall time, same model, prompt, length, device and clock",
    "stalls": "work that took over 3x the median time of the same stage's work of the same kind (prefill "
              "aside) and at least 5 ms more: a busy machine, not the method; their excess over that median",
}


def ideal_ppsd_speedup_slowest_stage(acceptance: float, slot_fraction: float) -> float:
    """S_PPSD(a, s) = 1 / (1 - a (1 - s)), s = the slowest stage's share of a token's cost.

    With s from the layers (`slot_fraction`, the page's ideal), every layer is taken to cost the
    same, so the largest stage sets the pipeline's slot: an
    accepted token costs one slot (s of AR's token), a corrected one the whole pipeline (L
    layers, as AR pays for every token). Equal stages have s = 1/K, the spec's 1 / (a/K + 1 - a);
    any other partition must pass its own s (`slot_fraction`), or the ideal overstates it.
    """
    return 1.0 / (1.0 - acceptance * (1.0 - slot_fraction))


def break_even_acceptance(target_speedup: float, slot_fraction: float) -> float:
    """The acceptance a* at which the ideal PPSD speedup reaches `target_speedup`: the inverse of
    `ideal_ppsd_speedup_slowest_stage` (0 when the target is 1 or less; above 1 when no
    acceptance reaches it)."""
    return max(0.0, (1.0 - 1.0 / target_speedup) / (1.0 - slot_fraction)) if target_speedup > 0 else 0.0


@dataclass(frozen=True)
class Stalls:
    """A trace's stalls (`DEFINITIONS["stalls"]`): how many, and the seconds they added."""

    count: int
    excess_seconds: float


STALL_FACTOR, STALL_MIN_SECONDS = 3.0, 0.005


def stalls(trace: Trace) -> Stalls:
    """The work in `trace` that took far longer than the same stage's usual work of its kind: on
    a quiet machine a stage's cost per token hardly varies, so these are the machine's doing."""
    groups: dict[tuple[int, str], list[float]] = {}
    for e in trace.events:
        if e.kind != "prefill":
            groups.setdefault((e.stage, e.kind), []).append(e.end - e.start)
    count, excess = 0, 0.0
    for durations in groups.values():
        usual = sorted(durations)[len(durations) // 2]
        late = [d - usual for d in durations if d > STALL_FACTOR * usual and d - usual >= STALL_MIN_SECONDS]
        count, excess = count + len(late), excess + sum(late)
    return Stalls(count, excess)


def decode_costs(trace: Trace) -> list[float]:
    """Per stage: seconds of decode work in `trace` (prefill aside, as its width is the prompt's)."""
    costs = [0.0] * trace.num_stages
    for e in trace.events:
        if e.kind != "prefill":
            costs[e.stage - 1] += e.duration
    return costs


def cost_slot_fraction(costs: list[float] | tuple[float, ...]) -> float | None:
    """`DEFINITIONS["cost_slot_fraction"]` from AR's `decode_costs`: the s of the ideal model with
    each stage's measured cost in place of its layer count (an LM head or an exit head costs more
    than a layer); None when there was no decode work."""
    return max(costs) / sum(costs) if costs and sum(costs) > 0 else None


def slot_fraction(partition: tuple[range, ...] | list[range]) -> float:
    """Layers of the largest stage over all layers: the slot of the ideal model, as a share."""
    return max(len(r) for r in partition) / sum(len(r) for r in partition)


def exit_fraction(partition: tuple[range, ...] | list[range]) -> float:
    """E/L: stage 1's layers (those the draft sees) over all layers."""
    return len(partition[0]) / sum(len(r) for r in partition)


def ideal_eesd_speedup(acceptance: float, draft_len: int, exit_fraction: float) -> float:
    """S_EESD(a, g, E/L) = tau / (g E/L + 1 - E/L), tau = (1 - a^(g+1)) / (1 - a)."""
    tau = draft_len + 1.0 if acceptance >= 1.0 else (1.0 - acceptance ** (draft_len + 1)) / (1.0 - acceptance)
    return tau / (draft_len * exit_fraction + 1.0 - exit_fraction)


@dataclass(frozen=True)
class Metrics:
    """Summary of one run. Times, speeds and utilization are on `clock`."""

    clock: str
    tokens: int
    accepted: int
    rejected: int
    flushed: int
    acceptance_rate: float | None
    wall_seconds: float
    tokens_per_second: float
    measured_wall_seconds: float
    stage_utilization: list[float]
    bubble_fraction: float
    wasted_stage_slots: int
    ideal_speedup: float
    slot_fraction: float | None = None  # s of this run's partition, the one its PPSD ideal used

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        """A few readable lines (`print(result.metrics())`); the repr keeps every field."""
        rate = ("no drafts" if self.acceptance_rate is None else
                f"{self.acceptance_rate:.2f} ({self.accepted} accepted, {self.rejected} corrected, "
                f"{self.flushed} flushed)")
        slot = "" if self.slot_fraction is None else f" (largest stage {self.slot_fraction:.0%} of the layers)"
        busy = ", ".join(f"{u:.2f}" for u in self.stage_utilization)
        return (f"{self.tokens} tokens in {self.wall_seconds:.2f} s: {self.tokens_per_second:.1f} tok/s "
                f"({self.clock} clock)\nacceptance {rate}\nstage utilization {busy} · bubbles "
                f"{self.bubble_fraction:.0%}\nideal speedup {self.ideal_speedup:.2f}x{slot}")


def summarize(
    *, method: str, tokens: list[Token], drafts: list[Draft], trace: Trace,
    measured_wall_seconds: float, draft_len: int, exit_fraction: float,
) -> Metrics:
    """Metrics on the trace's clock; on the measured clock the wall time is the whole call's."""
    accepted = sum(t.status == "accepted" for t in tokens)
    rejected = sum(t.status == "corrected" for t in tokens)
    rate = accepted / (accepted + rejected) if accepted + rejected else None
    wall = trace.wall(measured_wall_seconds)
    utilization = trace.utilization()
    slot = slot_fraction(trace.partition)
    if method == "ppsd":
        ideal = ideal_ppsd_speedup_slowest_stage(rate or 0.0, slot)
    elif method == "eesd":
        ideal = ideal_eesd_speedup(rate or 0.0, draft_len, exit_fraction)
    else:
        ideal = 1.0
    return Metrics(
        clock=trace.clock,
        tokens=len(tokens),
        accepted=accepted,
        rejected=rejected,
        flushed=sum(d.fate == "flushed" for d in drafts),
        acceptance_rate=rate,
        wall_seconds=wall,
        tokens_per_second=len(tokens) / wall if wall > 0 else 0.0,
        measured_wall_seconds=measured_wall_seconds,
        stage_utilization=utilization,
        bubble_fraction=1.0 - sum(utilization) / len(utilization),
        wasted_stage_slots=sum(e.width - e.kept_width for e in trace.events),
        ideal_speedup=ideal,
        slot_fraction=slot,
    )
