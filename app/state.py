"""What one server shares across its visitors: the loaded models, the line for the device, and
each session's Stop, in one object that the entry point builds and hands to the page
(`create_demo(state)`), which hands it to every handler. Nothing here is made at import, so a
test or a second page builds its own and no two share by accident.

The environment (PPSD_MODELS, PPSD_HEADS, PPSD_PROXY_HOPS, SPACE_ID, SPACES_ZERO_GPU) is read only by `AppState.from_environment`, when called.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable

import ppsd
from ppsd.executors.host import on_zerogpu

from . import lease
from .server.line import DeviceLine, StopRegistry
from .models import ModelCache
from .request import MAX_RUN_SECONDS, SHARED_RUN_SECONDS, RunRequest
from .server.sessions import SESSION_IDLE_SECONDS, Listeners
from .server.visitors import proxy_hops_from_environment
from .zerogpu import on_import_thread

QUEUE_SIZE = 16  # runs that may wait for the device; one more is told the demo is busy
# The pace a run's turn is sized at (`AppState.turn_seconds`), a token of any method, slow on
# purpose so that a default Run fits its turn on a loaded machine. On a CPU: a default Run (640
# tokens: 3 rounds of AR, PPSD and plain AR at 64 tokens on 2 worker processes, plain AR timed two
# ways in the first) took 56-90 s on a 2-core machine at load 2.5-10 (measured, issue 49):
# 90 s / 640. On a GPU: `app.lease`'s token with the stages in turn, the slowest way there.
CPU_TURN_TOKEN_SECONDS = 90 / 640
TURN_MARGIN = 1.5  # a turn is this much longer than the run needs at that pace


# What a first Run asks for, its stages at once (its prompt, which the turn does not count, any text).
DEFAULT_RUN = RunRequest(prompt="a first Run", workers=True).checked()


def decoded_tokens(run: RunRequest) -> int:
    """The tokens `run` decodes: every method of every timed round, plain AR too when the stages
    run at once (timed two ways in the first round). ValueError when `run` does not check out."""
    run = run.checked()
    return run.config.max_new_tokens * (run.rounds * (len(run.methods) + run.workers) + run.workers)


def allowed_models() -> tuple[str, ...] | None:
    """Which model names the page may load: PPSD_MODELS, comma-separated, or "*" for any name a
    visitor types. Unset: any, except on a Hugging Face Space (SPACE_ID is set), where only the
    default model loads unless the owner sets PPSD_MODELS."""
    return _allowed("PPSD_MODELS", (ppsd.DEFAULT_MODEL,))


def allowed_heads() -> tuple[str, ...] | None:
    """Which exit-head directories the page may load, besides the shipped and the shared heads
    (always offered): PPSD_HEADS, comma-separated, or "*" for any. Unset: any, except on a
    Space, where none does unless the owner sets PPSD_HEADS."""
    return _allowed("PPSD_HEADS", ())


def _allowed(variable: str, on_a_space: tuple[str, ...]) -> tuple[str, ...] | None:
    setting = os.environ.get(variable, "").strip()
    if setting == "*" or (not setting and not os.environ.get("SPACE_ID")):
        return None
    names = tuple(n.strip() for n in setting.split(",") if n.strip())
    return names or on_a_space


@dataclass(frozen=True)
class AppState:
    """A server's shared state. The defaults: any model name loads, QUEUE_SIZE runs may wait."""

    cache: ModelCache = field(default_factory=ModelCache)  # every visitor shares the loaded models
    line: DeviceLine = field(default_factory=lambda: DeviceLine(QUEUE_SIZE))  # one decode at a time
    stops: StopRegistry = field(default_factory=StopRegistry)  # session -> its running comparisons' Stops
    run_seconds: float = MAX_RUN_SECONDS  # how long one comparison may hold the device
    shared_seconds: float = SHARED_RUN_SECONDS  # the shortest turn while another visitor waits (`turn_seconds`)
    proxy_hops: int = 0  # proxies in front that append to X-Forwarded-For (`app.server.visitors.visitor`)
    session_seconds: float = SESSION_IDLE_SECONDS  # a visitor's session unused this long is forgotten (`app.server.sessions`)
    listeners: Listeners = field(default_factory=Listeners)  # sessions with an event stream open (`app.server.guard`)
    turn_token_seconds: float | None = None  # the pace turns are sized at; None: by device (CPU_TURN_TOKEN_SECONDS)

    def turn_seconds(self, run: RunRequest, device: str) -> float:
        """How long `run` may hold the device while another visitor waits: what its tokens need
        at a slow pace for `device` (`TURN_MARGIN` over it), never less than `shared_seconds` and
        never more than a default Run's, so that a default Run is never cut by the turn and no
        larger one holds a newcomer longer than a default Run would."""
        pace = self.turn_token_seconds
        if pace is None:
            pace = lease.EAGER_TOKEN_SECONDS if device.startswith("cuda") else CPU_TURN_TOKEN_SECONDS
        most = decoded_tokens(DEFAULT_RUN)
        try:
            tokens = min(decoded_tokens(run), most)
        except (TypeError, ValueError, OverflowError):  # refused in words by the run itself
            tokens = most
        return max(self.shared_seconds, math.ceil(TURN_MARGIN * pace * tokens))

    def gpu_lease(self) -> Callable[[int, RunRequest], int]:
        """The GPU seconds a Run asks ZeroGPU for (`app.lease.duration`), from its request: what
        the call's `spaces.GPU` asks, what the page says before Run and what cuts the run."""
        return lease.duration(self.run_seconds, lease.counter(self.cache.find))

    @classmethod
    def from_environment(cls) -> AppState:
        """The state a deployed server runs with: the models and heads PPSD_MODELS, PPSD_HEADS and
        SPACE_ID allow; on ZeroGPU (SPACES_ZERO_GPU), models load on the thread that imported
        `spaces` and warm up in the GPU call that decodes, not in the main process."""
        zerogpu = on_zerogpu()
        # On ZeroGPU a model loads on the thread that imported `spaces`, where `.to("cuda")` is emulated.
        loader = on_import_thread(ppsd.load_model) if zerogpu else ppsd.load_model
        return cls(cache=ModelCache(allowed=allowed_models(), allowed_heads=allowed_heads(), warm=not zerogpu,
                                    loader=loader),
                   proxy_hops=proxy_hops_from_environment())
