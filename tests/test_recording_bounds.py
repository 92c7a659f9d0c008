"""Issue 57, item 1: a hostile recording is bounded before any trace work. The page's check of
the settings (`app.replay.admit`) refuses a file of runs no page could have made before any run
is read; the library bounds each run's events and widths by its own sizes; `Trace.validate`
stops at its first broken invariant; the opens run several at once."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from app import replay
from ppsd import trace as trace_module
from ppsd.recording import BadRecording, loads
from ppsd.steps import Event
from ppsd.trace import Trace


def shipped() -> dict:
    return json.loads(next(iter(replay.shipped().values())).read_bytes())


def flood(stages: int, ids: int) -> bytes:
    raw = shipped()
    raw["model"].update(num_layers=max(30, stages), max_context=1 << 24)
    raw["prompt_ids"] = [0] * ids
    raw["settings"].update(num_stages=stages, exit_layer=1)
    for r in raw["rounds"]:
        for run in r.values():
            run["config"].update(num_stages=stages, exit_layer=1)
            run.update(partition=[[0, 1]] + [[k, k + 1] for k in range(1, stages - 1)] + [[stages - 1, max(30, stages)]],
                       events=[], tokens=[], drafts=[])
    return json.dumps(raw, separators=(",", ":")).encode()


def test_the_page_refuses_a_prompt_flood_before_any_run_is_read(monkeypatch):
    read = []
    import ppsd.recording.read as read_module
    real = read_module.read_run
    monkeypatch.setattr(read_module, "read_run", lambda *a, **k: read.append(1) or real(*a, **k))
    began = time.perf_counter()
    with pytest.raises(BadRecording, match="prompt_ids holds 200,000 tokens"):
        replay.open_bytes(flood(30, 200_000))
    assert read == [] and time.perf_counter() - began < 5


def test_the_library_bounds_a_run_before_its_trace_is_built(monkeypatch):
    built = []
    monkeypatch.setattr(trace_module.Trace, "validate", lambda self: built.append(1) or self)
    with pytest.raises(BadRecording, match="would cost"):
        loads(flood(256, 200_000))
    assert built == []


def test_validate_stops_at_the_first_violation():
    events = (Event(stage=1, position=0, kind="prefill", start=0.0, end=1.0, token_id=0, width=1),)
    t = Trace(events, (range(0, 1), range(1, 2)), 1, 10**7, "measured")
    began = time.perf_counter()
    with pytest.raises(ValueError, match="invariant 4"):
        t.validate()
    assert time.perf_counter() - began < 1.0  # the old check listed 2 x 10^7 positions
    assert len([v for v in t.violations() if v[0] == 4]) <= 2  # one message a stage


def test_opens_run_several_at_once():
    from app import AppState, create_demo

    demo = create_demo(AppState())
    opens = [f for f in demo.fns.values() if any(getattr(b, "elem_id", None) in ("open-recording", "shipped-runs")
                                                 for b in f.inputs)]
    assert len(opens) == 2
    assert all(isinstance(f.concurrency_limit, int) and f.concurrency_limit > 1 for f in opens)
