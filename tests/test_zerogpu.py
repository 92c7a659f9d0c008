"""The page's ZeroGPU parts where the real package (tests/test_zerogpu_real.py) cannot test them:
through the stand-in `spaces` of `tests/spaces_standin.py`, the OpenMP hazard of a call forked
on, and run on, the thread whose pool used two CPU threads (the real package runs calls on a pool
thread), and a call forked while another visitor's load holds the cache's lock; with no package,
the lease each call asks for, a refusal in words, heartbeats and the importing thread's loads."""

from __future__ import annotations

import math
import multiprocessing
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch

import spaces_standin
from conftest import page_model

FORK_SECONDS = 240.0  # a forked call that has not finished by then is taken as hung


def _use_two_threads(model) -> None:
    """Decode a few tokens on two CPU threads on this thread: its OpenMP pool now has threads,
    which a fork from this thread copies without them."""
    from ppsd import DecodeConfig, generate

    torch.set_num_threads(2)
    generate(model, [1, 2, 3], DecodeConfig(method="ar", max_new_tokens=4))


@pytest.fixture(scope="module")
def zerogpu_state(request):
    """A server's state as `app.py` builds it on ZeroGPU, under the stand-in: the model loaded at
    start-up in the main process, which has decoded on two threads first."""
    from app import AppState, zerogpu

    model, real = page_model(request)
    with pytest.MonkeyPatch.context() as monkeypatch:
        spaces_standin.install(monkeypatch)
        assert zerogpu.active()
        state = AppState.from_environment()
        loaded = state.cache.get(model)
        _use_two_threads(loaded.model)
        try:
            yield state, model, real
        finally:
            state.cache.clear()
            torch.set_num_threads(1)
            for child in multiprocessing.active_children():
                if child.name == "zerogpu-call":
                    child.kill()


def _request(model: str, **settings):
    from app.request import RunRequest

    settings = {"max_new_tokens": 16, "repeats": 1, "workers": True, "pipeline": "processes", **settings}
    return RunRequest(prompt="def fibonacci(n):", model=model, exit_layer=None, **settings)


def test_a_forked_call_decodes_though_the_thread_that_forked_used_two_cpu_threads(zerogpu_state):
    """The hazard: forked from a thread whose OpenMP pool ran two threads, a call that decodes on
    the copy of that thread hangs in its first parallel op. The call decodes on its own thread
    (`app.zerogpu.on_fresh_thread`), so it finishes, with AR and PPSD alike; the worker
    processes asked for cannot start in a daemonic call, and the page is told so."""
    from app import view, zerogpu
    from app.handlers import on_decode

    state, model, _ = zerogpu_state
    _use_two_threads(state.cache.get(model).model)  # on this thread, the one that forks
    decode = zerogpu.gpu_call(partial(on_decode, state), duration=lambda *args: 10)
    outputs: list = []
    with state.stops.running("forked") as stop:
        worker = threading.Thread(target=lambda: outputs.extend(decode(stop.slot, _request(model))), daemon=True)
        worker.start()
        worker.join(FORK_SECONDS)
        stop.set()
    assert not worker.is_alive(), f"the forked call did not finish in {FORK_SECONDS:g} s (OpenMP across the fork?)"
    last = dict(zip(view.OUTPUTS, outputs[-1]))
    summary = last["summary"]
    assert "error" not in summary, summary
    assert summary["ar"]["token_ids"] == summary["ppsd"]["token_ids"] and len(summary["ar"]["token_ids"]) > 0
    assert "this process is daemonic" in summary["note"] and "ran on threads" in last["message"]


def test_a_run_in_a_call_ends_before_its_lease_with_what_it_has_and_says_so(zerogpu_state, monkeypatch):
    """ZeroGPU frees the card when a call's lease is over: a run that would outlast it (a slower
    card, a longer capture than projected) ends `lease.MARGIN_SECONDS` before, as at the time
    limit, with the tokens it has, and says which limit ended it."""
    from app import lease, view, zerogpu
    from app.handlers import on_decode

    state, model, _ = zerogpu_state
    assert zerogpu.leases_gpu("cuda:0") and not zerogpu.leases_gpu("cpu")  # a CPU run (the tests') holds none
    monkeypatch.setattr(zerogpu, "leases_gpu", lambda device: True)  # this CPU decodes as a Space's GPU would
    state.cache.get(model, warm=True)  # warmed as a reused worker's would be: the lease is the run's own
    monkeypatch.setattr(lease, "gpu_seconds", lambda *args, **kwargs: 4)
    run = _request(model, max_new_tokens=240, repeats=9, eesd=True, workers=False)
    started = time.monotonic()
    with state.stops.running("lease") as stop:
        last = dict(zip(view.OUTPUTS, list(on_decode(state, stop.slot, run))[-1]))
    assert time.monotonic() - started < 4 + 10  # a step or two past the cut, on a busy CPU
    said = "Ended by its GPU lease (this Run asked ZeroGPU for 4 s of GPU)"
    assert last["summary"]["stopped"].startswith(said) and said in last["headline"], last["summary"]
    assert "error" not in last["summary"]


def test_a_call_forked_while_another_model_loads_still_decodes(zerogpu_state, monkeypatch):
    """A visitor's Load holds the model cache's load lock; a Run forked meanwhile gets a copy of
    the cache whose locks are its own and open, so it warms up and decodes."""
    from app import AppState, zerogpu
    from app.handlers import on_decode
    from app.models import ModelCache

    state, model, _ = zerogpu_state
    loaded, release = state.cache.get(model, warm=False), threading.Event()

    def loader(name, **kwargs):
        if name == "slow/model":
            release.wait(FORK_SECONDS)
        return loaded.model, loaded.tokenizer

    busy = AppState(cache=ModelCache(loader=loader, key=str, warm=False))
    busy.cache.get(model)
    loading = threading.Thread(target=lambda: busy.cache.get("slow/model"), daemon=True)
    loading.start()
    decode = zerogpu.gpu_call(partial(on_decode, busy), duration=lambda *args: 10)
    outputs: list = []
    try:
        with busy.stops.running("busy") as stop:
            worker = threading.Thread(target=lambda: outputs.extend(decode(stop.slot, _request(model))), daemon=True)
            worker.start()
            worker.join(FORK_SECONDS)
            stop.set()
    finally:
        release.set()
    assert not worker.is_alive(), "the forked call waited on a lock its parent held at the fork"
    assert outputs and "than AR" in outputs[-1][0]


def test_worker_processes_and_gpu_calls_are_for_zerogpu_not_wherever_spaces_is_installed(monkeypatch):
    """`spaces` is installed on every Space; only ZeroGPU (SPACES_ZERO_GPU) lends the GPU to one
    process for one call, so only there are worker processes refused on a GPU."""
    import sys
    import types

    from ppsd.executors.distributed.pool import workers_unavailable

    from app import zerogpu

    monkeypatch.setitem(sys.modules, "spaces", types.ModuleType("spaces"))
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert workers_unavailable(2, "cuda") is None
    decode = lambda slot: iter(())  # noqa: E731
    assert zerogpu.gpu_call(decode, duration=lambda slot: 10) is decode  # a run on a CPU Space: in this process
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert "ZeroGPU" in workers_unavailable(2, "cuda")


def test_the_lease_follows_the_run_and_the_default_run_on_a_gpu_asks_for_at_most_30_s(monkeypatch):
    """What the page hands `spaces.GPU`: a lease sized per call from the run's own inputs (after
    the stop slot): set-up, a capture per length bucket the run reaches, and each token at the
    captured steps' measured cost when the stages run at once (eager's otherwise), within the
    run's time limit. The page's default Run on a GPU (the captured steps) asks for at most 30 s,
    which ZeroGPU counts as 45 s: two fit an anonymous visitor's 120 s a day."""
    import types

    from app import AppState, create_demo, lease
    from app.request import RunRequest
    from ppsd import choice

    leases = []
    fake = types.ModuleType("spaces")
    fake.GPU = lambda duration: (leases.append(duration), lambda fn: fn)[1]
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    create_demo(AppState(run_seconds=120))
    (duration,) = leases
    form = lambda **kw: RunRequest(prompt="hi", **kw)  # noqa: E731
    short, long_ = duration(0, form(max_new_tokens=16, repeats=1)), duration(0, form(max_new_tokens=256))
    assert lease.SETUP_SECONDS < short < long_ <= lease.SETUP_SECONDS + 120 + 1
    assert duration(0, form(max_new_tokens=float("nan"))) == math.ceil(lease.SETUP_SECONDS)  # refused later, in words
    space_default = form(workers=True, pipeline="auto")  # a GPU's defaults: the stages at once, captured
    assert duration(0, space_default) <= 30 and lease.charged(duration(0, space_default)) * 2 <= 120
    assert duration(0, form(workers=True, pipeline="threads")) > duration(0, space_default)  # eager costs more
    more_buckets = form(workers=True, pipeline="auto", max_new_tokens=1000)
    assert duration(0, more_buckets) >= lease.SETUP_SECONDS + 5 * choice.CAPTURE_SECONDS_PER_BUCKET  # 64..1024
    note = lease.note(duration(0, space_default))
    assert f"asks ZeroGPU for {duration(0, space_default)} s" in note and "120 s a day" in note


def test_a_refusal_by_the_package_reaches_the_page_in_its_words_and_what_to_do(monkeypatch):
    """The package refuses a lease over the visitor's quota with a `gr.Error` titled "ZeroGPU quota
    exceeded" before the call runs: the page says its words, the lease asked for, and what to do;
    any other error passes as it is."""
    import types

    import gradio as gr

    from app import zerogpu

    def refusing(duration):
        def wrap(fn):
            def call(*args):
                raise gr.Error("You have exceeded your ZeroGPU quota (45s requested vs. 3s left).",
                               title="ZeroGPU quota exceeded")
                yield  # a generator function, as the package's wrapper is
            return call
        return wrap

    fake = types.ModuleType("spaces")
    fake.GPU = refusing
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    decode = zerogpu.gpu_call(lambda slot: iter(()), duration=lambda slot: 30)
    with pytest.raises(ValueError) as refused:
        list(decode(0))
    words = str(refused.value)
    assert words.startswith("ZeroGPU quota exceeded: You have exceeded your ZeroGPU quota")
    assert "asked for 30 s of GPU (45 s of quota)" in words and "sign in" in words
    assert zerogpu.refusal(gr.Error("GPU task aborted", title="ZeroGPU worker error"), 30) is None


def test_a_call_yields_a_heartbeat_while_its_work_yields_nothing_and_closes_without_waiting_for_it():
    """Closing a GPU call waits, on Gradio's event loop, for its next item: a call whose work is
    silent (a load, a warm-up, a capture) yields a heartbeat every `HEARTBEAT_SECONDS`, and closing
    it returns at once, leaving the work to finish its step on its own thread."""
    from app import zerogpu

    release = threading.Event()

    def silent():
        release.wait(30)  # a long step that yields nothing
        yield "done"

    calls = zerogpu.on_fresh_thread(silent, every=0.05)()
    started = time.monotonic()
    assert next(calls) is zerogpu.HEARTBEAT and next(calls) is zerogpu.HEARTBEAT
    assert time.monotonic() - started < 1.0
    closing = time.monotonic()
    calls.close()
    assert time.monotonic() - closing < 0.5  # not the 30 s the step would take
    release.set()
    assert list(zerogpu.on_fresh_thread(lambda: iter(["a", "b"]))()) == ["a", "b"]


def test_the_server_side_of_a_call_passes_each_heartbeat_on_as_an_item_the_page_ignores(monkeypatch):
    """Gradio closes a generator only between items: the server side yields the page's no-change
    item for each heartbeat of the call, so a client that leaves is let go within a heartbeat."""
    import types

    from app import zerogpu

    fake = types.ModuleType("spaces")
    fake.GPU = lambda duration: (lambda fn: fn)  # the call in this process, heartbeats and all
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(zerogpu, "HEARTBEAT_SECONDS", 0.05)

    def silent_then_done(slot):
        time.sleep(0.3)
        yield "done"

    items = list(zerogpu.gpu_call(silent_then_done, duration=lambda slot: 10, heartbeat="no change")(0))
    assert items[-1] == "done" and items[:-1] and set(items[:-1]) == {"no change"}
    assert list(zerogpu.gpu_call(silent_then_done, duration=lambda slot: 10)(0)) == ["done"]


def test_a_load_handed_to_the_importing_thread_runs_there_and_anywhere_else_runs_in_place():
    """CUDA emulation is the importing thread's alone, so the server's loads run on it while it
    serves; before it serves, on it, or in another process, a load runs where it is called."""
    from app import zerogpu

    where = zerogpu.on_import_thread(lambda: threading.current_thread().name)
    assert where() == threading.current_thread().name  # nothing serves yet
    stop = threading.Event()
    served = threading.Thread(target=zerogpu.serve_import_thread, args=(stop,), name="importer", daemon=True)
    served.start()
    try:
        deadline = time.monotonic() + 10
        while zerogpu._serving is None and time.monotonic() < deadline:
            time.sleep(0.01)
        answers: list[str] = []
        caller = threading.Thread(target=lambda: answers.append(where()), name="gradio-worker")
        caller.start()
        caller.join(10)
        assert answers == ["importer"]
        with pytest.raises(ValueError):  # the loader's refusal reaches its caller
            zerogpu.on_import_thread(lambda: int("x"))()
    finally:
        stop.set()
        served.join(10)
    assert zerogpu._serving is None and where() == threading.current_thread().name


def _python_312() -> str | None:
    """A Python 3.12 (what the Space's front matter names), on PATH or under pyenv."""
    import glob
    import shutil

    import subprocess

    candidates = [*sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12"))),
                  *filter(None, [shutil.which("python3.12")])]  # pyenv's shim may name one it cannot run
    for python in candidates:
        answer = subprocess.run([python, "--version"], capture_output=True, text=True)
        if answer.returncode == 0 and answer.stdout.startswith("Python 3.12"):
            return python
    return None


def test_the_code_compiles_under_the_python_a_zerogpu_space_runs(tmp_path):
    """ZeroGPU runs Python 3.10.13 or 3.12.12; the front matter asks for 3.12. Every source file
    compiles under a 3.12 (its byte code kept out of the checkout). Only compiling: a torch for
    3.12 is gigabytes, so the suite itself runs under this project's Python."""
    import re
    import subprocess

    python = _python_312()
    if python is None:
        pytest.skip("no python3.12 on PATH or under ~/.pyenv")
    root = Path(__file__).resolve().parent.parent
    front_matter = (root / "README.md").read_text().split("---")[1]
    assert re.search(r'^python_version: "3\.12"$', front_matter, re.M), front_matter
    done = subprocess.run([python, "-m", "compileall", "-q", "app.py", "app", "ppsd", "tools", "tests"], cwd=root,
                          env={"PYTHONPYCACHEPREFIX": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_on_zerogpu_the_page_says_before_run_what_the_run_will_ask_for(monkeypatch):
    """On ZeroGPU the page shows, from its first load and as the form changes, the GPU seconds the
    Run will ask for: the very number its call hands ZeroGPU for the same form."""
    import types

    from app import AppState, create_demo
    from app.request import RunRequest

    leases = []
    fake = types.ModuleType("spaces")
    fake.GPU = lambda duration: (leases.append(duration), lambda fn: fn)[1]
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    demo = create_demo(AppState())
    (duration,) = leases
    (shown,) = [block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "gpu-lease"]
    sayers = [fn for fn in demo.fns.values() if shown in fn.outputs]
    assert {"load", "change"} <= {event for fn in sayers for _, event in fn.targets}
    form = [component.value for component in sayers[0].inputs]  # the page's defaults
    said = sayers[0].fn(*form)
    request = RunRequest.from_form(*form)
    assert said["visible"] and f"asks ZeroGPU for {duration(0, request)} s of GPU" in said["value"]


def test_a_reused_worker_keeps_the_executor_for_the_next_call_with_the_same_model_and_stages(monkeypatch):
    """In a ZeroGPU call the executor a run built stays in the worker: the next call with the same
    weights, exit head and stages gets it back at once, made ready for its own length; another
    model or split closes it and builds anew; outside a call every run builds and lets go its own.
    What is kept is the page's `ReadyKinds`' (its copy in the worker), not a module's."""
    import types

    from ppsd import choice

    class Executor:
        def __init__(self):
            self.closed, self.prepared = False, []

        def prepare(self, length):
            self.prepared.append(length)

        def close(self):
            self.closed = True

    built: list[Executor] = []
    kind = types.SimpleNamespace(name="graphed", shared=False, prepares=True,
                                 ready=lambda setup, warm_up, progress: built.append(Executor()) or built[-1],
                                 release=lambda executor: executor.close())
    model = types.SimpleNamespace(hf_model=object(), exit_head=object(), info=types.SimpleNamespace(max_context=2048))
    setup = lambda partition, tokens=64: types.SimpleNamespace(  # noqa: E731
        model=model, partition=partition, prompt_ids=(1,) * 10,
        config=types.SimpleNamespace(max_new_tokens=tokens, num_stages=2, draft_len=4))
    ready = choice.ReadyKinds()
    monkeypatch.setattr(choice, "_in_a_call", lambda: True)
    first = ready.ready(kind, setup((range(0, 18), range(18, 30))), print)
    ready.release(kind, first)
    again = ready.ready(kind, setup((range(0, 18), range(18, 30)), tokens=500), print)
    assert again is first and not first.closed and len(built) == 1 and first.prepared == [10 + 500 + 10]
    assert choice.ReadyKinds().ready(kind, setup((range(0, 18), range(18, 30))), print) is not first  # its own
    other = ready.ready(kind, setup((range(0, 15), range(15, 30))), print)
    assert other is not first and first.closed and len(built) == 3
    monkeypatch.setattr(choice, "_in_a_call", lambda: False)
    outside = ready.ready(kind, setup((range(0, 15), range(15, 30))), print)
    ready.release(kind, outside)
    assert outside.closed and len(built) == 4 and not other.closed
