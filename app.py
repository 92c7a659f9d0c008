"""Launch the PPSD demo: `python app.py [--host H] [--port P] [--device auto|cpu|cuda]` (also
GRADIO_SERVER_NAME / GRADIO_SERVER_PORT / PPSD_DEVICE). The composition root: reads arguments and
the environment (also PPSD_MODELS, PPSD_HEADS, SPACE_ID, SPACES_ZERO_GPU, through
`AppState.from_environment`), builds the server's state and hands it to the page."""

from __future__ import annotations

try:
    import spaces  # noqa: F401 - ZeroGPU's guidance: imported before torch (which `app` imports)
except ImportError:  # anywhere but a Space
    pass

import argparse
import atexit
import os
import signal
import sys
import threading
import time

import ppsd
from app import AppState, create_demo, launch_kwargs, zerogpu
from app.runner import READY, prestart
from ppsd.cli import thread_count
from ppsd.executors.background import ticking
from ppsd.model import DEVICE_VARIABLE


TALK_SECONDS = 4.0  # a cold start's terminal is never silent longer than this (issue 50: 5 s at most)


class ColdStart:
    """What the start-up is doing, for the terminal: each step said as it begins (`tell`), and,
    while one lasts, said again with its seconds (`words`, every TALK_SECONDS through `ticking`)."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self.step, self.since = "preparing the page", clock()

    def tell(self, message: str) -> None:
        self.step, self.since = message.rstrip(".… "), self._clock()
        print(f"  {self.step}…", flush=True)

    def words(self) -> str:
        return f"  {self.step}… {self._clock() - self.since:.0f} s"


def _preload(state: AppState, progress=None) -> str:
    """The default model converted, loaded and warmed up, and the worker processes a first Run
    with the defaults needs, started (the captured steps then compile in the background): what
    is ready, in words ("" when the load failed). `progress` hears each step as it begins."""
    try:
        started = prestart(state.cache, ppsd.DEFAULT_MODEL, progress)
    except Exception as error:  # noqa: BLE001 - the thread ends with one line (a full disk, say); Run says it again
        print(f"preloading {ppsd.DEFAULT_MODEL} failed: {error}", file=sys.stderr, flush=True)
        return ""
    return f"{ppsd.DEFAULT_MODEL} loaded" + (f", {started} started" if started else "")


def _load_for_zerogpu(state: AppState) -> str:
    """ZeroGPU's documented pattern: the default model loaded at start-up, on this thread (the one
    that imported `spaces`), and every GPU call reusing it. What is ready, in words; a load that
    fails (a full disk, say) is one line, and the page comes up anyway: a Run loads the model
    again and says why it cannot, in words."""
    try:
        state.cache.get(ppsd.DEFAULT_MODEL)
    except Exception as error:  # noqa: BLE001 - one line, as the preload's; the page still serves
        print(f"loading {ppsd.DEFAULT_MODEL} failed: {error}", file=sys.stderr, flush=True)
        return "no model loaded yet"
    return f"{ppsd.DEFAULT_MODEL} loaded"


def _print(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="CPU threads for torch (default: torch's choice; 1 helps on busy shared CPUs)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=os.environ.get(DEVICE_VARIABLE) or "auto",
                        help="where models load (default auto: a GPU when there is one; a Space leaves it so). "
                             "cpu keeps them on the CPU, also under ZeroGPU's emulated CUDA (its tests)")
    args = parser.parse_args(argv)
    os.environ[DEVICE_VARIABLE] = args.device  # what "auto" means for every model this process loads
    zerogpu.prepare_main_process()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    # A container (a Space) stops with SIGTERM: exit as on Ctrl-C, so the worker pipelines are
    # closed in order at exit instead of finding their coordinator gone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Started from a background job, a process inherits SIGINT ignored: Ctrl-C must still stop it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        state = AppState.from_environment()
    except ValueError as error:  # a setting such as PPSD_PROXY_HOPS=abc: one line, no traceback
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    ready: list[str] = [_load_for_zerogpu(state)] if zerogpu.active() else []
    preload, cold = None, ColdStart()
    if not zerogpu.active() and state.cache.offers(ppsd.DEFAULT_MODEL):
        # A cold start's first Run waited ~40 s for the conversion, load and warm-up (tools/research/cold_start.py),
        # and 10 s more for the worker processes: done once, now, while the page comes up; a Run
        # meanwhile waits for it, with its progress shown.
        preload = threading.Thread(target=lambda: ready.append(_preload(state, cold.tell)), name="preload", daemon=True)
        print(f"Starting the PPSD demo: preparing {ppsd.DEFAULT_MODEL} and its worker processes…", flush=True)
    with ticking(_print if preload is not None else None, cold.words, TALK_SECONDS):
        if preload is not None:
            preload.start()
            print("  Building the page meanwhile…", flush=True)  # the ticks follow the preload's steps
        demo = create_demo(state)
        # Quiet: the one line below says where and when the page is ready, and with what.
        demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True, quiet=True,
                    **launch_kwargs())
        try:
            while preload is not None and preload.is_alive():
                preload.join(0.5)  # in slices: Ctrl-C meanwhile ends the server as it does after
        except KeyboardInterrupt:
            demo.close()
            return
    model = (ready or [""])[0] or "no model loaded yet"
    print(f"PPSD demo ready at {demo.local_url} ({model})", flush=True)
    if not zerogpu.active():
        demo.block_thread()  # until Ctrl-C, which closes the server
        return
    # This thread imported `spaces`, and only here is `.to("cuda")` emulated: it serves the
    # page's model loads (Load, a Run naming an unloaded model) for as long as the page is up.
    try:
        zerogpu.serve_import_thread()
    finally:
        demo.close()


def leave(code: int) -> None:
    """Exit with `code`. With a background compile still inside torch, the interpreter's teardown
    can crash under it (a segfault seen on Ctrl-C mid-compile), so the exit handlers run (the
    worker pipelines close in order) and the process ends without that teardown."""
    if not READY.compiling():
        sys.exit(code)
    atexit._run_exitfuncs()
    _end_children()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _end_children() -> None:
    """End what the exit handlers did not: a process the compile started after they ran (seen
    once in a full suite run: two children left 10 s after a Ctrl-C mid-compile). The worker
    pipelines were closed in order by then, so what is left is a straggler."""
    import psutil  # accelerate's dependency, so always installed with the page

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:  # gone meanwhile
            pass


if __name__ == "__main__":
    try:
        main()
    except SystemExit as stopping:  # SIGTERM, or a refusal of the command line
        if not READY.compiling():
            raise
        if isinstance(stopping.code, str):
            print(stopping.code, file=sys.stderr)
        leave(stopping.code if isinstance(stopping.code, int) else 1 if stopping.code else 0)
    leave(0)
