"""Where the compiled CPU steps are kept: torch's own compile caches (Inductor's FX graph cache and
AOTAutograd's, with the C++ they build) in one folder beside the converted models, so that a
restart loads them instead of compiling again (372 s cold at load 2 against 25.5 s with them, the
model load included: issue 50).

The folder is `$PPSD_CACHE/compiled/torch-<version>-<CPU key>` (`ppsd.model_source.cache_root`),
so it goes wherever the model cache goes and is removed with it; the key is torch's version and
this CPU's identity (architecture, model name, instruction-set flags), so another torch or another
CPU never reads what this one compiled. `use()` points torch there (TORCHINDUCTOR_CACHE_DIR, which
Inductor reads for every cache it keeps) before the first compile in a process. A finished
compile is recorded (`record`: torch, CPU, how long it took, and the size and sha256 of every
file, as the model cache's `ppsd_source.json`); `use()` checks that record first, and a damaged
entry (a file changed or missing) or a foreign one (a record naming another torch or CPU: a copied
folder) is moved aside and compiled again, and says so. An unfinished one (files, no record yet:
a compile cut short, or running in another process now) is used as it is: torch writes each
entry whole, and a restart compiles only what is missing.

The same folder keeps PPSD's tokens/s as this machine last measured them, by model and executor
kind, each with the load it was measured at and when (`Speed`, `speeds`, `note_speed`): what
"auto" on a CPU compares, and measures again when stale (`ppsd.choice.choose_measured`).

Boundary: the folder, its record and its check; what is compiled, and when, is
`ppsd.executors.runtime`'s and the front ends'.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .cache_files import COMPLETE_MARKER, checksums, damage, sealed

__all__ = ["RECORD", "SPEEDS", "STEPS", "Speed", "cpu_identity", "folder", "kept", "last_seconds", "note_speed", "record", "speeds", "use"]

SPEEDS = "ppsd_speeds.json"  # PPSD's tokens/s by model and executor kind, as this machine last measured them
RECORD = COMPLETE_MARKER  # written after a finished compile, with the checksums, as the model cache's
_INDUCTOR = "inductor"  # torch's own cache, inside the folder (the record stays outside it)
STEPS = "steps"  # whole compiled steps (`ppsd.kept_steps`): a restart loads them without tracing
_lock = threading.Lock()
_in_use: Path | None = None  # the folder this process's compiles go to, once `use` has run

Progress = Callable[[str], None]


def cpu_identity() -> str:
    """This CPU as a compiled step depends on it: architecture, model name and flags (Inductor
    picks its vector instructions from them), as a short hash with the architecture in front."""
    name, flags = platform.processor(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine()):
                name = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:  # not Linux: the platform's own words
        pass
    digest = hashlib.sha256(f"{platform.machine()}|{name}|{flags}".encode()).hexdigest()[:12]
    return f"{platform.machine()}-{digest}"


def folder() -> Path:
    """This torch's and this CPU's compile cache under the model cache root."""
    from .model_source import cache_root  # the cache root is defined there, once

    version = torch.__version__.replace("+", "_")
    return cache_root() / "compiled" / f"torch-{version}-{cpu_identity()}"


def _read(place: Path) -> dict | None:
    try:
        data = json.loads((place / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def problem(place: Path) -> str | None:
    """Why the entry in `place` cannot be used as it is, or None (also for an empty one)."""
    data = _read(place)
    if data is None:
        # No record: nothing compiled yet, or a compile not finished (here or in another process
        # now): torch writes each entry whole (a temporary file renamed), so what is there is used.
        return f"its {RECORD} is unreadable" if (place / RECORD).exists() else None
    ours = {"torch": torch.__version__, "cpu": cpu_identity()}
    for key, value in ours.items():
        if data.get(key) != value:
            return f"it was compiled by another {key} ({data.get(key)!r}, not {value!r})"
    return damage(place)  # the record's files, as the model cache checks its own


def use(progress: Progress | None = None) -> Path:
    """Point torch's compile caches at this torch's and CPU's folder, checked first (once per
    process): an entry that cannot be used is moved aside, said to `progress` (else the log),
    and compiled again. Returns the folder."""
    global _in_use
    with _lock:
        place = folder()
        if _in_use == place:
            return place
        why = problem(place)
        if why is not None:
            (progress or _log)(f"The compiled steps kept in {place} cannot be used: {why}. Compiling them again")
            _remove(place)
        (place / _INDUCTOR).mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(place / _INDUCTOR)
        from torch._inductor.utils import clear_caches  # what torch's own temporary_cache_dir does

        clear_caches()  # in-memory caches keyed by the old folder
        _in_use = place
        return place


def kept() -> bool:
    """Are compiled steps kept here for this torch and CPU, and intact?"""
    place = folder()
    return _read(place) is not None and problem(place) is None


def last_seconds() -> float | None:
    """How long the last finished compile here took, in seconds (None: none recorded)."""
    return _recorded_seconds("compile_seconds")


def last_load_seconds() -> float | None:
    """How long the last load of the kept compiled steps took here (a restart's), in seconds
    (None: none recorded): what the page says a restart will take, not a guess (issue 58)."""
    return _recorded_seconds("load_seconds")


def _recorded_seconds(key: str) -> float | None:
    """The record's `key`, read where `record` writes (the folder in use once one is)."""
    seconds = (_read(_in_use or folder()) or {}).get(key)
    return float(seconds) if isinstance(seconds, (int, float)) else None


def record(seconds: float | None = None, *, load_seconds: float | None = None) -> None:
    """After a finished compile: the folder's record, with every file's size and sha256, and how
    long it took (`seconds`; None keeps the recorded one: a later compile of more steps records
    its files again); after a load of the kept steps, how long that took (`load_seconds`, None
    keeps the recorded one)."""
    with _lock:
        place = _in_use or folder()
        before = _read(place) or {}
        if seconds is None:
            seconds = before.get("compile_seconds")
        if load_seconds is None:
            load_seconds = before.get("load_seconds")
        data = {"torch": torch.__version__, "cpu": cpu_identity(), "compile_seconds": seconds,
                "load_seconds": load_seconds,
                "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "written_by": "ppsd.compile_cache",
                "files": {f"{kept}/{name}": sums for kept in (_INDUCTOR, STEPS)
                          for name, sums in checksums(place / kept).items() if not _transient(name)}}
        place.mkdir(parents=True, exist_ok=True)
        staging = place / f".{RECORD}.part"
        staging.write_text(sealed(data), encoding="utf-8")
        staging.replace(place / RECORD)


@dataclass(frozen=True)
class Speed:
    """PPSD's tokens/s on one kind as this machine measured it, with the 1-minute load average
    just before that Run and when it ran (seconds since the epoch); None where a file kept by an
    earlier version recorded neither."""

    tokens_per_second: float
    load: float | None = None
    at: float | None = None


def speeds(model: str) -> dict[str, Speed]:
    """{executor kind: `Speed`} of `model` as last measured on this machine (by the page's Runs):
    what "auto" on a CPU picks the fastest of. Empty when none were, or the file is unreadable."""
    found = _speeds().get(model)
    return {kind: speed for kind, value in found.items() if (speed := _speed(value)) is not None} \
        if isinstance(found, dict) else {}


def _speed(value: object) -> Speed | None:
    number = lambda v: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None  # noqa: E731
    if not isinstance(value, dict):  # an earlier version kept the tokens/s alone
        return None if number(value) is None else Speed(number(value))
    tokens = number(value.get("tokens_per_second"))
    return None if tokens is None else Speed(tokens, number(value.get("load")), number(value.get("at")))


def _speeds() -> dict:
    try:
        data = json.loads((folder() / SPEEDS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def note_speed(model: str, kind: str, tokens_per_second: float, load: float) -> None:
    """Keep PPSD's latest measured tokens/s of `model` on `kind`, measured at `load` (the 1-minute
    load average before the Run), with the time now; a full disk keeps the old ones."""
    with _lock:
        place = folder()
        data = _speeds()
        kept = data.get(model) if isinstance(data.get(model), dict) else {}
        data[model] = kept | {kind: {"tokens_per_second": round(float(tokens_per_second), 3),
                                     "load": round(float(load), 2), "at": round(time.time())}}
        try:
            place.mkdir(parents=True, exist_ok=True)
            staging = place / f".{SPEEDS}.{os.getpid()}.part"
            staging.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
            staging.replace(place / SPEEDS)
        except OSError as error:
            _log(f"cannot keep the measured speeds in {place}: {error.strerror or error}")


def _transient(name: str) -> bool:
    """Files torch writes for a moment (locks, half-written temporaries), not what it keeps."""
    return name.startswith("locks/") or name.endswith((".lock", ".tmp", ".part")) or "/tmp" in name


def _remove(place: Path) -> None:
    """Move `place` aside first (a rename), then delete it: a process still reading it keeps its files."""
    if not place.exists():
        return
    aside = place.with_name(f".{place.name}-old-{os.getpid()}-{time.monotonic_ns()}")
    place.replace(aside)
    shutil.rmtree(aside, ignore_errors=True)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
