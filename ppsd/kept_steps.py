"""Compiled steps kept whole, so that a restart loads them instead of tracing the model again.

torch's own caches (`ppsd.compile_cache`) keep what Inductor builds, but not dynamo's trace of
the Python that builds the graph: with them a restart still traced every (stage, bucket,
drafting, thread count) step of the captured steps anew, 2-8 s each, 43 s before the page's
captured steps were ready (issue 50). Here each such step is compiled ahead of time
(`torch.compile(...).aot_compile`) and saved as one file in the compile cache's folder, which a
new process loads in a fraction of a second.

A loaded step runs without dynamo's guards (torch's check of them fails on the buffers' autograd
keys, which differ between the process that compiled and one that loads), so everything a guard
would check is in the file's key instead: the step's constant arguments, the torch threads, the
holder's `shape_key` (its static buffers' sizes, its model's structure and exit head) and the
sha256 of ppsd's own source with torch's and transformers' versions (the code the step traces
through). The folder's record (`compile_cache.record`) covers these files like torch's own, so
a damaged one is compiled again. Where saving or loading fails, the step compiles as before
(`torch.compile`, its guards on) and the reason is said once.

Boundary: one step function's kept files and their keys; where the folder is and its checks are
`compile_cache`'s; which steps run, and on which thread, is the executor's.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from . import compile_cache, quiet
from .model_source import first_line

__all__ = ["KeptSteps", "compiled", "kept", "prune", "source_key"]

_SUFFIX = ".pt2"
_compiled = 0  # steps this process compiled (rather than loaded): `compiled()`


class KeptSteps:
    """`function(holder, *args)`, compiled once per key and kept on disk: `holder` is the object
    whose tensors the step reads (no locks: dynamo pickles what it reads of it), `args` the step's
    constants (stage, bucket, drafting), `shape_key` what else fixes the graph (buffer sizes,
    model structure)."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self._jit = torch.compile(function, fullgraph=True, dynamic=False)
        self._ready: dict[tuple, Callable[..., Any]] = {}
        self._fallback = ""  # why steps compile the ordinary way from now on ("": they are kept)

    def __call__(self, holder: Any, *args: Any, shape_key: str) -> Any:
        key = (shape_key, *args, torch.get_num_threads(), torch.is_inference_mode_enabled())
        step = self._ready.get(key)
        if step is None:
            with quiet.compiling():  # a background compile never overlaps timed rounds (`ppsd.quiet`)
                step = self._ready[key] = self._kept(holder, args, key)
        return step(holder, *args)

    def _kept(self, holder: Any, args: tuple, key: tuple) -> Callable[..., Any]:
        """The step for `key`: loaded from its file, else compiled ahead and saved (a file that
        does not load is compiled again), else (compiling ahead failed once) compiled the
        ordinary way."""
        global _compiled
        if self._fallback:
            _compiled += 1
            return self._jit
        path = compile_cache.use() / compile_cache.STEPS / f"{_prefix()}{_digest(repr((source_key(), key)))}{_SUFFIX}"
        if path.exists():
            try:
                return _load(path)
            except Exception as error:  # noqa: BLE001 - a file torch cannot read back: compile it again
                _say(f"The kept step {path.name} does not load ({first_line(error)}); compiling it again")
                path.unlink(missing_ok=True)
        _compiled += 1
        try:
            return _save(self._jit.aot_compile(((holder, *args), {})), path)
        except Exception as error:  # noqa: BLE001 - an experimental torch API: the ordinary compile still works
            self._fallback = first_line(error)
            _say(f"Compiled steps are not kept whole ({type(error).__name__}: {self._fallback}); they compile as before")
            return self._jit


def compiled() -> int:
    """How many steps this process compiled rather than loaded: a build that compiled none loaded."""
    return _compiled


def kept() -> bool:
    """Are steps compiled by this very code kept here, so that a build loads rather than compiles?"""
    return any((compile_cache.folder() / compile_cache.STEPS).glob(f"{_prefix()}*{_SUFFIX}"))


def prune() -> None:
    """Delete the kept steps of other versions of ppsd's source (3 MB a step, never loaded again);
    called just before `compile_cache.record` lists the folder's files anew."""
    for path in (compile_cache.folder() / compile_cache.STEPS).glob(f"*{_SUFFIX}"):
        if not path.name.startswith(_prefix()):
            path.unlink(missing_ok=True)


def _prefix() -> str:
    """Every file name starts with its source's key: which code compiled it shows in the name."""
    return f"{source_key()[:16]}-"


def _load(path: Path) -> Callable[..., Any]:
    with path.open("rb") as file:
        step = torch.compiler.load_compiled_function(file)
    step.disable_guard_check()  # what the guards check is the file's key (the module's docstring)
    return step


def _save(step: Any, path: Path) -> Callable[..., Any]:
    """`step` written whole (a temporary file renamed), then returned."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.part")
    step.save_compiled_function(str(staging))
    staging.replace(path)
    return step


@functools.lru_cache(maxsize=1)
def source_key() -> str:
    """What a kept step was traced through: ppsd's source, torch's and transformers' versions."""
    import transformers

    digest = hashlib.sha256(f"{torch.__version__}|{transformers.__version__}".encode())
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
