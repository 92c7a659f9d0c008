"""Which executor kind a run takes: the kind a name asks for, and for "auto" the fastest PPSD
measured on this machine (on a GPU, the fastest measured on a GPU), with why in words.

Boundary: the rule of "auto" over the registry's facts (`kinds`) and the speeds measured here
(`ppsd.compile_cache.Speed`); what is ready in this process, and the speeds' measuring, are
`ppsd.ready_here`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from .kinds import AUTO, KINDS, ExecutorKind, kind_named

if TYPE_CHECKING:
    from ..compile_cache import Speed

__all__ = ["Choice", "choose", "choose_measured", "concurrent_by_default", "stale"]

# On a GPU "auto" takes the first of these that can run: the fastest PPSD measured on a GPU first
# (docs/benchmarks.md). Only "graphed" has been measured there so far; "stacked" joins this order
# where a device check measures it faster.
GPU_PPSD_ORDER = ("graphed",)


def choose(requested: str, num_stages: int, device: str) -> ExecutorKind:
    """The kind `requested` names, or for "auto": on a GPU the captured steps (CUDA graphs, one
    stream per stage: docs/benchmarks.md); on a CPU worker processes where they can start (no
    compilation before the first run), else threads. A kind asked for by name is returned even
    where it cannot run: its `ready` says why. ValueError for unknown names."""
    if requested != AUTO:
        return kind_named(requested)
    if device.startswith("cuda"):
        return next(KINDS[name] for name in GPU_PPSD_ORDER if KINDS[name].unavailable(device, num_stages) is None)
    processes = KINDS["processes"]
    return processes if processes.unavailable(device, num_stages) is None else KINDS["threads"]


@dataclass(frozen=True)
class Choice:
    """The kind "auto" runs on, and why, in words (after "chosen: ")."""

    kind: ExecutorKind
    why: str


STALE_SECONDS = 24 * 3600.0  # a speed older than this is measured again: the machine's other work changes
STALE_LOAD = 1.0  # nor is one kept that was measured at a load this much above the load now (a core was taken)


def stale(speed: "Speed", load: float | None, now: float) -> str:
    """Why `speed` no longer stands for this machine now ("" when it does): measured with no load
    recorded, more than a day ago, or while the machine was at least `STALE_LOAD` busier than now
    (`load`: the 1-minute load average now; None: not known)."""
    if speed.load is None or speed.at is None:
        return "it was kept with no load recorded"
    if now - speed.at > STALE_SECONDS:
        return "it was measured more than a day ago"
    if load is not None and speed.load - load >= STALE_LOAD:
        return f"it was measured at load {speed.load:.1f}, busier than now ({load:.1f})"
    return ""


def choose_measured(num_stages: int, device: str, ready: tuple[str, ...], speeds: Mapping[str, "Speed"], *,
                    measures: bool = True, load: float | None = None, now: float | None = None) -> Choice:
    """"auto" for PPSD once this machine has measured: on a GPU as `choose`; on a CPU the fastest
    PPSD measured here (`speeds`, `ppsd.compile_cache.Speed` by kind) among the kind that needs no
    compile and the compiled kinds `ready` now. A candidate not measured yet, or whose speed is
    `stale` at `load` (the load average now) and `now`, is taken first where a run `measures`
    (the page's): that run measures it. Else (the CLI) the speeds kept are compared, and with
    fewer than two the compiled kind is taken, fastest on a quiet 2-core CPU
    (docs/benchmarks.md). With no compiled kind ready, the kind that needs no compile."""
    default = choose(AUTO, num_stages, device)
    if device.startswith("cuda"):
        return Choice(default, "the fastest PPSD measured on a GPU (docs/benchmarks.md)")
    candidates = [default, *(KINDS[name] for name in ready if name in KINDS and name != default.name
                             and KINDS[name].unavailable(device, num_stages) is None)]
    if len(candidates) == 1:
        pending = [k.compiles for k in KINDS.values()
                   if k.compiles_on(device) and k.unavailable(device, num_stages) is None]
        return Choice(default, "it needs no compile" + (f" ({pending[0]} are not compiled yet)" if pending else ""))
    now = time.time() if now is None else now
    why_stale = {k.name: stale(speeds[k.name], load, now) for k in candidates if k.name in speeds}
    untried = [kind for kind in candidates if kind.name not in speeds or why_stale[kind.name]]
    if untried and measures:
        kind = untried[-1]
        if kind.name not in speeds:
            return Choice(kind, "not measured on this machine yet: this run measures it")
        return Choice(kind, f"its speed kept here ({speeds[kind.name].tokens_per_second:.1f} tokens/s) is stale: "
                            f"{why_stale[kind.name]}; this run measures it again")
    measured = [kind for kind in candidates if kind.name in speeds]
    if len(measured) < 2:  # nothing to compare: the compiled kind, measured fastest on a quiet 2-core CPU
        return Choice(candidates[-1], "the fastest PPSD on a quiet 2-core CPU (docs/benchmarks.md); not measured "
                                      "against the others on this machine yet")
    best = max(measured, key=lambda kind: speeds[kind.name].tokens_per_second)
    said = lambda k, unit="": f"{speeds[k.name].tokens_per_second:.1f}{unit}{_at(speeds[k.name])}"  # noqa: E731
    others = ", ".join(f"{said(k)} on the {k.choice.split(',')[0]}" for k in measured if k is not best)
    return Choice(best, f"the fastest PPSD measured on this machine ({said(best, ' tokens/s')}, against {others})")


def _at(speed: "Speed") -> str:
    return "" if speed.load is None else f" at load {speed.load:.1f}"


def concurrent_by_default(num_stages: int, device: str) -> bool:
    """Whether a front end should run the K stages at once by default: on a GPU (worker processes
    or CUDA streams), or where K cores are there for them."""
    from .host import usable_cores  # where workers_unavailable counts them

    return device.startswith("cuda") or usable_cores() >= num_stages
