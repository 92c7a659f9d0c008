"""A stand-in for Hugging Face's `spaces` package with ZeroGPU's process model, for the tests.

Each call of a generator function wrapped by `GPU(duration=...)`:
- asks `duration(*args)` for its lease, recorded in `LEASES`;
- runs in a daemonic child forked from the calling thread, so it works on a copy of the
  parent's memory and cannot start processes of its own;
- gets its arguments pickled, and sends each item it yields back pickled;
- stops at its next item once its consumer closes it (the real one's `stop_event`);
- raises a worker failure in the parent as `gr.Error` (a `gr.Error` as itself).

It is harsher than the real package in one way: the function runs on the child's main thread,
the copy of the thread that forked, where OpenMP's pool copied from the parent hangs the first
parallel op (the real package runs it on a pool thread). Install it with `install(monkeypatch)`.
"""

from __future__ import annotations

import functools
import multiprocessing
import pickle
import sys
import traceback
import types
from typing import Any, Callable, Iterator

import gradio as gr

_fork = multiprocessing.get_context("fork")
LEASES: list[int] = []  # the duration each call asked for, in order
JOIN_SECONDS = 10.0


def GPU(task: Callable | None = None, *, duration: Any = None) -> Callable:  # noqa: N802 - the package's name
    def wrap(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Iterator[Any]:
            LEASES.append(duration(*args, **kwargs) if callable(duration) else duration)
            payload = pickle.dumps((args, kwargs))  # what crosses the fork is pickled, as on ZeroGPU
            receive, send = _fork.Pipe(duplex=False)
            stop = _fork.Event()
            child = _fork.Process(target=_serve, args=(fn, payload, send, stop), daemon=True, name="zerogpu-call")
            child.start()
            send.close()
            try:
                while True:
                    try:
                        kind, value = receive.recv()
                    except EOFError:
                        raise gr.Error("GPU task aborted", title="ZeroGPU worker error") from None
                    if kind == "end":
                        return
                    if kind == "error":
                        raise value
                    yield value
            finally:
                stop.set()
                child.join(JOIN_SECONDS)
                if child.is_alive():
                    child.kill()
                receive.close()
        return call
    return wrap(task) if callable(task) else wrap


def _serve(fn: Callable[..., Iterator[Any]], payload: bytes, send: Any, stop: Any) -> None:
    """The child: the call's items down the pipe, then "end"; a failure as the parent will raise it."""
    try:
        args, kwargs = pickle.loads(payload)
        items = fn(*args, **kwargs)
        for item in items:
            if stop.is_set():
                items.close()
                break
            send.send(("item", item))
        send.send(("end", None))
    except gr.Error as error:
        send.send(("error", error))
    except BaseException as error:  # noqa: BLE001 - a worker failure, told to the parent as the package does
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        send.send(("error", gr.Error(type(error).__name__, title="ZeroGPU worker error")))
    finally:
        send.close()


def install(monkeypatch) -> types.ModuleType:
    """This stand-in as `spaces`, with ZeroGPU switched on (SPACES_ZERO_GPU), for one test."""
    module = types.ModuleType("spaces")
    module.GPU = GPU
    monkeypatch.setitem(sys.modules, "spaces", module)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    LEASES.clear()
    return module
