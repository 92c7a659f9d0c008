"""The distributed executor: same outputs as the in-process one, call by call; greedy AR, EESD and
PPSD token-identical to in-process AR; a measured, concurrent trace that validates; a killed or
hung worker gives a clear error and leaves no process behind.

Stage 1 runs in this process; workers (stages 2..K) start once per pool (seconds each), so
one K=2 pool serves every test that does not break it; the hang test breaks
it last; a K=3 pool covers a middle stage and the kill test. Nothing here asserts speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import ppsd
from ppsd import DecodeConfig, StagedModel
from ppsd.config import stage_layers
from ppsd.executors import InProcessExecutor
from ppsd.executors.distributed.pipeline import DistributedExecutor
from ppsd.executors.distributed.pool import current_pool, shared_pipeline, workers_unavailable
from ppsd.executors.distributed.processes import close_all
from ppsd.executors.distributed.wire import PipelineBusy, PipelineError, PipelineSpec
from ppsd.trace import Stopwatch

from conftest import tiny_llama

PROMPTS = {"short": [1, 5, 9, 3, 7], "long": list(range(2, 60, 3))}
NEW_TOKENS = 24
TIMEOUT = 5.0  # seconds a call may wait for a worker: the hang test waits this long


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """Workers load weights from a path, as they would a real checkpoint."""
    path = tmp_path_factory.mktemp("tiny-dist")
    tiny_llama().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model(checkpoint) -> StagedModel:
    """The coordinator's copy of the same seeded weights: the in-process reference."""
    return StagedModel(tiny_llama(), name=checkpoint)


@pytest.fixture(scope="module")
def pool(model):
    close_all()  # one pipeline per process: torch.distributed has one default group
    executor = shared_pipeline(model, DecodeConfig(num_stages=2).resolved(model.num_layers), timeout=TIMEOUT)
    yield executor
    executor.close()


class Twin:
    """Forwards every executor call to the reference and the candidate, checks that their
    Outputs agree (logits up to float noise, events apart from times), drives the decoder with
    the candidate's."""

    def __init__(self, reference, candidate) -> None:
        self.reference, self.candidate = reference, candidate
        self.partition, self.device, self.concurrent = candidate.partition, candidate.device, candidate.concurrent
        self.calls = 0

    def begin(self, stopwatch):
        self.reference.begin(stopwatch)
        self.candidate.begin(stopwatch)

    def end(self):
        self.reference.end()
        self.candidate.end()

    def slot(self, feed, *, slot):
        return self._check(self.reference.slot(feed, slot=slot), self.candidate.slot(feed, slot=slot))

    def push(self, feed):
        return self._check(self.reference.push(feed), self.candidate.push(feed))

    def flow(self):
        return self._check(self.reference.flow(), self.candidate.flow())

    def rollback(self, length):
        self.reference.rollback(length)
        self.candidate.rollback(length)

    def _check(self, ref, got):
        self.calls += 1
        untimed = lambda events: [replace(e, start=0.0, end=0.0) for e in events]  # noqa: E731
        assert untimed(got.events) == untimed(ref.events)
        assert got.final_position == ref.final_position
        for a, b in ((ref.exit_logits, got.exit_logits), (ref.final_logits, got.final_logits)):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
        return got


@pytest.mark.parametrize("method", ["ppsd", "eesd", "ar"])
def test_every_call_returns_what_the_in_process_executor_returns(model, pool, method):
    config = DecodeConfig(method=method, max_new_tokens=NEW_TOKENS).resolved(model.num_layers)
    reference = InProcessExecutor(model, pool.partition, Stopwatch())
    twin = Twin(reference, pool)
    result = ppsd.generate(model, PROMPTS["short"], config, executor=twin)
    assert twin.calls > NEW_TOKENS
    if method != "ar":  # the run must exercise both verdicts, so flushes and rollbacks happen
        assert {t.status for t in result.tokens} >= {"accepted", "corrected"}


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
@pytest.mark.parametrize("method", ["ar", "eesd", "ppsd"])
def test_greedy_output_equals_in_process_ar(model, pool, method, prompt):
    expected = ppsd.generate(model, PROMPTS[prompt], DecodeConfig(method="ar", max_new_tokens=NEW_TOKENS))
    result = ppsd.generate(model, PROMPTS[prompt], DecodeConfig(method=method, max_new_tokens=NEW_TOKENS),
                           executor=pool)
    assert result.token_ids == expected.token_ids
    # generate validated the trace: stage order, one piece of work per stage at a time and the
    # restart after a correction all hold on times stamped in K processes on one clock.
    assert result.trace.clock == "measured" and result.trace.concurrent
    assert result.metrics().clock == "measured"
    assert 0.0 <= result.trace.events[0].start < result.measured_wall_seconds  # each run restarts the clock


def test_a_run_pins_this_process_to_stage_1s_cores_and_gives_them_back(model, pool):
    import os

    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    seen = []
    for _ in ppsd.stream(model, PROMPTS["short"], DecodeConfig(method="ppsd", max_new_tokens=4), executor=pool):
        seen.append((os.sched_getaffinity(0), torch.get_num_threads()))
    expected = set(sorted(cores)[: pool.spec.threads_per_worker]) if pool.device == "cpu" else cores
    assert seen and all(s == (expected, pool.spec.threads_per_worker) for s in seen)
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == (cores, threads)  # back after the run
    steps = ppsd.stream(model, PROMPTS["short"], DecodeConfig(method="ppsd", max_new_tokens=40), executor=pool)
    next(steps)
    steps.close()  # a run stopped half-way (Stop) gives them back too
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == (cores, threads)
    result = ppsd.generate(model, PROMPTS["short"], DecodeConfig(method="ppsd", max_new_tokens=NEW_TOKENS),
                           executor=pool)  # and the next run starts clean (its run-ahead work flushed)
    assert result.token_ids == ppsd.generate(model, PROMPTS["short"],
                                             DecodeConfig(method="ar", max_new_tokens=NEW_TOKENS)).token_ids


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a pinned thread and the process differ on 2+ cores")
def test_while_a_run_pins_the_threads_every_thread_still_counts_the_processs_cores(model, pool):
    """A server's other threads (another visitor's Run) ask how many cores there are while a run
    holds the pipeline: the process's, not the 1 core its pinned threads keep to."""
    import threading

    from ppsd.executors.host import process_cores, usable_cores

    cores, before = os.sched_getaffinity(0), usable_cores()
    steps = ppsd.stream(model, PROMPTS["short"], DecodeConfig(method="ppsd", max_new_tokens=40), executor=pool)
    next(steps)
    seen = {}
    other = threading.Thread(target=lambda: seen.update(
        pinned=os.sched_getaffinity(0), cores=process_cores(), usable=usable_cores(),
        refused=workers_unavailable(2, "cpu")))
    other.start()
    other.join()
    steps.close()
    assert len(seen["pinned"]) == pool.spec.threads_per_worker  # the run did pin this other thread
    assert seen["cores"] == cores and seen["usable"] == before and seen["refused"] is None
    assert process_cores() == cores


def test_a_second_run_while_one_holds_the_pipeline_is_refused_and_the_pool_kept(model, pool, monkeypatch):
    """The executor owns its run lock, from `begin` to `end`: callers hold none."""
    monkeypatch.setattr(pool, "spec", replace(pool.spec, timeout=0.2))  # how long a second run waits
    config = DecodeConfig(method="ppsd", max_new_tokens=NEW_TOKENS)
    first = ppsd.stream(model, PROMPTS["short"], config, executor=pool)
    next(first)
    with pytest.raises(PipelineBusy, match="busy with another run: try again in a moment"):
        ppsd.generate(model, PROMPTS["short"], config, executor=pool)
    first.close()  # Stop ends the run, and frees the pipeline for the next
    assert pool.alive
    result = ppsd.generate(model, PROMPTS["short"], config, executor=pool)
    assert result.token_ids == ppsd.generate(model, PROMPTS["short"], replace(config, method="ar")).token_ids


def test_workers_are_reused_while_the_settings_match(model, pool):
    config = DecodeConfig(method="ar", num_stages=2).resolved(model.num_layers)
    assert shared_pipeline(model, config, timeout=TIMEOUT) is pool
    assert pool.alive and all(_running(pid) for pid in pool.pids)


def test_a_workers_interrupt_is_left_to_the_coordinator(model, pool):
    """Ctrl-C reaches every process of the terminal's group: a worker neither dies of it nor
    prints a traceback; the coordinator decides (it shuts the workers down, or they die with it)."""
    os.kill(pool.pids[0], signal.SIGINT)
    time.sleep(0.5)
    assert pool.alive and all(_running(pid) for pid in pool.pids)
    expected = ppsd.generate(model, PROMPTS["short"], DecodeConfig(method="ar", max_new_tokens=NEW_TOKENS))
    result = ppsd.generate(model, PROMPTS["short"], DecodeConfig(method="ppsd", max_new_tokens=NEW_TOKENS),
                           executor=pool)
    assert result.token_ids == expected.token_ids


def test_a_hung_worker_fails_the_call_within_the_timeout_and_is_cleaned_up(model, pool):
    pids = pool.pids
    stream = ppsd.stream(model, PROMPTS["short"], DecodeConfig(max_new_tokens=NEW_TOKENS), executor=pool)
    next(stream)
    os.kill(pids[0], signal.SIGSTOP)  # stage 2, alive but silent: only the timeout can tell
    started = time.monotonic()
    with pytest.raises(PipelineError, match="did not answer within 5 s") as failed:
        list(stream)
    assert ".cc:" not in str(failed.value)  # gloo's source file is no user's business
    assert time.monotonic() - started < TIMEOUT + 5.0
    assert not pool.alive and not any(_running(pid) for pid in pids)
    with pytest.raises(PipelineError, match="not running"):
        pool.flow()


def test_workers_holding_other_weights_are_refused(checkpoint):
    """Workers load from the path; the caller's model in memory must be the same weights (a
    checkpoint rewritten between the two loads would silently break exactness otherwise)."""
    close_all()
    other = StagedModel(tiny_llama(seed=1), name=checkpoint)
    executor = DistributedExecutor(PipelineSpec(model=checkpoint, partition=stage_layers(8, 4, 2)), other)
    with pytest.raises(PipelineError, match="stage 2 loaded other weights"):
        executor.start()
    assert executor.pids and not any(_running(pid) for pid in executor.pids)


def test_three_stages_then_a_killed_worker(checkpoint, model):
    close_all()
    spec = PipelineSpec(model=checkpoint, partition=stage_layers(8, 3, 3), timeout=TIMEOUT)
    with DistributedExecutor(spec, model) as pool:
        config = DecodeConfig(method="ppsd", exit_layer=3, num_stages=3, max_new_tokens=NEW_TOKENS)
        expected = ppsd.generate(model, PROMPTS["long"], replace(config, method="ar"))
        assert ppsd.generate(model, PROMPTS["long"], config, executor=pool).token_ids == expected.token_ids

        pids = pool.pids
        stream = ppsd.stream(model, PROMPTS["long"], config, executor=pool)
        for _ in range(5):
            next(stream)
        os.kill(pids[1], signal.SIGKILL)  # stage 3
        started = time.monotonic()
        with pytest.raises(PipelineError, match=rf"stage 3 \(pid {pids[1]}\) died \(killed by SIGKILL\)"):
            list(stream)
        assert time.monotonic() - started < TIMEOUT  # a death is seen at once, not at the timeout
        assert not any(_running(pid) for pid in pids)


def test_a_worker_that_dies_while_the_pool_idles_is_replaced_by_the_next_caller(model):
    """The next run must not inherit a dead pool: `shared_pipeline` starts fresh workers."""
    close_all()
    config = DecodeConfig(method="ppsd", num_stages=2, max_new_tokens=NEW_TOKENS).resolved(model.num_layers)
    first = shared_pipeline(model, config, timeout=TIMEOUT)
    try:
        pids = first.pids
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30.0  # a loaded machine may take a while to let it die
        while first.alive and time.monotonic() < deadline:
            time.sleep(0.02)  # nothing tells the pool: it finds out when asked
        assert not first.alive and current_pool() is None
        second = shared_pipeline(model, config, timeout=TIMEOUT)
        assert second is not first and second.alive and second.pids != pids
        expected = ppsd.generate(model, PROMPTS["short"], replace(config, method="ar"))
        assert ppsd.generate(model, PROMPTS["short"], config, executor=second).token_ids == expected.token_ids
    finally:
        close_all()


def _unavailable_in_a_daemon(answer) -> None:
    answer.put(workers_unavailable(2, "cpu"))


def test_a_daemonic_process_is_told_it_cannot_start_workers():
    """As a ZeroGPU call runs: a daemonic process may not have children, so say so up front."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    answer = context.Queue()
    child = context.Process(target=_unavailable_in_a_daemon, args=(answer,), daemon=True)
    child.start()
    try:
        assert "daemonic" in answer.get(timeout=60)
    finally:
        child.join(timeout=10)


def test_workers_exit_when_the_coordinator_is_killed(checkpoint):
    """No orphans even when the caller dies without cleaning up (SIGKILL skips atexit)."""
    script = (
        "import sys, time, ppsd\n"
        "from ppsd.executors.distributed.pool import shared_pipeline\n"
        "from conftest import tiny_llama\n"
        "if __name__ == '__main__':\n"
        f"    model = ppsd.StagedModel(tiny_llama(), name={checkpoint!r})\n"
        "    config = ppsd.DecodeConfig(num_stages=3, max_new_tokens=4).resolved(model.num_layers)\n"
        "    pool = shared_pipeline(model, config)\n"
        "    ppsd.generate(model, [1, 2, 3], config, executor=pool)\n"
        "    print('PIDS', *pool.pids, flush=True)\n"
        "    time.sleep(300)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.getcwd()])}
    coordinator = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env)
    try:
        pids = []
        for line in coordinator.stdout:  # other output (a library's, a worker's) may come first
            if line.startswith("PIDS "):
                pids = [int(pid) for pid in line.split()[1:]]
                break
        alive = [_running(pid) for pid in pids]  # while the coordinator lives
    finally:
        coordinator.kill()
        _, errors = coordinator.communicate()
    assert len(pids) == 2, f"the coordinator printed no worker pids; its stderr:\n{errors[-3000:]}"
    assert all(alive)
    deadline = time.monotonic() + 10.0
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in pids)


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (a reaped child no longer exists)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("files, expected", [
    ({}, None),  # no cgroup files: the affinity
    ({"cpu.max": "max 100000\n"}, None),  # v2, no quota
    ({"cpu.max": "150000 100000\n"}, 2),  # v2, 1.5 CPUs of quota: 2 cores may run at once
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # v1, one CPU
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, no quota
])
def test_usable_cores_is_the_affinity_capped_by_a_cgroup_quota(tmp_path, files, expected):
    import os

    from ppsd.executors.host import usable_cores

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = len(os.sched_getaffinity(0))
    assert usable_cores(str(tmp_path)) == (affinity if expected is None else min(affinity, expected))


def test_a_distributed_cli_run_leaves_no_process_behind(saved_model):
    # The forkserver the workers came from is stopped and waited for before the command returns:
    # the moment the command has exited, no process it started is still alive.
    code = ("import sys\n"
            "from multiprocessing import forkserver\n"
            "from ppsd.cli import main\n"
            f"code = main(['generate', '--model', {saved_model!r}, '--prompt', 'hi', '--max-new-tokens', '4',\n"
            "              '--executor', 'processes'])\n"
            "print('FORKSERVER', forkserver._forkserver._forkserver_pid, flush=True)\n"
            "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(next(line for line in done.stdout.splitlines() if line.startswith("FORKSERVER")).split()[1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
