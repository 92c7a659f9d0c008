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
    "ideal_speedup": "speedup of the ideal model at the measured acceptance rate "
                     "(PPSD: 1 / (1 - a (1 - s)), s = slowest stage's share of layers; 1/(a/K + 1 - a) when balanced)",
    "speedup": "AR wall time / method wall time, same model, prompt, length, device and clock",
}


def ideal_ppsd_speedup(acceptance: float, stages: int, *, slot_fraction: float | None = None) -> float:
    """S_PPSD = 1 / (1 - a (1 - s)), s = the slowest stage's share of the layers.

    An accepted token costs one slot (the slowest stage sets it), a corrected one the whole
    pipeline (L layers). Balanced stages have s = 1/K: the spec's S_PPSD(a, K) = 1 / (a/K + 1 - a).
    """
    s = 1.0 / stages if slot_fraction is None else slot_fraction
    return 1.0 / (1.0 - acceptance * (1.0 - s))


def slot_fraction(stages: tuple[range, ...] | list[range]) -> float:
    """Layers of the largest stage over all layers: the slot of the ideal model, as a share."""
    return max(len(r) for r in stages) / sum(len(r) for r in stages)


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

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(
    *, method: str, tokens: list[Token], drafts: list[Draft], trace: Trace,
    measured_wall_seconds: float, draft_len: int, exit_fraction: float,
) -> Metrics:
    """Metrics on the trace's clock; on the measured clock the wall time is the whole call's."""
    accepted = sum(t.status == "accepted" for t in tokens)
    rejected = sum(t.status == "corrected" for t in tokens)
    rate = accepted / (accepted + rejected) if accepted + rejected else None
    wall = measured_wall_seconds if trace.clock == "measured" else trace.makespan
    utilization = trace.utilization()
    if method == "ppsd":
        ideal = ideal_ppsd_speedup(rate or 0.0, trace.num_stages, slot_fraction=slot_fraction(trace.stages))
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
    )
