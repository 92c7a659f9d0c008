"""Hugging Face ZeroGPU: how the page's device work becomes a GPU call, and what crosses its fork.

What the real `spaces` package (0.51) does, and what the page does about it:

- **Each call runs in a worker forked from the server**: daemonic (it cannot start worker
  processes), its memory a copy (a model it loads, or a Stop set in the parent, is not seen across
  the fork), what it yields pickled back. A Stop crosses as a slot number (`app.server.line.StopFlag`);
  the pipeline kind is chosen inside the call (`app.runner`).
- **Workers are reused** while the scheduler says the GPU is idle: the next call runs in the same
  worker, whose copy is from its first fork. It keeps what it loaded, warmed and captured (the
  run's executor too, in its copy of the page's `ppsd.choice.ReadyKinds`: `ReadyKinds.ready`); a
  model the server loaded later is not in it, so the call loads what it lacks
  (`app.handlers.on_decode`).
- **CUDA emulation is thread-local**: `import spaces` (here, and first of all in `app.py`) makes
  `.to("cuda")` give deferred tensors on the importing thread only, so the server's loads run
  there (`on_import_thread`, served by `serve_import_thread` once the page is up).
- **Closing a call's generator waits, on Gradio's event loop, for the worker's next item**: the
  call yields a `Heartbeat` at least every `HEARTBEAT_SECONDS` (`on_fresh_thread`), through
  loads, warm-ups and captures too, and the server side drops it (`gpu_call`).
- **A refusal (quota, duration, queue) is a `gr.Error` from the package**: it reaches the page as
  its words and what to do (`refusal`).
- **OpenMP across the fork**: a child forked after its parent used torch's CPU threads hangs in
  its first parallel op on the thread that forked (libgomp's pool, copied without its threads;
  measured: 0 % CPU, for ever) and runs at full speed on any other. So the main process keeps
  torch to one CPU thread (`prepare_main_process`) and the call decodes on a thread started for
  it, with torch on every core the call has (`on_fresh_thread`).

`spaces` is imported here only (and by `app.py` first of all, before torch, as its guidance asks).
"""

from __future__ import annotations

import functools
import os
import queue
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterator, TypeVar

from ppsd.executors.host import on_zerogpu as active, usable_cores  # the library's workers ask the same

from .lease import advice

HEARTBEAT_SECONDS = 0.5  # a call never goes longer without an item: closing it waits for the next one
_END = object()
T = TypeVar("T")


def leases_gpu(device: str) -> bool:
    """Whether a run decoding on `device` here holds a GPU lease it can outlast: on ZeroGPU, on its
    GPU. A model kept on the CPU (`--device cpu`, as the tests serve the page under the package)
    is not timed by a lease sized for a GPU."""
    return active() and device.startswith("cuda")


@dataclass(frozen=True)
class Heartbeat:
    """An item a GPU call yields when its work has yielded nothing for `HEARTBEAT_SECONDS`; the
    server side drops it, so the page never sees one."""


HEARTBEAT = Heartbeat()


def import_spaces() -> ModuleType | None:
    """The `spaces` package, or None where it is not installed (anywhere but a Space)."""
    try:
        import spaces  # noqa: PLC0415 - optional, present on Spaces
    except ImportError:
        return None
    return spaces


def prepare_main_process() -> None:
    """On ZeroGPU, before anything else touches torch: `spaces` imported first, and torch kept to
    one CPU thread in the main process, which loads models and forks the calls but decodes none."""
    if not active():
        return
    import_spaces()
    import torch  # noqa: PLC0415 - after spaces

    torch.set_num_threads(1)


# --------------------------------------------------------------------------- the GPU call


def gpu_call(fn: Callable[..., Iterator[Any]], duration: Callable[..., int], *,
             heartbeat: Any = None) -> Callable[..., Iterator[Any]]:
    """The generator function `fn` as a GPU call: `spaces.GPU`, its lease sized per call by
    `duration(*args)`, on ZeroGPU (elsewhere `fn` as is, in this process, `spaces` installed or not). The
    body runs on a thread of its own (`on_fresh_thread`), whoever forked the process it runs in.
    Each of its heartbeats is yielded here as `heartbeat`, an item the page ignores (None: none is
    yielded): Gradio closes a generator (a client that left) only between items, so it never
    waits long to. A refusal by the package becomes a ValueError in words."""
    spaces = import_spaces() if active() else None
    if spaces is None:
        return fn
    call = spaces.GPU(duration=duration)(on_fresh_thread(fn))

    @functools.wraps(fn)
    def decode(*args: Any) -> Iterator[Any]:
        items, started = call(*args), time.perf_counter()
        try:
            for item in items:
                if not isinstance(item, Heartbeat):
                    yield item
                elif heartbeat is not None:
                    yield heartbeat
        except Exception as error:  # noqa: BLE001 - only the package's refusals are reworded
            words = refusal(error, duration(*args))
            if words is None:
                raise
            raise ValueError(words) from None
        finally:
            items.close()  # Stop or a closed page: the worker ends at its next item (a heartbeat at most)
            # For the Space's owner: what a call asked for against what it took (scheduling included),
            # the measurement that can replace the lease's projected set-up (`app.lease`).
            print(f"GPU call: asked {duration(*args)} s, took {time.perf_counter() - started:.1f} s",
                  file=sys.stderr, flush=True)

    return decode


# How the package titles a request it refuses before the call runs (`spaces.zero.client.schedule`).
REFUSALS = ("ZeroGPU quota exceeded", "ZeroGPU illegal duration", "ZeroGPU pending credits exceeded",
            "ZeroGPU queue timeout")


def refusal(error: BaseException, seconds: int) -> str | None:
    """The page's words for a `gr.Error` the package raised instead of running the call: its own
    message, then what this Run asked for and what to do; None for any other error."""
    if getattr(error, "title", None) not in REFUSALS:
        return None
    said = str(getattr(error, "message", "") or error).strip()
    return f"{error.title}: {said} {advice(seconds)}"


def _take_the_cores() -> None:
    """In a ZeroGPU call: torch on every core the call has, where the main process, whose
    setting the fork copied, keeps one."""
    if active():
        import torch  # noqa: PLC0415

        torch.set_num_threads(usable_cores())


def on_fresh_thread(fn: Callable[..., Iterator[Any]], every: float | None = None) -> Callable[..., Iterator[Any]]:
    """The generator function `fn`, created and advanced on one thread started for each call (a
    thread whose OpenMP pool is this process's own), yielding a `HEARTBEAT` whenever `fn` has
    yielded nothing for `every` seconds (None: `HEARTBEAT_SECONDS`). Closed while `fn` works, it returns at once: `fn` is
    closed on its thread after its current step (the run's own Stop ends that step soon)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Iterator[Any]:
        beat = every or HEARTBEAT_SECONDS
        thread = ThreadPoolExecutor(1, thread_name_prefix="gpu-call", initializer=_take_the_cores)
        items: Iterator[Any] | None = None
        try:
            started = thread.submit(fn, *args, **kwargs)
            items = yield from _beating(started, beat)
            while (item := (yield from _beating(thread.submit(next, items, _END), beat))) is not _END:
                yield item
        finally:  # after the step in flight, never waiting for it here
            if hasattr(items, "close"):
                thread.submit(items.close)
            thread.shutdown(wait=False)

    return wrapped


def _beating(future: Future, every: float) -> Iterator[Heartbeat]:
    """Heartbeats until `future` is done; then its result, as the generator's return value."""
    while True:
        try:
            return future.result(timeout=every)
        except FutureTimeout:
            yield HEARTBEAT


# --------------------------------------------------------------------------- the importing thread


@dataclass
class _ImportThread:
    """The thread that imported `spaces`, serving work handed to it (in the process `pid`)."""

    pid: int
    ident: int
    jobs: queue.SimpleQueue


_serving: _ImportThread | None = None


def on_import_thread(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, run on the thread that imported `spaces` while it serves (`serve_import_thread`),
    the caller waiting for its result: there `.to("cuda")` is emulated, so a model loaded on
    ZeroGPU moves to the card when a call starts. Anywhere else (that thread itself, before it
    serves, a forked GPU call, with real CUDA) `fn` runs on the caller's thread."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        serving = _serving
        if serving is None or serving.pid != os.getpid() or serving.ident == threading.get_ident():
            return fn(*args, **kwargs)
        done: Future = Future()
        serving.jobs.put((done, functools.partial(fn, *args, **kwargs)))
        return done.result()

    return run


def serve_import_thread(stop: threading.Event | None = None, poll: float = 0.1) -> None:
    """Serve `on_import_thread`'s work on this thread (the one that imported `spaces`) until
    `stop` is set or interrupted (Ctrl-C, SIGTERM as SystemExit): the entry point's last call."""
    global _serving
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    _serving = _ImportThread(os.getpid(), threading.get_ident(), jobs)
    try:
        while stop is None or not stop.is_set():
            try:
                done, job = jobs.get(timeout=poll)
            except queue.Empty:
                continue
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(job())
                except BaseException as error:  # noqa: BLE001 - the caller's to handle, on its thread
                    done.set_exception(error)
    finally:
        _serving = None
