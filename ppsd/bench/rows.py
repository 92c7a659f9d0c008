"""The results of `python -m ppsd bench` as JSON objects: one row per setting against its AR
baseline, the K-worker fields of a row, and the paper's central point over the rows. Reads
cells (`stats`); never runs a model or writes a file."""

from __future__ import annotations

import itertools
import statistics
from typing import Sequence

from ..config import DEFAULTS, stage_layers
from ..metrics import exit_fraction, ideal_eesd_speedup, ideal_ppsd_speedup_slowest_stage, slot_fraction
from .stats import Cell, acceptance_rate, round_speedups, speed
from .settings import Setting


def make_row(setting: Setting, cells: Sequence[Cell], ar_cells: Sequence[Cell], *, num_layers: int) -> dict:
    """The JSON object of one setting: its cells against the cells of its AR baseline."""
    rate = acceptance_rate(cells)
    partition = stage_layers(num_layers, setting.exit_layer, setting.num_stages)
    fraction = exit_fraction(partition)
    g = setting.draft_len or DEFAULTS.draft_len  # a row of another method: EESD's ideal at its default g
    measured, projected = speed(cells), speed(cells, projected=True)
    # Headline speedups are medians of the paired per-round ratios, so they sit inside their range.
    rounds_measured = round_speedups(cells, ar_cells)
    rounds_projected = round_speedups(cells, ar_cells, projected=True)
    s_measured, s_projected = statistics.median(rounds_measured), statistics.median(rounds_projected)
    slot = slot_fraction(partition)
    s_ppsd = ideal_ppsd_speedup_slowest_stage(rate or 0.0, slot)
    s_eesd = ideal_eesd_speedup(rate or 0.0, g, fraction)
    own_ideal = {"ppsd": s_ppsd, "eesd": s_eesd}.get(setting.method, 1.0)
    # PPSD in-process can only overlap on the projected clock; EESD and AR are single-device methods.
    actual, clock = (s_projected, "projected") if setting.method == "ppsd" else (s_measured, "measured")
    utilization = [statistics.fmean(u) for u in zip(*(c.utilization for c in cells))]
    return {
        "method": setting.method, "exit_layer": setting.exit_layer, "stages": setting.num_stages,
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
        "ideal_eesd_draft_len": g, "slot_fraction": slot,
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
            "acceptance_rate": acceptance_rate(mine),
            "speedup_measured": statistics.median(round_speedups(mine, base)),
            "speedup_projected": statistics.median(round_speedups(mine, base, projected=True)),
        }
    return found


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
            "acceptance_rate": acceptance_rate(cells),
        },
    }


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
