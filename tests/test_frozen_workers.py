"""A pipeline worker frozen outside decoding (SIGSTOP while the pool idles, or while it warms up)
is found and replaced before a run leans on it: the next run gets its result in the time fresh
workers take to start, never after the call timeout, and the frozen worker is killed.

On the tiny shipped model (`assets/models/ppsd-tiny`), with real worker processes; a frozen
worker is always continued and killed afterwards, whatever the test did.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import ppsd
from ppsd import DecodeConfig
from ppsd import compare
from ppsd.compare import Comparison
from ppsd.executors.distributed.pool import current_pool, ready_pipeline
from ppsd.executors.distributed.processes import close_all
from ppsd.executors.kinds import KINDS
from ppsd.model import TINY_MODEL, load_model
from ppsd.generate import warm_up
from ppsd.setup import set_up

PROMPT = [5, 17, 42, 9, 3]
TIMEOUT = 15.0  # seconds a call waits for a worker: what a run on a frozen worker used to wait, then fail


@pytest.fixture(scope="module")
def model():
    loaded, _ = load_model(TINY_MODEL)
    return loaded


@pytest.fixture
def config(model):
    return DecodeConfig(method="ppsd", num_stages=2, max_new_tokens=8).resolved(model.num_layers)


@pytest.fixture
def frozen():
    """Pids this test stops; each is continued and killed afterwards, and every pool closed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    close_all()


def _freeze(pid: int, frozen: list[int]) -> None:
    frozen.append(pid)
    os.kill(pid, signal.SIGSTOP)


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether `pid` has ended (or is a zombie nobody reaped yet) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_worker_frozen_while_the_pool_idles_is_replaced_before_the_next_run(model, config, frozen):
    close_all()
    expected = ppsd.generate(model, PROMPT, DecodeConfig(method="ar", max_new_tokens=8)).token_ids
    first = ready_pipeline(model, config, warm_up=warm_up, timeout=TIMEOUT)
    old = first.pids
    _freeze(old[0], frozen)
    told: list[str] = []
    started = time.monotonic()
    pipeline = ready_pipeline(model, config, warm_up=warm_up, timeout=TIMEOUT, progress=told.append)
    result = ppsd.generate(model, PROMPT, config, executor=pipeline)
    took = time.monotonic() - started
    assert result.token_ids == expected
    assert took < TIMEOUT, f"the run took {took:.1f} s: it waited on the frozen worker"
    assert pipeline is not first and not set(pipeline.pids) & set(old)
    assert any("did not answer within 1 s" in line for line in told), told
    assert _gone(old[0]), "the frozen worker was left running"


def test_a_worker_frozen_while_warming_up_is_replaced(model, config, frozen):
    """The warm-up is untimed and no Stop watches it: a worker frozen then used to hold it, and
    the lock every start takes, for the whole call timeout, and then fail the run."""
    close_all()
    frozen_once: list[int] = []

    def freezing_warm_up(*args, **kwargs):
        if not frozen_once:
            frozen_once.append(current_pool().pids[0])
            _freeze(frozen_once[0], frozen)
        return warm_up(*args, **kwargs)

    told: list[str] = []
    started = time.monotonic()
    pipeline = ready_pipeline(model, config, warm_up=freezing_warm_up, timeout=TIMEOUT, progress=told.append)
    took = time.monotonic() - started
    assert took < TIMEOUT, f"the start took {took:.1f} s: it waited on the frozen worker"
    assert pipeline.alive and frozen_once[0] not in pipeline.pids
    assert any("froze or fell silent while warming up" in line for line in told), told
    assert _gone(frozen_once[0]), "the frozen worker was left running"
    result = ppsd.generate(model, PROMPT, config, executor=pipeline)
    assert result.token_ids == ppsd.generate(model, PROMPT, DecodeConfig(method="ar", max_new_tokens=8)).token_ids


def test_frozen_during_warm_up_then_stop_leaves_no_frozen_worker_to_the_next_visitor(model, config, frozen,
                                                                                    monkeypatch):
    """As on the page: a visitor's first Run starts the pool, a worker freezes while it warms up,
    the visitor presses Stop. The next visitor's run ends with a result well within the call timeout."""
    close_all()
    stop = threading.Event()
    frozen_once: list[int] = []

    def freezing_warm_up(*args, **kwargs):
        if not frozen_once:
            frozen_once.append(current_pool().pids[0])
            _freeze(frozen_once[0], frozen)
            stop.set()  # the visitor gives up while the warm-up hangs
        return warm_up(*args, **kwargs)

    monkeypatch.setattr(compare, "warm_up", freezing_warm_up)  # the warm-up the comparison's start gives
    setup = set_up(model, config, prompt_ids=PROMPT)
    first = list(Comparison(setup, ("ar", "ppsd"), kind=KINDS["processes"], rounds=1, stop=stop).run())
    assert first[-1].stopped
    started = time.monotonic()
    states = list(Comparison(setup, ("ar", "ppsd"), kind=KINDS["processes"], rounds=1).run())
    took = time.monotonic() - started
    assert states[-1].done, states[-1]
    assert took < TIMEOUT, f"the next run took {took:.1f} s: it waited on the frozen worker"
    assert _gone(frozen_once[0]), "the frozen worker was left running"


def test_a_worker_silent_for_a_second_is_found_by_its_ping_and_killed(model, config, frozen, monkeypatch):
    """A worker that is not stopped but does not answer (hung) is known by its silence alone."""
    from ppsd.executors.distributed.processes import WorkerProcesses

    close_all()
    pool = ready_pipeline(model, config, warm_up=warm_up, timeout=TIMEOUT)
    pid = pool.pids[0]
    monkeypatch.setattr(WorkerProcesses, "frozen", lambda self: None)  # its process state is not looked at
    _freeze(pid, frozen)
    started = time.monotonic()
    reason = pool.check_workers()
    took = time.monotonic() - started
    assert reason == "a pipeline worker did not answer a ping within 1 s"
    assert took < 3.0, f"the ping took {took:.1f} s"
    assert not pool.alive and _gone(pid)


def _within(seconds: float, work):
    """`work()` on a thread, given `seconds`: (its result, how long it took), or the test fails
    saying it hung (the `frozen` fixture then kills what it hung on, which ends the thread)."""
    outcome: dict = {}

    def run() -> None:
        started = time.monotonic()
        try:
            outcome["value"] = work()
        except Exception as error:  # noqa: BLE001 - handed to the test below
            outcome["error"] = error
        outcome["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"it hung: no answer after {seconds:g} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], outcome["took"]


def _fork_server() -> int | None:
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid


def _helpers() -> list[int]:
    """The fork server's and the resource tracker's pids, as multiprocessing records them."""
    from multiprocessing import resource_tracker

    return [pid for pid in (_fork_server(), resource_tracker._resource_tracker._pid) if pid is not None]


def _spawner():
    """The module that watches the helpers; None where there is none (before issue 57: the
    tests below then show the hang)."""
    try:
        from ppsd.executors.distributed import spawner
    except ImportError:
        return None
    return spawner


def test_a_frozen_fork_server_tracker_and_worker_hang_neither_the_next_run_nor_the_one_behind(model, config,
                                                                                               frozen):
    """Issue 57: with the fork server, the resource tracker and a worker stopped, the next
    8-token run used to wait for ever in the fork server's answer, holding the start lock, so a
    visitor behind it whose run needs no worker process waited too. Now the run gets its result
    on fresh helpers and workers within 30 s, and the one behind it ends soon after."""
    close_all()
    setup = set_up(model, config, prompt_ids=PROMPT)
    list(Comparison(setup, ("ppsd",), kind=KINDS["processes"], rounds=1).run())
    helpers, workers = _helpers(), current_pool().pids
    assert len(helpers) == 2, helpers
    for pid in helpers + workers:
        _freeze(pid, frozen)
    behind: dict = {}

    def next_run():
        def visitor_behind():  # a run on the stages in turn: it needs only the start lock
            states = list(Comparison(setup, ("ar",), kind=KINDS["in-process"], rounds=1).run())
            behind["done"], behind["at"] = states[-1].done, time.monotonic()

        waiting = threading.Thread(target=visitor_behind, daemon=True)
        threading.Timer(0.3, waiting.start).start()
        states = list(Comparison(setup, ("ar", "ppsd"), kind=KINDS["processes"], rounds=1).run())
        waiting.join(30.0)
        return states[-1]

    started = time.monotonic()
    state, took = _within(60.0, next_run)
    assert state.done, state
    assert took < 30.0, f"the next run took {took:.1f} s"
    assert behind.get("done") and behind["at"] - started < 30.0, behind
    assert not set(_helpers()) & set(helpers), "the frozen helpers were not replaced"
    assert all(_gone(pid) for pid in helpers + workers), "a frozen process was left running"


def test_a_fork_server_that_freezes_as_a_worker_starts_is_replaced_and_the_start_tried_again(model, config, frozen,
                                                                                             monkeypatch):
    """The fork server stops after the start has looked at it: the start's deadline watch finds
    it, kills it, and the start is tried again on a fresh one."""
    close_all()
    ready_pipeline(model, config, warm_up=warm_up, timeout=TIMEOUT)
    close_all()
    server = _fork_server()
    _freeze(server, frozen)
    spawner = _spawner()
    if spawner is not None:  # the start's first look finds nothing: the fork server stops just after
        real, calls = spawner.replace_frozen, []
        monkeypatch.setattr(spawner, "replace_frozen", lambda: real() if calls or calls.append(1) else None)
    told: list[str] = []
    pipeline, took = _within(60.0, lambda: ready_pipeline(model, config, warm_up=warm_up, timeout=TIMEOUT,
                                                            progress=told.append))
    assert took < 30.0, f"the start took {took:.1f} s"
    assert any("is frozen (stopped), so it was shut down: starting the worker processes again" in line
               for line in told), told
    assert _gone(server) and _fork_server() not in (None, server)
    expected = ppsd.generate(model, PROMPT, DecodeConfig(method="ar", max_new_tokens=8)).token_ids
    assert ppsd.generate(model, PROMPT, config, executor=pipeline).token_ids == expected


def test_a_fork_server_that_hangs_without_stopping_meets_the_start_deadline(model, config, frozen, monkeypatch):
    """A fork server that does not answer but is not seen stopped (hung) is known by the start's
    deadline alone."""
    from ppsd.executors.distributed import processes

    close_all()
    ready_pipeline(model, config, warm_up=warm_up, timeout=TIMEOUT)
    close_all()
    server = _fork_server()
    if _spawner() is not None:
        monkeypatch.setattr(_spawner(), "frozen", lambda: None)  # its process state is not looked at
    monkeypatch.setattr(processes, "FORK_SECONDS", 2.0, raising=False)
    _freeze(server, frozen)
    told: list[str] = []
    pipeline, took = _within(60.0, lambda: ready_pipeline(model, config, warm_up=warm_up, timeout=TIMEOUT,
                                                            progress=told.append))
    assert took < 30.0, f"the start took {took:.1f} s"
    assert any("did not start a worker process within 2 s, so it was shut down" in line for line in told), told
    assert pipeline.alive and _gone(server)


def test_a_worker_frozen_while_it_loads_ends_the_start_in_one_sentence(model, config, frozen, monkeypatch):
    """A worker stopped before it has loaded its stage used to hold the start for the whole
    start-up timeout (300 s)."""
    import multiprocessing.context

    close_all()
    started = multiprocessing.context.ForkServerProcess.start

    def start_and_freeze(self):
        started(self)
        _freeze(self.pid, frozen)

    monkeypatch.setattr(multiprocessing.context.ForkServerProcess, "start", start_and_freeze)
    with pytest.raises(ValueError) as refused:
        _within(60.0, lambda: ready_pipeline(model, config, warm_up=warm_up, timeout=TIMEOUT))
    assert "is frozen (stopped) while the workers load" in str(refused.value)
    assert str(refused.value).count(". ") == 0, refused.value
    monkeypatch.undo()
    close_all()
    assert all(_gone(pid) for pid in frozen)
