"""The executor kinds: unknown names refused in words, "auto" resolved by its rule, every kind
saying why it cannot run where it cannot and the measured case it is kept for, the CLI and the
bench offering every kind of `KINDS` and the page's radio those measured fastest somewhere
(the API still takes the others by name), their names and words written nowhere else, and the
one place that chooses (`ppsd.choice`) holding no process state at module level."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from ppsd import choice
from ppsd.choice import choose, concurrent_by_default
from ppsd.executors import host, kinds
from ppsd.executors.distributed import pool
from ppsd.executors.kinds import KINDS, concurrent_kinds, kind_named
from ppsd.generate import warm_up

ROOT = Path(__file__).resolve().parent.parent


def _setup(device: str, num_stages: int) -> SimpleNamespace:
    """As much of a `RunSetup` as `ready` reads before it builds anything."""
    return SimpleNamespace(model=SimpleNamespace(info=SimpleNamespace(device=device)),
                           config=SimpleNamespace(num_stages=num_stages))


def test_an_unknown_name_is_refused_naming_the_choices():
    for ask in (lambda: kind_named("fibres"), lambda: choose("fibres", 2, "cpu")):
        with pytest.raises(ValueError, match="executor 'fibres' is unknown; choose one of: auto, in-process, "
                                             "processes, threads, graphed"):
            ask()
    assert kind_named("distributed") is KINDS["processes"]  # the CLI's earlier name


def test_auto_picks_processes_where_they_start_on_a_cpu_else_threads(monkeypatch):
    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    assert choose("auto", 2, "cpu").name == "processes"
    assert choose("auto", 3, "cpu").name == "threads"  # too few cores for a process each
    assert choose("auto", 2, "cuda:0").name == "graphed"  # one GPU: captured steps, a CUDA stream each
    assert choose("processes", 3, "cpu").name == "processes"  # asked for by name: refused by `ready`, with the reason
    assert choose("in-process", 2, "cpu").name == "in-process"
    assert concurrent_by_default(2, "cpu") and not concurrent_by_default(3, "cpu")
    assert concurrent_by_default(3, "cuda:0")
    monkeypatch.setattr(pool.multiprocessing, "current_process", lambda: type("P", (), {"daemon": True})())
    assert choose("auto", 2, "cpu").name == "threads"  # a daemonic process (ZeroGPU) cannot start workers


def test_every_kind_says_why_it_cannot_run_and_ready_refuses_with_that_reason(monkeypatch):
    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    impossible = {"processes": ("cpu", 3, "K = 3 worker processes need 3 CPU cores, one each; this machine gives 2"),
                  "threads": ("mps", 2, "the threads executor runs on CPU or CUDA, not mps"),
                  "graphed": ("mps", 2, "the graphed executor runs on CPU or CUDA, not mps"),
                  "stacked": ("mps", 2, "the stacked executor runs on CPU or CUDA, not mps")}
    assert set(impossible) | {"in-process"} == set(KINDS)  # a new kind gets a case here
    for name, (device, k, reason) in impossible.items():
        kind = KINDS[name]
        assert reason in kind.unavailable(device, k)
        with pytest.raises(ValueError, match=re.escape(reason)):
            kind.ready(_setup(device, k), warm_up=warm_up)
        assert kind.unavailable("cpu", 2) is None
    assert KINDS["in-process"].unavailable("mps", 64) is None  # one process runs anywhere
    monkeypatch.setattr(pool.multiprocessing, "current_process", lambda: type("P", (), {"daemon": True})())
    assert "daemonic" in KINDS["processes"].unavailable("cpu", 2)
    assert KINDS["threads"].unavailable("cpu", 2) is None  # the way a daemonic process runs the stages at once
    assert KINDS["graphed"].unavailable("cuda:0", 2) is None
    assert KINDS["stacked"].unavailable("cuda:0", 3) is None
    monkeypatch.setattr(kinds.shutil, "which", lambda name: None)
    assert "no C++ compiler" in KINDS["graphed"].unavailable("cpu", 2)  # it compiles its steps on a CPU


def test_release_closes_what_a_run_built_and_leaves_the_shared_pipeline():
    closed = []
    executor = SimpleNamespace(close=lambda: closed.append(True))
    KINDS["processes"].release(executor)
    KINDS["in-process"].release(None)
    assert closed == []
    KINDS["threads"].release(executor)
    assert closed == [True]


def test_the_cli_offers_every_kind_and_takes_the_earlier_name():
    from ppsd.cli import generate

    parser = argparse.ArgumentParser()
    generate.add_arguments(parser)
    action = next(a for a in parser._actions if a.dest == "executor")
    assert tuple(action.choices) == ("auto", *KINDS)  # auto: the fastest measured here (issue 50)
    assert all(f"{kind.name}: {kind.noun}, " in action.help for kind in KINDS.values())
    assert parser.parse_args(["--prompt", "hi", "--executor", "distributed"]).executor == "processes"


def test_the_page_offers_auto_and_the_kinds_measured_fastest_somewhere_in_their_words():
    """Issue 59: a kind earns its place on the radio by a measured case (docs/benchmarks.md, "Why
    each kind exists"): worker processes and the captured steps. Threads and stacked stay in the
    library, the CLI and the bench."""
    import gradio as gr

    from app import kind_words, ui

    with gr.Blocks():
        radio = ui._pipeline_controls()["pipeline"]
    assert [tuple(choice) for choice in radio.choices] == [
        (kind_words.AUTO_CHOICE, "auto"), ("worker processes, one per stage", "processes"),
        ("captured steps, one per stage", "graphed")]
    assert radio.value == "auto"  # the page's default: the fastest measured here (issue 50)
    assert {kind.name for kind in concurrent_kinds() if not kind.fastest} == {"threads", "stacked"}
    assert all(kind.fastest or kind.earns for kind in KINDS.values())  # every kind says why it is kept
    assert "experimental" in KINDS["stacked"].earns and "experimental" in kind_words.of("stacked").choice


def test_the_api_still_runs_a_kind_off_the_radio_by_name_and_refuses_any_other_name():
    """What a client sends as "pipeline" (docs/app.md, "Kinds off the radio"): the name of any
    concurrent kind passes the radio, so threads and stacked run through the API as before (the
    run itself is test_app_e2e's); another value is refused in Gradio's words, naming the choices."""
    import gradio as gr

    from app import ui

    with gr.Blocks():
        radio = ui._pipeline_controls()["pipeline"]
    assert radio.preprocess("threads") == "threads" and radio.preprocess("stacked") == "stacked"
    assert radio.preprocess("graphed") == "graphed" and radio.preprocess("auto") == "auto"
    for refused in ("fibres", "in-process"):
        with pytest.raises(gr.Error, match="not in the list of choices"):
            radio.preprocess(refused)


def test_the_page_has_words_for_every_kind_and_the_library_none_of_the_pages():
    from app import kind_words

    assert set(kind_words.WORDS) == set(KINDS)  # a new kind gets the page's words there
    page_words = {"choice", "where", "ran", "stages", "overhead"}
    assert not page_words & {field for field in kinds.ExecutorKind.__dataclass_fields__}
    assert not hasattr(kinds, "AUTO_CHOICE") and not hasattr(kinds, "fastest_ar")


def test_the_library_keeps_no_front_ends_state_at_module_level():
    """The process's one `ReadyKinds` is the front end's (`app.runner.READY`); `ppsd.choice` makes
    none, nor does app/zerogpu keep an executor of its own across calls."""
    from app import runner, zerogpu

    assert isinstance(runner.READY, choice.ReadyKinds)
    assert not [name for name, value in vars(choice).items() if isinstance(value, choice.ReadyKinds)]
    assert not {"_kept", "ready_pipeline", "release_pipeline"} & set(vars(zerogpu))
    assert not (ROOT / "ppsd" / "ready_here.py").exists() and not (ROOT / "ppsd" / "executors" / "choice.py").exists()


def test_bench_pipeline_has_an_ar_and_a_ppsd_row_per_concurrent_kind():
    from ppsd.bench.pipeline import rows

    methods = rows(3, 4, concurrent_kinds())
    at_once = [(m.method, m.executor, m.label) for m in methods if KINDS[m.executor].concurrent]
    assert at_once == [(method, kind.name, f"{name}, {kind.row.format(k=3)}") for kind in concurrent_kinds()
                       for method, name in (("ar", "AR"), ("ppsd", "PPSD"))]
    assert {m.executor for m in methods} == set(KINDS)


def test_the_kinds_names_and_words_are_written_only_in_their_module():
    """A list of kind names, or a kind's words, anywhere else would be a second place to update:
    the library's in `kinds.py`, the page's in `app/kind_words.py`."""
    from app import kind_words

    names = "|".join(re.escape(n) for n in (*KINDS, "distributed"))
    listed = re.compile(rf"""["']({names})["'][\s,()\[\]]*["']({names})["']""")
    words = [w for kind in KINDS.values() for w in (kind.label, kind_words.of(kind).choice, kind_words.of(kind).where)
             if len(w.split()) > 2]
    sources = [p for folder in ("ppsd", "app") for p in (ROOT / folder).rglob("*.py")
               if p.name not in ("kinds.py", "kind_words.py")]
    for path in sources:
        text = path.read_text()
        assert not listed.search(text), f"{path}: a list of executor kinds: {listed.search(text).group(0)}"
        for w in words:
            assert f'"{w}"' not in text, f"{path} repeats {w!r}"


def test_no_executor_kind_is_named_in_the_page():
    """app/ takes a kind's name, facts and costs from the library (`KINDS`, `IN_TURN`,
    `ppsd.choice`), so a new kind needs only its words there (`app.kind_words.WORDS`, keyed by
    name), the GPU lease included. A dict's key is a record's field or that key (the API's
    "threads": a thread count), not a kind; "auto" is a choice, not a kind."""
    found = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        tree = ast.parse(path.read_text())
        keys = {id(key) for node in ast.walk(tree) if isinstance(node, ast.Dict) for key in node.keys}
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in KINDS and id(node) not in keys]
    assert not found, found


def test_each_kind_is_priced_on_a_gpu_by_whether_it_captures():
    """What the ZeroGPU lease asks of a kind is `ppsd.choice`'s: the captured steps and the stacked
    chain (CUDA graphs a bucket) at graphed PPSD's measured token, the rest eager."""
    for kind in KINDS.values():
        assert 0 < choice.gpu_token_seconds(kind) <= choice.EAGER_GPU_TOKEN_SECONDS
        assert kind.gpu_captures == (choice.gpu_token_seconds(kind) < choice.EAGER_GPU_TOKEN_SECONDS)
    assert KINDS["stacked"].gpu_captures and KINDS["graphed"].gpu_captures and not kinds.IN_TURN.gpu_captures
    assert not kinds.IN_TURN.concurrent and not kinds.IN_TURN.times_plain
    assert all(kind.times_plain for kind in concurrent_kinds())  # plain AR timed beside the stages at once
