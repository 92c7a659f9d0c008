"""The demo's pure parts without a browser: trace -> figure data, tokens -> escaped spans,
metrics -> text, theory curves, the race replay, and the runner's timing and model cache."""

from __future__ import annotations

import html
import re
import shutil
import threading
import time

import pytest
import torch

import ppsd
from app import plots, reading, token_stream, words
from app.panels import columns, headline, theory, timeline, metrics as metrics_panel, race as race_panel, steps as steps_panel
from app.reading import RunView
from app.models import ModelCache
from app.request import RunRequest
from app.runner import run_comparison
from ppsd.compare import PausableStopwatch, PlainWay
from ppsd.compare_stats import Stats
from ppsd import Draft, Event, Token, Trace
from ppsd.metrics import DEFINITIONS, ideal_ppsd_speedup_slowest_stage

STAGES = (range(0, 2), range(2, 4))
PIECES = {1: "<script>", 2: "a & b", 3: " x", 4: "\n", 5: 'say "hi"'}
piece = PIECES.__getitem__


def hand_trace() -> Trace:
    """Two stages: prefill, one accepted draft, one corrected draft whose successor was flushed."""
    events = (
        Event(1, 0, "prefill", 0.0, 1.0, 3, width=2),
        Event(2, 0, "prefill", 1.0, 2.0, 3, width=2),
        Event(1, 2, "draft", 2.0, 3.0, 1, slot=0, from_final=True),
        Event(2, 2, "verify", 3.0, 4.0, 1, slot=1, decision="accepted"),
        Event(1, 3, "draft", 3.0, 4.0, 2, slot=1),
        Event(2, 3, "verify", 4.0, 5.0, 2, slot=2, decision="corrected"),
        Event(1, 4, "flushed", 4.0, 5.0, 5, slot=2),
    )
    return Trace(events, STAGES, prompt_len=2, length=5, clock="measured")


# --------------------------------------------------------------------------- timeline


def test_timeline_has_one_bar_per_event_on_its_stage_row_and_kinds_in_the_legend():
    trace = hand_trace()
    fig = timeline.render_timeline([("PPSD", trace)], piece)
    bars = [t for t in fig.data if t.type == "bar"]
    assert sum(len(t.x) for t in bars) == len(trace.events)
    labels = [timeline.stage_label(k, r, u) for k, (r, u) in enumerate(zip(STAGES, trace.utilization()), start=1)]
    for bar in bars:
        kind = next(k for k, name in plots.KIND_LABELS.items() if name == bar.name)
        events = [e for e in trace.events if e.kind == kind]
        assert list(bar.y) == [labels[e.stage - 1] for e in events]
        assert list(bar.base) == pytest.approx([e.start * 1e3 for e in events])
        assert list(bar.x) == pytest.approx([e.duration * 1e3 for e in events])
    assert {t.name for t in bars if t.showlegend} == {plots.KIND_LABELS[k] for k in ("prefill", "draft",
                                                                                      "verify", "flushed")}
    corrections = [t for t in fig.data if t.type == "scatter"]
    assert len(corrections) == 1 and list(corrections[0].x) == [5.0e3]  # the corrected verify's end
    assert labels[0].startswith("stage 1 · layers 0–1 · util ") and labels[1].startswith("stage 2 · layers 2–3")
    assert "measured clock" in timeline.unwrapped(fig.layout.title.text)


def test_timeline_of_a_real_run_stacks_ppsd_over_ar_and_names_the_projected_clock(llama):
    config = ppsd.DecodeConfig(method="ppsd", num_stages=4, max_new_tokens=12)
    runs = {m: ppsd.generate(llama, [1, 2, 3], ppsd.DecodeConfig(method=m, num_stages=4, max_new_tokens=12))
            for m in ("ar", "ppsd")}
    panels = [("PPSD", runs["ppsd"].trace.project()), ("AR", runs["ar"].trace.project())]
    fig = timeline.render_timeline(panels, None)
    for axis, (_, trace) in zip(("y", "y2"), panels):
        on_axis = [t for t in fig.data if t.type == "bar" and t.yaxis == axis]
        assert sum(len(t.x) for t in on_axis) == len(trace.events)
        assert {label.split(" · ")[0] for t in on_axis for label in t.y} == {f"stage {k}" for k in range(1, 5)}
    assert "projected: the measured per-stage costs replayed on K concurrent workers" in timeline.unwrapped(fig.layout.title.text)
    assert config.num_stages == 4 and [a.text for a in fig.layout.annotations[:2]] == ["PPSD", "AR"]


def test_no_trace_gives_a_placeholder_figure():
    fig = timeline.render_timeline([], piece)
    assert not fig.data and "appears here" in fig.layout.annotations[0].text


# --------------------------------------------------------------------------- tokens


def test_token_spans_escape_text_and_colour_by_status():
    tokens = [Token(2, 3, "verified"), Token(3, 1, "accepted", draft=1), Token(4, 2, "corrected", draft=5)]
    deciders = token_stream.deciding_events(hand_trace().events, 2)
    out = token_stream.render_tokens(tokens, piece, prompt="x < y", deciders=deciders)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "a &amp; b" in out and "x &lt; y" in out
    assert out.count('class="tok tok-verified"') == 1
    assert out.count('class="tok tok-accepted"') == 1
    # The corrected token keeps its rejected draft beside it, struck through (CSS class).
    assert '<span class="tok tok-rejected">say "hi"</span><span class="tok tok-corrected">a &amp; b</span>' in out
    assert 'class="ws">∅<' in token_stream.render_tokens([Token(0, 9, "verified")], {9: ""}.__getitem__)
    assert 'title="position 4 · draft &#x27;say &quot;hi&quot;&#x27; · final &#x27;a &amp; b&#x27; · corrected' in out
    assert "stage 2 · slot 2" in out  # the final-stage event that decided position 4
    assert "stage 2 · slot 1" in out and "no draft" in out


def test_pending_drafts_are_dashed_and_only_beyond_the_committed_tokens():
    tokens = [Token(2, 3, "verified")]
    pending = [Draft(2, 4), Draft(3, 1), Draft(4, 2)]
    out = token_stream.render_tokens(tokens, piece, pending=pending)
    assert out.count("tok-pending") == 2 and "position 3 · draft &#x27;&lt;script&gt;&#x27;" in out


def test_whitespace_is_kept_for_css_to_preserve():
    out = token_stream.render_tokens([Token(0, 4, "verified"), Token(1, 3, "verified")], piece)
    assert '<span class="ws">↵</span>\n</span>' in out and "> x</span>" in out


def test_deciding_events_skip_flushed_work_and_cover_prefill_width():
    deciders = token_stream.deciding_events(hand_trace().events, 2)
    assert deciders[2].kind == "prefill"  # first token comes from the prompt's last position
    assert deciders[3].slot == 1 and deciders[4].slot == 2 and 5 not in deciders


def test_legend_names_every_status():
    out = token_stream.render_legend()
    for cls in ("tok-accepted", "tok-corrected", "tok-rejected", "tok-verified", "tok-pending"):
        assert cls in out


# --------------------------------------------------------------------------- numbers


def metrics(*, wall: float, accepted: int = 0, rejected: int = 0, clock: str = "projected",
            ideal: float = 1.0) -> ppsd.Metrics:
    rate = accepted / (accepted + rejected) if accepted + rejected else None
    return ppsd.Metrics(clock, 10, accepted, rejected, 1, rate, wall, 10 / wall, wall * 2, [0.5, 0.75], 0.375, 3,
                        ideal)


def stats_of(lead: dict, measured: dict | None = None) -> Stats:
    """Made-up walls per round: `lead` on the page's clock, `measured` (default: the same)."""
    as_walls = lambda walls: {m: tuple(w) for m, w in walls.items()}  # noqa: E731
    return Stats(walls=as_walls(lead), measured=as_walls(measured or lead), projected=as_walls(lead))


def test_headline_names_speedup_clock_device_and_ideal():
    from dataclasses import replace

    ar, fast = metrics(wall=2.0), metrics(wall=1.0, accepted=8, rejected=2,
                                  ideal=ideal_ppsd_speedup_slowest_stage(0.8, 1 / 2))
    one = reading.Reading(ar, fast, num_stages=2, device="cpu", workers=False,
                             stats=stats_of({"ar": [2.0], "ppsd": [1.0]}, {"ar": [2.0], "ppsd": [2.5]}))
    out = headline.render_headline(one)
    # Issue 48: 2.00x is above what a = 0.80 allows (1.67x, plus the margin): no number is headlined.
    assert "Not a clean result" in out and "PPSD 2.00× faster than AR" not in out.split("<details")[0]
    assert ("(against the fastest AR this run measured: AR in one process; AR measured in this one process" in out
            and "; projected clock, one round, cpu)" in out)
    assert "a=0.80, K=2) = 1.67× faster" in out
    clean = headline.render_headline(replace(one, stats=stats_of({"ar": [2.0], "ppsd": [1.25]},
                                                                  {"ar": [2.0], "ppsd": [2.5]})))
    assert "PPSD 1.60× faster than AR in one process" in clean and "PPSD 1.60× faster than AR on the same pipeline" in clean
    assert "AR 2.00 s, PPSD 2.50 s (PPSD 1.25× slower than AR, medians)" in out and "cannot be faster there" in out
    assert "Compared: AR and PPSD decoding the same prompt to the same 10 tokens on the same 2-stage pipeline" in out
    assert "above the ideal" in out  # 2.00x against an ideal of 1.67x is explained, not left standing
    slow = headline.render_headline(reading.Reading(ar, metrics(wall=4.0, accepted=1, rejected=9),
                                                      num_stages=2, device="cpu", workers=False,
                                                      stats=stats_of({"ar": [2.0], "ppsd": [4.0]})))
    assert "PPSD 2.00× slower than AR on the same pipeline" in slow and "above the ideal" not in slow


def test_headline_gives_ratios_of_the_medians_and_every_rounds_wall():
    ar, ppsd_ = metrics(wall=2.0, clock="measured"), metrics(wall=1.6, accepted=8, rejected=2, clock="measured",
                                                             ideal=ideal_ppsd_speedup_slowest_stage(0.8, 1 / 2))
    # Per-round ratios 1.30, 1.10, 1.20 (median 1.20); the medians' ratio is 2.0 / 1.7 = 1.18.
    c = reading.Reading(ar, ppsd_, num_stages=2, device="cpu", workers=True, shown=2,
                           stats=stats_of({"ar": [2.08, 1.87, 2.0], "ppsd": [1.6, 1.7, 1.7]}))
    out = headline.render_headline(c)
    assert "PPSD 1.18× faster than AR on the same pipeline" in out and "1.20×" not in out
    assert "measured: AR on the same pipeline; measured clock, median of 3 rounds, cpu)" in out and "every ratio is of those medians" in out
    assert "AR 2.08 s, 1.87 s, 2.00 s; PPSD 1.60 s, 1.70 s, 1.70 s; the panels show round 3" in out
    assert "(each stage in its own worker process, at once)" in out and "above the ideal" not in out


def test_headline_leads_with_the_fastest_ar_and_says_why_the_pipelines_ar_differs():
    from dataclasses import replace

    ar, ppsd_ = metrics(wall=2.0, clock="measured"), replace(metrics(wall=1.6, accepted=5, rejected=5, clock="measured",
                                                                     ideal=ideal_ppsd_speedup_slowest_stage(0.5, 0.6)),
                                                             slot_fraction=0.6)
    way = PlainWay(2, "in this one process on 2 threads with no pipeline")
    c = reading.Reading(ar, ppsd_, num_stages=2, device="cpu", workers=True, plain=way,
                           stats=stats_of({"ar": [2.0, 2.0, 2.0], "ppsd": [1.6, 1.6, 1.6], "plain": [1.8, 1.9, 1.7]}))
    out = headline.render_headline(c)
    lines = re.findall(r'<div class="headline[^"]*">(.*?)</div>', out)
    # Line 1 against plain AR (1.8 / 1.6), line 2 against AR on the pipeline (2.0 / 1.6): 1.25 = 1.11 x 1.125.
    assert "PPSD 1.12× faster than plain AR" in lines[0] and "PPSD 1.25× faster than AR on the same pipeline" in lines[1]
    assert "AR on the pipeline ran 1.11× slower than plain AR" in out and "memory bus" in out
    assert "AR in this one process on 2 threads" in out and "(median of 3 rounds, measured)" in out
    assert "1.12× faster than plain AR, so PPSD beats it here" in out and "a* = 0.25 (this run: a = 0.50)" in out
    slower = headline.render_headline(replace(c, plain=PlainWay(1, "in this one process on 1 thread with no pipeline"),
                                             stats=stats_of({"ar": [2.0], "ppsd": [1.6], "plain": [1.0]})))
    # 1.0 / 1.6 = 0.625x; a* = (1 - 1/2) / 0.4 = 1.25: out of reach on this pipeline, so not shown
    assert "1.60× slower than plain AR, so PPSD does not beat it here" in slower and "on 1 thread " in slower
    assert "no acceptance makes PPSD beat it here (even a = 1 gives 1.67× faster" in slower and "a*" not in slower
    alone = headline.render_headline(replace(c, plain=None, stats=stats_of({"ar": [2.0], "ppsd": [1.6]})))
    assert "Plain decoding" not in alone and "headline-second" not in alone  # AR on the pipeline is the fastest


def test_everything_but_the_headline_lines_is_folded():
    ar, ppsd_ = metrics(wall=2.0, clock="measured"), metrics(wall=1.6, accepted=5, rejected=5, clock="measured",
                                                             ideal=ideal_ppsd_speedup_slowest_stage(0.5, 1 / 2))
    c = reading.Reading(ar, ppsd_, num_stages=2, device="cpu", workers=True,
                           stats=stats_of({"ar": [2.0], "ppsd": [1.6]}))
    out = headline.render_headline(c, agreement="✓ Identical output")
    visible, folded = out.split('<details class="headline-more">')
    assert "PPSD 1.25× faster" in visible and "ideal" not in visible and "Identical" not in visible
    assert "ideal" in folded and "Compared:" in folded and "Identical output" in folded


def test_a_busy_machine_is_said_on_the_headline_not_explained_away():
    from dataclasses import replace

    from ppsd.metrics import Stalls

    ar, ppsd_ = metrics(wall=2.0, clock="measured"), metrics(wall=1.0, accepted=8, rejected=2, clock="measured",
                                                             ideal=1.2)
    c = reading.Reading(ar, ppsd_, num_stages=2, device="cpu", workers=True,
                           stats=stats_of({"ar": [2.0], "ppsd": [1.0]}),
                           stalls={"ar": Stalls(3, 0.6), "ppsd": Stalls(0, 0.0)})
    out = headline.render_headline(c)  # 2.0x measured against an ideal of 1.2x, with AR stalled 0.6 s
    assert "The machine was busy: 3 stalls" in out and "600.0 ms to AR (15% of its time)" in out
    assert "above the ideal 1.20× faster: the machine was busy (stalled work added up to 15% of a method" in out
    assert "<summary>⚠ How this was measured" in out  # the fold's title flags it
    quiet = headline.render_headline(replace(c, stalls={"ar": Stalls(1, 0.01), "ppsd": Stalls(0, 0.0)}))
    assert "busy" not in quiet and "not explained by this run" in quiet  # 0.3 % of AR's time: noise, not a busy machine


def test_stalls_are_work_far_slower_than_the_same_stages_usual_work():
    from ppsd.metrics import stalls

    events = [Event(1, p, "verify", p * 1.0, p * 1.0 + 0.01, 1) for p in range(10)]
    events[4] = Event(1, 4, "verify", 4.0, 4.5, 1)  # 50x its stage's usual 10 ms: preempted
    trace = Trace(events=tuple(events), partition=(range(0, 2), range(2, 4)), prompt_len=0, length=10,
                  clock="measured")
    found = stalls(trace)
    assert found.count == 1 and found.excess_seconds == pytest.approx(0.49)
    assert stalls(Trace(events=tuple(events[:4]), partition=(range(0, 2), range(2, 4)), prompt_len=0, length=4,
                        clock="measured")).count == 0


def test_metrics_table_puts_each_definition_beside_its_values():
    runs = {"ar": reading.Clocks(metrics(wall=2.0, clock="measured"), metrics(wall=1.5)),
            "ppsd": reading.Clocks(metrics(wall=3.0, accepted=3, rejected=1, clock="measured"),
                                   metrics(wall=0.5, accepted=3, rejected=1))}
    out = metrics_panel.render_metrics_table(runs)
    for key in ("acceptance_rate", "tokens_per_second", "stage_utilization", "bubble_fraction",
                "wasted_stage_slots", "ideal_speedup"):
        assert html.escape(DEFINITIONS[key]) in out
    assert "<td>2.00 s</td><td>3.00 s</td>" in out  # measured walls
    assert "<td>1.50 s</td><td>500.0 ms</td>" in out  # projected walls
    assert "<td>—</td><td>0.75</td>" in out and "50% · 75%" in out
    assert "appear here" in metrics_panel.render_metrics_table({})
    assert "wall, measured (one process)" in out and "stage utilization, measured" not in out


def test_metrics_table_names_the_executor_the_measured_runs_ran_on():
    from ppsd.executors.kinds import KINDS

    runs = {"ar": reading.Clocks(metrics(wall=2.0, clock="measured"), metrics(wall=1.5))}
    out = metrics_panel.render_metrics_table(runs, on=KINDS["threads"])
    assert "wall, measured (K threads in one process)" in out and "worker process" not in out
    assert "stage utilization, measured" in out  # the stages ran at once: their measured overlap means something


def test_stats_card_shows_both_clocks():
    clocks = reading.Clocks(metrics(wall=1.0, clock="measured"), metrics(wall=0.5, accepted=1, rejected=1))
    out = columns.render_stats("ppsd", clocks)
    assert "500.0 ms" in out and "1.00 s" in out and "0.50" in out
    assert "decoding" in columns.render_stats("ppsd", None, live="decoding… 3 tokens")


def test_theory_curves_break_even_and_measured_point():
    assert theory.eesd_break_even(4, 8 / 32) == pytest.approx(0.44, abs=0.01)  # spec: L=32, E=8, g=4
    fig = theory.render_theory(num_stages=4, slot_fraction=0.25, draft_len=4, exit_fraction=0.25,
                               points=[theory.TheoryPoint("PPSD measured", 0.8, 2.1)])
    ppsd_curve = fig.data[0]
    assert ppsd_curve.y[0] == pytest.approx(1.0) and ppsd_curve.y[-1] == pytest.approx(4.0)
    assert fig.data[1].y[0] < 1.0  # EESD below 1x at a = 0
    assert list(fig.data[2].x) == [0.8] and list(fig.data[2].y) == [2.1]
    assert fig.layout.shapes[0].x1 == pytest.approx(0.44, abs=0.01)  # the shaded EESD < 1x region
    alone = theory.render_theory(num_stages=4, slot_fraction=0.25, draft_len=4, exit_fraction=0.25,
                                 eesd=False)  # EESD did not run
    assert [t.name for t in alone.data] == ["ideal PPSD, K=4"]
    assert not any("EESD" in str(a.text) for a in alone.layout.annotations)
    assert [shape.type for shape in alone.layout.shapes] == ["line"]  # the 1x line, no shaded region


def test_the_plot_passes_through_the_ideal_the_headline_and_the_table_quote(tiny_cache):
    """One ideal everywhere, on an uneven partition: L = 8, E = 2, K = 2 puts 6 layers in stage 2,
    so s = 6/8, and the equal-stage 1 / (a/K + 1 - a) would overstate the ideal."""
    from app import view

    request = RunRequest(prompt="def fibonacci(n):", model="tiny", num_stages=2, exit_layer=2, max_new_tokens=16,
                         repeats=1)
    snap = list(run_comparison(request, tiny_cache, throttle=0.0))[-1]
    shown = RunView.of(snap).runs["ppsd"].result.metrics("projected")  # one process: the page leads with projected
    a, ideal = shown.acceptance_rate, shown.ideal_speedup
    assert 0 < a < 1 and ideal == pytest.approx(1 / (1 - a * (1 - 6 / 8)))
    assert ideal < 1 / (a / 2 + 1 - a)
    values = view.snapshot(snap)
    curve, star = values["theory"].data[0], values["theory"].data[1]
    assert list(star.x) == [a] and curve.y[list(curve.x).index(a)] == pytest.approx(ideal)
    assert curve.name == "ideal PPSD, K=2, largest stage 75% of the layers"
    assert f"(a={a:.2f}, K=2) = {ideal:.2f}× faster, counting layers (stage 2 holds the most: 75%)" in values["headline"]
    assert f"<td>{ideal:.2f}× faster</td>" in values["metrics"] and "<td>0.75</td>" in values["metrics"]


# --------------------------------------------------------------------------- race replay


def test_race_lanes_commit_at_their_final_stage_times():
    trace = hand_trace()
    tokens = (Token(2, 3, "verified"), Token(3, 1, "accepted", 1), Token(4, 2, "corrected", 5))
    times = race_panel.commit_times(tokens, trace)
    assert times == (2.0, 4.0, 5.0)
    lane = race_panel.Lane("ppsd", tokens, times, trace.makespan)
    half = race_panel.render_race([lane], piece, at=4.5, clock="projected", stretch=100)
    assert "2/3 tokens" in half and "slowed 100×" in half and "finished" not in half and half.count("Replay") == 1
    assert "3/3 tokens" in race_panel.render_race([lane], piece, at=5.0, clock="projected", stretch=1)


def test_the_race_names_every_lane_in_finish_order_once_it_has_ended():
    tokens = (Token(2, 3, "verified"),)
    ar, ppsd_, plain = (race_panel.Lane("ar", tokens, (6.0,), 6.0), race_panel.Lane("ppsd", tokens, (4.0,), 4.0),
                        race_panel.Lane("plain", tokens, (7.5,), 7.5))
    end = race_panel.render_race([ar, plain, ppsd_], piece, at=7.5, clock="measured", stretch=1)
    assert ("PPSD finished first, in 4.00 s; then AR 6.00 s, 2.00 s behind; Plain AR, one process 7.50 s, "
            "3.50 s behind.") in end
    assert "at its recorded pace" in end
    assert "finished first" not in race_panel.render_race([ar, ppsd_], piece, at=5.0, clock="measured", stretch=1)


def test_an_answer_cut_by_the_limit_says_so_and_the_legend_explains_the_marks():
    out = token_stream.render_tokens([Token(0, 4, "verified")], piece, cut=16)
    assert "cut at 16 tokens" in out
    assert "cut at" not in token_stream.render_tokens([Token(0, 4, "verified")], piece)
    legend = token_stream.render_legend()
    assert "∅" in legend and "end token" in legend and "↵" in legend and "line break" in legend


# --------------------------------------------------------------------------- runner


def test_pausable_stopwatch_stands_still_while_paused():
    watch = PausableStopwatch()
    watch.pause()
    frozen = watch.now()
    time.sleep(0.02)
    assert watch.now() == frozen
    watch.resume()
    assert watch.now() < frozen + 0.02  # the paused sleep is not counted


@pytest.fixture(scope="module")
def tiny_loader(saved_model):
    """A ModelCache loader that knows one name, "tiny" (the tiny saved model); `loader.loads`
    lists the loads it did."""
    from transformers import AutoTokenizer

    loads = []

    def loader(name, device=None, progress=None):
        if name != "tiny":
            raise ValueError(f"cannot load model {name!r}: not found")
        loads.append(name)
        model, _ = ppsd.load_model(saved_model, device="cpu")
        return model, AutoTokenizer.from_pretrained(saved_model)

    loader.loads = loads
    return loader


@pytest.fixture(scope="module")
def tiny_cache(tiny_loader):
    torch.set_num_threads(1)
    cache = ModelCache(device="cpu", loader=tiny_loader)
    cache.loads = tiny_loader.loads
    return cache


def test_special_tokens_are_never_shown_as_text(tiny_cache):
    """An end-of-text or end-of-turn token is committed like any other, but its text (say
    "<|endoftext|>") is markup of the tokenizer's, not part of the answer."""
    loaded = tiny_cache.get("tiny")
    eos = loaded.tokenizer.eos_token_id
    assert loaded.piece(eos) == "" and loaded.tokenizer.decode([eos]) == "<|endoftext|>"
    stream = token_stream.render_tokens([Token(0, eos, "accepted", eos)], loaded.piece)
    assert "endoftext" not in stream and "∅" in stream


def test_runner_runs_ar_then_ppsd_then_eesd_with_identical_greedy_tokens(tiny_cache):
    request = RunRequest(prompt="def fibonacci(n):", model="tiny", num_stages=4, eesd=True, max_new_tokens=16)
    order = []
    for snap in run_comparison(request, tiny_cache, throttle=0.0):
        if snap.phase and snap.phase not in order:
            order.append(snap.phase)
    assert order == ["ar", "ppsd", "eesd", "repeats"] and snap.done and snap.active is None
    ids = {m: r.result.token_ids for m, r in RunView.of(snap).runs.items()}
    assert ids["ar"] == ids["ppsd"] == ids["eesd"] and len(ids["ar"]) == 16
    for run in RunView.of(snap).runs.values():
        assert run.result.trace.violations() == []
        assert run.result.measured_wall_seconds > 0
    assert RunView.of(snap).runs["ppsd"].result.config.exit_layer == 2  # balanced E = L/K = 8/4


@pytest.mark.parametrize("request_, message", [
    (RunRequest(prompt=" ", model="tiny"), "prompt is empty"),
    (RunRequest(prompt="hi", model="tiny", num_stages=9), "out of range"),
    (RunRequest(prompt="hi", model="tiny", max_new_tokens=ppsd.MAX_NEW_TOKENS_CAP + 1), "max_new_tokens"),
    (RunRequest(prompt="hi", model="nope"), "'nope' is not a loadable model here"),
])
def test_runner_rejects_bad_requests_and_keeps_the_loaded_model(tiny_cache, request_, message):
    list(run_comparison(RunRequest(prompt="hi", model="tiny", max_new_tokens=1), tiny_cache))
    with pytest.raises(ValueError, match=message):
        list(run_comparison(request_, tiny_cache))
    assert tiny_cache.names() == ["tiny"] and tiny_cache.loads == ["tiny"]  # loaded once, still there


def test_agreement_note_tells_identical_from_sampled_from_broken():
    assert "Identical output" in words.agreement_note({"ar": [1, 2], "ppsd": [1, 2]}, greedy=True)
    assert "should not happen" in words.agreement_note({"ar": [1, 2], "ppsd": [1, 3]}, greedy=True)
    assert "distribution" in words.agreement_note({"ar": [1, 2], "ppsd": [1, 3]}, greedy=False)


def test_live_updates_send_only_changes_and_end_complete(tiny_cache):
    from app import handlers

    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=12)
    updates = list(handlers._updates(run_comparison(request, tiny_cache, throttle=0.0)))
    skipped = lambda value: isinstance(value, dict) and value.get("__type__") == "update"  # noqa: E731
    assert not any(skipped(v) for v in updates[-1])  # the result an API client receives is whole
    assert 'class="tok tok-' in updates[-1][4] and updates[-1][-2]["ar"]["token_ids"]
    ar_stream = [u[2] for u in updates[:-1]]
    assert sum(not skipped(v) for v in ar_stream) < len(ar_stream) // 2  # unchanged AR text is not re-sent


def test_runner_uses_a_trained_exit_head_and_refuses_one_for_another_e(tiny_cache, tmp_path):
    from ppsd.heads import HeadConfig, build_head, fingerprint, save_exit_head

    loaded = tiny_cache.get("tiny")
    head = build_head("lowrank", loaded.model, 4)
    torch.nn.init.normal_(head.adapter.up.weight, std=0.5)  # a head unlike the shared one
    save_exit_head(head, tmp_path, HeadConfig(head_type="lowrank", exit_layer=4, base_model="tiny",
                                              base_fingerprint=fingerprint(loaded.model), rank=head.rank))
    shared = list(run_comparison(RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=16),
                                 tiny_cache, throttle=0.0))[-1]
    trained = list(run_comparison(RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=16,
                                             exit_head=str(tmp_path)), tiny_cache, throttle=0.0))[-1]
    ids = {m: r.result.token_ids for m, r in RunView.of(trained).runs.items()}
    assert ids["ar"] == ids["ppsd"] == RunView.of(shared).runs["ppsd"].result.token_ids  # lossless either way
    drafts = lambda snap: [d.id for d in RunView.of(snap).runs["ppsd"].result.drafts]  # noqa: E731
    assert drafts(trained) != drafts(shared)  # the drafts came from the trained head
    with pytest.raises(ValueError, match="exit layer E=4, not E=2"):
        list(run_comparison(RunRequest(prompt="hi", model="tiny", num_stages=4, exit_head=str(tmp_path)), tiny_cache))


def test_pausable_stopwatch_reads_any_process_stamp_without_the_pauses():
    """Pipeline workers stamp with perf_counter in their own processes; the run's clock converts
    those stamps, a stamp taken during a pause reading as the pause's start."""
    clock = PausableStopwatch()
    clock.pause()
    time.sleep(0.02)
    clock.resume()
    (start, end), = clock._pauses
    assert clock.at(start + 0.01) == pytest.approx(clock.at(start))  # inside the pause: stopped
    assert clock.at(end + 0.5) == pytest.approx(clock.at(start) + 0.5)  # after it: the pause left out
    assert clock.at(start - 0.5) == pytest.approx(clock.at(start) - 0.5)  # before it: untouched


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="K = 2 workers need 2 cores")
def test_runner_on_k_workers_gives_the_same_tokens_on_a_measured_concurrent_clock(tiny_cache):
    from dataclasses import replace

    from app import view
    from ppsd.executors.distributed.processes import close_all

    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=12, workers=True)
    first = []
    try:
        for snap in run_comparison(request, tiny_cache, throttle=0.0):  # one Snapshot, updated
            first = first or [(snap.active, len(RunView.of(snap).runs))]
    finally:
        close_all()
    assert first == [("workers", 0)]  # it says it is starting them before anything runs
    local = list(run_comparison(replace(request, workers=False), tiny_cache, throttle=0.0))[-1]
    at_once, in_turn = RunView.of(snap), RunView.of(local)
    for method in ("ar", "ppsd"):
        run = at_once.runs[method]
        assert run.result.token_ids == in_turn.runs[method].result.token_ids
        assert run.result.trace.concurrent and at_once.traces[method].clock == "measured"
        assert not in_turn.runs[method].result.trace.concurrent and in_turn.traces[method].clock == "projected"
    race = race_panel.race_state(RunView.of(snap))
    assert race["clock"] == "measured"
    for lane in race["lanes"]:  # the measured clock starts after 0: every lane still finishes whole
        assert sum(t <= lane.total for t in lane.times) == len(lane.tokens) == 12
    headline = view.snapshot(snap)["headline"]
    assert "measured clock" in headline
    # plain AR in this process, no pipeline, timed in the same run: the bar PPSD must clear
    stats = snap.state.stats()
    assert len(stats.runs("plain")) == len(stats.runs("ar")) and min(stats.runs("plain")) > 0 and snap.plain.threads >= 1
    assert "Plain decoding, the best AR here with no pipeline: AR in this one process" in headline
    assert "than plain AR" in headline
    assert "plain_wall_seconds" in view.snapshot(snap)["summary"]["timed_runs"]
    assert "plain" not in local.state.stats().walls and "Plain decoding" not in view.snapshot(local)["headline"]
    lanes = {lane.method: lane for lane in race_panel.race_state(RunView.of(snap))["lanes"]}  # plain AR races beside them
    # and PPSD as on K devices, projected (issue 48), its own lane
    assert set(lanes) == {"ar", "ppsd", "plain", "ppsd_projected"} and len(lanes["plain"].tokens) == 12
    assert lanes["plain"].tokens == tuple(RunView.of(snap).plain_run.result.tokens)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="compiled CPU steps need a C++ compiler (apt-get install -y g++)")
def test_runner_on_captured_steps_times_plain_ar_as_on_every_kind(tiny_cache):
    """With the graphed kind (compiled steps on stage threads on a CPU), plain AR is timed the same
    way as beside any kind (issue 56: on the captured steps alone, with no 1-thread trial, it was
    timed 3-10x too slow): in this one process, with no pipeline; same tokens, measured, said so."""
    from app import view

    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=12, workers=True,
                         pipeline="graphed")
    snap = list(run_comparison(request, tiny_cache, throttle=0.0))[-1]
    assert snap.pipeline == "graphed" and RunView.of(snap).runs["ppsd"].result.trace.concurrent
    assert RunView.of(snap).plain_run.result.token_ids == RunView.of(snap).runs["ar"].result.token_ids == RunView.of(snap).runs["ppsd"].result.token_ids
    assert snap.plain.words.startswith("in this one process on ") and snap.plain.words.endswith("with no pipeline")
    headline = view.snapshot(snap)["headline"]
    assert "Plain decoding, the best AR here with no pipeline: AR in this one process on" in headline
    assert "PPSD on the 2-stage pipeline (each stage a captured step" in headline  # and what PPSD ran on


def test_a_space_offers_only_the_models_its_owner_allows(monkeypatch, tiny_loader):
    from app.state import AppState, allowed_models

    for env, expected in [({}, None), ({"SPACE_ID": "me/ppsd"}, (ppsd.DEFAULT_MODEL,)),
                          ({"SPACE_ID": "me/ppsd", "PPSD_MODELS": "*"}, None),
                          ({"PPSD_MODELS": "tiny, other"}, ("tiny", "other"))]:
        monkeypatch.delenv("SPACE_ID", raising=False)
        monkeypatch.delenv("PPSD_MODELS", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert allowed_models() == expected, env
        assert AppState.from_environment().cache.allowed == expected, env  # read when called, not at import
    cache = ModelCache(device="cpu", loader=tiny_loader, allowed=("tiny",))
    assert cache.get("tiny").name == "tiny"
    with pytest.raises(ValueError, match=r"'/etc/passwd' is not offered here: choose one of tiny"):
        cache.get("/etc/passwd")


def test_a_space_offers_only_the_shipped_and_shared_heads_unless_its_owner_sets_ppsd_heads(monkeypatch):
    from app.state import AppState, allowed_heads

    for env, expected in [({}, None), ({"SPACE_ID": "me/ppsd"}, ()),
                          ({"SPACE_ID": "me/ppsd", "PPSD_HEADS": "*"}, None),
                          ({"SPACE_ID": "me/ppsd", "PPSD_HEADS": "heads/a, heads/b"}, ("heads/a", "heads/b"))]:
        monkeypatch.delenv("SPACE_ID", raising=False)
        monkeypatch.delenv("PPSD_HEADS", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert allowed_heads() == expected, env
        cache = AppState.from_environment().cache
        assert cache.allowed_heads == expected, env
        assert [cache.head_spec(h) for h in ("", " auto ", "shared")] == ["", "auto", "shared"]  # always offered
        if expected is not None:
            with pytest.raises(ValueError, match="'/root' is not offered here"):
                cache.head_spec("/root")


def test_a_megabyte_name_writes_a_line_not_a_megabyte_to_the_log(tiny_loader, capfd, tmp_path):
    name = "/tmp/" + "x" * 1_000_000
    cache = ModelCache(device="cpu", loader=tiny_loader)
    capfd.readouterr()
    for refused in (lambda: cache.get(name), lambda: cache.exit_head(name, cache.get("tiny"), 4)):
        with pytest.raises(ValueError):
            refused()
    logged = capfd.readouterr().err
    assert 0 < len(logged) < 2000, len(logged)


def test_one_client_holds_at_most_two_places_and_a_newcomer_waits_behind_one_run():
    from contextlib import ExitStack

    from app.server.line import DeviceLine

    line = DeviceLine(16)
    with ExitStack() as held:
        decoding, waiting = (held.enter_context(line.place("script")) for _ in range(2))
        with pytest.raises(ValueError, match="you have 2 runs in line already, the most one visitor may"):
            held.enter_context(line.place("script"))
        newcomer = held.enter_context(line.place("visitor"))
        assert (line.ahead(decoding), line.ahead(newcomer), line.ahead(waiting)) == (0, 1, 2)
        later = held.enter_context(line.place("another"))  # first runs in arrival order, seconds after them
        assert (line.ahead(newcomer), line.ahead(later), line.ahead(waiting)) == (1, 2, 3)
    assert len(line) == 0


def test_stop_reaches_every_run_of_its_session_and_no_other():
    from app.server.line import StopRegistry

    stops = StopRegistry()
    older, newer, other = stops.running("a"), stops.running("a"), stops.running("b")
    first, second, third = older.__enter__(), newer.__enter__(), other.__enter__()  # "a" ran twice
    stops.stop("a")
    assert first.is_set() and second.is_set() and not third.is_set()
    older.__exit__(None, None, None)
    newer.__exit__(None, None, None)
    with stops.running("a") as fresh:  # a run after Stop starts unstopped
        assert not fresh.is_set()
    other.__exit__(None, None, None)
    stops.stop("a")  # nothing running: nothing to stop


def test_a_run_stopped_while_its_stages_start_says_so_in_the_api_summary(tiny_cache):
    from app import view

    stop = threading.Event()
    stop.set()
    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=4, workers=True,
                         pipeline="threads")
    snap = list(run_comparison(request, tiny_cache, throttle=0.0, stop=stop))[-1]
    assert snap.stopped and not RunView.of(snap).runs
    assert view.snapshot(snap)["summary"] == {"stopped": view.STOPPED_BEFORE, "finished": {}}


def test_a_run_in_flight_shows_its_phases_done_now_and_to_come(tiny_cache):
    from app import view

    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=8, repeats=2)
    assert request.phases() == ("model", "ar", "ppsd", "repeats")
    assert __import__("dataclasses").replace(request, workers=True).phases() == (
        "model", "workers", "ar", "ppsd", "plain", "repeats")
    seen, beside_run, live = {}, {}, []
    for snap in run_comparison(request, tiny_cache, throttle=0.0):
        values = view.snapshot(snap)
        seen.setdefault(snap.phase, values["headline"])
        beside_run.setdefault(snap.phase, values["message"])
        if snap.active == "ppsd" and "decoding…" in values["stats_ppsd"]:
            live.append(values["stats_ppsd"])
    assert any("tok/s so far (measured, stages in turn)" in card for card in live)  # a speed while it decodes
    assert '<span class="phase phase-now">PPSD</span>' in seen["ppsd"] and "✓ AR" in seen["ppsd"]
    assert '<span class="phase phase-now">time again</span>' in seen["repeats"]
    # where the visitor pressed Run, the same status, in words
    assert "run-message-status" in beside_run["ppsd"] and "Running PPSD" in beside_run["ppsd"]
    assert "Timing again" in beside_run["repeats"]
    final = view.snapshot(snap)
    assert "phases" not in final["headline"]  # a finished run shows its numbers only
    assert "Timing again" not in final["headline"] and not snap.status  # nor what it was doing last
    assert "run-message-empty" in final["message"]
    # every panel says which round it shows, the one closest to the medians the headline gives
    label = RunView.of(snap).round_label
    assert label.startswith(f"Round {snap.state.shown_index() + 1} of 2, the one closest to the medians")
    assert label.replace("'", "&#x27;") in final["stats_ar"] and label.replace("'", "&#x27;") in final["stats_ppsd"]
    assert label.replace("'", "&#x27;") in final["metrics"] and label in timeline.unwrapped(final["timeline"].layout.title.text)
    assert "median of 2 rounds" in final["headline"]
    first = steps_panel.step(final["race"], 0)  # the step-through says which slot it shows, once, and which round
    assert first.count("Slot 1 of") == 1 and 'class="teach-caption step-caption"' in first
    assert label.replace("'", "&#x27;") in first
    loading = view.status("Loading tiny… 3 s", request, "model")
    assert '<span class="phase phase-now">load the model</span>' in loading["headline"]
    assert "phase-todo" in loading["headline"] and "Loading tiny… 3 s" in loading["message"]
