"""The timeline panel, under the first screen: each method's pipeline work as one bar per stage
and event, on the page's clock (PPSD on top, then AR and EESD), the corrections marked, with its
caption; live while a run decodes (redrawn at most once a second, `app.handlers`).
"""

from __future__ import annotations

import html
import re
from typing import Any, Sequence

import gradio as gr
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ppsd import Event, Trace
from ppsd.executors.kinds import KINDS, ExecutorKind

from .. import kind_words
from ..components import Plot
from ..page_text import TIMELINE_CAPTION
from ..plots import CORRECTION_COLOR, KIND_COLORS, KIND_LABELS, describe, empty_figure, style
from ..reading import RunView
from ..token_stream import Piece
from ..words import forced_words
from . import Page, Single

OUTPUTS = ("timeline",)
EMPTY = "The pipeline timeline appears here once a run starts."
NAMES = {"ppsd": "PPSD: verify while drafting", "ar": "AR on the same pipeline", "eesd": "EESD: draft, then verify"}
PROJECTED_NOTE = "projected: the measured per-stage costs replayed on K concurrent workers"
CONCURRENT_NOTE = "measured: {where}, all stamping one clock"  # {where}: the kind's words


def create() -> Single:
    # Drawn from the start: Gradio's empty box has an aria-label with no role (axe: serious).
    plot = Plot(empty_figure(EMPTY), label="Pipeline timeline", elem_id="timeline", show_label=False)
    gr.Markdown(TIMELINE_CAPTION, elem_classes=["caption"], elem_id="timeline-caption")
    return Single(OUTPUTS[0], plot)


def wire(made: Single, page: Page) -> None:
    """No events of its own: a Run fills it."""


def idle() -> dict[str, Any]:
    return {"timeline": empty_figure(EMPTY)}


def show(view: RunView) -> dict[str, Any]:
    """Every method that has done work in the shown round; its title says the clock and the round."""
    snap = view.snap
    panels = [(NAMES[m], view.traces[m]) for m in ("ppsd", "ar", "eesd")
              if m in view.runs and view.runs[m].recorder.events]
    if not panels:
        return {"timeline": empty_figure(EMPTY)}
    live = "" if snap.done else (" · stopped" if snap.stopped else " · live")
    forced = snap.request.forced
    sub = " · ".join(filter(None, (view.round_label, None if forced is None else forced_words(forced))))
    title = timeline_title(panels[0][1], snap.num_stages, KINDS.get(snap.pipeline)) + live + (
        f"<br><sub>{html.escape(sub, quote=False)}</sub>" if sub else "")
    return {"timeline": render_timeline(panels, snap.loaded.piece, title=title)}


def stage_label(k: int, layers: range, utilization: float) -> str:
    """Row label: "stage k · layers a–b · util NN%" (layers inclusive, 0-based)."""
    return f"stage {k} · layers {layers.start}–{layers.stop - 1} · util {utilization:.0%}"


def timeline_title(trace: Trace, num_stages: int, on: ExecutorKind | None = None) -> str:
    """The timeline's title: which clock, and for a measured concurrent run where it ran (`on`).
    Plotly draws a subset of HTML in a title (links, styles), so the device, a recording's own
    string in a replay, is escaped (an entity is drawn as its character)."""
    device = html.escape(trace.device)
    if trace.clock == "projected":
        return f"Pipeline timeline · {PROJECTED_NOTE} (K={num_stages}, {device})"
    if trace.concurrent:
        where = kind_words.of(on).where if on is not None else "the K stages at once"
        return f"Pipeline timeline · {CONCURRENT_NOTE.format(where=where)} (K={num_stages}, {device})"
    return f"Pipeline timeline · measured clock ({device})"


def render_timeline(
    panels: Sequence[tuple[str, Trace]], piece: Piece | None = None, *, title: str | None = None
) -> go.Figure:
    """One subplot per (name, trace), stacked with a shared time axis in milliseconds.

    Rows are stages (stage 1 on top), one horizontal bar per event, one trace per kind so the
    legend is the key; final-stage corrections are marked with a red cross at the bar's end.
    """
    if not panels:
        return empty_figure(EMPTY)
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[name for name, _ in panels])
    legended: set[str] = set()  # each kind once in the legend
    for row, (name, trace) in enumerate(panels, start=1):
        labels = [stage_label(k, r, u) for k, (r, u) in
                  enumerate(zip(trace.partition, trace.utilization()), start=1)]
        for kind in KIND_COLORS:
            events = [e for e in trace.events if e.kind == kind]
            if not events:
                continue
            fig.add_trace(go.Bar(
                name=KIND_LABELS[kind], legendgroup=kind, showlegend=kind not in legended,
                orientation="h", base=[e.start * 1e3 for e in events], x=[e.duration * 1e3 for e in events],
                y=[labels[e.stage - 1] for e in events], marker=dict(color=KIND_COLORS[kind], line_width=0),
                customdata=[_hover(e, piece) for e in events],
                hovertemplate="%{customdata}<extra>" + name + "</extra>",
            ), row=row, col=1)
            legended.add(kind)
        corrections = [e for e in trace.events if e.decision == "corrected" and e.stage == trace.num_stages]
        if corrections:
            fig.add_trace(go.Scatter(
                name="correction (flush behind it)", legendgroup="correction",
                showlegend="correction" not in legended, mode="markers",
                x=[e.end * 1e3 for e in corrections], y=[labels[e.stage - 1] for e in corrections],
                marker=dict(symbol="x-thin", size=11, color=CORRECTION_COLOR, line=dict(width=2.5,
                                                                                      color=CORRECTION_COLOR)),
                customdata=[_hover(e, piece) for e in corrections],
                hovertemplate="correction<br>%{customdata}<extra>" + name + "</extra>",
            ), row=row, col=1)
            legended.add("correction")
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(labels)), row=row, col=1)
    fig.update_xaxes(title_text="time (ms)", row=len(panels), col=1)
    title, top = wrapped_title(title or timeline_title(panels[0][1], panels[0][1].num_stages))
    height = 120 + top + sum(60 + 34 * t.num_stages for _, t in panels)
    style(fig, title, height=height)
    # Legend below the time axis' title: 66 px under the plot area (55 let it overlap that title by
    # 4 px, issue 58), inside a 110 px bottom margin.
    fig.update_layout(barmode="overlay", bargap=0.25, margin_b=110, margin_t=top,
                      legend=dict(y=-66 / (height - top - 110)))
    return describe(fig, timeline_alt(panels))


TITLE_CHARS, SUB_CHARS = 38, 52  # a line of the title at 20 px, of its smaller line, in a 380 px box


def wrapped_title(title: str) -> tuple[str, int]:
    """`title` in lines of at most `TITLE_CHARS` (its `<sub>` lines `SUB_CHARS`), broken at spaces:
    Plotly never wraps a title, and one line was clipped at 1366 px and on a phone (issue 58); and
    the top margin that holds them above the first subplot's name."""
    main, *subs = title.split("<br>")
    lines = _wrap(main, TITLE_CHARS)
    sub_lines = [line for sub in subs for line in _wrap(sub.removeprefix("<sub>").removesuffix("</sub>"), SUB_CHARS)]
    text = "<br>".join(lines + [f"<sub>{line}</sub>" for line in sub_lines])
    return text, 44 + 26 * len(lines) + 20 * len(sub_lines) + (15 if sub_lines else 0)


def unwrapped(title: str) -> str:
    """A title as it was before `wrapped_title` broke it into lines."""
    return re.sub(r"<br>(?!<sub>)", " ", title.replace("</sub><br><sub>", " "))


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def timeline_alt(panels: Sequence[tuple[str, Trace]]) -> str:
    """The timeline in words: per method, how busy each stage was, the corrections and when the
    work ended (its text alternative)."""
    said = []
    for name, trace in panels:
        busy = ", ".join(f"stage {k} {u:.0%}" for k, u in enumerate(trace.utilization(), start=1))
        flushed = sum(e.kind == "flushed" for e in trace.events)
        corrections = sum(e.decision == "corrected" and e.stage == trace.num_stages for e in trace.events)
        end = max((e.end for e in trace.events), default=0.0)
        said.append(f"{name}: stages busy {busy}; {corrections} corrections, {flushed} pieces of work flushed; "
                    f"the work ends at {end * 1e3:.0f} ms")
    return ("Pipeline timeline: one row per stage, one bar per piece of work along time (ms). "
            + ". ".join(said) + ".")


def _hover(e: Event, piece: Piece | None) -> str:
    token = "" if piece is None else f" {piece(e.token_id)!r}"
    positions = f"{e.position}" if e.width == 1 else f"{e.position}–{e.position + e.width - 1}"
    parts = [f"{e.kind} · stage {e.stage} · position {positions}{html.escape(token)}",
             f"{e.start * 1e3:.2f}–{e.end * 1e3:.2f} ms ({e.duration * 1e3:.2f} ms)"]
    if e.slot is not None:
        parts.append(f"slot {e.slot}")
    if e.decision:
        parts.append(f"decision: {e.decision}")
    return "<br>".join(parts)
