"""The page's panels as modules (`app/panels/`): each results panel gives its components as a
frozen dataclass, and its values before a run and for a snapshot under exactly its own output
names; the run's outputs are the panels' in turn; the Run handler works on a parsed request."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import gradio as gr
import pytest

import app.panels
from app import handlers, view
from app.request import CheckedRequest, RunRequest


def test_every_panel_module_says_its_boundary():
    names = [m.name for m in pkgutil.iter_modules(app.panels.__path__)]
    assert {"headline", "columns", "race", "timeline", "theory", "metrics", "steps", "summary"} <= set(names)
    for name in names:
        module = importlib.import_module(f"app.panels.{name}")
        assert (module.__doc__ or "").strip(), f"app.panels.{name} has no docstring"


def test_the_runs_outputs_are_the_panels_own_in_turn():
    assert view.OUTPUTS == tuple(name for panel in view.PANELS for name in panel.OUTPUTS)
    assert len(set(view.OUTPUTS)) == len(view.OUTPUTS)
    assert view.OUTPUTS[0] == "headline" and view.OUTPUTS[-2:] == ("summary", "race")  # the API's last: the JSON


def test_each_results_panel_is_a_dataclass_of_its_components_named_as_its_outputs():
    with gr.Blocks():
        for panel in view.PANELS:
            made = panel.create()
            assert dataclasses.is_dataclass(made) and made.__dataclass_params__.frozen, panel.__name__
            components = made.outputs()
            assert tuple(components) == panel.OUTPUTS, panel.__name__
            assert all(isinstance(c, gr.components.Component) for c in components.values()), panel.__name__


def test_each_panels_values_before_a_run_are_under_its_own_names():
    for panel in view.PANELS:
        assert tuple(panel.idle()) == panel.OUTPUTS, panel.__name__
    assert tuple(view.idle()) == view.OUTPUTS


def test_the_run_handler_takes_a_parsed_request_not_the_forms_values():
    for handler in (handlers.on_run, handlers.on_decode):
        parameters = inspect.signature(handler).parameters.values()
        assert not any(p.kind is p.VAR_POSITIONAL for p in parameters), handler.__name__
        assert [p.name for p in parameters if p.annotation in (CheckedRequest, "CheckedRequest")] == ["run"], \
            handler.__name__


def test_a_form_that_does_not_parse_is_refused_in_words_before_any_work():
    """`on_run_form` parses; a box sent as the string "false" is refused, nothing runs."""
    form = [getattr(RunRequest(prompt="hi"), name) for name in ("prompt", "model", "exit_layer", "num_stages")]
    ran = []
    outputs = list(handlers.on_run_form(None, lambda *a: ran.append(a), None, *form, "false"))
    (values,) = outputs
    summary = dict(zip(view.OUTPUTS, values))["summary"]
    assert summary == {"error": "eesd must be true or false, not 'false'"} and not ran


def _panel_modules():
    return {m.name: importlib.import_module(f"app.panels.{m.name}") for m in pkgutil.iter_modules(app.panels.__path__)}


def test_every_results_panel_has_one_shape_and_every_panel_one_wire():
    """Issue 51: results panels (`view.PANELS`) have `OUTPUTS`, `create`, `idle`, `show` and
    `wire(made, page)`; setting panels have `create` and the same `wire`, and no run output."""
    for name, module in _panel_modules().items():
        assert list(inspect.signature(module.wire).parameters) == ["made", "page"], name
        if module in view.PANELS:
            assert isinstance(module.OUTPUTS, tuple) and callable(module.idle) and callable(module.show), name
        else:
            assert not any(hasattr(module, part) for part in ("OUTPUTS", "idle", "show")), name


def test_the_run_outputs_come_from_the_one_panel_list():
    """The layout names no panel list of its own: a results panel it did not place fails at start-up."""
    from app import ui

    with pytest.raises(RuntimeError, match="headline"):
        ui.run_outputs({})


def _shipped():
    from app import replay

    return replay.open_bytes(next(iter(replay.shipped().values())).read_bytes())


def test_a_snapshot_computes_its_statistic_once(monkeypatch):
    """The library's `State.stats()` recomputes every run's metrics: the page asks for it once a
    snapshot, however many panels read it (it was 37 times for a recorded run), the Run handler's
    check of what changed included (it asked once more, through `Snapshot.runs`)."""
    from ppsd.compare import State

    snap = _shipped()
    calls, stats = [], State.stats
    monkeypatch.setattr(State, "stats", lambda state: calls.append(1) or stats(state))
    *_, last = handlers._updates(iter([snap]))
    assert len(calls) == 1 and last[view.OUTPUTS.index("summary")]["timed_runs"]["rounds"] >= 1


def test_shown_means_the_shown_round_on_every_panel():
    """Issue 59: "shown" was a round's index, its label, a mapping of runs and a trace; now it is the
    shown round, its 0-based index, which the label, the race and the API's summary agree on."""
    from app.reading import RunView

    snap = _shipped()
    shown = RunView.of(snap)
    assert isinstance(shown.shown, int) and shown.shown == snap.state.shown_index()
    assert shown.runs["ppsd"] is snap.state.rounds[shown.shown]["ppsd"] and shown.reading.shown == shown.shown
    values = view.snapshot(snap)
    assert values["summary"]["timed_runs"]["shown_round"] == shown.shown + 1
    assert values["race"]["round_label"] == shown.round_label and f"Round {shown.shown + 1} of" in shown.round_label


def test_the_timeline_title_names_where_a_concurrent_run_ran_not_always_worker_processes():
    from types import SimpleNamespace

    from app import kind_words
    from app.panels.timeline import timeline_title
    from ppsd.executors.kinds import concurrent_kinds

    trace = SimpleNamespace(clock="measured", concurrent=True, device="cpu")
    titles = {kind.name: timeline_title(trace, 2, kind) for kind in concurrent_kinds()}
    assert all(kind_words.of(kind).where in titles[kind.name] for kind in concurrent_kinds())
    assert len(set(titles.values())) == len(titles)  # each kind's own words
    assert "worker process" not in timeline_title(trace, 2)  # a run whose kind is not known says no more than it knows
