"""Measuring for `python -m ppsd bench`: the fixed-length model, the warm-up-then-repeat helper,
and `Run`, which times each group of settings on every prompt (interleaved, against its AR
baseline and the Hugging Face references) and keeps what has finished. The arithmetic on the
times lives in `stats` and `rows`; the writers in `report`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence, TypeVar

from ..config import balanced_exit_layer
from ..model import StagedModel, eos_ids
from .baselines import hf_assisted_early_exit, hf_generate, same_output
from .machine import weights_digest
from .rows import central_point, distributed_fields, make_row
from .stats import Cell, cell_from_results, walls_speed
from .settings import Setting

T = TypeVar("T")


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


def fixed_length(model: StagedModel) -> StagedModel:
    """The same weights with EOS treated as an ordinary token: every run then generates exactly
    max_new_tokens, so AR, EESD, PPSD and Hugging Face time the same amount of work."""
    bench = model.with_exit_head(model.exit_head)
    bench.info = replace(model.info, eos_token_ids=())
    return bench


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
    pipeline: Callable | None = None  # ppsd.executors.distributed.pool.shared_pipeline when K-worker runs are wanted
    exit_head: str = "auto"  # per E: the shipped head when one fits ("auto"), "shared", or a directory
    hf_early_exit: bool = True  # also time greedy EESD's HF twin, generate(assistant_early_exit=E)
    cells: dict = field(default_factory=dict)  # Setting -> list[Cell], settings done on every prompt
    pipeline_cells: dict = field(default_factory=dict)  # Setting -> list[Cell], AR and PPSD on K workers
    hf_assisted: dict = field(default_factory=dict)  # Setting -> {"tokens_per_second", "matches"}
    hf_tokens: list = field(default_factory=list)  # per prompt, HF generate()'s greedy tokens (`baselines`)
    matches_generate: dict = field(default_factory=dict)  # greedy Setting -> its tokens equal hf_tokens
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
        hits both alike. Keeps HF's tokens, against which `measure` checks every greedy setting."""
        from ..generate import generate

        eos = eos_ids(self.model.hf_model)  # the bench's own model ignores EOS; its weights' configs know it
        config = Setting("ar", balanced_exit_layer(self.model.num_layers, 2), 2, 0.0).config(self.max_new_tokens)
        ours, theirs, matches = [], [], True
        for p in self.prompts:
            pairs = repeat(lambda: (generate(self.model, p["ids"], config),
                                    hf_generate(self.model, p["ids"], self.max_new_tokens)),
                           warmup=self.warmup, repeats=self.repeats, tick=self.tick)
            ours.append([r.measured_wall_seconds for r, _ in pairs])
            theirs.append([hf[1] for _, hf in pairs])
            matches &= same_output(pairs[0][0].token_ids, pairs[0][1][0], eos)
            self.hf_tokens.append(pairs[0][1][0])
        ar, hf = (walls_speed(self.max_new_tokens * len(self.prompts), w) for w in (ours, theirs))
        ratio = ar.median / hf.median
        return {"ar_tokens_per_second": ar.median, "hf_generate_tokens_per_second": hf.median,
                "ar_vs_hf_speed_ratio": ratio, "ar_within_5_percent_or_faster": ratio >= 0.95,
                "ar_matches_hf_generate": matches, "ar_tokens_per_second_min": ar.low,
                "ar_tokens_per_second_max": ar.high, "hf_generate_tokens_per_second_min": hf.low,
                "hf_generate_tokens_per_second_max": hf.high,
                "comparison": "same prompts, greedy, exactly max_new_tokens each; token match on the "
                              "prefix before our first EOS (HF's min_new_tokens bans EOS)"}

    def measure(self, group: Sequence[Setting]) -> None:
        """Run a group (its AR baseline first) on every prompt, interleaved: each round runs every
        setting once, so load on the machine hits the baseline and the methods alike. A group is
        recorded only when every prompt has finished. Runs after `baselines`, whose HF tokens
        every greedy setting's must equal (greedy speculative decoding changes no token)."""
        from ..generate import generate

        eos = eos_ids(self.model.hf_model)
        model = self.staged(group[0].exit_layer)
        configs = [s.config(self.max_new_tokens) for s in group]
        checked = [self.hf_early_exit and s.method == "eesd" and s.temperature == 0.0
                   for s in group]  # HF has greedy EESD only
        cells: dict[Setting, list[Cell]] = {s: [] for s in group}
        # AR and PPSD again on K worker processes: the only measured (not projected) overlap.
        on_pipeline = [s for s in group if s.method in ("ar", "ppsd")] if self.pipeline else []
        executor = self.pipeline(model, configs[0]) if on_pipeline else None
        on_pipeline = on_pipeline if executor is not None else []
        pipeline_cells: dict[Setting, list[Cell]] = {s: [] for s in on_pipeline}
        hf_walls: dict[Setting, list[list[float]]] = {s: [] for s, c in zip(group, checked) if c}
        matches = dict.fromkeys(hf_walls, True)
        matches_generate = {s: True for s in group if s.temperature == 0.0}
        for p, hf_tokens in zip(self.prompts, self.hf_tokens, strict=True):
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
                if s in matches_generate:
                    matches_generate[s] &= same_output(rounds[0][i][0].token_ids, hf_tokens, eos)
            for i, s in enumerate(on_pipeline, start=len(group)):
                pipeline_cells[s].append(cell_from_results(p["name"], p["category"], [r[i][0] for r in rounds]))
        self.cells.update(cells)
        self.pipeline_cells.update(pipeline_cells)
        self.matches_generate.update(matches_generate)
        tokens = self.max_new_tokens * len(self.prompts)
        for s, walls in hf_walls.items():
            self.hf_assisted[s] = {"tokens_per_second": walls_speed(tokens, walls).median, "matches": matches[s]}

    def report(self, baselines: dict, *, machine: dict, interrupted: bool, prompts_source: str, quick: bool,
               command: str) -> dict:
        """The whole record: machine, model, method, baselines, one row per finished setting.
        `command` is the command line that reproduces the run."""
        rows = self.rows()
        hf_checks = [v["matches"] for v in self.hf_assisted.values()]
        generate_checks = list(self.matches_generate.values())
        baselines = dict(baselines, eesd_matches_hf_assistant_early_exit=all(hf_checks) if hf_checks else None,
                         eesd_hf_settings_checked=len(hf_checks),
                         greedy_matches_hf_generate=all(generate_checks) if generate_checks else None,
                         hf_generate_settings_checked=len(generate_checks))
        info = self.model.info
        return {
            "machine": machine,
            "model": {"name": info.name, "model_type": info.model_type, "num_layers": info.num_layers,
                      "vocab_size": info.vocab_size, "weights_sha256": weights_digest(info.name)},
            "method": {
                "warmup": self.warmup, "repeats": self.repeats, "max_new_tokens": self.max_new_tokens,
                "quick": quick, "hf_early_exit": self.hf_early_exit, "prompts_source": prompts_source,
                "command": command,
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
            row["matches_hf_generate"] = self.matches_generate.get(setting)
            if setting in self.hf_assisted:
                row["hf_tokens_per_second"] = self.hf_assisted[setting]["tokens_per_second"]
                row["matches_hf"] = self.hf_assisted[setting]["matches"]
            rows.append(row)
        return rows
