"""Pure render functions for the numbers of a run: the headline (one typed `Comparison`) and
the phases of a run in flight (each method's card and the metrics table: `app.tables`). Strings in, HTML out; every number says its clock. Speedups and
ideals come from `ppsd.metrics`, so the headline, the table and the theory plot agree.

One source per number: the headline's speedup is `Comparison.speedup` (the theory star takes the
same value), every ratio is written by `render.ratio_text` ("X× faster" / "X× slower") and every
duration by `render.duration_text`, so no two places show one number two ways.
"""

from __future__ import annotations

import html
import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ppsd import Metrics
from ppsd.executors.kinds import KINDS
from ppsd.metrics import (DEFINITIONS, Stalls, break_even_acceptance, cost_slot_fraction,
                          ideal_ppsd_speedup_slowest_stage, speedup)

from .render import METHOD_NAMES, PROJECTED_MEANING, duration_text, range_text, ratio_text


@dataclass(frozen=True)
class Clocks:
    """One finished run's metrics on both clocks, and the one the page leads with (`lead`):
    measured when the stages ran on K worker processes at once (`workers`), else projected, as on
    one device the measured clock runs the stages in turn and cannot show their overlap."""

    measured: Metrics
    projected: Metrics
    workers: bool = False

    @property
    def lead(self) -> Metrics:
        return self.measured if self.workers else self.projected

    @property
    def other(self) -> Metrics:
        return self.projected if self.workers else self.measured

    def on(self, clock: str) -> Metrics:
        return self.projected if clock == "projected" else self.measured


@dataclass(frozen=True)
class Stages:
    """The run's K stages two ways: by layers, the ideal model's view (the largest stage sets its
    slot), and by time on the page's clock: `utilization` of PPSD's run, what the timeline's rows
    say, and `costs`, each stage's seconds of decode work in AR's run, whose shares are a token's
    cost (`ppsd.metrics.decode_costs`)."""

    layers: tuple[int, ...]
    utilization: tuple[float, ...]
    costs: tuple[float, ...] = ()

    @property
    def largest(self) -> int:
        """The stage with the most layers (1-based; the first of equals)."""
        return 1 + self.layers.index(max(self.layers))

    @property
    def busiest(self) -> int:
        """The stage the timeline shows busiest (1-based): the slowest stage of this run."""
        return 1 + self.utilization.index(max(self.utilization))

    @property
    def cost_slot(self) -> float | None:
        return cost_slot_fraction(self.costs) if self.costs else None


@dataclass(frozen=True)
class Comparison:
    """What the headline reports: AR and PPSD on the page's clock (`lead`: measured on K worker
    processes, else projected) and on the other clock, the speedup of every timed round on the
    lead clock, and EESD (measured) when it ran."""

    ar: Metrics
    ppsd: Metrics
    ar_other: Metrics
    ppsd_other: Metrics
    num_stages: int
    device: str
    workers: bool
    speedups: tuple[float, ...] = ()  # AR wall / PPSD wall per timed round; empty: the one run above
    eesd: Metrics | None = None
    plain: Plain | None = None
    pipeline: str = "processes"  # with `workers`: the name of the kind that ran (`ppsd.executors.kinds`)
    stalls: Mapping[str, Stalls] = field(default_factory=dict)  # method -> its shown run's stalls
    stages: Stages | None = None

    @property
    def speedup(self) -> float:
        """The median over the timed rounds (the one run's when there is no spread): the number
        the headline and the theory star both show."""
        if self.speedups:
            return statistics.median(self.speedups)
        return speedup(self.ar.wall_seconds, self.ppsd.wall_seconds)

    @property
    def runs(self) -> tuple[float, ...]:
        """The speedup of every timed round (the one run's when there is no spread)."""
        return self.speedups or (self.speedup,)


BUSY_SHARE = 0.05  # stalls adding this share of a run's wall time make the machine "busy" on the headline


def _stalled(c: Comparison) -> list[tuple[str, Stalls, float]]:
    """(name, stalls, measured wall) of each method whose shown run stalled, when stalls added
    at least `BUSY_SHARE` of some method's time (the machine was busy); else []."""
    hit = []
    for name, method, metrics in (("AR", "ar", c.ar), ("PPSD", "ppsd", c.ppsd)):
        found, wall = c.stalls.get(method), metrics.measured_wall_seconds
        if found is not None and found.count and wall > 0:
            hit.append((name, found, wall))
    if not hit or max(found.excess_seconds / wall for _, found, wall in hit) < BUSY_SHARE:
        return []
    return hit


def busy_sentence(c: Comparison) -> str:
    """A warning when stalls (the machine's doing, not the method's) added a real share of time
    to the run shown; "" on a quiet run."""
    hit = _stalled(c)
    if not hit:
        return ""
    added = " and ".join(f"{duration_text(s.excess_seconds)} to {name} ({s.excess_seconds / wall:.0%} of its time)"
                         for name, s, wall in hit)
    count = sum(s.count for _, s, _ in hit)
    return (f"⚠ The machine was busy: {count} stall{'s' * (count != 1)} (a stage's work taking over 3× its usual "
            f"time) added {added} in the run shown. The speedup above is not a clean measurement: run again "
            "when the machine is quiet.")


@dataclass(frozen=True)
class Plain:
    """Plain AR in one process on `threads` threads, no pipeline, measured (median of `runs`),
    beside the medians of the pipeline's AR and PPSD walls on the page's clock: the bar PPSD on K
    workers must clear to be worth its K processes. `trials`: (threads, seconds, finished) of each
    way it was timed first, when there was a choice (1 thread and every core): the faster one was
    kept; one not finished was cut after `seconds`, already the slower."""

    seconds: float
    runs: int
    threads: int
    ar_seconds: float
    ppsd_seconds: float
    on: str = ""  # how it ran, in words (default: in this one process on `threads` threads, no pipeline)
    trials: tuple[tuple[int, float, bool], ...] = ()


def _threads(n: int) -> str:
    return f"{n} thread{'s' * (n != 1)}"


def plain_sentence(c: Comparison) -> str:
    """PPSD against plain decoding (never called just "AR": that is AR on the pipeline, the
    headline's), which way plain AR was kept, and the acceptance a* PPSD would need to beat it on
    this pipeline, said only where it is defined: where plain AR is faster than the pipeline's AR
    (else any acceptance would do) and some a <= 1 reaches it."""
    p = c.plain
    runs = f"median of {p.runs}" if p.runs > 1 else "one run"
    on = (f"the {c.num_stages} worker processes" if c.pipeline == "processes" else
          f"the {c.num_stages} stage threads" if c.pipeline == "threads" else
          f"the {c.num_stages}-stage pipeline ({KINDS[c.pipeline].where})")
    how = p.on or f"in this one process on {_threads(p.threads)} with no pipeline"
    kept = ""
    if len(p.trials) > 1:
        tried = " and ".join(f"{_threads(t)} ({duration_text(w)})" if done else
                             f"{_threads(t)} (cut after {duration_text(w)}, still decoding)" for t, w, done in p.trials)
        kept = f", the faster of {tried} in a first timing"
    ratio = speedup(p.seconds, p.ppsd_seconds)
    verdict = "beats it" if ratio > 1 else "does not beat it"
    text = (f"Plain decoding, the best AR here with no pipeline: AR {how}{kept}, {duration_text(p.seconds)} "
            f"({runs}, measured). PPSD on {on}: {ratio_text(ratio)} than plain AR, so PPSD {verdict} here.")
    need = speedup(p.ar_seconds, p.seconds)  # what PPSD must gain over the pipeline's AR to match plain AR
    rate = "" if c.ppsd.acceptance_rate is None else f" (this run: a = {c.ppsd.acceptance_rate:.2f})"
    slot = c.ppsd.slot_fraction or 1.0 / c.num_stages
    if need <= 1:
        return text + (f" Plain AR ran {ratio_text(need)} than AR on the pipeline here, so no acceptance "
                       "threshold applies.")
    a_star = break_even_acceptance(need, slot)
    if a_star <= 1:
        return text + (f" Plain AR is {ratio_text(need)} than AR on the pipeline; by the ideal model PPSD "
                       f"matches it at acceptance a* = {a_star:.2f}{rate}, the measured pipeline at somewhat more.")
    return text + (f" Plain AR is {ratio_text(need)} than AR on the pipeline; by the ideal model no acceptance "
                   f"makes PPSD beat it here (even a = 1 gives {ratio_text(1 / slot)} than AR on the pipeline).")


def pipeline_threads(num_stages: int, device: str) -> str:
    """How K stage threads in one process ran, in words."""
    return (f"{num_stages} threads in one process, a CUDA stream each" if device.startswith("cuda") else
            f"{num_stages} threads in one process, a core each")


def speedup_headline(c: Comparison) -> str:
    """The big line: PPSD against AR on the page's clock (median and range over the timed rounds,
    in the same words), the ideal at the measured acceptance beside it, the slowest stage as the
    timeline shows it, and why a run above the ideal is there (`above_ideal`)."""
    spread = (f"median of {len(c.speedups)} runs, range {range_text(c.speedups)}; "
              if len(c.speedups) > 1 else "one run; ")
    rate, slot, stages = c.ppsd.acceptance_rate, c.ppsd.slot_fraction, c.stages
    if rate is None:
        ideal = "no draft was verified: acceptance undefined"
    else:
        layers = ("" if slot is None else
                  f", counting layers (stage {stages.largest} holds the most: {slot:.0%})" if stages is not None else
                  f", counting layers (the largest stage holds {slot:.0%})")
        ideal = (f"ideal S<sub>PPSD</sub>(a={rate:.2f}, K={c.num_stages}) = {ratio_text(c.ppsd.ideal_speedup)}"
                 f"{layers}")
    slowest = ("" if stages is None or not stages.utilization else
               f'<span class="headline-slowest">slowest stage: stage {stages.busiest} '
               f"(util {max(stages.utilization):.0%} on the timeline, {c.ppsd.clock} clock)</span>")
    flag = above_ideal(c)
    flag = f'<span class="headline-flag">{html.escape(flag)}</span>' if flag else ""
    return (f'<div class="headline"><span class="headline-main">PPSD {ratio_text(c.speedup)} than AR</span>'
            f'<span class="headline-clock">({spread}{c.ppsd.clock} clock, {html.escape(c.device)})</span>'
            f'<span class="headline-ideal" title="{html.escape(DEFINITIONS["ideal_speedup"])}">{ideal}</span>'
            f"{slowest}{flag}</div>")


NOISE = 0.05  # a timed run this far above an ideal is within run-to-run timing noise
SPREAD_FLAG = 1.25  # timed runs further apart than this (fastest / slowest speedup) are not one measurement


def above_ideal(c: Comparison) -> str:
    """Why a timed run measured above the ideal, said beside the ideal (so wherever the headline
    is, Present mode too): the busy machine or a wide spread, flagged (⚠) as no clean result;
    the stages' measured costs (the ideal counts layers) or timing noise, explained; anything
    else flagged. "" when no run is above it."""
    rate, ideal, runs = c.ppsd.acceptance_rate, c.ppsd.ideal_speedup, c.runs
    top = max(runs)
    if rate is None or top <= ideal:
        return ""
    above = sum(r > ideal for r in runs)
    which = ("This run is" if len(runs) == 1 else "The median is" if c.speedup > ideal else
             f"{above} of the {len(runs)} timed runs {'is' if above == 1 else 'are'}")
    which += f" above the ideal {ratio_text(ideal)}"
    stalled = _stalled(c)
    if stalled:  # said in full here, as Present mode folds the busy note away
        share = max(s.excess_seconds / wall for _, s, wall in stalled)
        return (f"⚠ {which}: the machine was busy (stalled work added up to {share:.0%} of a method's time), "
                "so this is no clean result; run again.")
    if len(runs) > 1 and min(runs) > 0 and top / min(runs) > SPREAD_FLAG:
        return (f"⚠ {which}, and the timed runs range {range_text(runs)}, far apart: the machine was busy in some "
                "of them, so this is no clean result; run again.")
    cost_slot = None if c.stages is None else c.stages.cost_slot
    at_costs = None if cost_slot is None else ideal_ppsd_speedup_slowest_stage(rate, cost_slot)
    if at_costs is not None and at_costs > ideal and top <= at_costs * (1 + NOISE):
        return (f"{which}, which counts layers: on the {c.ppsd.clock} clock the stages' costs are not their layer "
                f"counts (the costliest stage takes {cost_slot:.0%} of a token's time in AR's run), and at those "
                f"costs the ideal is {ratio_text(at_costs)}.")
    if top <= ideal * (1 + NOISE):
        return f"{which} by less than {NOISE:.0%}: run-to-run timing noise, not a better-than-ideal pipeline."
    costs = "" if at_costs is None else f", also at the stages' measured costs ({ratio_text(at_costs)})"
    return f"⚠ {which}{costs}: not explained by this run, so no clean result; run again when the machine is quiet."


def compared_sentence(c: Comparison) -> str:
    """In one sentence, what was compared with what."""
    where = (f"one process, the measured stage costs replayed on {c.num_stages} workers" if not c.workers else
             f"{c.num_stages} worker processes running at once" if c.pipeline == "processes" else
             f"{pipeline_threads(c.num_stages, c.device)} running at once" if c.pipeline == "threads" else
             KINDS[c.pipeline].where)
    timed = f"each timed {len(c.speedups)}×, interleaved" if len(c.speedups) > 1 else "each timed once"
    return (f"Compared: AR and PPSD decoding the same prompt to the same {c.ar.tokens} tokens on the same "
            f"{c.num_stages}-stage pipeline ({where}), {timed}; the decoder alone is timed.")


PHASE_NAMES = {"model": "load the model", "workers": "start the pipeline", "ar": "AR", "ppsd": "PPSD",
               "eesd": "EESD", "plain": "plain AR, one process", "repeats": "time again"}


def render_progress(phases: Sequence[str], current: str | None) -> str:
    """The run's phases as steps: done, now (the one `current` names), still to come."""
    if current not in phases:
        return ""
    now = phases.index(current)
    steps = [f'<span class="phase phase-{"done" if i < now else "now" if i == now else "todo"}">'
             f'{"✓ " if i < now else ""}{html.escape(PHASE_NAMES.get(p, p))}</span>' for i, p in enumerate(phases)]
    return f'<div class="phases">{"<span class=phase-arrow>›</span>".join(steps)}</div>'


def render_headline(c: Comparison | None, *, status: str = "", agreement: str = "", progress: str = "") -> str:
    """Headline, the sentence saying what was compared, and the honest notes on the other clock;
    `status` (and the `progress` steps) while a run is in flight; `agreement` says whether the
    outputs are identical."""
    if c is None:
        body = html.escape(status or "Press Run: AR, then PPSD (then EESD) decode the prompt one after another.")
        return f'<div class="headline-box">{progress}<div class="headline-status">{body}</div></div>'
    note = lambda text: f'<div class="headline-note">{text}</div>'  # noqa: E731
    lines = [speedup_headline(c), f'<div class="headline-note headline-compared">{html.escape(compared_sentence(c))}</div>']
    if c.plain is not None:
        lines.append(f'<div class="headline-note headline-plain">{html.escape(plain_sentence(c))}</div>')
    busy = busy_sentence(c)
    if busy:
        lines.append(f'<div class="headline-note headline-busy">{html.escape(busy)}</div>')
    other = ratio_text(speedup(c.ar_other.wall_seconds, c.ppsd_other.wall_seconds))
    if c.workers and c.pipeline == "threads":
        lines.append(note(
            f"Measured: each of the K={c.num_stages} stages ran on its own thread in this one process "
            f"({pipeline_threads(c.num_stages, c.device)}), at the same time, sharing the weights and the KV cache; "
            f"AR ran on the same threads. The same stage costs replayed (projected clock) give PPSD {other} than AR: "
            "the difference is what the threads lose to each other (on a CPU, Python's lock between short kernels)."))
    elif c.workers and c.pipeline == "graphed":
        lines.append(note(
            f"Measured: each of the K={c.num_stages} stages ran as one captured step in this one process "
            f"({KINDS[c.pipeline].where}), sharing the weights and a static KV cache; AR ran on the same steps. "
            f"The same stage costs replayed (projected clock) give PPSD {other} than AR."))
    elif c.workers:
        lines.append(note(
            f"Measured: each of the K={c.num_stages} stages ran in its own worker process (pinned to its own cores or "
            f"GPU), at the same time; AR ran on the same pipeline. The same stage costs replayed with no messages "
            f"between the stages (projected clock) give PPSD {other} than AR: the difference is the cost of moving "
            "hidden states and logits between processes."))
    else:
        lines.append(note(f"Projected clock: {PROJECTED_MEANING} (K={c.num_stages}), as if each stage had its own device."))
        lines.append(note(
            f"Measured on this one {html.escape(c.device)} device, stages run in turn: AR "
            f"{duration_text(c.ar_other.wall_seconds)}, PPSD {duration_text(c.ppsd_other.wall_seconds)} "
            f"(PPSD {other} than AR). On one device PPSD does the same work as AR plus the flushed work, so it "
            "cannot be faster there: its speed comes from K stages running at the same time on K workers."))
    if c.eesd is not None:
        ar_measured = c.ar if c.workers else c.ar_other
        ratio = speedup(ar_measured.wall_seconds, c.eesd.wall_seconds)
        rate = "n/a" if c.eesd.acceptance_rate is None else f"{c.eesd.acceptance_rate:.2f}"
        lines.append(note(
            f"EESD (draft then verify, one device): {ratio_text(ratio)} than AR on the measured clock; ideal "
            f"S<sub>EESD</sub> at a={rate}: {ratio_text(c.eesd.ideal_speedup)}."))
    if agreement:
        lines.append(f'<div class="headline-note headline-agreement">{html.escape(agreement)}</div>')
    if status:
        lines.append(f'{progress}<div class="headline-status">{html.escape(status)}</div>')
    return f'<div class="headline-box">{"".join(lines)}</div>'


def agreement_note(token_ids: Mapping[str, Sequence[int]], *, greedy: bool) -> str:
    """Whether every method produced the same tokens, and what that means here."""
    names = " = ".join(METHOD_NAMES.get(m, m) for m in token_ids)
    same = len({tuple(ids) for ids in token_ids.values()}) == 1
    if same:
        return f"✓ Identical output, token for token ({names}): speculation changed only the speed."
    if greedy:
        return (f"✗ Outputs differ ({', '.join(METHOD_NAMES.get(m, m) for m in token_ids)}) although decoding "
                "is greedy: this should not happen, please report it.")
    return ("Outputs differ: with temperature > 0 each method draws its own sample. PPSD and EESD keep the "
            "full model's distribution (speculative sampling), not its exact draws.")
