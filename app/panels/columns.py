"""The method columns, under the headline: one column per method (AR, PPSD, EESD when it runs),
each its token stream and a stats card (the page's CSS sets which stands first), then the drafts
toggle and the stream's key. The card leads with the page's clock and gives the headline's ratio
(medians); the stream colours each token as `app.token_stream` draws it, live while the method decodes.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Mapping

import gradio as gr

from ppsd import Trace

from ..reading import Clocks, RunView
from ..token_stream import deciding_events, render_legend, render_tokens
from ..words import duration_text, forced_words, ratio_text
from . import QUIET, Page, div

METHODS = ("ar", "ppsd", "eesd")
OUTPUTS = tuple(f"{part}_{m}" for m in METHODS for part in ("stats", "stream"))
TITLES = {"ar": ("AR", "autoregressive, the reference"),
          "ppsd": ("PPSD", "verify while drafting, K stages"),
          "eesd": ("EESD", "draft g tokens, then verify")}
# On the body, so the race's lanes follow the streams' toggle.
SHOW_DRAFTS_JS = "(on) => { document.body.classList.toggle('show-drafts', on); }"


@dataclass(frozen=True)
class Column:
    box: gr.Column
    stats: gr.HTML
    stream: gr.HTML


@dataclass(frozen=True)
class ColumnsPanel:
    columns: Mapping[str, Column]  # by method, in `METHODS`' order
    drafts: gr.Checkbox

    def outputs(self) -> dict[str, Any]:
        return {f"{part}_{m}": getattr(column, part) for m, column in self.columns.items()
                for part in ("stats", "stream")}


def create() -> ColumnsPanel:
    """The columns side by side (EESD's hidden until EESD is asked for), the toggle and the key."""
    columns = {}
    with gr.Row(equal_height=False, elem_id="columns"):
        for method, (name, sub) in TITLES.items():
            with gr.Column(min_width=260, visible=method != "eesd", elem_id=f"col-{method}") as box:
                gr.HTML(f'<div class="col-title">{name} <span>{sub}</span></div>')
                columns[method] = Column(box, gr.HTML(elem_id=f"stats-{method}"), gr.HTML(elem_id=f"stream-{method}"))
    # A short label: in Present it stands on one line above the timeline, its info folded away.
    drafts = gr.Checkbox(value=False, label="Show the drafts", elem_id="drafts",
                         info="Rejected drafts struck through, in-flight ones dashed. Off: each stream (and each "
                              "lane of the race) shows only its committed text, so AR's and PPSD's can be compared "
                              "word for word. Hover a token for its draft either way.")
    gr.HTML(render_legend(), elem_id="stream-legend")
    return ColumnsPanel(columns, drafts)


def wire(made: ColumnsPanel, page: Page) -> None:
    """The toggle works in the browser alone; EESD's box shows its column and names it on Run."""
    made.drafts.change(None, made.drafts, None, js=SHOW_DRAFTS_JS)
    eesd = page.controls["eesd"]
    eesd.change(on_eesd, eesd, [made.columns["eesd"].box, page.controls["run"]], **QUIET)


def on_eesd(on: bool) -> tuple:
    return gr.update(visible=on), gr.update(value="▶ Run AR vs PPSD vs EESD" if on else "▶ Run AR vs PPSD")


def idle() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for method in METHODS:
        values[f"stats_{method}"] = render_stats("", None, live="not enabled" if method == "eesd" else "waiting")
        values[f"stream_{method}"] = render_tokens((), str, placeholder="The output appears here.",
                                                   label=_answer_label(method))
    return values


def show(view: RunView) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for method in METHODS:
        values[f"stats_{method}"], values[f"stream_{method}"] = _column(view, method)
    return values


def _column(view: RunView, method: str) -> tuple[str, str]:
    """A method's card and stream: waiting, live (with its rate so far) or done."""
    snap = view.snap
    piece, prompt = snap.loaded.piece, snap.request.prompt
    run = view.runs.get(method)
    if run is None:
        waiting = "not enabled" if method == "eesd" and not snap.request.eesd else (
            "not run: stopped" if snap.stopped else "waiting for its turn")
        return render_stats(method, None, live=waiting), render_tokens((), piece, prompt=prompt,
                                                                       label=_answer_label(method))
    trace = run.trace()
    deciders = deciding_events(trace.events, trace.num_stages)
    if run.done:
        clocks = view.finished[method]
        median = view.stats.median(method) if snap.request.rounds > 1 else None
        stats = render_stats(method, clocks, round_label=view.round_label, median=median,
                             against=_ratio_line(method, view))
        pending = ()
    else:
        doing = "stopped at" if snap.stopped else "decoding…"
        stats = render_stats(method, None, live=f"{doing} {len(run.recorder.tokens)} tokens"
                             + _rate_so_far(trace, len(run.recorder.tokens)))
        pending = () if snap.stopped else run.recorder.pending
    tokens = run.recorder.tokens
    # Ended by the limit, not by the model: a teacher should not read a cut answer as a whole one.
    limit = run.config.max_new_tokens
    cut = limit if run.done and len(tokens) >= limit and tokens[-1].id not in snap.loaded.model.info.eos_token_ids \
        else None
    stream = render_tokens(tokens, piece, prompt=prompt, pending=pending, deciders=deciders, cut=cut,
                           label=_answer_label(method))
    forced = snap.request.forced
    if forced is not None:  # the what-if: every card's numbers and PPSD's tokens are not the model's
        note = div("forced-note", forced_words(forced))
        stats, stream = note + stats, (note + stream if method == "ppsd" else stream)
    return stats, stream


def _answer_label(method: str) -> str:
    return f"{TITLES[method][0]}'s answer"


def _ratio_line(method: str, view: RunView) -> str:
    """What a method's card says of it against AR: the headline's ratio (medians), nothing else."""
    c = view.reading
    if not view.teaches:
        return ""
    timed = "medians" if c.rounds > 1 else "one round"
    if method == "ppsd":
        return f"PPSD {ratio_text(c.speedup)} than AR ({timed})"
    if method == "eesd" and c.eesd is not None:
        return f"EESD {ratio_text(c.eesd_speedup)} than AR ({timed}, measured)"
    return ""


def _rate_so_far(trace: Trace, tokens: int) -> str:
    """Tokens per second of a run in flight, on the clock its trace is on (measured: where it ran)."""
    if not trace.events or tokens == 0:
        return ""
    seconds = max(e.end for e in trace.events) - min(e.start for e in trace.events)
    where = "measured, K stages at once" if trace.concurrent else "measured, stages in turn"
    return f" · {tokens / seconds:.1f} tok/s so far ({where})" if seconds > 0 else ""


def render_stats(method: str, clocks: Clocks | None, *, live: str = "", round_label: str = "",
                 median: float | None = None, against: str = "") -> str:
    """The small card at the top of a method's column, its `clocks` led by the page's clock
    (`live`: what it says instead while there are none); `round_label`: the
    shown round in words, when there were several; `median`: the method's median wall over the rounds
    (the time the headline uses), `against`: the headline's ratio for this method."""
    if clocks is None:
        return f'<div class="stats"><span class="stats-live">{html.escape(live or "waiting")}</span></div>'
    lead, other = clocks.lead, clocks.other
    rate = "—" if lead.acceptance_rate is None else f"{lead.acceptance_rate:.2f}"
    lead_name, other_name = ("measured, K workers", "projected") if clocks.workers else ("projected", "measured")
    cells = [("tokens", f"{lead.tokens}"),
             *([(f"wall, median of rounds ({lead_name})", duration_text(median))] if median is not None else []),
             (f"wall, this round ({lead_name})" if median is not None else f"wall ({lead_name})",
              duration_text(lead.wall_seconds)),
             (f"tok/s, this round ({lead_name})", f"{lead.tokens_per_second:.1f}"),
             (f"wall, this round ({other_name})" if median is not None else f"wall ({other_name})",
              duration_text(other.wall_seconds)),
             ("acceptance", rate)]
    if method == "ar":
        cells[-1] = ("acceptance (no drafts)", "—")
    body = "".join(f'<div class="stat"><div class="stat-value">{v}</div><div class="stat-name">{k}</div></div>'
                   for k, v in cells)
    # Each method's own time and rate in one line, AR's as PPSD's: what Present keeps of the card.
    timed = f"median of rounds, {lead_name}" if median is not None else lead_name
    time = (f'<div class="stats-time">{duration_text(lead.wall_seconds if median is None else median)} '
            f'<span class="stats-clock">({html.escape(timed)})</span> · {lead.tokens_per_second:.1f} tok/s</div>')
    return f'<div class="stats">{time}{div("stats-ratio", against)}{body}{div("shown-run", round_label)}</div>'
