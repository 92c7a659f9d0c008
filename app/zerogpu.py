"""Hugging Face ZeroGPU: how the page's device work becomes a GPU call, and what crosses the fork.

On a ZeroGPU Space each call of a function wrapped by `spaces.GPU` runs in a child process forked
from the server's main process. The child is daemonic (it cannot start worker processes), its
memory is a copy (a model it loads, or a Stop set in the parent, is not seen across the fork)
and what it returns or yields is pickled back. So, on ZeroGPU:

- the main process loads models (at start-up, and on Load) and never decodes: it keeps torch to
  one CPU thread (`prepare_main_process`), and the call finds the model in its copy;
- the call decodes on a thread started for it (`on_fresh_thread`), with torch on every core the
  call has: a child forked after its
  parent used torch's CPU threads hangs in its first parallel op on the thread that forked
  (libgomp's pool of the parent's thread, copied without its threads; measured: 0 % CPU, for
  ever) and runs at full speed on any other thread;
- a run's Stop crosses as a slot number (`app.line.StopFlag`), and the pipeline kind is chosen
  inside the call, where it runs (`app.runner`).

`spaces` is imported here only, and by `app.py` first of all, before torch, as its guidance asks.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, Callable, Iterator

from ppsd.executors.placement import usable_cores
from ppsd.executors.pool import on_zerogpu as active  # the library's workers ask the same

_END = object()


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


def gpu_call(fn: Callable[..., Iterator[Any]], duration: Callable[..., int]) -> Callable[..., Iterator[Any]]:
    """The generator function `fn` as a GPU call: `spaces.GPU`, its lease sized per call by
    `duration(*args)`, where the package is installed (else `fn` as is, in this process). The
    body runs on a thread of its own (`on_fresh_thread`), whoever forked the process it runs in."""
    spaces = import_spaces()
    if spaces is None:
        return fn
    return spaces.GPU(duration=duration)(on_fresh_thread(fn))


def _take_the_cores() -> None:
    """In a ZeroGPU call: torch on every core the call has, where the main process, whose
    setting the fork copied, keeps one."""
    if active():
        import torch  # noqa: PLC0415

        torch.set_num_threads(usable_cores())


def on_fresh_thread(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """The generator function `fn`, created, advanced and closed on one thread started for each
    call, and so on a thread whose OpenMP pool is this process's own."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with ThreadPoolExecutor(1, thread_name_prefix="gpu-call", initializer=_take_the_cores) as thread:
            items = thread.submit(fn, *args, **kwargs).result()
            try:
                while (item := thread.submit(next, items, _END).result()) is not _END:
                    yield item
            finally:  # the consumer left (Stop, a closed page): the generator ends on its thread
                thread.submit(items.close).result()

    return wrapped
