"""The page's shared words: how every ratio, range and duration is written, and each method's
name, so no two panels write one number two ways ("0.74×" beside "1.35× slower")."""

from __future__ import annotations

from typing import Mapping, Sequence

METHOD_NAMES = {"ar": "AR", "ppsd": "PPSD", "eesd": "EESD", "plain": "Plain AR, one process",
                "ppsd_projected": "PPSD, one device per stage (projected)"}
PROJECTED_LANE = "ppsd_projected"  # the race's lane of PPSD as on K devices, one per stage: never in the finishing order
# A what-if run (`ppsd.bench.forced`): every number, stream and saved state of one says so.
FORCED_WORDS = "forced acceptance: the tokens are not the model's answer"
PROJECTED_AS = "as on {k} devices, one per stage (projected from this run's stage costs)"  # the paper's setup


def forced_words(acceptance: float) -> str:
    """The what-if's label, on every number and stream of a forced run."""
    return f"{FORCED_WORDS} (a = {acceptance:.2f})"


# The words a student meets on the first screen, one sentence each (the glossary under the headline).
GLOSSARY = (
    ("AR", "Autoregressive decoding: the model makes one token at a time, each after the last has passed "
           "through every layer."),
    ("AR on the same pipeline", "AR run on the same K stages as PPSD, so only one stage works at a time: the "
                                "baseline that shows what PPSD's drafting itself gains."),
    ("plain AR", "AR with no pipeline: the whole model in this one process, its layers one after another "
                 "(eager, or on the captured steps, which then run the stages in turn), no token passed between "
                 "workers; the fastest ordinary way to decode here, the sceptic's baseline."),
    ("measured clock", "Times read off a stopwatch while the K stages really ran at the same time on this "
                       "machine."),
    ("projected clock", "This run's measured stage costs replayed as if each stage had its own device, with "
                        "the same dependencies and no shared memory bus: the paper's setup, computed, not run."),
    ("acceptance", "The share of drafts that the full model agreed with, a; the higher it is, the more PPSD "
                   "can gain."),
    ("flush", "When a draft is rejected, the work already started on the tokens behind it is thrown away and "
              "redone."),
    ("round", "One timed run of each method, AR and PPSD back to back; the page times several and shows one."),
    ("median", "The middle of the rounds' times, half of them faster and half slower, so one slow round does not "
               "move it; the headline's ratios are ratios of medians."),
    ("stall", "A piece of work that took far longer than the same stage's usual one, the machine's doing (another "
              "program, the memory bus) and not PPSD's; a round whose stalls add up to 5% of its time is not "
              "headlined."),
    ("slot", "One beat of the pipeline: in it each stage works on one piece (a token's pass through its layers), "
             "all at once; the step-through moves slot by slot."),
    ("bubble", "A slot in which a stage has nothing to do, waiting for the token before it or after a flush: the "
               "gaps between the timeline's bars."),
)


def duration_text(seconds: float) -> str:
    """"12.3 ms" below a second, "1.23 s" above."""
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def ratio_text(ratio: float | None) -> str:
    """A speedup (baseline wall / method wall) in words, the factor always at least 1: "1.35×
    faster", for 0.74 "1.35× slower", within half a percent of 1 "no faster (1.00×)". The one way the page writes a ratio, so a headline, a
    card, a star and a sentence never show one number two ways (0.74× beside 1.35× slower)."""
    if ratio is None or ratio <= 0:  # None: a median not timed (`ppsd.compare_stats.Stats.ratio`)
        return "not timed"
    if round(ratio, 2) == 1.0 or round(1 / ratio, 2) == 1.0:
        return "no faster (1.00×)"  # "1.00× slower" is no phrase: within half a percent, neither way
    return f"{ratio:.2f}× faster" if ratio >= 1 else f"{1 / ratio:.2f}× slower"


def agreement_note(token_ids: Mapping[str, Sequence[int]], *, greedy: bool) -> str:
    """Whether every method produced the same tokens, and what that means here."""
    names = [METHOD_NAMES.get(m, m) for m in token_ids]
    if len({tuple(ids) for ids in token_ids.values()}) == 1:
        return f"✓ Identical output, token for token ({' = '.join(names)}): speculation changed only the speed."
    if greedy:
        return (f"✗ Outputs differ ({', '.join(names)}) although decoding is greedy: this should not happen, "
                "please report it.")
    return ("Outputs differ: with temperature > 0 each method draws its own sample. PPSD and EESD keep the "
            "full model's distribution (speculative sampling), not its exact draws.")

OPEN_RECORDED = "Open a recorded run"  # the recordings panel's label, which a visitor told "busy" is pointed to
