"""Snapshot -> page: what every output of a run shows, as plain values keyed by output name.

Pure functions over `app.runner` snapshots and `app.render`: no Gradio events, no decoding.
`app.ui` maps the names to its components (`OUTPUTS` is their order) and leaves any output a
view does not name unchanged.
"""

from __future__ import annotations

import html
from typing import Any

from ppsd import Trace
from ppsd.compare import PLAIN
from ppsd.executors.kinds import KINDS
from ppsd.metrics import decode_costs, exit_fraction, slot_fraction, stalls

from . import numbers, render, tables, teach, words
from .panels import headline
from .panels.progress import render_progress
from .numbers import MIN_TIMED_TOKENS, Clocks
from .request import RunRequest
from .runner import Snapshot

METHODS = ("ar", "ppsd", "eesd")
OUTPUTS = ("headline", *(f"{part}_{m}" for m in METHODS for part in ("stats", "stream")),
           "timeline", "theory", "metrics", "message", "summary", "race")
TIMELINE_EMPTY = "The pipeline timeline appears here once a run starts."
TIMELINE_NAMES = {"ppsd": "PPSD: verify while drafting", "ar": "AR on the same pipeline",
                  "eesd": "EESD: draft, then verify"}


def message(text: str = "", kind: str = "error") -> str:
    """The message box beside Run: empty, or one error (or notice) in words."""
    if not text:
        return '<div class="run-message run-message-empty"></div>'
    return f'<div class="run-message run-message-{kind}" role="status">{html.escape(text)}</div>'


def idle() -> dict[str, Any]:
    """The page before any run (also after a failed one: no stale numbers stay up)."""
    values: dict[str, Any] = {"headline": headline.render_headline(None)}
    for method in METHODS:
        values[f"stats_{method}"] = tables.render_stats("", None, None,
                                                        live="not enabled" if method == "eesd" else "waiting")
        values[f"stream_{method}"] = render.render_tokens((), str, placeholder="The output appears here.")
    values.update(timeline=render.empty_figure(TIMELINE_EMPTY),
                  theory=render.render_theory(num_stages=2, slot_fraction=0.5, draft_len=4, exit_fraction=0.5,
                                              eesd=False),
                  metrics=tables.render_metrics_table({}), message=message(), summary=None, race=None)
    return values


def failed(text: str) -> dict[str, Any]:
    """A run that could not start or failed: the reason beside Run, the results cleared. The
    API's last output carries it too, as {"error": text}."""
    return {**idle(), "message": message(text), "summary": {"error": text}}


STOPPED_BEFORE = "Stopped before decoding began. Press Run to start again."


def stopped_before() -> dict[str, Any]:
    """Stop while the model loaded or the run waited for the device: the words, and the API's last
    output saying so as every stopped run's does (`_stopped`)."""
    return {**status(STOPPED_BEFORE), "summary": {"stopped": STOPPED_BEFORE, "finished": {}}}


def status(text: str, request: RunRequest | None = None, phase: str | None = None) -> dict[str, Any]:
    """Only the status changes (loading a model, waiting for the device): the headline's status
    line, with the run's phases as steps when `request` and its current `phase` are given, and the
    same words beside Run, where the visitor is looking when they press it."""
    progress = render_progress(request.phases(), phase) if request is not None else ""
    return {"headline": headline.render_headline(None, status=text, progress=progress),
            "message": message(text, "status")}


def snapshot(snap: Snapshot, *, figures: bool = True) -> dict[str, Any]:
    """Every output for one snapshot (live, stopped or final); without `figures` the two plots
    are left as they are."""
    # At the end, what the run did otherwise than asked (a pipeline that could not run where it ran).
    beside_run = message(snap.note, "notice") if snap.done or snap.stopped else message(_status_line(snap), "status")
    if not snap.runs:  # the worker processes are starting: only the status changes
        stopped = {"summary": _stopped(snap)} if snap.stopped else {}  # the API's last output says so
        return {"headline": _headline(snap, {}, None), "message": beside_run, **stopped}
    finished = {m: Clocks(r.result.metrics("measured"), r.result.metrics("projected"), snap.concurrent)
                for m, r in snap.runs.items() if r.done}
    comparison = _comparison(snap, finished)  # one value per number: the headline and the theory star read it
    values: dict[str, Any] = {"headline": _headline(snap, finished, comparison)}
    for method in METHODS:
        values[f"stats_{method}"], values[f"stream_{method}"] = _column(snap, method, finished, comparison)
    if figures:
        values.update(timeline=_timeline(snap), theory=_theory(snap, finished, comparison))
    values.update(metrics=tables.render_metrics_table(finished, on=KINDS[snap.pipeline], shown=shown_run(snap)),
                  message=beside_run,
                  summary=_summary(snap, finished) if snap.done else _stopped(snap),
                  race=_race_state(snap) if snap.done else None)
    return values


def _rate_so_far(trace: Trace, tokens: int) -> str:
    """Tokens per second of a run in flight, on the clock its trace is on (measured: where it ran)."""
    if not trace.events or tokens == 0:
        return ""
    seconds = max(e.end for e in trace.events) - min(e.start for e in trace.events)
    where = "measured, K stages at once" if trace.concurrent else "measured, stages in turn"
    return f" · {tokens / seconds:.1f} tok/s so far ({where})" if seconds > 0 else ""


def shown_run(snap: Snapshot) -> str:
    """Which round the panels show, when there are several: the first while it decodes live,
    then the one closest to the medians, whose times the headline gives."""
    rounds, index = snap.request.rounds(), snap.state.shown_index()
    if rounds == 1:
        return ""
    if index is None:
        return f"Round 1 of {rounds}, decoded live; the headline will give each method's median of the {rounds} rounds"
    return (f"Round {index + 1} of {len(snap.state.rounds)}, the one closest to the medians; the headline gives each "
            "method's median")


def _ratio_line(method: str, comparison: numbers.Comparison | None) -> str:
    """What a method's card says of it against AR: the headline's ratio (medians), nothing else."""
    if comparison is None or comparison.ar.tokens < MIN_TIMED_TOKENS:
        return ""
    if method == "ppsd":
        return f"PPSD {words.ratio_text(comparison.speedup)} than AR (medians)"
    if method == "eesd" and comparison.eesd is not None:
        return f"EESD {words.ratio_text(comparison.eesd_speedup)} than AR (medians, measured)"
    return ""


def _column(snap: Snapshot, method: str, finished: dict[str, Clocks],
            comparison: numbers.Comparison | None = None) -> tuple[str, str]:
    piece, prompt = snap.loaded.piece, snap.request.prompt
    run = snap.runs.get(method)
    if run is None:
        waiting = "not enabled" if method == "eesd" and not snap.request.eesd else (
            "not run: stopped" if snap.stopped else "waiting for its turn")
        return tables.render_stats(method, None, None, live=waiting), render.render_tokens((), piece, prompt=prompt)
    trace = run.trace()
    deciders = render.deciding_events(trace.events, trace.num_stages)
    if run.done:
        clocks = finished[method]
        median = snap.stats().median(method) if snap.request.rounds() > 1 else None
        stats = tables.render_stats(method, clocks.projected, clocks.measured, workers=snap.concurrent,
                                     shown=shown_run(snap), median=median, against=_ratio_line(method, comparison))
        pending = ()
    else:
        doing = "stopped at" if snap.stopped else "decoding…"
        stats = tables.render_stats(method, None, None, live=f"{doing} {len(run.recorder.tokens)} tokens"
                                     + _rate_so_far(trace, len(run.recorder.tokens)))
        pending = () if snap.stopped else run.recorder.pending
    tokens = run.recorder.tokens
    # Ended by the limit, not by the model: a teacher should not read a cut answer as a whole one.
    limit = run.config.max_new_tokens
    cut = limit if run.done and len(tokens) >= limit and tokens[-1].id not in snap.loaded.model.info.eos_token_ids \
        else None
    return stats, render.render_tokens(tokens, piece, prompt=prompt, pending=pending, deciders=deciders, cut=cut)


def _status_line(snap: Snapshot) -> str:
    ended = ("Stopped" if snap.time_limit is None else
             f"Ended by the time limit (a run may hold the device {snap.time_limit:g} s)")
    if snap.stopped:
        run = snap.runs.get(snap.active or "")
        where = (f" during {render.METHOD_NAMES[snap.active]}, after {len(run.recorder.tokens)} tokens"
                 if run is not None else " before decoding began")
        return f"{ended}{where}. " + ("Press Run to start again." if snap.time_limit is None else
                                      "Ask for fewer new tokens or fewer timed runs.")
    timed, rounds = len(snap.stats().runs("ppsd")), snap.request.rounds()
    if snap.done and timed < rounds:
        return f"{ended} while timing again: the medians are over {timed} round{'s' * (timed != 1)}."
    if snap.active == "workers":
        return snap.status or f"Starting the {KINDS[snap.pipeline].choice}…"
    if snap.phase == "repeats":
        return f"Timing again for the medians: {snap.status}"
    if snap.active in snap.runs and not snap.done:
        run = snap.runs[snap.active]
        return (f"Running {render.METHOD_NAMES[snap.active]}… {len(run.recorder.tokens)}/"
                f"{run.config.max_new_tokens} tokens")
    return snap.status


def _comparison(snap: Snapshot, finished: dict[str, Clocks]) -> numbers.Comparison | None:
    """What the headline reports, once AR and PPSD have finished; None before."""
    if "ar" not in finished or "ppsd" not in finished:
        return None
    ar, ppsd_ = finished["ar"], finished["ppsd"]
    shown = snap.runs["ppsd"].shown()  # the trace the timeline draws on top: its rows' "util" are these
    stages = numbers.Stages(layers=tuple(len(r) for r in shown.partition), utilization=tuple(shown.utilization()),
                            costs=tuple(decode_costs(snap.runs["ar"].shown())))
    return numbers.Comparison(
        ar=ar.lead, ppsd=ppsd_.lead, ar_other=ar.other, ppsd_other=ppsd_.other, num_stages=snap.num_stages,
        device=snap.device, workers=snap.concurrent, stats=snap.stats(),
        eesd=finished["eesd"].measured if "eesd" in finished else None, plain=snap.plain,
        pipeline=snap.pipeline, stalls={m: stalls(snap.runs[m].trace()) for m in ("ar", "ppsd")}, stages=stages,
        shown=snap.state.shown_index())


def _headline(snap: Snapshot, finished: dict[str, Clocks], comparison: numbers.Comparison | None) -> str:
    status_text = _status_line(snap)
    progress = "" if snap.done or snap.stopped else render_progress(snap.request.phases(), snap.phase)
    if comparison is not None and comparison.ar.tokens < MIN_TIMED_TOKENS:
        return headline.short_headline(comparison.ar.tokens, status=status_text, progress=progress)
    if comparison is None:
        return headline.render_headline(None, status=status_text, progress=progress)
    done = {m: r.result.token_ids for m, r in snap.runs.items() if r.done}
    agreement = words.agreement_note(done, greedy=snap.request.temperature == 0) if snap.done else ""
    return headline.render_headline(comparison, status=status_text, agreement=agreement, progress=progress)


def _timeline(snap: Snapshot):
    panels = [(TIMELINE_NAMES[m], snap.runs[m].shown()) for m in ("ppsd", "ar", "eesd")
              if m in snap.runs and snap.runs[m].recorder.events]
    if not panels:
        return render.empty_figure(TIMELINE_EMPTY)
    live = "" if snap.done else (" · stopped" if snap.stopped else " · live")
    _, top = panels[0]
    shown = shown_run(snap)
    title = render.timeline_title(top, snap.num_stages) + live + (f"<br><sub>{shown}</sub>" if shown else "")
    return render.render_timeline(panels, snap.loaded.piece, title=title)


def _theory(snap: Snapshot, finished: dict[str, Clocks], comparison: numbers.Comparison | None):
    first = next(iter(snap.runs.values()))
    config = first.config
    points = []
    teaches = comparison is not None and comparison.ar.tokens >= MIN_TIMED_TOKENS
    if teaches and comparison.ppsd.acceptance_rate is not None:
        clock = "measured clock, K workers" if snap.concurrent else "projected clock"
        runs = comparison.rounds
        label = f"PPSD measured ({clock}{', medians of %d rounds' % runs if runs > 1 else ''})"
        points.append(render.TheoryPoint(label, comparison.ppsd.acceptance_rate, comparison.speedup))
    if teaches and comparison.eesd is not None and comparison.eesd.acceptance_rate is not None:
        points.append(render.TheoryPoint("EESD measured (measured clock, medians)", comparison.eesd.acceptance_rate,
                                         comparison.eesd_speedup))
    # The slot of the run's own partition, from the trace its metrics came from: the curve then
    # passes through the ideal the headline and the metrics table quote.
    partition = first.trace().partition
    return render.render_theory(num_stages=config.num_stages, slot_fraction=slot_fraction(partition),
                                draft_len=config.draft_len, exit_fraction=exit_fraction(partition), points=points,
                                eesd=snap.request.eesd)


def _summary(snap: Snapshot, finished: dict[str, Clocks]) -> dict:
    """The machine-readable result of a run (also the API's last output)."""
    info = snap.loaded.model.info
    config = next(iter(snap.runs.values())).config
    out: dict[str, Any] = {
        "model": info.name, "device": info.device, "dtype": info.dtype, "num_layers": info.num_layers,
        "exit_layer": config.exit_layer, "stages": config.num_stages, "draft_len": config.draft_len,
        "max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "top_p": config.top_p,
        "seed": config.seed, "prompt": snap.request.prompt, "chat": snap.request.chat and snap.loaded.chat,
        "exit_head": snap.head,
        "executor": KINDS[snap.pipeline].label,
        "timing": (f"decoder only, UI rendering paused; measured = {KINDS[snap.pipeline].where}; "
                   "projected = measured per-stage costs replayed on K workers"),
    }
    for method, run in snap.runs.items():
        clocks = finished[method]
        out[method] = {"text": snap.loaded.decode(run.result.token_ids), "token_ids": run.result.token_ids,
                       "measured": clocks.measured.to_dict(), "projected": clocks.projected.to_dict()}
    stats = snap.stats()
    # Every ratio is of the medians of the rounds' walls, as on the page.
    for clock in ("projected", "measured"):
        out[f"speedup_{clock}"] = stats.ratio("ar", "ppsd", clock=clock)
    index = snap.state.shown_index()
    out["timed_runs"] = {"clock": snap.state.clock, "statistic": "each method's median wall; ratios of medians",
                         "rounds": len(stats.runs("ppsd")), "shown_round": None if index is None else index + 1,
                         "speedup": stats.ratio("ar", "ppsd"), "speedup_vs_fastest_ar": stats.against_fastest(),
                         "fastest_ar": (stats.fastest_ar() or (None,))[0],
                         **{f"{m}_wall_seconds": list(stats.runs(m)) for m in stats.walls}}
    if snap.note:
        out["note"] = snap.note
    if snap.plain is not None:  # plain AR is on the measured clock, whatever the page's
        out["timed_runs"]["plain"] = f"AR {snap.plain.words}, measured"
        # each way plain AR was first timed, when there was a choice: the faster was kept
        out["timed_runs"]["plain_first_timings"] = [{"threads": t, "wall_seconds": w, "finished": done}
                                                    for t, w, done in snap.plain.trials]
    if len(stats.runs("ppsd")) < snap.request.rounds():  # Stop or the time limit cut the timing again short
        out["stopped"] = _status_line(snap)
    return out


def _stopped(snap: Snapshot) -> dict | None:
    """The API's last output for a run that ended before its results: why, and where."""
    if not snap.stopped:
        return None
    return {"stopped": _status_line(snap), **({"note": snap.note} if snap.note else {}),
            "finished": {m: {"token_ids": r.result.token_ids} for m, r in snap.runs.items() if r.done}}


def _race_state(snap: Snapshot) -> dict:
    """What the race replay needs, as plain data: lanes on the page's clock and token text."""
    lanes = []
    pieces: dict[int, str] = {}
    plain = [(PLAIN, snap.plain_run)] if snap.plain_run is not None else []
    for method, run in [*snap.runs.items(), *plain]:
        trace = run.shown()
        tokens = run.result.tokens
        # A lane ends at its run's wall on the page's clock, the value the stats card and the
        # metrics table show (the last event ends a little before the stopwatch stops).
        lanes.append(render.Lane(method, tokens, render.commit_times(tokens, trace), run.wall()))
        for token in tokens:
            for token_id in (token.id, token.draft):
                if token_id is not None:
                    pieces[token_id] = snap.loaded.piece(token_id)
    ppsd_run = snap.runs["ppsd"]
    steps = teach.slots(ppsd_run.result.trace)  # the same trace the timeline draws
    return {"lanes": lanes, "pieces": pieces, "clock": "measured" if snap.concurrent else "projected",
            "shown": shown_run(snap),
            "steps": steps, "ppsd_tokens": ppsd_run.result.tokens}


def step(race: dict | None, index: int) -> str:
    """Slot `index` (0-based) of the finished PPSD run: what every stage computed, the draft
    accepted or corrected, the work flushed, and the text committed so far."""
    if not race or not race.get("steps"):
        return '<div class="race-note">Run a comparison; then step through its PPSD run slot by slot here.</div>'
    steps = race["steps"]
    index = max(0, min(int(index), len(steps) - 1))
    piece = lambda token_id: race["pieces"].get(token_id, "?")  # noqa: E731
    return teach.render_slot(steps, index, race["ppsd_tokens"], piece)  # its caption says which slot, once


def diagram(num_layers: int, exit_layer: int, num_stages: int) -> str:
    """The pipeline picture for the sliders' E and K ("" while they do not fit the model)."""
    try:
        return teach.pipeline_diagram(int(num_layers), int(exit_layer), int(num_stages))
    except ValueError:
        return ""
