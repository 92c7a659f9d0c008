"""The headline panel, at the top of the results: the headline's lines (PPSD against the fastest AR
measured here, then against AR on the same pipeline) and a fold with everything else, or, for an
answer too short to time, the answer and no speedup; while a run is in flight, its status and
phases as steps (`render_progress`). The numbers are the run's `app.reading.Reading`'s (every
ratio read off its `Stats`, written by `app.words.ratio_text`), the sentences `app.analysis`'s;
this module writes the HTML.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

import gradio as gr

from ppsd.metrics import DEFINITIONS

from .. import kind_words
from ..analysis import (above_ideal, busy_sentence, compared_sentence, forced_sentence, loss_sentence, plain_sentence,
                        projected_line, rounds_tag, rounds_text, unclean_reason, walls_sentence, why_sentence)
from ..reading import MIN_TIMED_TOKENS, Reading, RunView
from ..words import GLOSSARY, agreement_note, duration_text, forced_words, ratio_text
from . import Page, Single, div


OUTPUTS = ("headline",)
# The run's phases as its progress steps say them (`RunRequest.phases`), in the headline box while it runs.
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


def create() -> Single:
    return Single(OUTPUTS[0], gr.HTML(render_headline(None), elem_id="headline"))


def render_glossary() -> str:
    """Each term of `app.words.GLOSSARY` in one sentence, in a fold whose summary names them."""
    terms = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(meaning)}</dd>" for term, meaning in GLOSSARY)
    names = ", ".join(term for term, _ in GLOSSARY)
    return (f'<details class="glossary"><summary>Words on this page: {html.escape(names)}</summary>'
            f"<dl>{terms}</dl></details>")


def wire(made: Single, page: Page) -> None:
    """No events of its own: a Run fills it."""


def idle() -> dict[str, Any]:
    return {"headline": render_headline(None)}


def show(view: RunView) -> dict[str, Any]:
    """The headline of `view`: its comparison once AR and PPSD are done, its status until it ends."""
    snap, c = view.snap, view.reading
    progress = "" if view.ended else render_progress(snap.request.phases(), snap.phase)
    if c is not None and not view.teaches:
        return {"headline": short_headline(c.ar.tokens, status=view.status, progress=progress)}
    if c is None:
        return {"headline": render_headline(None, status=view.status, progress=progress)}
    done = {m: r.result.token_ids for m, r in view.runs.items() if r.done}
    agreement = agreement_note(done, greedy=snap.request.temperature == 0) if snap.done else ""
    if snap.done and c.forced is not None:  # forced verdicts change PPSD's tokens: no agreement to check
        agreement = f"PPSD's text differs from AR's by design here: {forced_words(c.forced)}."
    return {"headline": render_headline(c, status=view.status, agreement=agreement, progress=progress)}


def short_headline(tokens: int, *, status: str = "", progress: str = "") -> str:
    """The headline of an answer too short to time: the answer stands, no speedup is told."""
    doing = f'{progress}<div class="headline-status">{html.escape(status)}</div>' if status else ""
    return (f'<div class="headline-box"><div class="headline"><span class="headline-main">The answer is {tokens} '
            f'token{"s" * (tokens != 1)}: too short to time</span></div><div class="headline-why">Under '
            f"{MIN_TIMED_TOKENS} tokens the pipeline never fills, so no speedup is told. Raise Max new tokens, "
            f"or ask for a longer answer (with Chat on, the model answers a question).</div>{doing}</div>")


def render_headline(c: Reading | None, *, status: str = "", agreement: str = "", progress: str = "") -> str:
    """The headline's lines (`speedup_headline`), then a fold with everything else: the ideal,
    what was compared, every round's wall, plain AR, the other clock, EESD, whether the outputs
    are identical (`agreement`); `status` (and the `progress` steps) while a run is in flight."""
    if c is None:
        body = html.escape(status or "Press Run: AR, then PPSD (then EESD) decode the prompt one after another.")
        return f'<div class="headline-box">{progress}<div class="headline-status">{body}</div></div>'
    busy = busy_sentence(c)
    plain = plain_sentence(c) if c.plain is not None and c.stats.runs("plain") else ""
    more = [_note(forced_sentence(c), "forced-why"), ideal_line(c), _note(compared_sentence(c), "compared"),
            _note(walls_sentence(c), "walls"), _note(plain, "plain"), _note(busy, "busy"),
            _note(_how_it_ran(c), html_=True)]
    if c.eesd is not None:
        rate = "n/a" if c.eesd.acceptance_rate is None else f"{c.eesd.acceptance_rate:.2f}"
        more.append(_note(
            f"EESD (draft then verify, one device): {ratio_text(c.eesd_speedup)} than AR on the measured clock "
            f"(medians); ideal S<sub>EESD</sub> at a={rate}: {ratio_text(c.eesd.ideal_speedup)}.", html_=True))
    more.append(_note(agreement, "agreement"))
    flagged = "⚠ " if busy or above_ideal(c).startswith("⚠") else ""
    summary = f"{flagged}How this was measured: the ideal, every round, plain AR, the other clock"
    lines = [speedup_headline(c), f'<details class="headline-more"><summary>{html.escape(summary)}</summary>'
                                  f'{"".join(more)}</details>']
    if status:
        lines.append(f'{progress}<div class="headline-status">{html.escape(status)}</div>')
    return f'<div class="headline-box">{"".join(lines)}</div>'


def _note(text: str, kind: str = "", *, html_: bool = False) -> str:
    """One line of the fold ("" for no text): `text` escaped unless it is `html_` already."""
    cls = f"headline-note headline-{kind}" if kind else "headline-note"
    return (f'<div class="{cls}">{text}</div>' if text else "") if html_ else div(cls, text)


def _how_it_ran(c: Reading) -> str:
    """Where the stages ran and what the other clock gives, in words (HTML)."""
    other = ratio_text(c.other_speedup)
    if not c.workers:
        measured = lambda m: duration_text(c.stats.median(m, clock="measured") or 0.0)  # noqa: E731
        return (f"Measured on this one {html.escape(c.device)} device, stages run in turn: AR {measured('ar')}, PPSD "
                f"{measured('ppsd')} (PPSD {other} than AR, medians). On one device PPSD does the same work as AR plus "
                "the flushed work, so it cannot be faster there: its speed comes from K stages running at the same time.")
    kind = kind_words.of(c.kind)
    note = f"Measured: {kind.ran_on(c.num_stages, c.device)}."
    if kind.overhead is not None:
        note += f" The same stage costs replayed (projected clock) give PPSD {other} than AR"
        note += f": the difference is {kind.overhead}." if kind.overhead else "."
    return note


def _fastest_name(c: Reading) -> tuple[str, str]:
    """The fastest AR measured here, short (for the big line) and in full (beside it)."""
    key, _ = c.fastest
    if key == "plain":
        return "plain AR", f"plain AR {c.plain.words if c.plain else 'with no pipeline'}, measured"
    if c.workers:
        return "AR on the same pipeline", ""
    return "AR in one process", "AR measured in this one process, the stages in turn"


def speedup_headline(c: Reading) -> str:
    """The big lines: PPSD against the fastest AR measured here (the sceptic's baseline: the
    headline's number, read off the rounds' `Stats` and written here), then
    against AR on the same pipeline (the algorithm's own effect) when that is another run,
    with one sentence on why they differ. Ratios of medians, in `ratio_text`'s words."""
    base, detail = _fastest_name(c)
    timed = rounds_text(c.rounds) if c.final else f"{c.rounds} of {c.rounds_asked} rounds timed so far"
    # The baseline is whichever AR was fastest in this run, so it changes between runs: said each time (issue 58).
    clock = "; ".join(filter(None, (f"against the fastest AR this run measured: {base}", detail,
                                    f"{c.ppsd.clock} clock, {timed}, {c.device}")))
    tag = rounds_tag(c)
    tag = f'<span class="headline-rounds">{html.escape(tag)}</span>' if tag else ""
    forced = div("headline-forced", forced_words(c.forced)) if c.forced is not None else ""
    reason = unclean_reason(c)
    if reason:  # no number: a class would read it as the method's
        return (f'{forced}<div class="headline"><span class="headline-main headline-unclean">Not a clean result'
                f'</span>{tag}<span class="headline-clock">({html.escape(clock)})</span></div>'
                f'<div class="headline-unclean-why">Why: {html.escape(reason)}.</div>{_projected_div(c)}')
    first = f'<span class="headline-main">PPSD {ratio_text(c.stats.against_fastest())} than {base}</span>'
    lines = [forced, f'<div class="headline">{first}{tag}<span class="headline-clock">({html.escape(clock)})</span></div>']
    if c.fastest[0] == "plain" or not c.workers:
        lines.append(f'<div class="headline headline-second"><span class="headline-pipeline">PPSD '
                     f"{ratio_text(c.speedup)} than AR on the same pipeline</span></div>")
    lines.append(_projected_div(c))
    why = loss_sentence(c) or why_sentence(c)  # when PPSD lost, why it lost says why the lines differ too
    if why:
        lines.append(div("headline-why", why))
    return "".join(lines)


def _projected_div(c: Reading) -> str:
    head, said, why = projected_line(c).partition("not a clean result: ")  # Present folds the reason away
    why = f'{html.escape(said[:-2])}<span class="headline-projected-why">: {html.escape(why)}</span>' if said else ""
    return f'<div class="headline headline-projected">{html.escape(head)}{why}</div>' if head else ""


def ideal_line(c: Reading) -> str:
    """The ideal at the measured acceptance (a what-if's forced a), the slowest stage as the
    timeline shows it, and why a run above the ideal is there (`above_ideal`)."""
    rate, slot, stages = c.acceptance, c.ppsd.slot_fraction, c.stages
    if rate is None:
        ideal = "no draft was verified: acceptance undefined"
    else:
        layers = ("" if slot is None else
                  f", counting layers (stage {stages.largest} holds the most: {slot:.0%})" if stages is not None else
                  f", counting layers (the largest stage holds {slot:.0%})")
        forced = "forced " if c.forced is not None else ""
        ideal = (f"ideal S<sub>PPSD</sub>({forced}a={rate:.2f}, K={c.num_stages}) = {ratio_text(c.ideal)}"
                 f"{layers}")
    slowest = ("" if stages is None or not stages.utilization else
               f'; <span class="headline-slowest">slowest stage: stage {stages.busiest} '
               f"(util {max(stages.utilization):.0%} on the timeline, {c.ppsd.clock} clock)</span>")
    flag = above_ideal(c)
    flag = f'<span class="headline-flag">{html.escape(flag)}</span>' if flag else ""
    return (f'<div class="headline-note headline-ideal-line"><span class="headline-ideal" '
            f'title="{html.escape(DEFINITIONS["ideal_speedup"])}">{ideal}</span>{slowest}{flag}</div>')
