"""The page under the real `spaces` package in its ZeroGPU mode, on this CPU, for the tests.

`DeviceAPI` is a fake ZeroGPU device API on 127.0.0.1 (`/startup-report`, `/schedule`,
`/allow`, `/release`): it grants every call, answering `idle: true` from the second on so that
the package reuses its forked worker, logs the duration each call asks for, and refuses (HTTP
429, with what is left and the wait) when `quota_left` is set and the request exceeds it.

`serve(...)` starts `python tests/zerogpu_real.py ARGS` in a subprocess (the mode is read once, at
import, and patches torch for the whole process), with ZeroGPU's environment. Run so, this module
patches only what torch's CPU build lacks before `import spaces` (`torch.version.cuda`, a
`torch._C._cuda_init` that raises, a module-level `torch.cuda._is_in_bad_fork`), stubs the
worker's `init` and `move` (no card to start or move tensors to), then runs `app.py` with ARGS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parent.parent
START_SECONDS = 240.0  # the server's start: the default model's load included


class DeviceAPI:
    """A fake ZeroGPU device API on 127.0.0.1; `durations` logs each /schedule's durationSeconds."""

    def __init__(self) -> None:
        self.durations: list[int] = []
        self.schedules = 0
        self.quota_left: int | None = None  # set: a request above it is refused (429)
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/schedule":
                    api.schedule(self, query)
                else:  # /startup-report, /allow, /release
                    self._send(200, {})

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._handler = Handler
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="device-api").start()

    def schedule(self, handler, query: dict[str, str]) -> None:
        seconds = int(query.get("durationSeconds", 0))
        self.durations.append(seconds)
        if self.quota_left is not None and seconds > self.quota_left:
            handler._send(429, {"left": self.quota_left, "wait": 300})
            return
        self.schedules += 1
        handler._send(200, {"idle": self.schedules > 1, "nvidiaIndex": 0, "nvidiaUUID": "GPU-fake",
                            "allowToken": f"token-{self.schedules}"})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def serve(api: DeviceAPI, port: int, tmp: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`app.py ARGS` under the real package in ZeroGPU mode on `port`: its address once it answers;
    stopped (SIGTERM, then killed) afterwards, also on failure. Its log goes to `tmp`/server.log."""
    environment = {**os.environ, "SPACES_ZERO_GPU": "true", "SPACES_ZERO_DEVICE_API_URL": api.url,
                   "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                   "ZEROGPU_OFFLOAD_DIR": str(tmp / "offload"), "HOME": os.environ.get("HOME", str(tmp)),
                   "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    log = open(tmp / "server.log", "wb")
    process = subprocess.Popen([sys.executable, __file__, "--port", str(port), *args], cwd=ROOT,
                               env=environment, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited ({process.returncode}):\n{log_tail(tmp)}")
            try:
                urllib.request.urlopen(url + "config", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not answer in {START_SECONDS:g} s:\n{log_tail(tmp)}")
                time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def log_tail(tmp: Path, chars: int = 4000) -> str:
    return (tmp / "server.log").read_text(errors="replace")[-chars:]


def _not_in_bad_fork() -> bool:
    return False


def _launch() -> None:
    """In the server's process: torch's CPU build given what `spaces` needs, then `app.py`."""
    import torch

    torch.version.cuda = "12.8"  # the package reads it; a CPU build has None

    def no_cuda() -> None:
        raise RuntimeError("no CUDA on this CPU build: the emulation let a CUDA call through")

    torch._C._cuda_init = no_cuda
    torch.cuda._is_in_bad_fork = _not_in_bad_fork  # module-level (the package pickles it to a fork)
    import spaces  # noqa: F401 - the real package, now in its ZeroGPU mode
    import spaces.zero.torch as zero_torch

    zero_torch.init = lambda nvidia_uuid: None  # no card: nothing to start...
    zero_torch.move = lambda callback=None: None  # ...or to move the deferred tensors to
    import runpy

    sys.argv = [str(ROOT / "app.py"), *sys.argv[1:]]
    sys.path.insert(0, str(ROOT))
    runpy.run_path(str(ROOT / "app.py"), run_name="__main__")


if __name__ == "__main__":
    _launch()
