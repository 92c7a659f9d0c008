"""The exit heads this repository ships (`assets/heads/`): `default_exit_layer` and
`choose_exit_head` are how every entry point picks E and a head when none is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..assets import ASSETS
from ..config import balanced_exit_layer, max_stages
from ..model import StagedModel
from .exits import TRAINED_HEAD_TYPES, shared_head
from .files import CONFIG_FILE, HeadConfig, fingerprint, fingerprint_matches, load_exit_head

SHIPPED_HEADS = ASSETS / "heads"
AUTO_HEAD, SHARED_HEAD = "auto", "shared"


def pipeline_stages(num_layers: int, exit_layer: int) -> int:
    """The K a head at E serves when its config does not say: the one whose balanced E is nearest."""
    return max(2, min(round(num_layers / exit_layer), num_layers - exit_layer + 1))


def _shipped(root: Path) -> list[tuple[Path, HeadConfig]]:
    """Every head directory under `root`, with its config, in name order."""
    if not root.is_dir():
        return []
    return [(d, HeadConfig.read(d)) for d in sorted(p for p in root.iterdir() if (p / CONFIG_FILE).is_file())]


def shipped_exit_layers(model_name: str, root: Path = SHIPPED_HEADS) -> dict[int, int]:
    """{K: E} of the shipped heads made for the model called `model_name` (by name alone, no
    weights read: the E a run with K stages uses by default; the fingerprint is checked at load)."""
    chosen: dict[int, int] = {}
    for _, config in _shipped(root):
        if config.base_model == str(model_name).strip():
            layers = config.base_fingerprint["architecture"]["num_layers"]
            chosen.setdefault(config.stages or pipeline_stages(layers, config.exit_layer), config.exit_layer)
    return chosen


def default_exit_layer(model_name: str, num_layers: int, num_stages: int) -> int:
    """The E a run of `model_name` with K stages uses when none is given: the shipped head's for
    that K (its E was chosen by measured speed), else the balanced L/K."""
    shipped = shipped_exit_layers(model_name).get(num_stages)
    if shipped is None or not 1 <= shipped < num_layers or num_stages > max_stages(num_layers, shipped):
        return balanced_exit_layer(num_layers, num_stages)  # none, or made for a model of other depth
    return shipped


def shipped_head(model: StagedModel, exit_layer: int, root: Path = SHIPPED_HEADS) -> Path | None:
    """The shipped head directory made for `model`'s weights at `exit_layer`, if there is one."""
    current = None
    for directory, config in _shipped(root):
        if config.exit_layer != exit_layer or config.head_type not in TRAINED_HEAD_TYPES:
            continue
        current = current or fingerprint(model)
        if fingerprint_matches(config.base_fingerprint, current):
            return directory
    return None


@dataclass(frozen=True)
class HeadChoice:
    """Which exit head a run uses, and how to say it: `path` is None for the shared head."""

    head: nn.Module
    path: Path | None

    @property
    def label(self) -> str:
        return "shared (the model's own norm + LM head)" if self.path is None else f"trained ({self.path.name})"


def choose_exit_head(model: StagedModel, exit_layer: int, spec: str | None = AUTO_HEAD) -> HeadChoice:
    """The exit head `spec` names: "auto" (or empty) is the shipped head for these weights and E
    when there is one, else the shared head; "shared" is the shared head; anything else is a
    directory written by `train-head` (ValueError when it does not fit, as `load_exit_head`)."""
    spec = (spec or AUTO_HEAD).strip()
    if spec == SHARED_HEAD:
        return HeadChoice(shared_head(model), None)
    path = shipped_head(model, exit_layer) if spec == AUTO_HEAD else Path(spec)
    if path is None:
        return HeadChoice(shared_head(model), None)
    return HeadChoice(load_exit_head(path, model, exit_layer), path)
