"""One validated description of a decoding run, and the partition of layers into stages.

Only entry points (CLI, app) build it from user input; everything below receives it resolved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

METHODS = ("ar", "eesd", "ppsd")
MAX_NEW_TOKENS_CAP = 1024  # documented in the README; keeps a demo request bounded
MAX_DRAFT_LEN = 64  # EESD's g: beyond it every draft block is longer than a useful answer
SEED_MAX = 2**63 - 1  # torch seeds are signed 64-bit
WHOLE_FIELDS = ("exit_layer", "num_stages", "draft_len", "max_new_tokens", "seed")


def whole_number(name: str, value: object) -> int:
    """`value` as an int when it is a whole number (7, 7.0, "7"), else ValueError naming `name`:
    a form or an API may send any number, and 2.5 layers must not quietly become 2."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number") from None
    if isinstance(value, bool) or not (math.isfinite(number) and number.is_integer()):
        raise ValueError(f"{name}={value!r} is not a whole number")
    return int(number)


def real_number(name: str, value: object) -> float:
    """`value` as a float (ValueError naming `name` when it is not a number; ranges are checked
    by `DecodeConfig.resolved`)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number") from None


@dataclass(frozen=True)
class DecodeConfig:
    """Settings of one run. `exit_layer` None means the model's default: `ppsd.setup.resolve_config`
    gives the shipped head's E when the model has one for K, `resolved` alone the balanced L/K."""

    method: str = "ppsd"
    exit_layer: int | None = None
    num_stages: int = 2
    draft_len: int = 4
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def partition(self, num_layers: int) -> tuple[range, ...]:
        """The layers of each stage of this run (E given, as in a resolved config) on a model of
        `num_layers` layers."""
        if self.exit_layer is None:
            raise ValueError("the exit layer is not set: resolve the config first (ppsd.setup.resolve_config)")
        return stage_layers(num_layers, self.exit_layer, self.num_stages)

    def resolved(self, num_layers: int) -> "DecodeConfig":
        """Check every field against a model with `num_layers` layers and fill the defaults.

        Raises ValueError naming the value and its allowed range.
        """
        for name in WHOLE_FIELDS:
            value = getattr(self, name)
            if not (value is None and name == "exit_layer") and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name}={value!r} is not a whole number")
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is unknown; choose one of: {', '.join(METHODS)}")
        exits, counts = stage_bounds(num_layers)
        if num_layers < 2:
            raise ValueError(f"a model of {num_layers} layer{'s' * (num_layers != 1)} cannot be split into "
                             "pipeline stages: PPSD needs at least 2 layers")
        if self.num_stages not in counts:
            raise ValueError(f"stages K={self.num_stages} is out of range: {counts.start} <= K <= {num_layers} (layers)")
        exit_layer = balanced_exit_layer(num_layers, self.num_stages) if self.exit_layer is None else self.exit_layer
        if exit_layer not in exits:
            raise ValueError(f"exit layer E={exit_layer} is out of range: {exits.start} <= E < {num_layers} (layers)")
        if self.num_stages > max_stages(num_layers, exit_layer):
            raise ValueError(
                f"stages K={self.num_stages} do not fit: the {num_layers - exit_layer} layers after E={exit_layer} "
                f"allow at most K={max_stages(num_layers, exit_layer)}"
            )
        if not 1 <= self.draft_len <= MAX_DRAFT_LEN:
            raise ValueError(f"draft length G={self.draft_len} is out of range: 1 <= G <= {MAX_DRAFT_LEN}")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_CAP:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens} is out of range: 1 <= N <= {MAX_NEW_TOKENS_CAP}"
            )
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ValueError(f"temperature={self.temperature} is out of range: 0 <= T < inf (0 is greedy)")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p} is out of range: 0 < P <= 1")
        if not 0 <= self.seed <= SEED_MAX:
            raise ValueError(f"seed={self.seed} is out of range: 0 <= seed <= 2^63 - 1 ({SEED_MAX})")
        return replace(self, exit_layer=exit_layer, temperature=float(self.temperature), top_p=float(self.top_p))


DEFAULTS = DecodeConfig()  # every entry point's defaults (CLI flags, the page's form and sliders)


def stage_bounds(num_layers: int) -> tuple[range, range]:
    """The values E and K may take, each on its own, on a model of `num_layers` layers: E in
    [1, L - 1] (stage 1 holds a layer and leaves one), K in [2, L]. Together they also need
    K <= max_stages(L, E)."""
    return range(1, num_layers), range(2, num_layers + 1)


def max_stages(num_layers: int, exit_layer: int) -> int:
    """The most stages a split at E allows: stages 2..K need a layer each of the L - E after E."""
    return num_layers - exit_layer + 1


def fit_stages(num_layers: int, exit_layer: int, num_stages: int, *,
               moved: Literal["stages", "exit_layer"] = "stages") -> tuple[int, int]:
    """(E, K) brought inside the bounds, lowering the one that did not move: `moved="stages"`
    puts K inside its bounds, then lowers E until K fits; `moved="exit_layer"` puts E inside its
    bounds, then lowers K. What a form does with a pair that `DecodeConfig.resolved` refuses."""
    exits, counts = stage_bounds(num_layers)
    if moved == "stages":
        num_stages = max(counts.start, min(num_stages, counts.stop - 1))
        return max(exits.start, min(exit_layer, num_layers - num_stages + 1)), num_stages
    exit_layer = max(exits.start, min(exit_layer, exits.stop - 1))
    return exit_layer, max(counts.start, min(num_stages, max_stages(num_layers, exit_layer)))


def balanced_exit_layer(num_layers: int, num_stages: int) -> int:
    """E = L / K rounded, so stage 1 (layers plus exit head) costs about one slot."""
    return min(max(1, round(num_layers / num_stages)), num_layers - 1)


def stage_layers(num_layers: int, exit_layer: int, num_stages: int) -> tuple[range, ...]:
    """Stage 1 is layers [0, E); stages 2..K split [E, L) as evenly as possible (spec: Words)."""
    size, extra = divmod(num_layers - exit_layer, num_stages - 1)  # the first `extra` stages get a layer more
    cuts = [exit_layer + i * size + min(i, extra) for i in range(num_stages)]
    return (range(0, exit_layer), *(range(a, b) for a, b in zip(cuts, cuts[1:])))
