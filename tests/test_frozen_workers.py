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
