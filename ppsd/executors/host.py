"""What this host gives the process: the cores it may use (its affinity, not a pinned thread's,
capped by a container's CPU quota) and whether it is a Hugging Face ZeroGPU Space. Read when
asked; nothing here starts, pins or decodes (a pipeline run that pins threads says so through
`pinning` and `unpinned`).
"""

from __future__ import annotations

import math
import os
import threading


def on_zerogpu() -> bool:
    """Is this a Hugging Face ZeroGPU Space? (SPACES_ZERO_GPU, read as the `spaces` package reads
    it: the package is installed on every Space, with or without ZeroGPU.)"""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


_pins = threading.Lock()
_pinned: list[set[int]] = []  # while runs pin this process's threads: the cores it had


def pinning(cores: set[int]) -> None:
    """A run is about to pin every thread of this process; `cores` are what the process had."""
    with _pins:
        _pinned.append(cores)


def unpinned(cores: set[int]) -> None:
    """The run that was given `cores` to `pinning` has given them back to every thread."""
    with _pins:
        _pinned.remove(cores)


def process_cores() -> set[int]:
    """The cores this process was given. `sched_getaffinity(0)` is the calling thread's, and while
    a run pins every thread to stage 1's core it says 1, on every thread of a server: the cores
    from before the pinning are what the process has."""
    with _pins:
        if _pinned:
            return set(_pinned[0])
    return os.sched_getaffinity(0)


def usable_cores(cgroup: str = "/sys/fs/cgroup") -> int:
    """CPU cores this process may really use: its affinity (`process_cores`, not a pinned
    thread's), capped by a cgroup CPU quota (a container on a big host sees every core but may be
    given two)."""
    cores = len(process_cores())
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            with open(os.path.join(cgroup, quota_file)) as f:
                fields = f.read().split()
            if period_file is not None:
                with open(os.path.join(cgroup, period_file)) as f:
                    fields.append(f.read().strip())
            quota, period = fields[0], float(fields[1])
        except (OSError, IndexError, ValueError):
            continue
        if quota not in ("max", "-1") and period > 0:
            return max(1, min(cores, math.ceil(float(quota) / period)))
        return cores
    return cores
