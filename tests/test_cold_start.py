"""The page starts fast and gets faster, and a cold start talks (issue 50): the background compile's
states and words, the terminal's lines while something long runs, "auto" on a CPU choosing the
fastest PPSD measured here once compiled steps are ready, and the start-up's steps said as they
begin and again while they last. Fakes and a fake clock throughout: nothing compiles here."""

from __future__ import annotations

import importlib.util
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ppsd.executors import host
from ppsd.executors.background import Background, ticking
from ppsd.compile_cache import Speed
from ppsd.choice import choose, choose_measured
from ppsd.executors.kinds import KINDS

ROOT = Path(__file__).resolve().parent.parent
needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="the captured steps compile on a CPU only with a C++ compiler")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_background_compile_says_how_far_it_is_then_hands_over_its_executor():
    clock, release, built = Clock(), threading.Event(), object()
    background = Background("the captured steps", lambda: release.wait(5) and built, clock=clock)
    assert background.state == "waiting"
    background.start()
    clock.now += 40
    assert background.state == "compiling" and background.executor is None
    assert background.words() == "compiling the captured steps: 40 s so far"
    clock.now += 12
    release.set()
    assert background.wait(5)
    assert background.state == "ready" and background.executor is built
    assert background.words() == "the captured steps ready (compiled in 52 s)"
    clock.now += 100
    assert background.seconds == pytest.approx(52)  # done: the clock stops


def test_a_background_build_from_the_kept_compile_says_it_loads_rather_than_compiles():
    clock, release, built = Clock(), threading.Event(), object()
    background = Background("the captured steps", lambda: release.wait(5) and built, kept=True, clock=clock).start()
    clock.now += 9
    assert background.words() == "loading the kept compile of the captured steps: 9 s so far"
    release.set()
    assert background.wait(5)
    assert background.words() == "the captured steps ready (loaded from the kept compile in 9 s)"


def test_a_failed_background_compile_says_why_and_leaves_nothing_to_run_on():
    def fail():
        raise RuntimeError("no C++ compiler\nand more lines")

    background = Background("the captured steps", fail, clock=Clock()).start()
    assert background.wait(5) and background.state == "failed" and background.executor is None
    assert background.words() == "compiling the captured steps failed after 0 s: no C++ compiler"


def test_ticking_says_where_it_stands_while_the_block_runs_and_stops_after():
    said: list[str] = []
    with ticking(said.append, lambda: f"line {len(said)}", 0.02):
        time.sleep(0.2)
    count = len(said)
    assert count >= 3 and said[:2] == ["line 0", "line 1"]
    time.sleep(0.1)
    assert len(said) == count  # silent once the block ended
    with ticking(None, lambda: "never", 0.01):  # no terminal: nothing said
        time.sleep(0.05)


NOW = 1_800_000_000.0


def quiet(tokens: float, load: float = 0.3) -> Speed:
    """A speed measured an hour ago on a quiet machine."""
    return Speed(tokens, load, NOW - 3600)


@needs_compiler
def test_auto_on_a_cpu_runs_where_nothing_compiles_until_the_captured_steps_are_ready(monkeypatch):
    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    default = choose("auto", 2, "cpu")
    measured = lambda ready, speeds, **kw: choose_measured(2, "cpu", ready, speeds, load=0.2, now=NOW, **kw)  # noqa: E731
    first = measured((), {})
    assert first.kind is default and first.why == "it needs no compile (the captured steps are not compiled yet)"
    measured_once = measured(("graphed",), {default.name: quiet(15.4)})
    assert measured_once.kind is KINDS["graphed"] and "this run measures it" in measured_once.why
    faster = measured(("graphed",), {default.name: quiet(15.4), "graphed": quiet(19.9, 0.5)})
    assert faster.kind is KINDS["graphed"]
    assert faster.why == ("the fastest PPSD measured on this machine (19.9 tokens/s at load 0.5, against 15.4 at "
                          "load 0.3 on the worker processes)")
    slower = measured(("graphed",), {default.name: quiet(15.4), "graphed": quiet(12.7)})
    assert slower.kind is default and "15.4 tokens/s at load 0.3, against 12.7 at load 0.3 on the captured steps" in slower.why
    cli = measured(("graphed",), {}, measures=False)  # the CLI measures nothing
    assert cli.kind is KINDS["graphed"] and "docs/benchmarks.md" in cli.why
    assert measured(("graphed",), {"graphed": quiet(19.9)}, measures=False).kind is KINDS["graphed"]
    assert measured(("graphed",), {default.name: quiet(15.4), "graphed": quiet(12.7)},
                    measures=False).kind is default  # where the page measured otherwise
    assert choose_measured(2, "cuda:0", ("graphed",), {"processes": quiet(99.0)}).kind is KINDS["graphed"]


@needs_compiler
def test_auto_measures_again_a_speed_taken_on_a_busier_machine_or_long_ago(monkeypatch):
    """Issue 56: auto chose the captured steps over the worker processes' 5.3 tokens/s, measured while
    the background compile held a core (the bench measured 18.1). A speed kept with its load is
    measured again once the machine is at least a load of 1 quieter, or a day later."""
    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    default = choose("auto", 2, "cpu")
    busy = {default.name: Speed(5.3, 2.4, NOW - 600), "graphed": Speed(12.6, 0.4, NOW - 60)}
    again = choose_measured(2, "cpu", ("graphed",), busy, load=0.4, now=NOW)
    assert again.kind is default
    assert again.why == ("its speed kept here (5.3 tokens/s) is stale: it was measured at load 2.4, busier than now "
                         "(0.4); this run measures it again")
    assert choose_measured(2, "cpu", ("graphed",), busy, load=2.0, now=NOW).kind is KINDS["graphed"]  # as busy now
    old = {default.name: Speed(15.4, 0.3, NOW - 2 * 86400), "graphed": quiet(12.7)}
    assert "more than a day ago" in choose_measured(2, "cpu", ("graphed",), old, load=0.3, now=NOW).why
    unrecorded = {default.name: Speed(15.4), "graphed": quiet(12.7)}  # kept by an earlier version
    assert "no load recorded" in choose_measured(2, "cpu", ("graphed",), unrecorded, load=0.3, now=NOW).why
    assert choose_measured(2, "cpu", ("graphed",), busy, load=0.4, now=NOW,
                           measures=False).kind is KINDS["graphed"]  # the CLI compares what is kept


@needs_compiler
def test_the_page_runs_auto_on_the_kept_executor_only_for_the_setup_it_was_built_for(monkeypatch):
    from app import kind_words
    from ppsd import choice

    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    monkeypatch.setattr(choice.compile_cache, "speeds",
                        lambda model: {"processes": Speed(15.4, 0.2, time.time()),
                                       "graphed": Speed(19.9, 0.2, time.time())} if model == "m" else {})
    monkeypatch.setattr(choice, "load", lambda: 0.2)
    weights, head, partition = object(), object(), (range(0, 4), range(4, 8))

    def setup(hf_model=weights) -> SimpleNamespace:
        return SimpleNamespace(model=SimpleNamespace(hf_model=hf_model, exit_head=head,
                                                     info=SimpleNamespace(device="cpu", name="m")),
                               partition=partition, config=SimpleNamespace(num_stages=2))

    here = choice.ReadyKinds()  # what the front end owns: the library keeps none
    assert not here.measuring()  # nothing compiles in the background (tests never write the user's cache)
    compiling = Background("the captured steps", lambda: threading.Event().wait(5), clock=Clock())
    here.builds["graphed"] = (choice.setup_key(setup()), compiling.start())
    assert here.auto(setup()).kind is KINDS["processes"]  # a Run never waits for the compile
    assert here.words() == "compiling the captured steps: 0 s so far" and here.compiling()
    assert not here.measuring()  # a Run beside the compile is slowed by it: its speed is not kept
    built = object()
    ready = Background("the captured steps", lambda: built, clock=Clock()).start()
    ready.wait(5)
    here.builds["graphed"] = (choice.setup_key(setup()), ready)
    run = here.for_run("auto", setup())
    assert run.kind is KINDS["graphed"] and run.executor is built and here.kept(run.kind, setup()) is built
    assert here.measuring() and not here.compiling()
    assert kind_words.note(run) == ("The stages ran on the captured steps, chosen by auto: the fastest PPSD "
                                      "measured on this machine (19.9 tokens/s at load 0.2, against 15.4 at load 0.2 on the worker processes).")
    other = setup(hf_model=object())  # another model: the kept steps do not fit it
    assert here.for_run("auto", other).kind is KINDS["processes"] and here.kept(KINDS["graphed"], other) is None
    asked = here.for_run("processes", setup())  # a kind asked for by name runs as asked, said nothing of
    assert asked.kind is KINDS["processes"] and asked.chosen is None and kind_words.note(asked) == ""


def test_the_cold_start_says_each_step_as_it_begins_and_again_while_it_lasts(capsys):
    spec = importlib.util.spec_from_file_location("app_main", ROOT / "app.py")
    app_main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app_main)
    assert app_main.TALK_SECONDS < 5  # the terminal is never silent 5 s
    clock = Clock()
    cold = app_main.ColdStart(clock)
    cold.tell("Converting SmolLM2-135M-Instruct.Q4_1.gguf to safetensors in /cache (once, about 20 s)")
    clock.now += 8
    assert cold.words() == "  Converting SmolLM2-135M-Instruct.Q4_1.gguf to safetensors in /cache (once, about 20 s)… 8 s"
    cold.tell("Starting 2 worker processes, one per stage, and loading the weights in each")
    assert cold.words().endswith("in each… 0 s")
    assert capsys.readouterr().out.splitlines() == [
        "  Converting SmolLM2-135M-Instruct.Q4_1.gguf to safetensors in /cache (once, about 20 s)…",
        "  Starting 2 worker processes, one per stage, and loading the weights in each…"]


@needs_compiler
def test_prestart_serves_on_the_kind_needing_no_compile_and_compiles_the_others_in_the_background(monkeypatch):
    from app import runner
    from ppsd import choice

    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    started, compiling, told = [], [], []
    monkeypatch.setattr(choice, "ready", lambda kind, setup, progress: started.append(kind))
    monkeypatch.setattr(runner.READY, "compile_in_background", lambda kind, setup: compiling.append((kind, setup)))
    loaded = SimpleNamespace(model=SimpleNamespace(info=SimpleNamespace(device="cpu")), chat=True)
    made = SimpleNamespace()
    cache = SimpleNamespace(get=lambda name, progress=None, warm=None: loaded,
                            set_up=lambda *args, **kwargs: made)
    words = runner.prestart(cache, "tiny", told.append)
    assert started == [choose("auto", 2, "cpu")] and words == "2 worker processes"
    assert [(kind.name, setup) for kind, setup in compiling] == [
        (kind.name, made) for kind in KINDS.values() if kind.compiles_on("cpu")] and compiling
    assert told[0] == "Loading tiny and warming it up (untimed)"


@needs_compiler
def test_the_cli_auto_says_a_one_time_compile_is_coming_and_ticks_while_it_runs(saved_model, tmp_path, monkeypatch,
                                                                                   capsys):
    """`generate --executor auto` on a CPU with nothing kept: the captured steps, a one-time
    compile announced with where it is kept, a line every few seconds while it runs, and a record
    after it. The compile itself is a stand-in (it waits): the real one is test_graphed's."""
    import dataclasses

    from ppsd import compile_cache
    from ppsd.cli import generate, main

    monkeypatch.setenv("PPSD_CACHE", str(tmp_path))
    monkeypatch.setattr(compile_cache, "_in_use", None)  # as in a new process: an earlier test's folder is not this one
    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    monkeypatch.setattr(generate, "ticking", lambda say, words, every: ticking(say, words, 0.05))
    slow = dataclasses.replace(KINDS["graphed"], build=lambda setup, warm_up, tell, options: time.sleep(0.3))
    monkeypatch.setitem(KINDS, "graphed", slow)
    assert main(["generate", "--model", saved_model, "--prompt", "The quick", "--max-new-tokens", "4",
                 "--executor", "auto"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("--executor auto: the captured steps, chosen: the fastest PPSD on a quiet 2-core CPU")
    assert err[1].startswith("A one-time compile of the captured steps is coming (a minute or two on a quiet small "
                             f"CPU, more under load); it is kept in {compile_cache.folder()}")
    ticks = [line for line in err[2:] if line.startswith("compiling the captured steps: ")]
    assert len(ticks) >= 3 and all(line.endswith(" s so far") for line in ticks)
    assert compile_cache.last_seconds() is not None and compile_cache.last_seconds() >= 0.3


def test_the_page_says_what_compiles_under_run_refreshed_by_a_timer():
    import gradio as gr

    from app.panels import compile_status

    assert "run-message-empty" in compile_status.render("")
    words = ["compiling the captured steps: 40 s so far"]
    with gr.Blocks() as demo:
        panel = compile_status.create()
        timer = compile_status.refresh(panel, lambda: words[0])
    assert timer.value == compile_status.REFRESH_SECONDS <= 5
    tick = next(block.fn for block in demo.fns.values() if block.outputs == [panel.component])
    assert tick() == ('<div class="run-message run-message-status" role="status">Compiling the captured steps: '
                      '40 s so far</div>')
    words[0] = "the captured steps ready (compiled in 52 s)"
    assert "The captured steps ready (compiled in 52 s)" in tick()


@needs_compiler
def test_a_build_that_expected_to_load_but_compiled_says_compiled():
    clock, built = Clock(), object()

    def build():
        clock.now += 149
        background.loaded = False  # what the build found it did: the kept steps were another code's
        return built

    background = Background("the captured steps", build, kept=True, clock=clock)
    background.start()
    assert background.wait(5)
    assert background.words() == "the captured steps ready (compiled in 149 s)"


def test_a_runs_speed_is_kept_with_its_load_only_when_nothing_compiled_in_its_rounds(monkeypatch):
    """Issue 56: a speed measured while a compile ran measured the compile too; auto must not compare it."""
    from ppsd import choice

    kept = []
    monkeypatch.setattr(choice.compile_cache, "note_speed", lambda *args: kept.append(args))
    run = SimpleNamespace(result=SimpleNamespace(token_ids=list(range(40))))
    setup = SimpleNamespace(model=SimpleNamespace(info=SimpleNamespace(name="m", device="cpu")))
    state = lambda compiled, done=True, others=(0.05,): SimpleNamespace(  # noqa: E731
        stats=lambda: SimpleNamespace(median=lambda m: 2.0), rounds=({"ppsd": run},), compiled=compiled, done=done,
        others=others)
    here = choice.ReadyKinds()
    assert not here.note_speed(KINDS["graphed"], setup, state(()), 0.7)  # nothing compiled in the background here
    monkeypatch.setattr(here, "measuring", lambda: True)
    assert not here.note_speed(KINDS["graphed"], setup, state((1,)), 0.7)
    assert not here.note_speed(KINDS["graphed"], setup, state((), done=False), 0.7)  # a live state is no speed
    assert not here.note_speed(KINDS["in-process"], setup, state(()), 0.7)  # the stages in turn: not PPSD's speed
    assert not here.note_speed(KINDS["graphed"], setup, state((), others=(0.9,)), 0.7)  # other programs crowded it
    assert kept == []
    assert here.note_speed(KINDS["graphed"], setup, state(()), 0.7)
    assert kept == [("m", "graphed", 20.0, 0.7)]
