"""The trace as data: invariants hold on real runs and each one catches its own kind of breakage;
metrics agree with the token record; the projected clock behaves like the ideal model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ppsd import DecodeConfig, StagedModel, Trace, generate
from ppsd.compare_stats import speedup
from ppsd.metrics import ideal_eesd_speedup, ideal_ppsd_speedup_slowest_stage
from ppsd.steps import Event

from test_exactness import exit_equals_full, model_for

PROMPT = [1, 5, 9, 3, 7]


class TickStopwatch:
    """Every reading is one tick later: each piece of stage work costs exactly one tick."""

    def __init__(self) -> None:
        self.ticks = 0

    def now(self) -> float:
        self.ticks += 1
        return float(self.ticks)


def run(model: StagedModel, method: str, *, num_stages: int = 2, new: int = 24, ticks: bool = False, **kw):
    config = DecodeConfig(method=method, num_stages=num_stages, max_new_tokens=new, **kw)
    return generate(model, PROMPT, config, stopwatch=TickStopwatch() if ticks else None)


@pytest.mark.parametrize("method", ["ar", "eesd", "ppsd"])
@pytest.mark.parametrize("num_stages", [2, 3, 4])
def test_real_traces_are_sound_on_both_clocks(llama, method, num_stages):
    result = run(llama, method, num_stages=num_stages, draft_len=3)
    assert result.trace.violations() == []
    assert result.trace.project().violations() == []


def broken(trace: Trace, index: int, **changes) -> Trace:
    events = list(trace.events)
    events[index] = replace(events[index], **changes)
    return replace(trace, events=tuple(events))


@pytest.fixture(scope="module")
def ppsd_trace(llama) -> Trace:
    return run(llama, "ppsd", num_stages=3, ticks=True).trace


def first(trace: Trace, predicate) -> int:
    return next(i for i, e in enumerate(trace.events) if predicate(e))


def test_invariant_1_malformed_event(ppsd_trace):
    bad = broken(ppsd_trace, 3, stage=7)
    assert 1 in {n for n, _ in bad.violations()}
    with pytest.raises(ValueError, match="invariant 1"):
        broken(ppsd_trace, 3, end=ppsd_trace.events[3].start - 5).validate()


def test_invariant_2_two_pieces_of_work_at_once(ppsd_trace):
    i = first(ppsd_trace, lambda e: e.stage == 1 and e.kind == "draft" and e.position > ppsd_trace.prompt_len + 2)
    previous = max(j for j in range(i) if ppsd_trace.events[j].stage == 1)
    start = ppsd_trace.events[previous].start
    assert 2 in {n for n, _ in broken(ppsd_trace, i, start=start, end=start + 1).violations()}


def test_invariant_3_stage_before_its_input(ppsd_trace):
    i = first(ppsd_trace, lambda e: e.stage == 2 and e.kind == "verify")
    assert 3 in {n for n, _ in broken(ppsd_trace, i, start=0.0, end=0.5).violations()}


def test_invariant_4_token_skips_a_stage(ppsd_trace):
    i = first(ppsd_trace, lambda e: e.stage == 3 and e.kind == "verify")
    events = ppsd_trace.events[:i] + ppsd_trace.events[i + 1:]
    assert 4 in {n for n, _ in replace(ppsd_trace, events=events).violations()}
    flushed = first(ppsd_trace, lambda e: e.kind == "flushed")
    assert 4 in {n for n, _ in broken(ppsd_trace, flushed, kind="verify").violations()}


def test_invariant_5_utilization_above_one(ppsd_trace):
    e = ppsd_trace.events[-1]
    doubled = replace(ppsd_trace, events=ppsd_trace.events + (e,) * len(ppsd_trace.events) * 3)
    assert 5 in {n for n, _ in doubled.violations()}


def test_invariant_6_restart_before_the_decision(ppsd_trace):
    i = first(ppsd_trace, lambda e: e.stage == 1 and e.from_final and e.position > ppsd_trace.prompt_len)
    decided = max(j for j in range(i) if ppsd_trace.events[j].stage == 3)
    end = ppsd_trace.events[decided].end
    assert 6 in {n for n, _ in broken(ppsd_trace, i, start=end - 0.5, end=end + 0.5).violations()}


@pytest.mark.parametrize("method", ["eesd", "ppsd"])
def test_acceptance_rate_matches_the_token_record(llama, method):
    result = run(llama, method, draft_len=3)
    metrics = result.metrics()
    statuses = [t.status for t in result.tokens]
    fates = [d.fate for d in result.drafts]
    assert metrics.accepted == statuses.count("accepted") == fates.count("accepted")
    assert metrics.rejected == statuses.count("corrected") == fates.count("rejected")
    assert metrics.flushed == fates.count("flushed")
    assert "pending" not in fates
    assert metrics.acceptance_rate == pytest.approx(metrics.accepted / (metrics.accepted + metrics.rejected))
    assert 0 < metrics.acceptance_rate < 1


def projected_speedup(model: StagedModel, num_stages: int, exit_layer: int | None = None) -> float:
    ar = run(model, "ar", num_stages=num_stages, new=64, ticks=True, exit_layer=exit_layer)
    pp = run(model, "ppsd", num_stages=num_stages, new=64, ticks=True, exit_layer=exit_layer)
    assert ar.token_ids == pp.token_ids
    return ar.metrics("projected").wall_seconds / pp.metrics("projected").wall_seconds


@pytest.mark.parametrize("num_stages", [2, 4])
def test_projected_speedup_is_close_to_k_when_every_draft_is_accepted(num_stages):
    model = exit_equals_full(8 // num_stages)
    assert projected_speedup(model, num_stages) >= 0.85 * num_stages


@pytest.mark.parametrize("num_stages", [2, 4])
def test_projected_speedup_is_not_below_one_when_no_draft_is_accepted(num_stages):
    assert projected_speedup(model_for("random", 8 // num_stages), num_stages) >= 0.97


def test_ideal_formulas_match_the_spec():
    # Equal stages (s = 1/K) give the spec's S_PPSD(a, K) = 1 / (a/K + 1 - a).
    ideal = ideal_ppsd_speedup_slowest_stage
    assert ideal(0.0, 1 / 4) == 1.0 and ideal(1.0, 1 / 4) == 4.0
    assert ideal(0.8, 1 / 4) == pytest.approx(2.5) == pytest.approx(1 / (0.8 / 4 + 1 - 0.8))
    assert speedup(3.0, 1.5) == 2.0 and speedup(3.0, 0.0) == 0.0  # no time yet: no speedup, no error
    # Spec example: L=32, E=8, g=4 breaks even near a = 0.44.
    assert ideal_eesd_speedup(0.40, 4, 0.25) < 1.0 < ideal_eesd_speedup(0.48, 4, 0.25)


def test_chrome_trace_export(llama):
    trace = run(llama, "ppsd", num_stages=2).trace
    chrome = json.loads(json.dumps(trace.to_chrome()))
    work = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(work) == len(trace.events)
    assert {e["tid"] for e in work} == {1, 2}
    assert chrome["otherData"]["clock"] == "measured"


def test_ideal_ppsd_speedup_takes_its_slot_from_the_slowest_stage(llama):
    # L=8, E=2, K=2: stage 2 holds 6 layers, so an accepted token costs 6/8 of AR's time.
    assert ideal_ppsd_speedup_slowest_stage(1.0, 6 / 8) == pytest.approx(8 / 6)
    result = run(llama, "ppsd", num_stages=2, exit_layer=2)
    a = result.metrics().acceptance_rate
    assert result.metrics().ideal_speedup == pytest.approx(1 / (1 - a * (1 - 6 / 8)))
    assert result.metrics().slot_fraction == result.metrics("projected").slot_fraction == 6 / 8


def test_an_eesd_verification_waits_for_the_last_draft_it_checks():
    """EESD pushes g drafts through stage 1 one by one, then stage 2 verifies all g at once: on
    the projected clock that verification starts after the last draft, not after the first."""
    events = (Event(1, 0, "prefill", 0.0, 1.0, 5, width=3), Event(2, 0, "prefill", 1.0, 2.0, 5, width=3),
              Event(1, 3, "draft", 2.0, 3.0, 6), Event(1, 4, "draft", 3.0, 4.0, 7), Event(1, 5, "draft", 4.0, 5.0, 8),
              Event(2, 3, "verify", 5.0, 6.0, 6, width=3))
    trace = Trace(events, (range(0, 2), range(2, 4)), prompt_len=3, length=7, clock="measured")
    projected = trace.project()
    assert projected.events[-1].start == pytest.approx(projected.events[-2].end)
    wrong = replace(events[-1], start=3.5, end=4.5)  # begun while drafts 2 and 3 were still running
    assert 3 in [n for n, _ in Trace(events[:-1] + (wrong,), trace.partition, 3, 7, "measured").violations()]


def test_metrics_print_as_a_few_readable_lines(llama):
    text = str(run(llama, "ppsd", new=8).metrics())
    assert text.startswith("8 tokens in ") and "tok/s (projected clock)" in text
    assert "\nacceptance " in text and "\nstage utilization " in text and "\nideal speedup " in text
    assert "Metrics(" not in text
