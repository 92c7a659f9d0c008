"""The page under the real `spaces` package (pinned in requirements-dev.txt) in its ZeroGPU mode,
served by `app.py` in a subprocess on this CPU, against a fake device API that answers `idle` from
the second call on, so the package reuses its worker (`tests/zerogpu_real.py`).

With `--device cpu` the models stay on the CPU and the page decodes: the default Run, a second Run
on the reused worker, Load of another model then a Run on it, Stop, and a quota refusal in words.
With the device left as a Space leaves it, CUDA is emulated (nothing can decode on this CPU): a
Load on Gradio's threads gives an emulated-CUDA model, and the default Run's lease is what a Space
would ask for.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Callable

import pytest
from gradio_client import Client

import ppsd
from app import view
from app.request import FORM
from conftest import free_port
from ppsd.model import TINY_MODEL
from ppsd.model_source import default_available

pytest.importorskip("spaces")
import zerogpu_real  # noqa: E402 - after the skip: it serves the page under the package

pytestmark = pytest.mark.skipif(not default_available(), reason="the default model's wheel is not installed")
RUN_SECONDS = 300.0  # the default Run on 2 busy CPU cores, in the worker
WORKER_STARTED = "self.arg_queue._writer.fileno()"  # the package's debug line, once per worker it forks
HEADLINE, STREAM_AR, MESSAGE = (view.OUTPUTS.index(name) for name in ("headline", "stream_ar", "message"))


@pytest.fixture(scope="module")
def api():
    device_api = zerogpu_real.DeviceAPI()
    yield device_api
    device_api.close()


@pytest.fixture(scope="module")
def cpu_page(api, tmp_path_factory):
    """The page in ZeroGPU mode with its models on the CPU, and the log's directory."""
    tmp = tmp_path_factory.mktemp("zerogpu-cpu")
    with zerogpu_real.serve(api, free_port(), tmp, "--device", "cpu", "--threads", "1") as url:
        yield url, tmp


def _answer_seconds(url: str) -> float:
    started = time.monotonic()
    urllib.request.urlopen(url + "config", timeout=30).read()
    return time.monotonic() - started


def _workers_forked(tmp) -> int:
    return zerogpu_real.log_tail(tmp, 10**9).count(WORKER_STARTED)


def _until(job, seen: Callable[[tuple], bool], seconds: float) -> float:
    """Seconds until one of `job`'s outputs is `seen` (AssertionError past `seconds`)."""
    started = time.monotonic()
    while not any(seen(out) for out in job.outputs()):
        assert time.monotonic() - started < seconds and not job.done() or any(seen(o) for o in job.outputs()), \
            [str(o[MESSAGE])[:300] for o in job.outputs()[-2:]]
        time.sleep(0.05)
    return time.monotonic() - started


def _page_defaults(client: Client) -> list:
    """The `run` endpoint's arguments as the page starts (`FORM`'s order)."""
    parameters = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/run"]["parameters"]
    return [parameter["parameter_default"] for parameter in parameters]


def _finished(job, tmp) -> str:
    """The headline of `job`, run to its end, which must not be an error."""
    last = job.result(timeout=RUN_SECONDS)
    assert "run-message-error" not in str(last[MESSAGE]), (last[MESSAGE], zerogpu_real.log_tail(tmp))
    return str(last[HEADLINE])


def test_runs_reuse_the_worker_stop_a_refusal_in_words_and_another_model(api, cpu_page):
    """One visitor, in order (each step needs the one before): the default Run ends with a
    headline and no error; a second Run, on the reused worker, shows its first token within 5 s;
    Stop 4 s into it ends it within 3 s while the server answers another request within 2 s; a
    client that leaves mid-run never stalls the server for 2 s; a
    refusal for quota, in the package's words and what to do; Load of another model, then a Run
    on it, which the reused worker (forked before that Load) loads in the call. One worker is
    forked for all of it."""
    url, tmp = cpu_page
    client = Client(url, verbose=False)  # one session: Stop reaches its run
    assert "than AR" in _finished(client.submit(api_name="/run"), tmp)

    job = client.submit(api_name="/run")
    first_token = _until(job, lambda out: 'class="tok tok-' in str(out[STREAM_AR]), 60)
    time.sleep(max(0.0, 4.0 - first_token))
    answered: list[float] = []
    meanwhile = threading.Thread(target=lambda: answered.append(_answer_seconds(url)), daemon=True)
    client.predict(api_name="/stop")
    meanwhile.start()
    stop_seconds = _until(job, lambda out: "Stopped" in str(out[HEADLINE]) + str(out[MESSAGE]), 30)
    meanwhile.join(30)
    print(f"second Run's first token {first_token:.2f} s; Stop {stop_seconds:.2f} s; "
          f"another request meanwhile {answered} s; leases asked {api.durations}")
    assert first_token < 5.0, f"the second Run's first token took {first_token:.1f} s"
    assert stop_seconds < 3.0, f"Stop took {stop_seconds:.1f} s"
    assert answered and answered[0] < 2.0, f"the server answered in {answered} s"
    job.result(timeout=30)

    # A client that leaves mid-run (Gradio closes the call's generator, on its event loop, which
    # waits for the worker's next item): the server keeps answering, and the worker serves on.
    job = client.submit(api_name="/run")
    _until(job, lambda out: 'class="tok tok-' in str(out[STREAM_AR]), 60)
    time.sleep(3.0)
    job.cancel()
    slowest = max(_answer_seconds(url) for _ in range(20))
    print(f"while a left run's call closed, the slowest of 20 answers took {slowest:.2f} s")
    assert slowest < 2.0, f"the server took {slowest:.1f} s to answer while a call closed"

    api.quota_left = 3
    try:
        last = client.submit(api_name="/run").result(timeout=60)
    finally:
        api.quota_left = None
    words = str(last[MESSAGE])
    assert "ZeroGPU quota exceeded" in words and "sign in" in words and "Max new tokens" in words, words

    status = client.predict(TINY_MODEL, api_name="/load")[0]
    assert "model-ok" in status and "cpu" in status, status
    layers = 8  # ppsd-tiny's: E and K must fit it
    form = _page_defaults(client)
    form[FORM.index("model")], form[FORM.index("exit_layer")] = TINY_MODEL, layers // 2
    headline = _finished(client.submit(*form, api_name="/run"), tmp)
    assert "than AR" in headline
    assert _workers_forked(tmp) == 1, "each call was to reuse the first worker (the API said idle)"
    assert len(api.durations) == 5 and api.durations[0] == api.durations[1]  # the default form, thrice
    took = zerogpu_real.log_tail(tmp, 10**9).count("GPU call: asked ")
    assert took == 5, f"the log says {took} times what a call asked for and took"


@pytest.fixture(scope="module")
def space_page(api, tmp_path_factory):
    """The page in ZeroGPU mode with the device left as a Space leaves it: CUDA emulated."""
    tmp = tmp_path_factory.mktemp("zerogpu-space")
    with zerogpu_real.serve(api, free_port(), tmp, "--threads", "1", env={"PPSD_DEVICE": ""}) as url:
        yield url, tmp


def test_on_a_space_load_works_from_any_thread_and_the_default_run_asks_for_at_most_30_s(api, space_page):
    """CUDA emulation is the importing thread's alone: Load, run on one of Gradio's threads, still
    gives a model on (emulated) CUDA, as the start-up load does. The page's default Run, with a
    Space's defaults (the stages at once, on the captured steps), asks for at most 30 s, which the
    package multiplies by 1.5: two Runs fit an anonymous visitor's 120 s a day. (The Run itself
    cannot decode on this CPU: its worker finds no CUDA.)"""
    url, tmp = space_page
    client = Client(url, verbose=False)
    asked = len(api.durations)
    try:
        client.submit(api_name="/run").result(timeout=120)
    except Exception:  # noqa: BLE001 - the worker's "AssertionError" (no CUDA here): only the lease counts
        pass
    assert len(api.durations) == asked + 1 and api.durations[-1] <= 30, api.durations
    status = client.predict(TINY_MODEL, api_name="/load")[0]
    assert "model-ok" in status and "cuda:0" in status, (status, zerogpu_real.log_tail(tmp))
