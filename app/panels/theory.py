"""The theory panel, beside the metrics: the ideal speedup against the acceptance rate (PPSD at the
run's own slot, EESD when it runs, the 1× line), with this run's measured speedups placed on it.
Before any run it follows the sliders (a formula: no run needed).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Sequence

import gradio as gr
import plotly.graph_objects as go

import ppsd
from ppsd.config import fit_stages
from ppsd.metrics import exit_fraction, ideal_eesd_speedup, ideal_ppsd_speedup_slowest_stage, slot_fraction

from ..components import Plot
from ..plots import CORRECTION_COLOR, FONT, KIND_COLORS, describe, style
from ..reading import RunView
from ..words import ratio_text
from . import QUIET, Page, Single

OUTPUTS = ("theory",)


def create() -> Single:
    # Drawn from the start: Gradio's empty box has an aria-label with no role (axe: serious).
    return Single(OUTPUTS[0], Plot(idle()["theory"], label="Theory", elem_id="theory", show_label=False))


def wire(made: Single, page: Page) -> None:
    """Redrawn as E, K or g are let go and as EESD is ticked."""
    c = page.controls
    settings = [c["exit_layer"], c["num_stages"], c["draft_len"], c["layers"], c["eesd"]]
    gr.on([c[name].release for name in ("exit_layer", "num_stages", "draft_len")], on_settings, settings,
          made.component, **QUIET)
    c["eesd"].change(on_settings, settings, made.component, **QUIET)


def on_settings(exit_layer: float, num_stages: float, draft_len: float, layers: int, eesd: bool = False):
    """The curves for the sliders' E, K and g (EESD's only when EESD will run), on the partition a
    run of them would use."""
    exit_layer, num_stages = fit_stages(int(layers), int(exit_layer), int(num_stages))
    partition = ppsd.stage_layers(int(layers), exit_layer, num_stages)  # the run's own, as after a run
    return render_theory(num_stages=num_stages, slot_fraction=slot_fraction(partition), draft_len=int(draft_len),
                         exit_fraction=exit_fraction(partition), eesd=bool(eesd))


def idle() -> dict[str, Any]:
    return {"theory": render_theory(num_stages=2, slot_fraction=0.5, draft_len=4, exit_fraction=0.5, eesd=False)}


def show(view: RunView) -> dict[str, Any]:
    """The curves of the run's own partition, from the trace its metrics came from (so the curve
    passes through the ideal the headline and the metrics table quote), and its measured points."""
    snap, c = view.snap, view.reading
    first = next(iter(view.runs.values()))
    config = first.config
    points = []
    if view.teaches and c.ppsd.acceptance_rate is not None:
        clock = "measured clock, K workers" if snap.concurrent else "projected clock"
        medians = f", medians of {c.rounds} rounds" if c.rounds > 1 else ""
        forced = f", forced a = {c.forced:.2f}" if c.forced is not None else ""
        # Two lines: a horizontal legend does not wrap, and one line is clipped at the panel's width.
        label = f"PPSD measured<br>({clock}{medians}{forced})"
        points.append(TheoryPoint(label, c.ppsd.acceptance_rate, c.speedup))
        # Both clocks placed: the other clock's point of the same rounds (issue 48), labelled as what it is.
        other = (f"PPSD projected<br>(as on {c.num_stages} devices, one per stage{medians}{forced})" if snap.concurrent
                 else f"PPSD measured<br>(one process, stages in turn{medians}{forced})")
        points.append(TheoryPoint(other, c.ppsd.acceptance_rate, c.other_speedup, hollow=True))
    if view.teaches and c.eesd is not None and c.eesd.acceptance_rate is not None:
        points.append(TheoryPoint("EESD measured<br>(measured clock, medians)", c.eesd.acceptance_rate, c.eesd_speedup))
    partition = first.trace().partition
    return {"theory": render_theory(num_stages=config.num_stages, slot_fraction=slot_fraction(partition),
                                    draft_len=config.draft_len, exit_fraction=exit_fraction(partition), points=points,
                                    eesd=snap.request.eesd)}


@dataclass(frozen=True)
class TheoryPoint:
    """A measured run placed on the theory plot: its acceptance and its speedup over AR (the
    value the headline reports, written by `ratio_text` as the headline writes it)."""

    label: str
    acceptance: float
    speedup: float
    hollow: bool = False  # the other clock's point: an open marker beside the page's own


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
    fig.add_hline(y=1.0, line=dict(color=FONT, width=1, dash="dot"), annotation_text="1× (AR)",
                  annotation_position="bottom left")
    _add_points(fig, points)
    fig.update_xaxes(title_text="acceptance rate a", range=[-0.02, 1.06])
    fig.update_yaxes(title_text="speedup over AR", rangemode="tozero")
    style(fig, "Theory: ideal speedup vs acceptance rate", height=420)
    fig.update_layout(margin_b=100, legend=dict(y=-55 / (420 - 160)))
    ideal = lambda a: ratio_text(ideal_ppsd_speedup_slowest_stage(a, slot_fraction))  # noqa: E731
    placed = "".join(f"; {p.label.replace('<br>', ' ')} at a = {p.acceptance:.2f}: {ratio_text(p.speedup)}"
                     for p in points)
    return describe(fig, f"Theory: the ideal PPSD speedup over AR against the acceptance rate a, {name}: "
                         f"{ideal(0.0)} at a = 0, {ideal(0.5)} at a = 0.5, {ideal(1.0)} at a = 1{placed}.")


def _add_points(fig: go.Figure, points: Sequence[TheoryPoint]) -> None:
    """Each measured point, its ratio written on the side away from any point near it: above the
    higher of two at about the same acceptance, below the lower (issue 58: a fixed side put the
    measured "1.25×" on the projected star above it)."""
    symbols = {"PPSD": "star", "EESD": "diamond"}
    for point in points:
        near = [p.speedup for p in points if p is not point and abs(p.acceptance - point.acceptance) < 0.1]
        below = any(speedup > point.speedup for speedup in near)
        fig.add_trace(go.Scatter(
            x=[point.acceptance], y=[point.speedup], mode="markers+text", name=point.label,
            text=[ratio_text(point.speedup)], textposition="bottom center" if below else "top center",
            marker=dict(size=14, symbol=symbols.get(point.label.split()[0], "circle") + ("-open" if point.hollow else ""),
                        color=KIND_COLORS["verify"] if point.label.startswith("PPSD") else KIND_COLORS["draft"],
                        line=dict(width=1.5, color="#111827")),
            hovertemplate=f"{html.escape(point.label.replace('<br>', ' '))}<br>a=%{{x:.2f}}, {ratio_text(point.speedup)}<extra></extra>"))
