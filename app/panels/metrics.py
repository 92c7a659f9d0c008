"""The metrics panel, beside the theory: every metric of every finished run of the round shown, each
beside its definition and the clock it reads (`ppsd.metrics.DEFINITIONS`).
"""

from __future__ import annotations

import html
from typing import Any, Mapping

import gradio as gr

from ppsd.executors.kinds import IN_TURN, KINDS, ExecutorKind
from ppsd.metrics import DEFINITIONS

from .. import kind_words
from ..reading import Clocks, RunView
from ..words import METHOD_NAMES, duration_text, forced_words, ratio_text
from . import Page, Single, div

OUTPUTS = ("metrics",)


def create() -> Single:
    return Single(OUTPUTS[0], gr.HTML(elem_id="metrics"))


def wire(made: Single, page: Page) -> None:
    """No events of its own: a Run fills it."""


def idle() -> dict[str, Any]:
    return {"metrics": render_metrics_table({})}


def show(view: RunView) -> dict[str, Any]:
    table = render_metrics_table(view.finished, on=KINDS[view.snap.pipeline], round_label=view.round_label)
    forced = view.snap.request.forced
    if forced is not None:  # the what-if's numbers, said as such over the table
        table = div("forced-note", forced_words(forced)) + table
    return {"metrics": table}


# (row name, which run's Metrics it reads, DEFINITIONS key or own definition, format). "measured":
# the decoder alone, where it ran ({where} and {how}: the executor kind's words); "projected":
# replayed on K concurrent workers. `None` as the clock: a row shown only for runs whose stages
# ran at once (with the stages in turn, a measured utilization says nothing about overlap).
_UTILIZATION = lambda m: " · ".join(f"{u:.0%}" for u in m.stage_utilization)  # noqa: E731
_TABLE_ROWS = (
    ("tokens", "measured", "generated tokens", lambda m: f"{m.tokens}"),
    ("wall, measured ({where})", "measured",
     "seconds of the decoder alone, {how} (UI rendering excluded)", lambda m: duration_text(m.wall_seconds)),
    ("wall, projected (K workers)", "projected",
     "makespan when the measured per-stage costs are replayed on K concurrent workers",
     lambda m: duration_text(m.wall_seconds)),
    ("tokens/s, measured", "measured", "tokens_per_second", lambda m: f"{m.tokens_per_second:.1f}"),
    ("tokens/s, projected", "projected", "tokens_per_second", lambda m: f"{m.tokens_per_second:.1f}"),
    ("acceptance a", "measured", "acceptance_rate",
     lambda m: "—" if m.acceptance_rate is None else f"{m.acceptance_rate:.2f}"),
    ("accepted / corrected / flushed", "measured",
     "drafts confirmed / replaced by the full model / discarded before verification",
     lambda m: f"{m.accepted} / {m.rejected} / {m.flushed}"),
    ("stage utilization, projected", "projected", "stage_utilization", _UTILIZATION),
    ("bubble fraction, projected", "projected", "bubble_fraction", lambda m: f"{m.bubble_fraction:.0%}"),
    ("wasted stage slots", "measured", "wasted_stage_slots", lambda m: f"{m.wasted_stage_slots}"),
    ("ideal speedup at a", "measured", "ideal_speedup", lambda m: ratio_text(m.ideal_speedup)),
    ("slot s", "measured", "slot_fraction", lambda m: "—" if m.slot_fraction is None else f"{m.slot_fraction:.2f}"),
    ("stage utilization, measured", None, "stage_utilization", _UTILIZATION),
)


def render_metrics_table(runs: Mapping[str, Clocks], *, on: ExecutorKind = IN_TURN, round_label: str = "") -> str:
    """Every metric of every run, each beside its definition; each row names the clock it reads
    when the clock matters; `on`: the kind of executor the measured runs ran on; `round_label`: the
    shown round in words, when there were several."""
    if not runs:
        return '<div class="metrics-empty">Metrics and their definitions appear here after a run.</div>'
    methods = list(runs)
    head = "".join(f"<th>{METHOD_NAMES.get(m, m)}</th>" for m in methods)
    rows = []
    for name, clock, definition, fmt in _TABLE_ROWS:
        if clock is None and not on.concurrent:
            continue
        where = {"where": on.label, "how": kind_words.of(on).where}
        name, definition = name.format(**where), DEFINITIONS.get(definition, definition).format(**where)
        values = [fmt(runs[m].on(clock)) for m in methods]
        if name.startswith("ideal"):
            values = ["the reference" if m == "ar" else v for m, v in zip(methods, values)]
        cells = "".join(f"<td>{html.escape(v)}</td>" for v in values)
        rows.append(f'<tr><th scope="row">{html.escape(name)}</th>{cells}'
                    f'<td class="definition">{html.escape(definition)}</td></tr>')
    return (f'{div("shown-run", round_label)}<table class="metrics-table"><thead><tr><th>metric</th>{head}<th>definition</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table>')
