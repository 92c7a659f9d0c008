"""The headline panel, at the top of the results: the headline's lines (PPSD against the fastest AR
measured here, then against AR on the same pipeline) and a fold with everything else, or, for an
answer too short to time, the answer and no speedup; while a run is in flight, its status and
phases. The analysis and its sentences are `app.analysis`'s; this module lays them out as HTML.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from ppsd.executors.kinds import KINDS

from ..analysis import (MIN_TIMED_TOKENS, Comparison, above_ideal, busy_sentence, compared_sentence, ideal_line,
                        plain_sentence, speedup_headline, walls_sentence)
from ..run_view import RunView
from ..words import GLOSSARY, PROJECTED_MEANING, agreement_note, duration_text, forced_words, ratio_text
from . import Single
from .progress import render_progress


OUTPUTS = ("headline",)


def create() -> Single:
    return Single(OUTPUTS[0], gr.HTML(render_headline(None), elem_id="headline"))


def create_glossary() -> gr.HTML:
    """The glossary, under the headline: where a student first meets AR, plain AR and the clocks."""
    return gr.HTML(render_glossary(), elem_id="glossary")


def render_glossary() -> str:
    """Each term of `app.words.GLOSSARY` in one sentence, in a fold whose summary names them."""
    terms = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(meaning)}</dd>" for term, meaning in GLOSSARY)
    names = ", ".join(term for term, _ in GLOSSARY)
    return (f'<details class="glossary"><summary>Words on this page: {html.escape(names)}</summary>'
            f"<dl>{terms}</dl></details>")


def idle() -> dict[str, Any]:
    return {"headline": render_headline(None)}


def show(view: RunView) -> dict[str, Any]:
    """The headline of `view`: its comparison once AR and PPSD are done, its status until it ends."""
    snap, c = view.snap, view.comparison
    progress = "" if view.ended else render_progress(snap.request.phases(), snap.phase)
    if c is not None and not view.teaches:
        return {"headline": short_headline(c.ar.tokens, status=view.status, progress=progress)}
    if c is None:
        return {"headline": render_headline(None, status=view.status, progress=progress)}
    done = {m: r.result.token_ids for m, r in snap.runs.items() if r.done}
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


def render_headline(c: Comparison | None, *, status: str = "", agreement: str = "", progress: str = "") -> str:
    """The headline's lines (`speedup_headline`), then a fold with everything else: the ideal,
    what was compared, every round's wall, plain AR, the other clock, EESD, whether the outputs
    are identical (`agreement`); `status` (and the `progress` steps) while a run is in flight."""
    if c is None:
        body = html.escape(status or "Press Run: AR, then PPSD (then EESD) decode the prompt one after another.")
        return f'<div class="headline-box">{progress}<div class="headline-status">{body}</div></div>'
    note = lambda text: f'<div class="headline-note">{text}</div>'  # noqa: E731
    more = [ideal_line(c), f'<div class="headline-note headline-compared">{html.escape(compared_sentence(c))}</div>']
    walls = walls_sentence(c)
    if walls:
        more.append(f'<div class="headline-note headline-walls">{html.escape(walls)}</div>')
    if c.plain is not None and c.stats.runs("plain"):
        more.append(f'<div class="headline-note headline-plain">{html.escape(plain_sentence(c))}</div>')
    busy = busy_sentence(c)
    if busy:
        more.append(f'<div class="headline-note headline-busy">{html.escape(busy)}</div>')
    more.extend(note(text) for text in _how_it_ran(c))
    if c.eesd is not None:
        rate = "n/a" if c.eesd.acceptance_rate is None else f"{c.eesd.acceptance_rate:.2f}"
        more.append(note(
            f"EESD (draft then verify, one device): {ratio_text(c.eesd_speedup)} than AR on the measured clock "
            f"(medians); ideal S<sub>EESD</sub> at a={rate}: {ratio_text(c.eesd.ideal_speedup)}."))
    if agreement:
        more.append(f'<div class="headline-note headline-agreement">{html.escape(agreement)}</div>')
    flagged = "⚠ " if busy or above_ideal(c).startswith("⚠") else ""
    summary = f"{flagged}How this was measured: the ideal, every round, plain AR, the other clock"
    lines = [speedup_headline(c), f'<details class="headline-more"><summary>{html.escape(summary)}</summary>'
                                  f'{"".join(more)}</details>']
    if status:
        lines.append(f'{progress}<div class="headline-status">{html.escape(status)}</div>')
    return f'<div class="headline-box">{"".join(lines)}</div>'


def _how_it_ran(c: Comparison) -> list[str]:
    """Where the stages ran and what the other clock gives, in words (HTML)."""
    other = ratio_text(c.other_speedup)
    notes: list[str] = []
    if c.workers:
        kind = KINDS[c.pipeline]
        note = f"Measured: {kind.words(kind.ran, c.num_stages, c.device)}."
        if kind.overhead is not None:
            note += f" The same stage costs replayed (projected clock) give PPSD {other} than AR"
            note += f": the difference is {kind.overhead}." if kind.overhead else "."
        notes.append(note)
    else:
        measured = lambda m: duration_text(c.stats.median(m, clock="measured") or 0.0)  # noqa: E731
        notes.append(f"Projected clock: {PROJECTED_MEANING} (K={c.num_stages}), as if each stage had its own device.")
        notes.append(
            f"Measured on this one {html.escape(c.device)} device, stages run in turn: AR {measured('ar')}, PPSD "
            f"{measured('ppsd')} (PPSD {other} than AR, medians). On one device PPSD does the same work as AR plus the "
            "flushed work, so it cannot be faster there: its speed comes from K stages running at the same time.")
    return notes
