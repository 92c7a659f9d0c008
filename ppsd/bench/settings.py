"""The settings of `python -m ppsd bench`: presets, one `Setting` per point, and the sweep that
groups them under their AR baselines. Nothing here runs a model or reads a clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..config import DecodeConfig, balanced_exit_layer

# Presets; flags override each entry. QUICK is a smoke check (its cost is measured in
# docs/benchmarks.md): one prompt, greedy, K = 2 at its default E, 16 tokens, one warm-up and one
# timed round. Like FULL it checks every greedy decoder's tokens against HF generate(); it leaves
# out HF's early exit, each of whose decodes (drafting with the model's own head) took 3 to 6
# times AR's. FULL is the sweep the docs report. Exit layers None: each K's default E. The full
# sweep adds the early and late exits L/4 and 3L/4, where EESD's drafting costs most.
QUICK = {"max_new_tokens": 16, "repeats": 1, "warmup": 1, "stages": (2,), "draft_lens": (4,),
         "temperatures": (0.0,), "exit_fractions": None, "prompts": 1, "hf_early_exit": False}
FULL = {"max_new_tokens": 64, "repeats": 5, "warmup": 2, "stages": (2, 3, 4), "draft_lens": (1, 2, 4),
        "temperatures": (0.0, 0.8), "exit_fractions": (0.25, 0.5, 0.75), "prompts": None, "hf_early_exit": True}


@dataclass(frozen=True)
class Setting:
    """One point of the sweep: a method on the K-stage partition with exit layer E (stage 1 is
    [0, E), stages 2..K split [E, L)). `draft_len` is g for EESD and None otherwise."""

    method: str
    exit_layer: int
    num_stages: int
    temperature: float
    draft_len: int | None = None

    def config(self, max_new_tokens: int, seed: int = 0) -> DecodeConfig:
        return DecodeConfig(method=self.method, exit_layer=self.exit_layer, num_stages=self.num_stages,
                            draft_len=self.draft_len or 4, max_new_tokens=max_new_tokens,
                            temperature=self.temperature, seed=seed)

    def baseline(self) -> "Setting":
        """AR on the same partition and temperature: the denominator of every speedup."""
        return Setting("ar", self.exit_layer, self.num_stages, self.temperature)

    @property
    def label(self) -> str:
        g = f" g={self.draft_len}" if self.draft_len else ""
        return f"{self.method} E={self.exit_layer} K={self.num_stages}{g} T={self.temperature:g}"


def sweep(num_layers: int, *, num_stages: Iterable[int], draft_lens: Iterable[int],
          temperatures: Iterable[float], exit_layers: Iterable[int] | None = None,
          default_exit: Callable[[int], int] | None = None) -> list[list[Setting]]:
    """The sweep as groups that share one AR baseline (first in each group): per temperature and
    valid (E, K), AR and PPSD, plus EESD for every g in the group of the smallest K with that E
    (EESD cannot overlap stages, so K changes nothing for it but the split of its verify pass).

    Without `exit_layers` each K uses `default_exit(K)` (default: the balanced E = L/K); invalid
    (E, K) pairs are skipped (DecodeConfig decides what is valid).
    """
    default_exit = default_exit or (lambda k: balanced_exit_layer(num_layers, k))
    layouts = sorted({(e, k) for k in num_stages
                      for e in ([default_exit(k)] if exit_layers is None else exit_layers)
                      if _valid(num_layers, e, k)})
    eesd_home: dict[int, int] = {}
    for e, k in layouts:
        eesd_home.setdefault(e, k)
    groups = []
    for e, k in layouts:  # temperatures innermost: one partition's groups run back to back
        for temperature in dict.fromkeys(temperatures):
            group = [Setting("ar", e, k, temperature), Setting("ppsd", e, k, temperature)]
            if eesd_home[e] == k:
                group += [Setting("eesd", e, k, temperature, g) for g in dict.fromkeys(draft_lens)]
            groups.append(group)
    return groups


def _valid(num_layers: int, exit_layer: int, num_stages: int) -> bool:
    try:
        DecodeConfig(exit_layer=exit_layer, num_stages=num_stages).resolved(num_layers)
    except ValueError:
        return False
    return True


def preset_exit_layers(fractions: Iterable[float] | None, num_layers: int, num_stages: Iterable[int],
                       default_exit: Callable[[int], int]) -> list[int] | None:
    """The exit layers of a preset: E = f L for each fraction, plus each valid K's default E;
    None (each K its default E) for a preset without fractions."""
    if not fractions:
        return None
    return sorted({max(1, round(f * num_layers)) for f in fractions}
                  | {default_exit(k) for k in num_stages if 2 <= k <= num_layers})
