"""The page on ZeroGPU's process model, through the stand-in `spaces` of `tests/spaces_standin.py`:
every Run's decoding is a forked, daemonic call whose outputs are pickled back, from a server
whose process has already used torch on two CPU threads (as a Space that loads its model at
start-up has). Run, Stop, Load, Replay and a second Run, in a real browser; the OpenMP hazard of
such a fork, on the thread that forks; and the lease each call asks for."""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch

import spaces_standin
from conftest import CHROMIUM, open_page, page_model, served

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


def _form(model: str, **settings):
    from app.request import FORM, RunRequest

    settings = {"max_new_tokens": 16, "repeats": 1, "workers": True, "pipeline": "processes", **settings}
    request = RunRequest(prompt="def fibonacci(n):", model=model, exit_layer=None, **settings)
    return tuple(getattr(request, name) for name in FORM)


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
        worker = threading.Thread(target=lambda: outputs.extend(decode(stop.slot, *_form(model))), daemon=True)
        worker.start()
        worker.join(FORK_SECONDS)
        stop.set()
    assert not worker.is_alive(), f"the forked call did not finish in {FORK_SECONDS:g} s (OpenMP across the fork?)"
    last = dict(zip(view.OUTPUTS, outputs[-1]))
    summary = last["summary"]
    assert "error" not in summary, summary
    assert summary["ar"]["token_ids"] == summary["ppsd"]["token_ids"] and len(summary["ar"]["token_ids"]) > 0
    assert "this process is daemonic" in summary["note"] and "ran on threads" in last["message"]


def test_a_stop_set_in_the_server_reaches_the_forked_call(zerogpu_state):
    """Stop arrives in the server's process; the run decodes in the fork. Its flag is a slot of a
    mapping both share, so the call ends at its next step and says where."""
    from app import zerogpu
    from app.handlers import on_decode

    state, model, _ = zerogpu_state
    decode = zerogpu.gpu_call(partial(on_decode, state), duration=lambda *args: 10)
    with state.stops.running("stopping") as stop:
        calls = decode(stop.slot, *_form(model, max_new_tokens=1000))
        while "Running AR" not in next(calls)[0]:
            pass
        state.stops.stop("stopping")
        started = time.monotonic()
        last = list(calls)[-1]
        ended = time.monotonic() - started
    assert ended < 3.0 and "Stopped during AR" in last[0]


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
            worker = threading.Thread(target=lambda: outputs.extend(decode(stop.slot, *_form(model))), daemon=True)
            worker.start()
            worker.join(FORK_SECONDS)
            stop.set()
    finally:
        release.set()
    assert not worker.is_alive(), "the forked call waited on a lock its parent held at the fork"
    assert outputs and "than AR" in outputs[-1][0]


def test_worker_processes_are_refused_on_zerogpu_not_wherever_spaces_is_installed(monkeypatch):
    """`spaces` is installed on every Space; only ZeroGPU (SPACES_ZERO_GPU) lends the GPU to one
    process for one call, so only there are worker processes refused on a GPU."""
    import sys
    import types

    from ppsd.executors.pool import workers_unavailable

    monkeypatch.setitem(sys.modules, "spaces", types.ModuleType("spaces"))
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert workers_unavailable(2, "cuda") is None
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert "ZeroGPU" in workers_unavailable(2, "cuda")


def test_the_lease_follows_the_run_and_the_default_run_asks_for_at_most_a_minute(monkeypatch):
    """What the page hands `spaces.GPU`: a lease sized per call from the run's own inputs (after
    the stop slot), from the measured cost of a token, within the run's time limit; the page's
    default run asks for at most 60 s."""
    import sys
    import types

    from app import AppState, create_demo
    from app.request import FORM, GPU_SETUP_SECONDS, RunRequest

    leases = []
    fake = types.ModuleType("spaces")
    fake.GPU = lambda duration: (leases.append(duration), lambda fn: fn)[1]
    monkeypatch.setitem(sys.modules, "spaces", fake)
    create_demo(AppState(run_seconds=120))
    (duration,) = leases
    form = lambda **kw: tuple(getattr(RunRequest(prompt="hi", **kw), name) for name in FORM)  # noqa: E731
    short, long_ = duration(0, *form(max_new_tokens=16, repeats=1)), duration(0, *form(max_new_tokens=256))
    assert GPU_SETUP_SECONDS < short < long_ <= GPU_SETUP_SECONDS + 120 + 1
    assert duration(0, *form(max_new_tokens=256, repeats=9, eesd=True)) == math.ceil(GPU_SETUP_SECONDS + 120)
    assert duration(0, *form(max_new_tokens=float("nan"))) == math.ceil(GPU_SETUP_SECONDS)  # refused later, in words
    assert duration(0, *form(workers=True)) <= 60  # the defaults: 64 tokens, 3 timed runs of AR, PPSD and plain AR


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: install Debian's chromium")
def test_the_page_runs_stops_loads_and_replays_with_every_run_a_forked_call(zerogpu_state):
    """The page's default Run, with nothing changed but the model box off the real model:
    finishes with a headline, no error, in a forked call whose lease is at most a minute; Replay
    replays it; Load finds the model loaded at start-up; a second Run shows its first token
    within 5 s; Stop, pressed 4 s into a run, ends it within 3 s."""
    state, model, real = zerogpu_state
    loaded = state.cache.get(model, warm=False)
    with served(state) as url, open_page((url, model, real)) as page:
        prompt = page.locator("#prompt textarea").first
        if not prompt.input_value():  # a page with no default prompt: its first example
            page.locator("#examples button, #examples td").first.click()
        page.locator("#run").click()
        page.locator(".headline-agreement").first.wait_for(state="attached", timeout=FORK_SECONDS * 1000)  # once a run is done
        headline = page.locator("#headline").inner_text()
        assert "than AR" in headline, headline
        assert not page.locator("#run-message .error, .run-message-error").count()
        assert spaces_standin.LEASES and max(spaces_standin.LEASES) <= 60

        page.get_by_role("button", name="Replay").first.click()
        page.locator("#race .race-lane").first.wait_for(state="attached", timeout=10_000)
        assert "PPSD" in page.locator("#race").inner_text()  # the race's data came back pickled from the fork

        page.locator("#load").click()
        page.locator(".model-status.model-ok").first.wait_for(timeout=30_000)
        assert state.cache.get(model, warm=False) is loaded  # loaded once, at start-up

        page.locator("#run").click()
        clicked = time.monotonic()
        page.locator("#stream-ar .tok, #columns .tok").first.wait_for(timeout=60_000)
        first_token = time.monotonic() - clicked
        page.wait_for_timeout(max(0.0, 4.0 - (time.monotonic() - clicked)) * 1000)
        page.locator("#stop").click()
        stopped = time.monotonic()
        page.get_by_text("Stopped").first.wait_for(timeout=10_000)
        stop_seconds = time.monotonic() - stopped
    print(f"second Run's first token {first_token:.2f} s; Stop ended the run in {stop_seconds:.2f} s")
    assert first_token < 5.0, f"the second Run's first token took {first_token:.1f} s"
    assert stop_seconds < 3.0, f"Stop took {stop_seconds:.1f} s"
