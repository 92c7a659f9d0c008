"""What the page says of a comparison, in sentences: whether its result is clean, the headline's
rounds, plain AR, why the two headline lines differ, why PPSD lost when it did, the ideal and every round's walls, each from
one `app.reading.Reading` (laid out as HTML by `app.panels.headline`). Plain text out; every
number says its clock.

One statistic: every ratio is a ratio of medians of the rounds' walls (`ppsd.compare_stats.Stats`),
so the headline, the sentences, the theory star, the cards and the API's summary agree and
multiply; ideals come from `ppsd.metrics`. Every ratio is written by `words.ratio_text` and
every duration by `words.duration_text`.
"""

from __future__ import annotations

from ppsd import quiet
from ppsd.compare import PlainWay
from ppsd.metrics import Stalls, break_even_acceptance, ideal_ppsd_speedup_slowest_stage

from . import kind_words
from .reading import Reading
from .words import PROJECTED_AS, duration_text, ratio_text

BUSY_SHARE = 0.05  # stalls adding this share of a run's wall time make the machine "busy" on the headline


def _stalled(c: Reading) -> list[tuple[str, Stalls, float]]:
    """(name, stalls, measured wall) of each method whose run stalled in the shown round, when stalls added
    at least `BUSY_SHARE` of some method's time (the machine was busy); else []."""
    hit = []
    for name, method, metrics in (("AR", "ar", c.ar), ("PPSD", "ppsd", c.ppsd)):
        found, wall = c.stalls.get(method), metrics.measured_wall_seconds
        if found is not None and found.count and wall > 0:
            hit.append((name, found, wall))
    if not hit or max(found.excess_seconds / wall for _, found, wall in hit) < BUSY_SHARE:
        return []
    return hit


def busy_sentence(c: Reading) -> str:
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


def _threads(n: int) -> str:
    return f"{n} thread{'s' * (n != 1)}"


def rounds_text(n: int) -> str:
    """What a median stands on: "median of 3 rounds", or "one round"."""
    return f"median of {n} rounds" if n > 1 else "one round"


# How far above its run's own ideal a headline ratio may be. Not 5 %: a clean run measured 1.68x at an ideal of 1.56x
CLEAN_MARGIN = 0.15  # (PPSD hides part of the pipeline's hand-overs); 15 % still refuses a 1.99x at a = 0


def allowed_speedup(c: Reading) -> float | None:
    """The most the run's own acceptance allows (a what-if's forced a), margin included: the ideal S_PPSD(a, s) with the
    slowest stage's share s counted by layers or by the stages' measured costs (the larger), times
    1 + `CLEAN_MARGIN`; None when no draft was verified (no acceptance, no ideal)."""
    rate, ideal = c.acceptance, c.ideal
    if rate is None:
        return None
    cost_slot = None if c.stages is None else c.stages.cost_slot
    at_costs = 0.0 if cost_slot is None else ideal_ppsd_speedup_slowest_stage(rate, cost_slot)
    return max(ideal, at_costs) * (1 + CLEAN_MARGIN)


def _rounds_named(rounds) -> str:
    """"round 2" or "rounds 1, 3": the 0-based `rounds` (an iterable of indices) as the page says them."""
    ordered = sorted(rounds)
    return f"round{'s' * (len(ordered) > 1)} " + ", ".join(str(i + 1) for i in ordered)


def unclean_reason(c: Reading, clock: str | None = None) -> str:
    """Why the ratio on `clock` (None: the page's) is not a clean result ("" when it is): a round the
    machine stalled in (`BUSY_SHARE`), that other programs crowded (`ppsd.quiet.crowded`) or that
    compiled, a plain AR that is no measurement, or a ratio above its run's own ideal by over `CLEAN_MARGIN`."""
    busy = {i: share for i, share in enumerate(c.round_busy) if share >= BUSY_SHARE}
    if busy:
        return (f"the machine was busy in {_rounds_named(busy)} (stalled work added up to "
                f"{max(busy.values()):.0%} of a method's time); run again when it is quiet")
    crowded = quiet.crowded(c.others)
    if crowded:
        return (f"other programs used {max(crowded.values()):.1f} of this machine's cores while "
                f"{_rounds_named(crowded)} ran; run again when it is quiet")
    if c.compiled:
        return (f"something compiled in this process during {_rounds_named(c.compiled)}, so the "
                "compiler was timed with the decoder; run again")
    fault = plain_fault(c)
    if fault:
        return fault
    ratio = c.projected_speedup if clock == "projected" else c.speedup
    allowed = allowed_speedup(c)
    if allowed is not None and ratio > allowed:
        return (f"{ratio_text(ratio)} is more than the ideal for its own acceptance a = "
                f"{c.acceptance:.2f} allows ({ratio_text(allowed / (1 + CLEAN_MARGIN))}, plus a "
                f"{CLEAN_MARGIN:.0%} margin); run again when the machine is quiet")
    return ""


PLAIN_NOISE = 0.10  # plain AR this far slower than AR on the pipeline's same eager steps is a timing fault


def plain_fault(c: Reading) -> str:
    """Why plain AR's time is not a measurement ("" when it is): its own rounds far apart, or,
    where the pipeline runs the same eager steps, plain AR slower than AR on it by more than
    `PLAIN_NOISE` (plain AR does that work without the hand-overs: a busy machine's doing)."""
    if c.plain is None or not c.stats.runs("plain"):
        return ""
    spread = c.spread("plain")
    if spread > SPREAD_FLAG:
        return (f"plain AR's slowest round took {spread:.2f} times its fastest: the machine was busy while it ran; "
                "run again when it is quiet")
    faster = c.stats.ratio("plain", "ar") or 0.0  # > 1: AR on the pipeline ran faster than plain AR
    if not c.kind.compiles_on(c.device) and faster > 1 + PLAIN_NOISE:
        return (f"plain AR ran {ratio_text(1 / faster)} than AR on the pipeline's same eager steps, which it runs "
                "without the hand-overs: a timing fault (the machine was busy while it ran); run again")
    return ""


def rounds_tag(c: Reading) -> str:
    """What the headline's number stands on, said beside it: "provisional, round r of R" until the
    last round is timed, "one round" for a single round, else ""."""
    if not c.final:
        return f"provisional, round {c.rounds} of {c.rounds_asked or c.rounds}"
    return "one round" if c.rounds == 1 else ""


def projected_line(c: Reading) -> str:
    """The paper's setup as a result of its own, where the measured clock exists (K stages ran at
    once): "As on K devices, one per stage (…): PPSD X× faster than AR", or why it is not clean."""
    if not c.workers:
        return ""
    said = PROJECTED_AS.format(k=c.num_stages)
    reason = unclean_reason(c, "projected")
    same = reason and reason == unclean_reason(c)  # said once, beside the first line
    result = ("not a clean result either" if same else f"not a clean result: {reason}" if reason
              else f"PPSD {ratio_text(c.projected_speedup)} than AR")
    return f"{said[0].upper()}{said[1:]}: {result}"


def plain_sentence(c: Reading) -> str:
    """PPSD against plain decoding (never called just "AR": that is AR on the pipeline), which
    way plain AR was kept, and the acceptance a* PPSD would need to beat it on this pipeline,
    said only where it is defined. Every ratio is of the medians, so they multiply."""
    p, stats = c.plain, c.stats
    seconds = stats.median("plain", clock="measured")
    on = kind_words.of(c.kind).stages_on(c.num_stages, c.device)
    kept = ""
    if len(p.trials) > 1:
        tried = " and ".join(f"{_threads(t)} ({duration_text(w)})" if done else
                             f"{_threads(t)} (cut after {duration_text(w)}, still decoding)" for t, w, done in p.trials)
        kept = f", the faster of {tried} in the first round"
    ratio = stats.ratio("plain", "ppsd") or 0.0
    verdict = "beats it" if ratio > 1 else "does not beat it"
    if c.fastest[0] != "plain":  # never a win over a baseline slower than one measured beside it
        verdict = ("is not compared with it: AR on the pipeline ran faster, so the headline compares PPSD with that, "
                   "the fastest AR measured")
    text = (f"Plain decoding, the best AR here with no pipeline: AR {p.words}{kept}, {duration_text(seconds)} "
            f"({rounds_text(len(stats.runs('plain')))}, measured). PPSD on {on}: {ratio_text(ratio)} than plain AR, "
            f"so PPSD {verdict} here.")
    need = stats.ratio("ar", "plain") or 0.0  # what PPSD must gain over the pipeline's AR to match plain AR
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


def why_sentence(c: Reading) -> str:
    """Why the first line (against the fastest AR) and the second (against AR on the pipeline)
    differ, in one short sentence; "" when they are the same comparison."""
    key, _ = c.fastest
    if not c.workers:
        return (f"Projected: PPSD's measured stage costs replayed as if each of the {c.num_stages} stages had its "
                f"own device; here one device runs them in turn, where PPSD cannot beat AR.")
    if key != "plain":
        return ""
    slower = ratio_text(c.stats.ratio("plain", "ar") or 0.0)
    cause = ("the stages share one CPU's memory bus and caches, and pass every token between them"
             if c.device == "cpu" else "the stages pass every token between them")
    return f"AR on the pipeline ran {slower} than plain AR: {cause}; PPSD hides that cost only in part."


def loss_sentence(c: Reading) -> str:
    """Why PPSD lost to the fastest AR measured here, in one sentence for the headline box ("" when
    it did not, or there is no clean number): a second thread that speeds plain AR up (then no
    acceptance may help), AR on the pipeline slower than plain AR by more than PPSD won back, or
    the pipeline's own overheads above what drafting ahead saved at this acceptance."""
    if not c.workers or unclean_reason(c) or (c.stats.against_fastest() or 0.0) >= 1:
        return ""
    slot = c.ppsd.slot_fraction or 1.0 / c.num_stages
    rate = "no draft was judged" if c.acceptance is None else f"a = {c.acceptance:.2f}"
    if c.fastest[0] != "plain":  # lost to AR on its own pipeline
        spent = kind_words.of(c.kind).overhead or "the hand-overs between the stages"
        return (f"Why PPSD lost: at {rate} the ideal is {ratio_text(c.ideal)} than AR, but on this pipeline "
                f"{spent} outweighed what drafting ahead saved.")
    need = c.stats.ratio("ar", "plain") or 1.0  # AR on the pipeline over plain AR
    a_star = break_even_acceptance(need, slot)
    gap = (f"by the ideal model no acceptance closes that gap here (even a = 1 gives PPSD only {ratio_text(1 / slot)} "
           "than AR on the pipeline)" if a_star > 1 else f"PPSD would need acceptance a* = {a_star:.2f} ({rate} here)")
    lead = f"AR on the pipeline ran {ratio_text(1 / need)} than plain AR, and PPSD {ratio_text(c.speedup)} than that AR"
    second = _second_thread(c.plain)
    if second is not None:
        return (f"Why PPSD lost: a second thread speeds AR up here (plain AR on {_threads(c.plain.threads)} ran "
                f"{second:.2f} times as fast as on 1), while each of the {c.num_stages} stages runs on a core of its own; "
                f"{lead}, so {gap}.")
    return f"Why PPSD lost: {lead}; {gap}."


def _second_thread(plain: PlainWay | None) -> float | None:
    """How much faster plain AR ran on every core than on 1 in round 1 (None: it kept 1 thread, or
    more threads were no faster than the noise)."""
    if plain is None or plain.threads <= 1:
        return None
    walls = {threads: seconds for threads, seconds, _ in plain.trials}
    if 1 not in walls or plain.threads not in walls or walls[plain.threads] <= 0:
        return None
    gain = walls[1] / walls[plain.threads]  # a 1-thread trial cut short: its wall is a lower bound
    return gain if gain > 1 + NOISE else None


NOISE = 0.05  # a timed run this far above an ideal is within run-to-run timing noise
SPREAD_FLAG = 1.25  # a method's rounds further apart than this (slowest / fastest wall) are not one measurement


def above_ideal(c: Reading) -> str:
    """Why the measured speedup (the medians') is above the ideal, said beside the ideal: the busy
    machine or a wide spread, flagged (⚠) as no clean result; the stages' measured costs (the
    ideal counts layers) or timing noise, explained; anything else flagged. "" when it is not."""
    rate, ideal, measured = c.acceptance, c.ideal, c.speedup
    if rate is None or measured <= ideal:
        return ""
    which = f"{'The median' if c.rounds > 1 else 'This run'} ({ratio_text(measured)}) is above the ideal {ratio_text(ideal)}"
    stalled = _stalled(c)
    if stalled:  # said in full here, as Present mode folds the busy note away
        share = max(s.excess_seconds / wall for _, s, wall in stalled)
        return (f"⚠ {which}: the machine was busy (stalled work added up to {share:.0%} of a method's time), "
                "so this is no clean result; run again.")
    spread = max(c.spread("ar"), c.spread("ppsd"))
    if spread > SPREAD_FLAG:
        return (f"⚠ {which}, and one method's slowest round took {spread:.2f} times its fastest: the machine was "
                "busy in some of them, so this is no clean result; run again.")
    cost_slot = None if c.stages is None else c.stages.cost_slot
    at_costs = None if cost_slot is None else ideal_ppsd_speedup_slowest_stage(rate, cost_slot)
    if at_costs is not None and at_costs > ideal and measured <= at_costs * (1 + NOISE):
        return (f"{which}, which counts layers: on the {c.ppsd.clock} clock the stages' costs are not their layer "
                f"counts (the costliest stage takes {cost_slot:.0%} of a token's time in AR's run), and at those "
                f"costs the ideal is {ratio_text(at_costs)}.")
    if measured <= ideal * (1 + NOISE):
        return f"{which} by less than {NOISE:.0%}: run-to-run timing noise, not a better-than-ideal pipeline."
    costs = "" if at_costs is None else f", also at the stages' measured costs ({ratio_text(at_costs)})"
    return f"⚠ {which}{costs}: not explained by this run, so no clean result; run again when the machine is quiet."


def compared_sentence(c: Reading) -> str:
    """In one sentence, what was compared with what, and which round the panels show."""
    where = (kind_words.of(c.kind).where if c.workers else
             f"one process, the measured stage costs replayed on {c.num_stages} workers")
    timed = (f"each timed in {c.rounds} interleaved rounds; each method's time is the median of its rounds, and "
             "every ratio is of those medians" if c.rounds > 1 else "each timed once")
    tokens = (f"the same {c.ar.tokens} tokens" if c.ar.tokens == c.ppsd.tokens else
              f"{c.ar.tokens} tokens (AR) and {c.ppsd.tokens} (PPSD), unequal work")
    return (f"Compared: AR and PPSD decoding the same prompt to {tokens} on the same "
            f"{c.num_stages}-stage pipeline ({where}), {timed}; the decoder alone is timed.")


def forced_sentence(c: Reading) -> str:
    """A what-if's forced a against the acceptance measured under it, and why they differ, said
    once in words a student follows; "" on a run with the model's own drafts."""
    if c.forced is None:
        return ""
    p, a = c.ppsd, c.forced
    judged = p.accepted + p.rejected
    measured = ("" if p.acceptance_rate is None else
                f" It accepted {p.accepted} of the {judged} drafts PPSD judged, a measured acceptance of "
                f"{p.acceptance_rate:.2f}: a count of whole drafts can only come within one of "
                f"{a:.2f} × {judged} = {a * judged:.1f}.")
    flushed = (f" The {p.flushed} draft{'s' * (p.flushed != 1)} made behind a correction (or still in flight at "
               "the end) were thrown away before they were judged, so they count in neither number."
               if p.flushed else "")
    return (f"What-if: the coin was set to accept a = {a:.2f} of the drafts.{measured}{flushed} The ideal is "
            f"taken at the forced a. Every method decoded exactly {c.ar.tokens} tokens: a what-if ignores the "
            "end-of-text token, as PPSD's forced tokens are not AR's.")


def walls_sentence(c: Reading) -> str:
    """Every round's walls, so a reader can check the medians and see the spread."""
    if c.rounds < 2:
        return ""
    names = (("plain", "plain AR"), ("ar", "AR"), ("ppsd", "PPSD"), ("eesd", "EESD"))
    parts = [f"{name} " + ", ".join(duration_text(w) for w in c.stats.runs(key)) for key, name in names
             if c.stats.runs(key)]
    which = "" if c.shown is None else f"; the panels show round {c.shown + 1}, the one closest to the medians"
    return f"Every round's wall: {'; '.join(parts)}{which}."

