"""`python -m ppsd bench`: measure PPSD against EESD and AR, and against Hugging Face `generate()`.

The boundary: this module defines the sweep, runs it (warm-up runs excluded, median of repeats,
spread kept), and turns runs into per-setting rows with the speedup math. It reads the library's
`Result`s and never changes how they are produced; writing tables, files and plots lives in
`bench_report`.

Every number says its clock. "measured" is wall time on this process's single device, stages run
in turn; "projected" replays the same measured stage work on K concurrent workers
(`Trace.project`): a projection, not a measurement. All methods generate exactly
`max_new_tokens` tokens (EOS is treated as an ordinary token) so that times compare like for like.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

from ..assets import ASSETS
from ..cli import thread_count
from ..config import DecodeConfig, balanced_exit_layer, stage_layers
from ..metrics import ideal_eesd_speedup, ideal_ppsd_speedup
from ..metrics import slot_fraction as stage_slot_fraction
from ..chat import encode_prompt, use_chat
from ..heads import default_exit_layer
from ..model import DEFAULT_MODEL, StagedModel

T = TypeVar("T")
PROMPTS_FILE = ASSETS / "prompts" / "prompts.json"
CHAT_PROMPTS_FILE = PROMPTS_FILE.with_name("chat.json")  # questions for instruct models
# Used only when assets/prompts/prompts.json is missing; the report says so. Stdlib-style code,
# reference prose and arithmetic, like the embedded model's held-out prompts.
FALLBACK_PROMPTS = (
    {"name": "gcd", "category": "code",
     "prompt": "def gcd(a, b):\n    \"\"\"Return the greatest common divisor of a and b.\"\"\"\n    while b:\n"},
    {"name": "dedent", "category": "code",
     "prompt": "def dedent(text):\n    \"\"\"Remove any common leading whitespace from every line in text.\n"},
    {"name": "for-statement", "category": "prose",
     "prompt": "The for statement is used to iterate over the elements of a sequence (such as a string,"},
    {"name": "truth-value", "category": "prose",
     "prompt": "Any object can be tested for truth value, for use in an if or while condition or as"},
    {"name": "fractions", "category": "math",
     "prompt": ">>> from fractions import Fraction\n>>> Fraction(3, 4) + Fraction(1, 4)\n"},
    {"name": "mean", "category": "math",
     "prompt": ">>> mean([1, 2, 3, 4, 4])\n2.8\n>>> mean([-1.0, 2.5, 3.25, 5.75])\n"},
)
# Presets; flags override each entry. Exit layers None: the balanced E = L/K of each K. The full
# sweep adds the early and late exits L/4 and 3L/4, where EESD's drafting costs most.
QUICK = {"max_new_tokens": 32, "repeats": 2, "warmup": 1, "stages": (2, 4), "draft_lens": (4,),
         "temperatures": (0.0, 0.8), "exit_fractions": None}
FULL = {"max_new_tokens": 64, "repeats": 5, "warmup": 2, "stages": (2, 3, 4), "draft_lens": (1, 2, 4),
        "temperatures": (0.0, 0.8), "exit_fractions": (0.25, 0.5, 0.75)}


# ---------------------------------------------------------------------------------------------
# The sweep


@dataclass(frozen=True)
class Setting:
    """One point of the sweep: a method on the K-stage partition with exit layer E (stage 1 is
    [0, E), stages 2..K split [E, L)). `draft_len` is g for EESD and None otherwise."""

    method: str
    exit_layer: int
    stages: int
    temperature: float
    draft_len: int | None = None

    def config(self, max_new_tokens: int, seed: int = 0) -> DecodeConfig:
        return DecodeConfig(method=self.method, exit_layer=self.exit_layer, stages=self.stages,
                            draft_len=self.draft_len or 4, max_new_tokens=max_new_tokens,
                            temperature=self.temperature, seed=seed)

    def baseline(self) -> "Setting":
        """AR on the same partition and temperature: the denominator of every speedup."""
        return Setting("ar", self.exit_layer, self.stages, self.temperature)

    @property
    def label(self) -> str:
        g = f" g={self.draft_len}" if self.draft_len else ""
        return f"{self.method} E={self.exit_layer} K={self.stages}{g} T={self.temperature:g}"


def sweep(num_layers: int, *, stages: Iterable[int], draft_lens: Iterable[int],
          temperatures: Iterable[float], exit_layers: Iterable[int] | None = None,
          default_exit: Callable[[int], int] | None = None) -> list[list[Setting]]:
    """The sweep as groups that share one AR baseline (first in each group): per temperature and
    valid (E, K), AR and PPSD, plus EESD for every g in the group of the smallest K with that E
    (EESD cannot overlap stages, so K changes nothing for it but the split of its verify pass).

    Without `exit_layers` each K uses `default_exit(K)` (default: the balanced E = L/K); invalid
    (E, K) pairs are skipped (DecodeConfig decides what is valid).
    """
    default_exit = default_exit or (lambda k: balanced_exit_layer(num_layers, k))
    layouts = sorted({(e, k) for k in stages
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


def _valid(num_layers: int, exit_layer: int, stages: int) -> bool:
    try:
        DecodeConfig(exit_layer=exit_layer, stages=stages).resolved(num_layers)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Timing


def repeat(fn: Callable[[], T], *, warmup: int, repeats: int, tick: Callable[[], None] = lambda: None) -> list[T]:
    """Call `fn` warmup + repeats times; return only the results after warm-up (caches, allocator
    and lazy initialisation settle during warm-up and must not count)."""
    for _ in range(warmup):
        fn()
        tick()
    kept = []
    for _ in range(repeats):
        kept.append(fn())
        tick()
    return kept


@dataclass(frozen=True)
class Cell:
    """One setting on one prompt: counts from the run and the wall times of every kept repeat."""

    prompt: str
    category: str
    tokens: int
    accepted: int
    rejected: int
    flushed: int
    wasted_stage_slots: int
    walls: tuple[float, ...]  # measured, seconds, one per repeat
    projected_walls: tuple[float, ...]  # projected on K workers, one per repeat
    utilization: tuple[float, ...]  # per stage, projected clock, median repeat
    token_ids: tuple[int, ...]


def cell_from_results(prompt: str, category: str, results: Sequence) -> Cell:
    """Fold the repeats of one setting on one prompt (library `Result`s) into a Cell. Counts come
    from the first repeat: repeats are seeded identically, so they decode the same tokens."""
    first = results[0]
    projected = [r.metrics("projected") for r in results]
    middle = sorted(range(len(results)), key=lambda i: projected[i].wall_seconds)[len(results) // 2]
    m = projected[middle]
    return Cell(prompt=prompt, category=category, tokens=m.tokens, accepted=m.accepted, rejected=m.rejected,
                flushed=m.flushed, wasted_stage_slots=m.wasted_stage_slots,
                walls=tuple(r.measured_wall_seconds for r in results),
                projected_walls=tuple(p.wall_seconds for p in projected),
                utilization=tuple(m.stage_utilization), token_ids=tuple(first.token_ids))


@dataclass(frozen=True)
class Speed:
    """Tokens per second of a set of cells: median wall per prompt, summed over prompts, and the
    same sum over each prompt's fastest and slowest repeat (the spread)."""

    tokens: int
    median: float
    low: float
    high: float


def speed(cells: Sequence[Cell], *, projected: bool = False) -> Speed:
    walls = [c.projected_walls if projected else c.walls for c in cells]
    tokens = sum(c.tokens for c in cells)
    rate = lambda seconds: tokens / seconds if seconds > 0 else float("nan")  # noqa: E731
    return Speed(tokens, rate(sum(statistics.median(w) for w in walls)),
                 rate(sum(max(w) for w in walls)), rate(sum(min(w) for w in walls)))


def round_speedups(cells: Sequence[Cell], baseline: Sequence[Cell], *, projected: bool = False) -> list[float]:
    """Speedup per round: round r of the method ran right after round r of its AR baseline on
    every prompt, so the spread of these paired ratios is the honest spread of the speedup."""
    walls = lambda cs: [c.projected_walls if projected else c.walls for c in cs]  # noqa: E731
    mine, base = walls(cells), walls(baseline)
    ratio = sum(c.tokens for c in cells) / sum(c.tokens for c in baseline)
    return [ratio * sum(w[r] for w in base) / sum(w[r] for w in mine) for r in range(len(mine[0]))]


def ideal_ppsd(acceptance: float, slot_fraction: float) -> float:
    """S_PPSD at the measured acceptance for a partition whose slowest stage is `slot_fraction`."""
    return ideal_ppsd_speedup(acceptance, round(1 / slot_fraction), slot_fraction=slot_fraction)


def slot_fraction(num_layers: int, exit_layer: int, stages: int) -> float:
    """Layers of the largest stage of the partition, over all layers."""
    return stage_slot_fraction(stage_layers(num_layers, exit_layer, stages))


# ---------------------------------------------------------------------------------------------
# Rows: one per setting


def make_row(setting: Setting, cells: Sequence[Cell], ar_cells: Sequence[Cell], *, num_layers: int,
             draft_len_for_ideal: int = 4) -> dict:
    """The JSON object of one setting: its cells against the cells of its AR baseline."""
    rate = _rate(cells)
    fraction = setting.exit_layer / num_layers
    g = setting.draft_len or draft_len_for_ideal
    measured, projected = speed(cells), speed(cells, projected=True)
    # Headline speedups are medians of the paired per-round ratios, so they sit inside their range.
    rounds_measured = round_speedups(cells, ar_cells)
    rounds_projected = round_speedups(cells, ar_cells, projected=True)
    s_measured, s_projected = statistics.median(rounds_measured), statistics.median(rounds_projected)
    s_ppsd = ideal_ppsd(rate or 0.0, slot_fraction(num_layers, setting.exit_layer, setting.stages))
    s_eesd = ideal_eesd_speedup(rate or 0.0, g, fraction)
    own_ideal = {"ppsd": s_ppsd, "eesd": s_eesd}.get(setting.method, 1.0)
    # PPSD in-process can only overlap on the projected clock; EESD and AR are single-device methods.
    actual, clock = (s_projected, "projected") if setting.method == "ppsd" else (s_measured, "measured")
    utilization = [statistics.fmean(u) for u in zip(*(c.utilization for c in cells))]
    return {
        "method": setting.method, "exit_layer": setting.exit_layer, "stages": setting.stages,
        "draft_len": setting.draft_len, "temperature": setting.temperature, "label": setting.label,
        "prompts": len(cells), "tokens": measured.tokens, "repeats": len(cells[0].walls),
        "acceptance_rate": rate, "accepted": sum(c.accepted for c in cells),
        "rejected": sum(c.rejected for c in cells),
        "flushed": sum(c.flushed for c in cells),
        "tokens_per_second": measured.median, "tokens_per_second_min": measured.low,
        "tokens_per_second_max": measured.high,
        "ar_tokens_per_second": speed(ar_cells).median,
        "speedup_measured": s_measured,
        "speedup_measured_min": min(rounds_measured), "speedup_measured_max": max(rounds_measured),
        "projected_tokens_per_second": projected.median,
        "ar_projected_tokens_per_second": speed(ar_cells, projected=True).median,
        "speedup_projected": s_projected,
        "speedup_projected_min": min(rounds_projected), "speedup_projected_max": max(rounds_projected),
        "speedup_measured_distributed": None, "distributed": None,
        "ideal_speedup": own_ideal, "ideal_ppsd_speedup": s_ppsd, "ideal_eesd_speedup": s_eesd,
        "ideal_eesd_draft_len": g,
        "efficiency": actual / own_ideal, "efficiency_clock": clock,
        "bubble_fraction": 1.0 - statistics.fmean(utilization), "stage_utilization": utilization,
        "wasted_stage_slots": sum(c.wasted_stage_slots for c in cells),
        "hf_tokens_per_second": None, "matches_hf": None,
        "by_category": _by_category(cells, ar_cells),
    }


def _by_category(cells: Sequence[Cell], ar_cells: Sequence[Cell]) -> dict:
    found = {}
    for category in dict.fromkeys(c.category for c in cells):
        mine = [c for c in cells if c.category == category]
        base = [c for c in ar_cells if c.category == category]
        found[category] = {
            "acceptance_rate": _rate(mine),
            "speedup_measured": statistics.median(round_speedups(mine, base)),
            "speedup_projected": statistics.median(round_speedups(mine, base, projected=True)),
        }
    return found


def central_point(rows: Sequence[dict]) -> list[dict]:
    """The paper's claim per (E, T): does EESD fall below 1x (measured, one device) while PPSD
    stays at or above 1x (projected on K workers)? Each entry states what the data say in `verdict`."""
    found = []
    for (e, t), group in itertools.groupby(sorted(rows, key=lambda r: (r["exit_layer"], r["temperature"])),
                                           key=lambda r: (r["exit_layer"], r["temperature"])):
        group = list(group)
        eesd = [r for r in group if r["method"] == "eesd"]
        ppsd = [r for r in group if r["method"] == "ppsd"]
        if not eesd or not ppsd:
            continue
        worst = min(eesd, key=lambda r: r["speedup_measured"])
        pp = min(ppsd, key=lambda r: r["speedup_projected"])
        found.append({
            "exit_layer": e, "temperature": t,
            "eesd_worst": worst["label"], "eesd_speedup_measured": worst["speedup_measured"],
            "eesd_below_1": any(r["speedup_measured"] < 1.0 for r in eesd),
            "ppsd_worst": pp["label"], "ppsd_speedup_projected": pp["speedup_projected"],
            "ppsd_at_least_1": all(r["speedup_projected"] >= 1.0 for r in ppsd),
        })
    for entry in found:
        entry["supports_paper"] = entry["eesd_below_1"] and entry["ppsd_at_least_1"]
        if entry["supports_paper"]:
            entry["verdict"] = "shows the paper's point: EESD below 1x, PPSD at or above 1x"
        elif not entry["ppsd_at_least_1"]:
            entry["verdict"] = "disagrees with the paper: PPSD (projected) falls below 1x"
        else:
            entry["verdict"] = "EESD does not fall below 1x here; PPSD stays at or above 1x"
    return found


# ---------------------------------------------------------------------------------------------
# Running it


def fixed_length(model: StagedModel) -> StagedModel:
    """The same weights with EOS treated as an ordinary token: every run then generates exactly
    max_new_tokens, so AR, EESD, PPSD and Hugging Face time the same amount of work."""
    bench = StagedModel(model.hf_model, name=model.info.name, exit_head=model.exit_head)
    bench.info = replace(bench.info, eos_token_ids=())
    return bench


def hf_generate(model: StagedModel, prompt_ids: list[int], new_tokens: int, **kwargs) -> tuple[list[int], float]:
    """Hugging Face `generate()` greedy on the same weights, device and dtype: (token ids, seconds).

    `min_new_tokens` masks EOS until `new_tokens` are out, so HF too generates exactly that many.
    """
    import torch

    ids = torch.tensor([prompt_ids], device=model.hf_model.device)
    eos = model.hf_model.generation_config.eos_token_id
    pad = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    _sync(model)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      pad_token_id=pad, **kwargs)
    _sync(model)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - started


def hf_assisted_early_exit(model: StagedModel, prompt_ids: list[int], new_tokens: int, *, exit_layer: int,
                           draft_len: int) -> tuple[list[int], float]:
    """HF's draft-then-verify early exit (`assistant_early_exit=E`), g drafts per round: a constant
    schedule and no confidence cut-off, so it drafts exactly what our EESD drafts."""
    return hf_generate(model, prompt_ids, new_tokens, assistant_early_exit=exit_layer,
                       num_assistant_tokens=draft_len, num_assistant_tokens_schedule="constant",
                       assistant_confidence_threshold=0.0)


def same_output(ours: Sequence[int], theirs: Sequence[int], eos: Sequence[int]) -> bool:
    """Equal up to our first EOS: HF's `min_new_tokens` bans EOS where ours emits it, so the two
    can only be compared on the common prefix before it."""
    cut = next((i for i, t in enumerate(ours) if t in eos), len(ours))
    return list(ours[:cut]) == list(theirs[:cut])


def _sync(model: StagedModel) -> None:
    if model.info.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


@dataclass
class Run:
    """A benchmark in progress: what it measures and what has finished (kept on Ctrl-C)."""

    model: StagedModel
    prompts: list[dict]  # {"name", "category", "prompt", "ids"}
    groups: list[list[Setting]]
    max_new_tokens: int
    warmup: int
    repeats: int
    tick: Callable[[], None]
    pipeline: Callable | None = None  # ppsd.executors.pool.shared_pipeline when K-worker runs are wanted
    exit_head: str = "auto"  # per E: the shipped head when one fits ("auto"), "shared", or a directory
    cells: dict = field(default_factory=dict)  # Setting -> list[Cell], settings done on every prompt
    pipeline_cells: dict = field(default_factory=dict)  # Setting -> list[Cell], AR and PPSD on K workers
    hf_assisted: dict = field(default_factory=dict)  # Setting -> {"tokens_per_second", "matches"}
    heads: dict = field(default_factory=dict)  # E -> (fixed-length model drafting with its head, head label)

    def staged(self, exit_layer: int) -> StagedModel:
        """The model with the exit head this run uses at `exit_layer` (chosen once per E)."""
        if exit_layer not in self.heads:
            from ..heads import choose_exit_head

            choice = choose_exit_head(self.model, exit_layer, self.exit_head)
            self.heads[exit_layer] = (fixed_length(self.model.with_exit_head(choice.head)), choice.label)
        return self.heads[exit_layer][0]

    def total_runs(self) -> int:
        # One tick per round: a round runs a whole group (or the AR / HF baseline pair) once.
        return (self.warmup + self.repeats) * len(self.prompts) * (len(self.groups) + 1)

    def baselines(self) -> dict:
        """Our AR against HF greedy `generate()`, interleaved run by run so that load on the machine
        hits both alike."""
        from ..generate import generate

        eos = _hf_eos(self.model)  # the bench's own model ignores EOS; HF's generation config knows it
        config = Setting("ar", balanced_exit_layer(self.model.num_layers, 2), 2, 0.0).config(self.max_new_tokens)
        ours, theirs, matches = [], [], True
        for p in self.prompts:
            pairs = repeat(lambda: (generate(self.model, p["ids"], config),
                                    hf_generate(self.model, p["ids"], self.max_new_tokens)),
                           warmup=self.warmup, repeats=self.repeats, tick=self.tick)
            ours.append([r.measured_wall_seconds for r, _ in pairs])
            theirs.append([hf[1] for _, hf in pairs])
            matches &= same_output(pairs[0][0].token_ids, pairs[0][1][0], eos)
        tokens = self.max_new_tokens * len(self.prompts)
        ar = tokens / sum(statistics.median(w) for w in ours)
        hf = tokens / sum(statistics.median(w) for w in theirs)
        return {"ar_tokens_per_second": ar, "hf_generate_tokens_per_second": hf, "ar_vs_hf_speed_ratio": ar / hf,
                "ar_within_5_percent_or_faster": ar / hf >= 0.95, "ar_matches_hf_generate": matches,
                "ar_tokens_per_second_min": tokens / sum(max(w) for w in ours),
                "ar_tokens_per_second_max": tokens / sum(min(w) for w in ours),
                "hf_generate_tokens_per_second_min": tokens / sum(max(w) for w in theirs),
                "hf_generate_tokens_per_second_max": tokens / sum(min(w) for w in theirs),
                "comparison": "same prompts, greedy, exactly max_new_tokens each; token match on the "
                              "prefix before our first EOS (HF's min_new_tokens bans EOS)"}

    def measure(self, group: Sequence[Setting]) -> None:
        """Run a group (its AR baseline first) on every prompt, interleaved: each round runs every
        setting once, so load on the machine hits the baseline and the methods alike. A group is
        recorded only when every prompt has finished."""
        from ..generate import generate

        eos = _hf_eos(self.model)
        model = self.staged(group[0].exit_layer)
        configs = [s.config(self.max_new_tokens) for s in group]
        checked = [s.method == "eesd" and s.temperature == 0.0 for s in group]  # HF has greedy EESD only
        cells: dict[Setting, list[Cell]] = {s: [] for s in group}
        # AR and PPSD again on K worker processes: the only measured (not projected) overlap.
        on_pipeline = [s for s in group if s.method in ("ar", "ppsd")] if self.pipeline else []
        executor = self.pipeline(model, configs[0]) if on_pipeline else None
        on_pipeline = on_pipeline if executor is not None else []
        pipeline_cells: dict[Setting, list[Cell]] = {s: [] for s in on_pipeline}
        hf_walls: dict[Setting, list[list[float]]] = {s: [] for s, c in zip(group, checked) if c}
        matches = dict.fromkeys(hf_walls, True)
        for p in self.prompts:
            def one_round():
                found = []
                for s, config, check in zip(group, configs, checked):
                    ours = generate(model, p["ids"], config)
                    hf = hf_assisted_early_exit(self.model, p["ids"], self.max_new_tokens,
                                                exit_layer=s.exit_layer, draft_len=s.draft_len) if check else None
                    found.append((ours, hf))
                for s in on_pipeline:
                    found.append((generate(model, p["ids"], s.config(self.max_new_tokens), executor=executor),
                                  None))
                return found
            rounds = repeat(one_round, warmup=self.warmup, repeats=self.repeats, tick=self.tick)
            for i, s in enumerate(group):
                cells[s].append(cell_from_results(p["name"], p["category"], [r[i][0] for r in rounds]))
                if s in hf_walls:
                    hf_walls[s].append([r[i][1][1] for r in rounds])
                    matches[s] &= same_output(rounds[0][i][0].token_ids, rounds[0][i][1][0], eos)
            for i, s in enumerate(on_pipeline, start=len(group)):
                pipeline_cells[s].append(cell_from_results(p["name"], p["category"], [r[i][0] for r in rounds]))
        self.cells.update(cells)
        self.pipeline_cells.update(pipeline_cells)
        tokens = self.max_new_tokens * len(self.prompts)
        for s, walls in hf_walls.items():
            self.hf_assisted[s] = {"tokens_per_second": tokens / sum(statistics.median(w) for w in walls),
                                   "matches": matches[s]}

    def report(self, baselines: dict, *, machine: dict, interrupted: bool, prompts_source: str,
               args: argparse.Namespace) -> dict:
        """The whole record: machine, model, method, baselines, one row per finished setting."""
        rows = self.rows()
        hf_checks = [v["matches"] for v in self.hf_assisted.values()]
        baselines = dict(baselines, eesd_matches_hf_assistant_early_exit=all(hf_checks) if hf_checks else None,
                         eesd_hf_settings_checked=len(hf_checks))
        info = self.model.info
        return {
            "machine": machine,
            "model": {"name": info.name, "model_type": info.model_type, "num_layers": info.num_layers,
                      "vocab_size": info.vocab_size, "weights_sha256": weights_digest(info.name)},
            "method": {
                "warmup": self.warmup, "repeats": self.repeats, "max_new_tokens": self.max_new_tokens,
                "quick": args.quick, "prompts_source": prompts_source, "command": command_line(args),
                "prompts": [{"name": p["name"], "category": p["category"], "prompt_tokens": len(p["ids"])}
                            for p in self.prompts],
                "clocks": {"measured": "wall time on this one device, stages run in turn",
                           "projected": "the same measured stage work replayed on K concurrent workers",
                           "distributed": "wall time with one worker process per stage (ppsd.distributed)"},
                "timing": "rounds run every setting of a group once, interleaved; median of the rounds after "
                          "warm-up; ranges are the lowest and highest per-round (paired) speedups",
                "eos": "ignored: every run generates exactly max_new_tokens",
            },
            "baselines": baselines,
            "results": rows,
            "central_point": central_point(rows),
            "interrupted": interrupted,
        }

    def rows(self) -> list[dict]:
        rows = []
        for setting, cells in self.cells.items():
            base = self.cells.get(setting.baseline())
            if base is None:
                continue
            row = make_row(setting, cells, base, num_layers=self.model.num_layers)
            row["exit_head"] = self.heads[setting.exit_layer][1] if setting.exit_layer in self.heads else "shared"
            if setting in self.pipeline_cells and setting.baseline() in self.pipeline_cells:
                row.update(distributed_fields(row, self.pipeline_cells[setting],
                                              self.pipeline_cells[setting.baseline()], base))
            if setting in self.hf_assisted:
                row["hf_tokens_per_second"] = self.hf_assisted[setting]["tokens_per_second"]
                row["matches_hf"] = self.hf_assisted[setting]["matches"]
            rows.append(row)
        return rows


def distributed_fields(row: dict, cells: Sequence[Cell], pipeline_ar: Sequence[Cell],
                       single_ar: Sequence[Cell]) -> dict:
    """Measured speedups of a method run on K worker processes: against AR on the same K-worker
    pipeline (the fair baseline) and against AR on one device."""
    mine = speed(cells)
    versus_pipeline = statistics.median(round_speedups(cells, pipeline_ar))
    return {
        "speedup_measured_distributed": versus_pipeline,
        "distributed": {
            "tokens_per_second": mine.median, "tokens_per_second_min": mine.low, "tokens_per_second_max": mine.high,
            "ar_pipeline_tokens_per_second": speed(pipeline_ar).median,
            "speedup_vs_ar_pipeline": versus_pipeline,
            "speedup_vs_ar_pipeline_min": min(round_speedups(cells, pipeline_ar)),
            "speedup_vs_ar_pipeline_max": max(round_speedups(cells, pipeline_ar)),
            "speedup_vs_ar_single_device": statistics.median(round_speedups(cells, single_ar)),
            "efficiency": versus_pipeline / row["ideal_speedup"],
            "acceptance_rate": _rate(cells),
        },
    }


def _rate(cells: Sequence[Cell]) -> float | None:
    accepted, rejected = sum(c.accepted for c in cells), sum(c.rejected for c in cells)
    return accepted / (accepted + rejected) if accepted + rejected else None


def _hf_eos(model: StagedModel) -> tuple[int, ...]:
    eos = model.hf_model.generation_config.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


# ---------------------------------------------------------------------------------------------
# Inputs and the record of the machine


def load_prompts(path: str | None) -> tuple[list[dict], str]:
    """The prompt set and where it came from. Raises ValueError on a malformed file."""
    file = Path(path) if path else PROMPTS_FILE
    if not file.exists():
        if path:
            raise ValueError(f"prompts file {path!r} does not exist")
        return [dict(p) for p in FALLBACK_PROMPTS], f"built-in fallback ({PROMPTS_FILE.name} is missing)"
    try:
        prompts = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read prompts file {str(file)!r}: {error}") from None
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(p, dict) and {"name", "category", "prompt"} <= p.keys() for p in prompts):
        raise ValueError(f"prompts file {str(file)!r} must be a non-empty list of "
                         f'{{"name", "category", "prompt"}} objects')
    return prompts, str(file)


def quick_subset(prompts: Sequence[dict]) -> list[dict]:
    """The first prompt of each category: every task represented, in about a minute."""
    return spread(prompts, len({p["category"] for p in prompts}))


def spread(prompts: Sequence[dict], count: int) -> list[dict]:
    """Up to `count` prompts, taking categories in turn (in order of first appearance) so each
    is represented."""
    by_category: dict[str, list[dict]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt["category"], []).append(prompt)
    chosen: list[dict] = []
    while len(chosen) < count and any(by_category.values()):
        for queue in by_category.values():
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen


def machine_info(model: StagedModel) -> dict:
    import torch
    import transformers

    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    device = model.info.device
    return {
        "cpu": cpu, "cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "device": device, "dtype": model.info.dtype,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "distributed_executor": "available" if importlib.util.find_spec("ppsd.executors.pool") else "absent",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def weights_digest(name: str) -> str | None:
    """SHA-256 over a local model folder's safetensors files: which weights were measured
    (a folder can be overwritten later, for example by a training run)."""
    files = sorted(Path(name).glob("*.safetensors")) if Path(name).is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# The command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"{DEFAULT_MODEL} (default), a local directory, a .gguf file or a hub id")
    parser.add_argument("--exit-head", default="auto",
                        help="per E: auto (the shipped head when one fits, else shared; default), shared, or a "
                             "train-head directory")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="prompts through the chat template (default: on when the model has one)")
    parser.add_argument("--quick", action="store_true",
                        help="one prompt per category and a small sweep (about a minute on a laptop CPU)")
    parser.add_argument("--json", action="store_true", help="print the JSON report on stdout (table on stderr)")
    parser.add_argument("--out", default="benchmarks", help="folder for bench.json/.csv/.html/.md (default benchmarks)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per setting and prompt (median kept)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs before them")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens generated per run (exactly)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--exit-layers", type=int, nargs="+", default=None, help="E values (default: L/K per K)")
    parser.add_argument("--stages", type=int, nargs="+", default=None, help="K values for PPSD")
    parser.add_argument("--draft-lens", type=int, nargs="+", default=None, help="g values for EESD")
    parser.add_argument("--temperatures", type=float, nargs="+", default=None, help="0 is greedy")
    parser.add_argument("--distributed", choices=("auto", "on", "off"), default=None,
                        help="also run AR and PPSD on K worker processes (ppsd.distributed). auto: when "
                             "available, for each K whose workers get a core each; on: every K. Default: "
                             "off with --quick (each stage layout starts K processes), else auto")
    parser.add_argument("--threads", type=thread_count, default=1,
                        help="torch CPU threads (default 1: small models gain nothing from more, and on a "
                             "busy machine spinning threads cost far more than they give)")
    parser.add_argument("--prompts", default=None,
                        help="prompts JSON [{name, category, prompt}] (default: assets/prompts/chat.json with "
                             "the chat template, else prompts.json)")
    parser.add_argument("--plotly-js", choices=("embed", "cdn"), default="embed",
                        help="embed plotly.js in bench.html (works offline) or link the CDN (small file)")


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers
    from tqdm import tqdm

    from . import report as bench_report
    from ..model import load_model

    if args.threads < 1:
        raise ValueError(f"threads={args.threads} must be >= 1")
    torch.set_num_threads(args.threads)
    # HF warns on every assisted call about its own internal arguments; the table is the output.
    transformers.logging.set_verbosity_error()

    preset = QUICK if args.quick else FULL
    pick = lambda name: preset[name] if getattr(args, name) is None else getattr(args, name)  # noqa: E731
    repeats, warmup, new_tokens = pick("repeats"), pick("warmup"), pick("max_new_tokens")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats} must be >= 1 and warmup={warmup} >= 0")
    loaded, tokenizer = load_model(args.model, device=args.device)
    chat = use_chat(tokenizer, args.chat)
    prompts, source = load_prompts(args.prompts or (CHAT_PROMPTS_FILE if chat else None))
    if args.quick:
        prompts = quick_subset(prompts)
    model = fixed_length(loaded)
    for p in prompts:
        p["ids"] = _prompt_ids(tokenizer, p["prompt"], model.info.max_context - new_tokens, chat=chat)
    source += ", through the chat template" if chat else ", raw text"
    default_exit = lambda k: default_exit_layer(args.model, model.num_layers, k)  # noqa: E731
    exit_layers = args.exit_layers or (preset["exit_fractions"] and sorted(
        {max(1, round(f * model.num_layers)) for f in preset["exit_fractions"]}
        | {default_exit(k) for k in pick("stages") if 2 <= k <= model.num_layers}))
    groups = sweep(model.num_layers, stages=pick("stages"), draft_lens=pick("draft_lens"),
                   temperatures=pick("temperatures"), exit_layers=exit_layers, default_exit=default_exit)
    if not groups:
        raise ValueError(f"no valid (exit layer, stages) pair for a {model.num_layers}-layer model")
    for s in itertools.chain(*groups):
        s.config(new_tokens).resolved(model.num_layers)  # bad values fail before any timing
    bar = tqdm(total=0, desc="bench", unit="round", file=sys.stderr, dynamic_ncols=True)
    bench = Run(model, prompts, groups, new_tokens, warmup, repeats, tick=lambda: bar.update(),
                pipeline=_pipeline(args), exit_head=args.exit_head)
    bar.total = bench.total_runs()
    baselines, interrupted = {}, False
    machine = machine_info(model)  # before timing: the load average and date of the start
    try:
        bar.set_postfix_str("AR vs HF generate()")
        baselines = bench.baselines()
        for group in groups:
            bar.set_postfix_str(group[0].label.replace("ar ", ""))
            bench.measure(group)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bench.pipeline is not None:
            importlib.import_module("ppsd.executors.processes").close_all()
    bar.close()
    report = bench.report(baselines, machine=machine, interrupted=interrupted, prompts_source=source, args=args)
    bench_report.write_all(report, Path(args.out), plotly_js=args.plotly_js)
    table = bench_report.table(report)
    if args.json:
        print(json.dumps(bench_report.finite(report), allow_nan=False))
        print(table, file=sys.stderr)
    else:
        print(table)
        print(f"wrote {args.out}/bench.json, bench.csv, bench.html, bench.md")
    if interrupted:
        print("interrupted: kept the settings finished so far", file=sys.stderr)
        return 130
    return 0


def _pipeline(args: argparse.Namespace) -> Callable | None:
    """`ppsd.executors.pool.shared_pipeline` when K-worker runs are asked for (or auto and available)."""
    available = importlib.util.find_spec("ppsd.executors.pool") is not None
    mode = args.distributed or ("off" if args.quick else "auto")
    if mode == "on" and not available:
        raise ValueError("--distributed on, but ppsd.executors.pool is not part of this installation")
    if mode == "off" or not available:
        return None
    module = importlib.import_module("ppsd.executors.pool")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    def make(model: StagedModel, config: DecodeConfig):
        # K processes sharing fewer cores run in turn again: not a K-worker measurement.
        if mode == "auto" and model.info.device == "cpu" and config.stages * args.threads > cores:
            return None
        return module.shared_pipeline(model, config, threads_per_worker=args.threads)
    return make


def _prompt_ids(tokenizer, text: str, room: int, *, chat: bool = False) -> list[int]:
    ids = encode_prompt(tokenizer, text, chat=chat)
    if not ids:
        raise ValueError(f"prompt {text[:40]!r} has no tokens")
    return ids[-room:]  # keep the end: it is what the continuation depends on


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run, rebuilt from the parsed arguments (defaults left out)."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    parts = ["python -m ppsd bench"]
    for name, value in vars(args).items():
        if name in ("command", "json") or value == defaults.get_default(name):
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            parts.append(flag)
        else:
            values = value if isinstance(value, (list, tuple)) else [value]
            parts.append(" ".join([flag] + [f"{v:g}" if isinstance(v, float) else str(v) for v in values]))
    return " ".join(parts)
