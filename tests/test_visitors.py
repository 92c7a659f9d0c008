"""Fairness and Stop without a server: who a visitor is (`app.visitors`), a run giving its turn up
while others wait (`DeviceLine.turn`), and a Stop that cannot wait for a blocked run
(`ppsd.stop_guard.StopGuard`). The same through the page is in test_app_e2e."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from types import SimpleNamespace

import pytest

from app.line import DeviceLine, StopRegistry
from ppsd.stop_guard import StopGuard
from app.visitors import proxy_hops_from_environment, visitor


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
    monkeypatch.setenv("PPSD_PROXY_HOPS", "-1")
    with pytest.raises(ValueError, match="PPSD_PROXY_HOPS='-1'"):
        proxy_hops_from_environment()


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
