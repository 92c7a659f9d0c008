"""Fairness and Stop without a server: who a visitor is (`app.server.visitors`), a run giving its turn up
while others wait (`DeviceLine.turn`), and a Stop that cannot wait for a blocked run
(`ppsd.stop_guard.StopGuard`). The same through the page is in test_app_e2e."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from types import SimpleNamespace

import pytest

from app.server.line import DeviceLine, StopRegistry
from app.request import RunRequest
from app.state import DEFAULT_RUN, AppState, decoded_tokens
from ppsd.stop_guard import StopGuard
from app.server.visitors import proxy_hops_from_environment, visitor


def request(peer: str, *forwarded: str) -> SimpleNamespace:
    headers = {"x-forwarded-for": ", ".join(forwarded)} if forwarded else {}
    return SimpleNamespace(client=SimpleNamespace(host=peer), headers=headers)


def test_a_visitor_is_the_peer_locally_whatever_headers_it_sends():
    assert visitor(request("127.0.0.1", "198.51.100.7")) == "127.0.0.1"
    assert visitor(request("192.0.2.4")) == "192.0.2.4"
    assert visitor(None) == "unknown"


def test_behind_a_proxy_a_visitor_is_what_the_proxy_appended_not_what_it_sent():
    proxy = "10.16.3.80"
    assert visitor(request(proxy, "203.0.113.5"), proxy_hops=1) == "203.0.113.5"
    # a script that sends its own header gets the proxy's entry appended after it: still one visitor
    assert visitor(request(proxy, "198.51.100.1, 203.0.113.5"), proxy_hops=1) == "203.0.113.5"
    assert visitor(request(proxy, "198.51.100.2", "203.0.113.5"), proxy_hops=1) == "203.0.113.5"
    assert visitor(request(proxy, "198.51.100.1, 203.0.113.5, 10.0.0.2"), proxy_hops=2) == "203.0.113.5"
    assert visitor(request(proxy), proxy_hops=1) == proxy  # no header: the peer


def test_proxy_hops_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("PPSD_PROXY_HOPS", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert proxy_hops_from_environment() == 0
    monkeypatch.setenv("SPACE_ID", "someone/ppsd")
    assert proxy_hops_from_environment() == 1
    monkeypatch.setenv("PPSD_PROXY_HOPS", "2")
    assert proxy_hops_from_environment() == 2
    for setting in ("-1", "abc", "²", "1.5"):  # "²" passes str.isdigit() and fails int()
        monkeypatch.setenv("PPSD_PROXY_HOPS", setting)
        with pytest.raises(ValueError, match=r"PPSD_PROXY_HOPS=.*: give how many proxies stand in front"):
            proxy_hops_from_environment()


@pytest.mark.parametrize("setting", ["abc", "²"])
def test_a_bad_proxy_hops_setting_stops_the_server_with_one_line(setting):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "app.py"), "--port", "1"], cwd=root, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PPSD_PROXY_HOPS": setting})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"app.py: error: PPSD_PROXY_HOPS={ascii(setting)}: give how many proxies stand in front of the server and "
        "append to X-Forwarded-For, as a whole number (0, 1, ...)"]


def test_a_run_gives_its_turn_up_only_once_its_time_is_over_and_another_visitor_waits():
    line, stops = DeviceLine(16), StopRegistry()
    with ExitStack() as held, stops.running("s") as stop:
        decoding = held.enter_context(line.place("script"))
        with line.turn(decoding, stop, seconds=0.3):
            held.enter_context(line.place("script"))  # its own second run does not cut it short
            time.sleep(0.6)
            assert not stop.is_set()
            held.enter_context(line.place("newcomer"))
            for _ in range(100):
                if stop.is_set():
                    break
                time.sleep(0.02)
            assert stop.is_set() and stop.handed_over
    with stops.running("s") as fresh:  # a later run in the same slot starts unstopped
        assert not fresh.is_set() and not fresh.handed_over


def test_a_turn_within_its_time_is_left_alone():
    line, stops = DeviceLine(16), StopRegistry()
    with ExitStack() as held, stops.running("s") as stop:
        decoding = held.enter_context(line.place("script"))
        with line.turn(decoding, stop, seconds=30.0):
            held.enter_context(line.place("newcomer"))
            time.sleep(0.3)
        assert not stop.is_set()


def test_a_stop_guard_aborts_a_run_that_does_not_reach_its_next_step():
    stop, aborted = threading.Event(), threading.Event()
    with StopGuard(stop, aborted.set, grace=0.2) as guard:
        stop.set()
        assert aborted.wait(5.0) and guard.fired  # blocked (a frozen worker): torn down


def test_a_stop_guard_leaves_alone_a_run_that_ends_or_is_handing_a_snapshot_over():
    stop, aborted = threading.Event(), threading.Event()
    with StopGuard(stop, aborted.set, grace=0.2) as guard:
        with guard.handing():  # the caller holds the run: not the run's time
            stop.set()
            time.sleep(0.5)
    assert not aborted.is_set() and not guard.fired
    with StopGuard(stop, None, grace=0.0) as guard:  # nothing to abort: nothing watches
        time.sleep(0.1)
    assert not guard.fired


def test_a_default_run_fits_its_turn_and_no_larger_run_gets_a_longer_one():
    """A default Run took 56-90 s on a loaded 2-core machine (issue 49), and was cut at 60 s
    whenever another visitor waited; its turn now fits it, and a larger run gets no more."""
    state = AppState()
    default = state.turn_seconds(DEFAULT_RUN, "cpu")
    # The slowest pace measured, 90 s for a 3-round default Run's 640 tokens, with a fifth to spare.
    assert default >= 1.2 * 90 / 640 * decoded_tokens(DEFAULT_RUN)
    largest = RunRequest(prompt="x", max_new_tokens=1024, repeats=9, eesd=True, workers=True)
    assert state.turn_seconds(largest, "cpu") == default
    assert state.turn_seconds(RunRequest(prompt="x", max_new_tokens=8, repeats=1), "cpu") == state.shared_seconds
    assert state.turn_seconds(DEFAULT_RUN, "cuda:0") >= state.shared_seconds
    assert state.turn_seconds(RunRequest(prompt="x", repeats=2.5), "cpu") == default  # refused by the run itself


def test_a_default_run_is_not_cut_when_another_visitor_waits_within_its_turn():
    line, stops = DeviceLine(16), StopRegistry()
    # Scaled down 150 times: a 0.6 s default Run (90 s), the shortest turn 0.4 s (60 s).
    state = AppState(turn_token_seconds=0.6 / 640, shared_seconds=0.4)
    turn = state.turn_seconds(DEFAULT_RUN, "cpu")
    assert turn >= 0.6 * 1.2
    with ExitStack() as held, stops.running("s") as stop:
        decoding = held.enter_context(line.place("script", turn))
        with line.turn(decoding, stop):
            held.enter_context(line.place("newcomer", turn))
            time.sleep(0.6)  # the whole default Run, another visitor waiting all along
            assert not stop.is_set()


def test_a_visitor_told_busy_is_told_how_long_the_line_may_take():
    line = DeviceLine(1)
    with line.place("a", 100.0), line.place("b", 100.0):
        with pytest.raises(ValueError) as refused:
            with line.place("c", 100.0):
                pass
    assert str(refused.value) == ("the demo is busy (one run decoding, 1 waiting, the most it queues): while others "
                                  "wait each run may hold the device for its turn, so the line may take up to 4 min. "
                                  "Please come back in a few minutes (runs often end sooner), or in 4 min at the "
                                  "latest. Meanwhile, \"Open a recorded run\" under Run replays a run "
                                  "recorded earlier, with no wait")


def test_a_waiting_visitor_sees_the_longest_it_may_wait():
    line = DeviceLine(16)
    with line.place("a", 135.0), line.place("b", 60.0), line.place("c", 60.0) as mine:
        assert line.ahead(mine) == 2 and line.longest_wait(mine) == 195.0
