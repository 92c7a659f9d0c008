"""bench-pipeline's summary names the fastest of every row: PPSD at its best over the fastest AR
measured in the same run, whichever kinds each ran on, in the table's first summary line and in
the JSON (issue 50). On a synthetic result table: nothing is decoded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ppsd.bench import pipeline
from test_bench import UNEVEN, ar_run, ppsd_run

ROWS = (("ar1", "ar", "in-process", 1), ("ar2", "ar", "in-process", 2), ("hf", "hf", "in-process", 1),
        ("hf2", "hf", "in-process", 2), ("ar pipe", "ar", "processes", 1), ("ppsd pipe", "ppsd", "processes", 1),
        ("ar threads", "ar", "threads", 1), ("ppsd threads", "ppsd", "threads", 1),
        ("ar steps", "ar", "graphed", 1), ("ppsd steps", "ppsd", "graphed", 1))


def report_of(walls: dict[str, float]) -> dict:
    """The report of one prompt of 3 tokens whose rows took `walls` seconds (every other row 6 s),
    plus a projected PPSD row faster than all (a projection, never "measured")."""
    ar, pp = [ar_run(s, UNEVEN) for s in (1.0, 2.0)], [ppsd_run(s, UNEVEN) for s in (1.0, 1.5)]
    methods = [pipeline.Method(*row) for row in ROWS]
    methods.append(pipeline.Method("ppsd projected", "ppsd", "in-process", 1, clock="projected"))
    table = {(m.label, 0): [walls.get(m.label, 6.0)] for m in methods} | {("ppsd projected", 0): [0.1]}
    args = SimpleNamespace(new_tokens=3, device="cpu", threads_per_worker=1, repeats=1, warmup=0)
    return pipeline._report(args, pp[0].config, methods, [[5]], pipeline.Measured(table, {"ar pipe": ar,
                                                                                          "ppsd pipe": pp}),
                            "hand-made", (0.0, 0.0, 0.0), 0.0)


def test_the_summary_takes_the_fastest_ppsd_and_the_fastest_ar_whatever_their_kinds():
    # The table: the captured steps are fastest for both; HF generate() faster still is no AR row.
    report = report_of({"ppsd steps": 3.0, "ar steps": 3.6, "ppsd pipe": 4.0, "ar1": 4.5, "hf2": 2.0})
    assert report["best_ppsd_and_fastest_ar"] == {"ppsd": "ppsd steps", "ar": "ar steps"}
    assert report["best_ppsd_speedup_vs_fastest_ar"] == pytest.approx(3.6 / 3.0)
    assert report["tokens_per_second"]["ar1"] == pytest.approx(3 / 4.5)  # the per-kind lines stay
    line = next(line for line in pipeline.table(report).splitlines() if line.startswith("PPSD at its best"))
    assert line == ("PPSD at its best (ppsd steps, 1.0 tokens/s) over the fastest AR (ar steps, 0.8 tokens/s) "
                    "= 1.200")
    assert "PPSD on 2 worker" not in line and "ppsd pipe" in pipeline.table(report)


def test_the_fastest_may_run_on_different_kinds():
    report = report_of({"ppsd threads": 2.0, "ar1": 2.5, "ar steps": 3.0})
    assert report["best_ppsd_and_fastest_ar"] == {"ppsd": "ppsd threads", "ar": "ar1"}
    assert report["best_ppsd_speedup_vs_fastest_ar"] == pytest.approx(2.5 / 2.0)
    # slower than AR reads below 1: nothing is clipped
    slower = report_of({"ppsd pipe": 5.0, "ar2": 4.0})
    assert slower["best_ppsd_and_fastest_ar"] == {"ppsd": "ppsd pipe", "ar": "ar2"}
    assert slower["best_ppsd_speedup_vs_fastest_ar"] == pytest.approx(0.8)
