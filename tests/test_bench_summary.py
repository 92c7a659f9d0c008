"""bench-pipeline's summary names the fastest of every row: PPSD at its best over the fastest AR
measured in the same run, whichever kinds each ran on, in the table's first summary line and in
the JSON (issue 50), HF generate() included among the AR rows (issue 56). On a synthetic result
table: nothing is decoded."""

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
    # Issue 50's table: the captured steps are fastest for both (HF generate() slower here).
    report = report_of({"ppsd steps": 3.0, "ar steps": 3.6, "ppsd pipe": 4.0, "ar1": 4.5, "hf2": 4.0})
    assert report["best_ppsd_and_fastest_ar"] == {"ppsd": "ppsd steps", "ar": "ar steps", "ar_method": "ar"}
    assert report["best_ppsd_speedup_vs_fastest_ar"] == pytest.approx(3.6 / 3.0)
    assert report["tokens_per_second"]["ar1"] == pytest.approx(3 / 4.5)  # the per-kind lines stay
    line = next(line for line in pipeline.table(report).splitlines() if line.startswith("PPSD at its best"))
    assert line == ("PPSD at its best (ppsd steps, 1.0 tokens/s) over the fastest AR, HF generate() included "
                    "(ar steps, 0.8 tokens/s) = 1.200")
    assert "PPSD on 2 worker" not in line and "ppsd pipe" in pipeline.table(report)


def test_the_fastest_may_run_on_different_kinds():
    report = report_of({"ppsd threads": 2.0, "ar1": 2.5, "ar steps": 3.0})
    assert report["best_ppsd_and_fastest_ar"] == {"ppsd": "ppsd threads", "ar": "ar1", "ar_method": "ar"}
    assert report["best_ppsd_speedup_vs_fastest_ar"] == pytest.approx(2.5 / 2.0)
    # slower than AR reads below 1: nothing is clipped
    slower = report_of({"ppsd pipe": 5.0, "ar2": 4.0})
    assert slower["best_ppsd_and_fastest_ar"] == {"ppsd": "ppsd pipe", "ar": "ar2", "ar_method": "ar"}
    assert slower["best_ppsd_speedup_vs_fastest_ar"] == pytest.approx(0.8)


def test_hf_generate_fastest_of_the_ar_rows_is_the_fastest_ar():
    """Issue 56: HF generate() on 2 threads ran 23.3 tok/s, the fastest AR-family row; the summary
    named "AR, 2 captured steps" (17.5) and printed 1.369, where against HF it is 1.03."""
    walls = {"ppsd steps": 3 / 24.0, "ar steps": 3 / 17.5, "hf2": 3 / 23.3, "ar1": 3 / 12.0}
    report = report_of(walls)
    assert report["best_ppsd_and_fastest_ar"] == {"ppsd": "ppsd steps", "ar": "hf2", "ar_method": "hf"}
    assert report["best_ppsd_speedup_vs_fastest_ar"] == pytest.approx(24.0 / 23.3)
    line = next(line for line in pipeline.table(report).splitlines() if line.startswith("PPSD at its best"))
    assert line == ("PPSD at its best (ppsd steps, 24.0 tokens/s) over the fastest AR, HF generate() included "
                    "(hf2, 23.3 tokens/s) = 1.030")
