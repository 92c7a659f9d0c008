"""Pure render functions: run records in, HTML strings and Plotly figures out.

Nothing here runs a model, touches a tensor or knows Gradio: `app.view` calls these (the numbers
of a run are in `app.numbers`),
and tests call them without a browser. Token text arrives through a `piece(token_id) -> str`
callable so the tokenizer stays with the runner. Every number drawn says its clock.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ppsd import Draft, Event, Token, Trace
from ppsd.metrics import ideal_eesd_speedup, ideal_ppsd_speedup_slowest_stage

from .words import METHOD_NAMES, PROJECTED_MEANING, duration_text, range_text, ratio_text  # noqa: F401 - re-exported

Piece = Callable[[int], str]

# One colour per kind of work; the same colours are used by the CSS legend of the token stream.
KIND_COLORS = {"prefill": "#94a3b8", "draft": "#3b82f6", "verify": "#22c55e", "flushed": "#f59e0b"}
KIND_LABELS = {"prefill": "prefill (prompt)", "draft": "draft (stage 1 + exit head)",
               "verify": "verify / forward", "flushed": "flushed (wasted)"}
CORRECTION_COLOR = "#ef4444"
PROJECTED_NOTE = "projected: the measured per-stage costs replayed on K concurrent workers"
WORKERS_NOTE = "measured on K worker processes, one per stage, all stamping one clock"

_GRID = "rgba(128,128,128,0.25)"
_FONT = "#8a8f98"  # mid grey: readable on the light and the dark theme alike


# --------------------------------------------------------------------------- tokens


def deciding_events(events: Sequence[Event], num_stages: int) -> dict[int, Event]:
    """position of a committed token -> the final-stage work that produced it.

    The token at position p comes from the final stage's output on position p - 1, so the
    decider is the kept (never flushed) final-stage event whose kept range covers p - 1.
    """
    found: dict[int, Event] = {}
    for event in events:
        if event.stage != num_stages or event.kind == "flushed":
            continue
        for p in range(event.position, event.position + event.kept_width):
            found[p + 1] = event
    return found


def render_tokens(
    tokens: Sequence[Token],
    piece: Piece,
    *,
    prompt: str = "",
    pending: Sequence[Draft] = (),
    deciders: Mapping[int, Event] | None = None,
    placeholder: str = "",
    cut: int | None = None,
) -> str:
    """Committed tokens as coloured spans (accepted / corrected with its struck-through draft /
    plain), then in-flight drafts as dashed spans, then, for an answer the max-tokens limit
    ended (`cut`, that limit), a note saying so. All text is escaped; CSS keeps whitespace."""
    deciders = deciders or {}
    parts = [f'<span class="tok-prompt" title="prompt">{_text(prompt)}</span>'] if prompt else []
    for token in tokens:
        parts.append(_token_span(token, piece, deciders.get(token.position)))
    committed = tokens[-1].position if tokens else -1
    for draft in sorted(pending, key=lambda d: d.position):
        if draft.position > committed:
            tip = f"position {draft.position} · draft {piece(draft.id)!r} · pending: still in the pipeline"
            parts.append(f'<span class="tok tok-pending" title="{_attr(tip)}">{_token_text(piece(draft.id))}</span>')
    if not tokens and not pending and placeholder:
        parts.append(f'<span class="tok-placeholder">{html.escape(placeholder)}</span>')
    if cut is not None:
        parts.append(f'<span class="tok-cut">✂ cut at {cut} tokens (Max new tokens): the model had not ended its '
                     'answer</span>')
    return f'<div class="ppsd-stream">{"".join(parts)}</div>'


def _token_span(token: Token, piece: Piece, decider: Event | None) -> str:
    final = piece(token.id)
    where = "" if decider is None else f" · stage {decider.stage}" + (
        f" · slot {decider.slot}" if decider.slot is not None else "")
    if token.draft is None:
        tip = f"position {token.position} · no draft · final {final!r}{where}"
        return f'<span class="tok tok-verified" title="{_attr(tip)}">{_token_text(final)}</span>'
    drafted = piece(token.draft)
    tip = f"position {token.position} · draft {drafted!r} · final {final!r} · {token.status}{where}"
    if token.status == "accepted":
        return f'<span class="tok tok-accepted" title="{_attr(tip)}">{_token_text(final)}</span>'
    return (f'<span class="tok-pair" title="{_attr(tip)}"><span class="tok tok-rejected">{_token_text(drafted)}'
            f'</span><span class="tok tok-corrected">{_token_text(final)}</span></span>')


def _text(text: str) -> str:
    return html.escape(text, quote=False)


def _token_text(text: str) -> str:
    """Escaped token text that stays visible: a newline gets a faint ↵ before the line break
    (a coloured span holding only a line break has no width), an empty piece shows ∅."""
    if not text:
        return '<span class="ws">∅</span>'
    return _text(text).replace("\n", '<span class="ws">↵</span>\n')


def _attr(text: str) -> str:
    return html.escape(text, quote=True)


def render_legend() -> str:
    """The key of the token stream, shown above it at all times."""
    items = [("tok-accepted", "accepted", "the exit head's draft, confirmed by the full model"),
             ("tok-corrected", "corrected", "the full model replaced the draft"),
             ("tok-rejected", "rejected draft", "struck through, with “Show the drafts”"),
             ("tok-verified", "no draft", "AR, or the first token after the prompt"),
             ("tok-pending", "pending", "drafted, still in the pipeline (live only)")]
    spans = "".join(f'<span class="legend-item" title="{_attr(tip)}"><span class="tok {cls}">{label}</span>'
                    f'<span class="legend-tip">{html.escape(tip)}</span></span>' for cls, label, tip in items)
    marks = [(_token_text(""), "the model's end token: its answer is complete"),
             (_token_text("\n"), "a line break")]  # drawn by `_token_text`, so the key matches the stream
    spans += "".join(f'<span class="legend-item"><span class="tok tok-mark">{mark.strip()}</span>'
                     f'<span class="legend-tip">{html.escape(tip)}</span></span>' for mark, tip in marks)
    return f'<div class="ppsd-legend">{spans}</div>'


# --------------------------------------------------------------------------- timeline


def stage_label(k: int, layers: range, utilization: float) -> str:
    """Row label: "stage k · layers a–b · util NN%" (layers inclusive, 0-based)."""
    return f"stage {k} · layers {layers.start}–{layers.stop - 1} · util {utilization:.0%}"


def timeline_title(trace: Trace, num_stages: int) -> str:
    if trace.clock == "projected":
        return f"Pipeline timeline · {PROJECTED_NOTE} (K={num_stages}, {trace.device})"
    if trace.concurrent:
        return f"Pipeline timeline · {WORKERS_NOTE} (K={num_stages}, {trace.device})"
    return f"Pipeline timeline · measured clock ({trace.device})"


def render_timeline(
    panels: Sequence[tuple[str, Trace]], piece: Piece | None = None, *, title: str | None = None
) -> go.Figure:
    """One subplot per (name, trace), stacked with a shared time axis in milliseconds.

    Rows are stages (stage 1 on top), one horizontal bar per event, one trace per kind so the
    legend is the key; final-stage corrections are marked with a red cross at the bar's end.
    """
    panels = [(name, trace) for name, trace in panels if trace is not None]
    if not panels:
        return empty_figure("The pipeline timeline appears here once a run starts.")
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[name for name, _ in panels])
    shown: set[str] = set()
    for row, (name, trace) in enumerate(panels, start=1):
        labels = [stage_label(k, r, u) for k, (r, u) in
                  enumerate(zip(trace.partition, trace.utilization()), start=1)]
        for kind in KIND_COLORS:
            events = [e for e in trace.events if e.kind == kind]
            if not events:
                continue
            fig.add_trace(go.Bar(
                name=KIND_LABELS[kind], legendgroup=kind, showlegend=kind not in shown,
                orientation="h", base=[e.start * 1e3 for e in events], x=[e.duration * 1e3 for e in events],
                y=[labels[e.stage - 1] for e in events], marker=dict(color=KIND_COLORS[kind], line_width=0),
                customdata=[_hover(e, piece) for e in events],
                hovertemplate="%{customdata}<extra>" + name + "</extra>",
            ), row=row, col=1)
            shown.add(kind)
        corrections = [e for e in trace.events if e.decision == "corrected" and e.stage == trace.num_stages]
        if corrections:
            fig.add_trace(go.Scatter(
                name="correction (flush behind it)", legendgroup="correction",
                showlegend="correction" not in shown, mode="markers",
                x=[e.end * 1e3 for e in corrections], y=[labels[e.stage - 1] for e in corrections],
                marker=dict(symbol="x-thin", size=11, color=CORRECTION_COLOR, line=dict(width=2.5,
                                                                                      color=CORRECTION_COLOR)),
                customdata=[_hover(e, piece) for e in corrections],
                hovertemplate="correction<br>%{customdata}<extra>" + name + "</extra>",
            ), row=row, col=1)
            shown.add("correction")
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(labels)), row=row, col=1)
    fig.update_xaxes(title_text="time (ms)", row=len(panels), col=1)
    height = 170 + sum(60 + 34 * t.num_stages for _, t in panels)
    _style(fig, title or timeline_title(panels[0][1], panels[0][1].num_stages), height=height)
    # Legend below the time axis: about 55 px under the plot area, inside a 100 px bottom margin.
    fig.update_layout(barmode="overlay", bargap=0.25, margin_b=100, legend=dict(y=-55 / (height - 160)))
    return fig


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


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color=_FONT))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    _style(fig, None, height=220)
    return fig


def _style(fig: go.Figure, title: str | None, *, height: int) -> None:
    # The legend sits under the plot: above it, it collides with the title and subplot titles.
    fig.update_layout(
        title=dict(text=title, font=dict(size=20), x=0.01, xanchor="left") if title else None, height=height,
        margin=dict(l=10, r=10, t=60 if title else 20, b=20),
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", font=dict(color=_FONT, size=14),
        legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, bgcolor="rgba(0,0,0,0)"),
        hoverlabel=dict(align="left"),
    )
    fig.update_xaxes(gridcolor=_GRID, zerolinecolor=_GRID)
    fig.update_yaxes(gridcolor=_GRID, automargin=True)
    fig.update_annotations(font=dict(color=_FONT))


# --------------------------------------------------------------------------- theory


@dataclass(frozen=True)
class TheoryPoint:
    """A measured run placed on the theory plot: its acceptance and its speedup over AR (the
    value the headline reports, written by `ratio_text` as the headline writes it)."""

    label: str
    acceptance: float
    speedup: float


def eesd_break_even(draft_len: int, exit_fraction: float, steps: int = 2000) -> float | None:
    """Smallest acceptance at which ideal EESD reaches 1x (None when it never does)."""
    for i in range(steps + 1):
        if ideal_eesd_speedup(i / steps, draft_len, exit_fraction) >= 1.0:
            return i / steps
    return None


def render_theory(
    *, num_stages: int, draft_len: int, exit_fraction: float, slot_fraction: float | None = None,
    points: Sequence[TheoryPoint] = (), eesd: bool = True,
) -> go.Figure:
    """Ideal speedup against acceptance rate: PPSD at the run's slot (`slot_fraction`, the largest
    stage's share of the layers, the s its metrics used), the 1x line and the measured points of
    this run; with `eesd` (only when EESD runs) also EESD(g, E/L) and where it loses to AR.
    Without `slot_fraction` the stages are taken as equal (s = 1/K): only for a caller that has
    no partition to pass, as the curve then misses a run on uneven stages."""
    slot_fraction = 1 / num_stages if slot_fraction is None else slot_fraction
    # The points' own acceptances are on the grid, so the curve passes exactly through the ideal
    # the headline quotes for them, not through a neighbour's.
    grid = sorted({i / 200 for i in range(201)} | {p.acceptance for p in points})
    fig = go.Figure()
    lose = eesd_break_even(draft_len, exit_fraction)
    if eesd and (lose is None or lose > 0):
        fig.add_vrect(x0=0, x1=1 if lose is None else lose, fillcolor=CORRECTION_COLOR, opacity=0.08,
                      line_width=0, annotation_text="EESD slower than AR", annotation_position="top left",
                      annotation_font=dict(color=CORRECTION_COLOR, size=14))
    equal = abs(slot_fraction * num_stages - 1) < 1e-9  # then K alone says what s is
    name = f"ideal PPSD, K={num_stages}" + ("" if equal else f", largest stage {slot_fraction:.0%} of the layers")
    fig.add_trace(go.Scatter(x=grid, y=[ideal_ppsd_speedup_slowest_stage(a, slot_fraction) for a in grid],
                             mode="lines", name=name, line=dict(color=KIND_COLORS["verify"], width=3)))
    if eesd:
        fig.add_trace(go.Scatter(x=grid, y=[ideal_eesd_speedup(a, draft_len, exit_fraction) for a in grid],
                                 mode="lines", name=f"ideal EESD, g={draft_len}, E/L={exit_fraction:.2f}",
                                 line=dict(color=KIND_COLORS["draft"], width=3, dash="dash")))
    fig.add_hline(y=1.0, line=dict(color=_FONT, width=1, dash="dot"), annotation_text="1× (AR)",
                  annotation_position="bottom left")
    symbols = {"PPSD": "star", "EESD": "diamond"}
    for point in points:
        fig.add_trace(go.Scatter(
            x=[point.acceptance], y=[point.speedup], mode="markers+text", name=point.label,
            text=[ratio_text(point.speedup)], textposition="top center",
            marker=dict(size=14, symbol=symbols.get(point.label.split()[0], "circle"),
                        color=KIND_COLORS["verify"] if point.label.startswith("PPSD") else KIND_COLORS["draft"],
                        line=dict(width=1.5, color="#111827")),
            hovertemplate=f"{html.escape(point.label)}<br>a=%{{x:.2f}}, {ratio_text(point.speedup)}<extra></extra>"))
    fig.update_xaxes(title_text="acceptance rate a", range=[-0.02, 1.06])
    fig.update_yaxes(title_text="speedup over AR", rangemode="tozero")
    _style(fig, "Theory: ideal speedup vs acceptance rate", height=420)
    fig.update_layout(margin_b=100, legend=dict(y=-55 / (420 - 160)))
    return fig


# --------------------------------------------------------------------------- race replay


@dataclass(frozen=True)
class Lane:
    """One method in the race: its committed tokens and the time (s) each became final."""

    method: str
    tokens: tuple[Token, ...]
    times: tuple[float, ...]
    total: float


def commit_times(tokens: Sequence[Token], trace: Trace) -> tuple[float, ...]:
    """When each token was decided on `trace`'s clock: the end of its final-stage work."""
    deciders = deciding_events(trace.events, trace.num_stages)
    times, last = [], 0.0
    for token in tokens:
        event = deciders.get(token.position)
        last = max(last, event.end) if event is not None else last
        times.append(last)
    return tuple(times)


def render_race(lanes: Sequence[Lane], piece: Piece, *, at: float, clock: str, stretch: float,
                shown: str = "") -> str:
    """The race at time `at` (seconds on the recorded clock): each lane shows what it had
    committed by then, with a progress bar and its own finishing time; `shown`: which round it
    replays, in the panels' words."""
    longest = max((lane.total for lane in lanes), default=0.0) or 1.0
    rows = []
    for lane in lanes:
        done = sum(t <= at for t in lane.times)
        finished = at >= lane.total
        committed = render_tokens(lane.tokens[:done], piece)
        clock_text = f"{duration_text(min(at, lane.total))}" + (" ✓ finished" if finished else "")
        rows.append(
            f'<div class="race-lane"><div class="race-head"><span class="race-name">'
            f'{METHOD_NAMES.get(lane.method, lane.method)}</span><span class="race-clock">{clock_text} · '
            f'{done}/{len(lane.tokens)} tokens</span></div><div class="race-track"><div class="race-bar '
            f'race-{lane.method}" style="width:{100 * min(at, lane.total) / longest:.1f}%"></div></div>'
            f'{committed}</div>')
    which = f"{shown[0].lower()}{shown[1:].split(';')[0]}" if shown else "this run"  # the round, as the panels say
    note = (f"Replay of {which}, slowed {stretch:.0f}× from its recorded pace ({clock} clock) so the "
            "eye can follow." if stretch >= 1.5 else
            f"Replay of {which} at its recorded pace ({clock} clock).")
    verdict = race_verdict(lanes) if at >= longest else ""
    verdict = f'<div class="race-verdict">{html.escape(verdict)}</div>' if verdict else ""
    return f'<div class="race"><div class="race-note">{html.escape(note)}</div>{verdict}{"".join(rows)}</div>'


def race_verdict(lanes: Sequence[Lane]) -> str:
    """Every lane in the order it finished, with its time and how far behind the first it was
    (the replay's last frame)."""
    if len(lanes) < 2:
        return ""
    first, *rest = sorted(lanes, key=lambda lane: lane.total)
    name = lambda lane: METHOD_NAMES.get(lane.method, lane.method)  # noqa: E731
    behind = "; ".join(f"{name(lane)} {duration_text(lane.total)}, {duration_text(lane.total - first.total)} behind"
                       for lane in rest)
    return f"{name(first)} finished first, in {duration_text(first.total)}; then {behind}."
