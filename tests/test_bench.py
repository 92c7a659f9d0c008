"""The benchmark suite: the speedup math on hand-made runs with known timings, the sweep, the
timing helper, the report writers, and `python -m ppsd bench` end to end on a tiny model.
Speed itself is never asserted: only the arithmetic on times that the test wrote."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import pytest

from ppsd import DecodeConfig, Draft, Event, Result, Token, Trace
from ppsd.bench import prompts as bench_prompts
from ppsd.bench import report as bench_report
from ppsd.bench.baselines import same_output
from ppsd.bench.prompts import load_prompts, spread
from ppsd.bench.rows import central_point, make_row
from ppsd.bench.run import Run, repeat
from ppsd.bench.stats import Cell, cell_from_results, speed
from ppsd.bench.settings import Setting, sweep
from ppsd.cli import main
from ppsd.config import stage_layers
from ppsd.metrics import ideal_ppsd_speedup_slowest_stage, slot_fraction

STAGES = (range(0, 1), range(1, 2))  # a 2-layer model, E = 1, K = 2: every stage takes 1 s below


def _scaled(events, scale):
    return tuple(replace(e, start=e.start * scale, end=e.end * scale) for e in events)


def ar_run(scale: float = 1.0, partition: tuple[range, ...] = STAGES) -> Result:
    """AR, prompt of 1 token, 3 new tokens: each token passes stage 1 then stage 2, 6 s in all."""
    events = (Event(1, 0, "prefill", 0, 1, 5), Event(2, 0, "prefill", 1, 2, 5),
              Event(1, 1, "verify", 2, 3, 11, from_final=True), Event(2, 1, "verify", 3, 4, 11),
              Event(1, 2, "verify", 4, 5, 12, from_final=True), Event(2, 2, "verify", 5, 6, 12))
    tokens = (Token(1, 11, "verified"), Token(2, 12, "verified"), Token(3, 13, "verified"))
    trace = Trace(_scaled(events, scale), partition, prompt_len=1, length=4, clock="measured").validate()
    config = DecodeConfig(method="ar", exit_layer=partition[1].start, num_stages=2, max_new_tokens=3)
    config = config.resolved(partition[1].stop)
    return Result((5,), tokens, (), trace, config, 6.0 * scale)


def ppsd_run(scale: float = 1.0, partition: tuple[range, ...] = STAGES) -> Result:
    """PPSD on the same work, both drafts accepted. Run in turn it also takes 6 s; on 2 workers
    stage 1 drafts position 2 while stage 2 verifies position 1, so the projection takes 5 s."""
    events = (Event(1, 0, "prefill", 0, 1, 5), Event(2, 0, "prefill", 1, 2, 5),
              Event(1, 1, "draft", 2, 3, 11, slot=0, from_final=True),
              Event(2, 1, "verify", 3, 4, 11, slot=1, decision="accepted"),
              Event(1, 2, "draft", 4, 5, 12, slot=1),
              Event(2, 2, "verify", 5, 6, 12, slot=2, decision="accepted"))
    tokens = (Token(1, 11, "verified"), Token(2, 12, "accepted", 12), Token(3, 13, "accepted", 13))
    drafts = (Draft(2, 12, "accepted"), Draft(3, 13, "accepted"))
    trace = Trace(_scaled(events, scale), partition, prompt_len=1, length=4, clock="measured").validate()
    config = DecodeConfig(method="ppsd", exit_layer=partition[1].start, num_stages=2, max_new_tokens=3)
    config = config.resolved(partition[1].stop)
    return Result((5,), tokens, drafts, trace, config, 6.0 * scale)


def test_hand_made_runs_give_the_expected_speedups():
    # Three paired rounds; the middle round ran slower for both, the last faster.
    ar = cell_from_results("p", "code", [ar_run(s) for s in (1.0, 2.0, 0.5)])
    pp = cell_from_results("p", "code", [ppsd_run(s) for s in (1.0, 1.5, 0.5)])
    assert ar.walls == (6.0, 12.0, 3.0) and ar.projected_walls == pytest.approx((6.0, 12.0, 3.0))
    assert pp.projected_walls == pytest.approx((5.0, 7.5, 2.5))
    row = make_row(Setting("ppsd", 1, 2, 0.0), [pp], [ar], num_layers=2)
    assert row["tokens"] == 3 and row["acceptance_rate"] == 1.0 and row["accepted"] == 2
    assert row["tokens_per_second"] == pytest.approx(3 / 6)  # median of 6, 9, 3 s
    assert row["speedup_measured"] == pytest.approx(6 / 6)
    assert row["speedup_projected"] == pytest.approx(6 / 5)
    assert row["speedup_measured_min"] == pytest.approx(1.0)  # rounds: 6/6, 12/9, 3/3
    assert row["speedup_measured_max"] == pytest.approx(12 / 9)
    assert (row["speedup_projected_min"], row["speedup_projected_max"]) == pytest.approx((1.2, 1.6))
    assert row["ideal_ppsd_speedup"] == pytest.approx(2.0)  # 1 / (1 - a (1 - E/L)), a = 1, E/L = 1/2
    assert row["ideal_eesd_speedup"] == pytest.approx(5 / 2.5)  # tau = g + 1 = 5 over g E/L + 1 - E/L
    assert row["efficiency"] == pytest.approx(1.2 / 2.0) and row["efficiency_clock"] == "projected"
    assert row["stage_utilization"] == pytest.approx([3 / 5, 3 / 5])
    assert row["bubble_fraction"] == pytest.approx(0.4)
    assert row["by_category"]["code"]["speedup_projected"] == pytest.approx(1.2)
    ar_row = make_row(Setting("ar", 1, 2, 0.0), [ar], [ar], num_layers=2)
    assert ar_row["speedup_measured"] == 1.0 and ar_row["bubble_fraction"] == pytest.approx(0.5)


def test_speeds_sum_prompts_and_keep_the_spread():
    cells = [Cell("a", "code", 10, 0, 0, 0, 0, (1.0, 2.0, 4.0), (1.0, 1.0, 1.0), (1.0,), ()),
             Cell("b", "prose", 30, 0, 0, 0, 0, (3.0, 1.0, 2.0), (1.0, 1.0, 1.0), (1.0,), ())]
    s = speed(cells)
    assert (s.tokens, s.median, s.low, s.high) == (40, 40 / 4.0, 40 / 7.0, 40 / 2.0)


@pytest.mark.parametrize("a,fraction,expected", [(0.0, 0.25, 1.0), (1.0, 0.25, 4.0), (0.8, 0.25, 2.5),
                                                 (0.5, 0.5, 1 / 0.75)])
def test_ideal_ppsd_matches_the_spec(a, fraction, expected):
    assert ideal_ppsd_speedup_slowest_stage(a, fraction) == pytest.approx(expected)


UNEVEN = (range(0, 2), range(2, 3))  # L = 3, E = 2, K = 2: stage 1 is the slot, s = 2/3, not 1/K


def test_the_bench_bench_pipeline_and_the_run_quote_one_ideal():
    """`bench` (stats, rows), `bench-pipeline` (its report and table) and the run's own metrics
    (the page's headline and plot) all take S_PPSD at the partition's slot, here 2/3 of the layers."""
    from types import SimpleNamespace

    from ppsd.bench import pipeline

    ar, pp = [ar_run(s, UNEVEN) for s in (1.0, 2.0)], [ppsd_run(s, UNEVEN) for s in (1.0, 1.5)]
    expected = 1 / (1 - 1.0 * (1 - 2 / 3))  # a = 1; equal stages (s = 1/K) would claim 2.0
    assert pp[0].metrics().ideal_speedup == pytest.approx(expected) and pp[0].metrics().slot_fraction == 2 / 3
    row = make_row(Setting("ppsd", 2, 2, 0.0), [cell_from_results("p", "code", pp)],
                   [cell_from_results("p", "code", ar)], num_layers=3)
    assert row["ideal_ppsd_speedup"] == pytest.approx(expected) and row["slot_fraction"] == pytest.approx(2 / 3)

    methods = [pipeline.Method(label, method, executor, threads) for label, method, executor, threads in (
        ("ar1", "ar", "in-process", 1), ("ar2", "ar", "in-process", 2), ("hf", "hf", "in-process", 1),
        ("hf2", "hf", "in-process", 2), ("ar pipe", "ar", "processes", 1), ("ppsd pipe", "ppsd", "processes", 1),
        ("ar threads", "ar", "threads", 1), ("ppsd threads", "ppsd", "threads", 1))]
    walls = {(m.label, 0): [6.0, 12.0] for m in methods} | {("ppsd pipe", 0): [5.0, 7.5], ("hf2", 0): [4.0, 5.0],
                                                          ("ar threads", 0): [10.0, 12.0]}
    args = SimpleNamespace(new_tokens=3, device="cpu", threads_per_worker=1, repeats=2, warmup=0)
    report = pipeline._report(args, pp[0].config, methods, [[5]], pipeline.Measured(walls, {"ar pipe": ar,
                                                                                          "ppsd pipe": pp}),
                              "hand-made", (0.0, 0.0, 0.0), 0.0)
    assert report["ideal_ppsd_speedup"] == pytest.approx(expected) and report["ppsd_slot_fraction"] == 2 / 3
    assert report["measured_ppsd_speedup_vs_pipeline_ar"] == pytest.approx(9.0 / 6.25)  # median walls
    assert "= 1.500 (K=2, s = slowest stage's share of the layers = 0.667)" in pipeline.table(report)
    # The best single process is the fastest of AR and HF generate() on 1 or 2 threads (here HF on
    # 2, 4.5 s), and a* is where the ideal over the pipeline's AR (9 s) reaches it: 2x, a* = 1.5.
    assert report["best_single_process"] == "hf2"
    assert report["ppsd_speedup_vs_best_single_process_ar"] == pytest.approx(4.5 / 6.25)
    assert report["break_even_acceptance"] == pytest.approx(1.5)
    # the overhead each pipeline puts on plain AR: its AR over 1-thread single-process AR (9 s)
    assert report["pipeline_ar_over_ar_1_thread"] == {"processes": pytest.approx(1.0), "threads": pytest.approx(9 / 11)}
    assert report["measured_ppsd_speedup_vs_threads_ar"] == pytest.approx(11 / 9)


def test_ar_time_per_token_splits_into_compute_hand_overs_and_returns():
    """AR runs one stage at a time: its measured trace splits each token's time into the stages'
    compute, the hand-over between stages and the return to stage 1 (prefill left out)."""
    from types import SimpleNamespace

    from ppsd import Event
    from ppsd.bench.pipeline_summary import overhead

    events = [Event(1, 0, "prefill", 0.0, 0.5, 1), Event(2, 0, "prefill", 0.6, 1.0, 1),
              Event(1, 3, "verify", 1.2, 2.2, 5), Event(2, 3, "verify", 2.7, 4.2, 5),  # hand-over 0.5
              Event(1, 4, "verify", 4.4, 5.2, 6), Event(2, 4, "verify", 5.3, 6.2, 6)]  # return 0.2, hand-over 0.1
    run = SimpleNamespace(trace=SimpleNamespace(events=events, num_stages=2))
    parts = overhead([run])
    assert parts == {"compute": pytest.approx(2100.0), "hand_over": pytest.approx(300.0),
                     "return": pytest.approx(100.0)}  # ms per token, 2 tokens
    assert overhead([]) == {}


@pytest.mark.parametrize("target,fraction", [(1.2, 0.5), (1.5, 0.6), (2.0, 0.25), (0.9, 0.5)])
def test_break_even_acceptance_is_the_ideals_inverse(target, fraction):
    from ppsd.metrics import break_even_acceptance

    a = break_even_acceptance(target, fraction)
    assert ideal_ppsd_speedup_slowest_stage(a, fraction) == pytest.approx(max(target, 1.0))


# (L, E, K) -> layers of the slowest stage / L: it sets the slot, whichever stage it is.
@pytest.mark.parametrize("layers,exit_layer,num_stages,expected", [(8, 4, 2, 4 / 8), (8, 2, 4, 2 / 8), (8, 6, 2, 6 / 8),
                                                               (8, 2, 2, 6 / 8), (8, 3, 3, 3 / 8), (8, 1, 8, 1 / 8)])
def test_slot_is_the_slowest_stage(layers, exit_layer, num_stages, expected):
    assert slot_fraction(stage_layers(layers, exit_layer, num_stages)) == pytest.approx(expected)


def test_repeat_drops_warmup_runs():
    calls, ticks = [], []
    kept = repeat(lambda: calls.append(len(calls)) or len(calls), warmup=2, repeats=3,
                  tick=lambda: ticks.append(1))
    assert kept == [3, 4, 5] and len(ticks) == 5


# (stages, exit layers, draft lens) -> the groups expected for L = 8 at one temperature.
SWEEPS = [
    ((2,), None, (4,), [["ar E=4 K=2", "ppsd E=4 K=2", "eesd E=4 K=2 g=4"]]),
    ((2, 4), None, (2, 4), [["ar E=2 K=4", "ppsd E=2 K=4", "eesd E=2 K=4 g=2", "eesd E=2 K=4 g=4"],
                            ["ar E=4 K=2", "ppsd E=4 K=2", "eesd E=4 K=2 g=2", "eesd E=4 K=2 g=4"]]),
    # EESD once per E, in the group of the smallest K; E=6 K=4 does not fit (2 layers, 3 stages).
    ((2, 4), (6,), (1,), [["ar E=6 K=2", "ppsd E=6 K=2", "eesd E=6 K=2 g=1"]]),
    ((2, 3), (2,), (3,), [["ar E=2 K=2", "ppsd E=2 K=2", "eesd E=2 K=2 g=3"], ["ar E=2 K=3", "ppsd E=2 K=3"]]),
    ((9,), None, (4,), []),
]


@pytest.mark.parametrize("num_stages,exits,draft_lens,expected", SWEEPS)
def test_sweep_groups_settings_under_their_baseline(num_stages, exits, draft_lens, expected):
    groups = sweep(8, num_stages=num_stages, draft_lens=draft_lens, temperatures=[0.0], exit_layers=exits)
    assert [[s.label.removesuffix(" T=0") for s in g] for g in groups] == expected
    assert all(s.baseline() == g[0] for g in groups for s in g)


def test_same_output_compares_before_our_first_eos():
    assert same_output([1, 2, 9, 4], [1, 2, 3, 3], eos=(9,))
    assert not same_output([1, 2, 9, 4], [1, 3, 3, 3], eos=(9,))
    assert same_output([1, 2], [1, 2], eos=())


def test_prompts_fall_back_and_reject_bad_files(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_prompts, "PROMPTS_FILE", tmp_path / "missing.json")
    prompts, source = load_prompts(None)
    assert "fallback" in source and {p["category"] for p in prompts} == {"code", "prose", "math"}
    assert [p["category"] for p in spread(prompts, 3)] == ["code", "prose", "math"]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"name": "x"}]')
    with pytest.raises(ValueError, match="name.*category.*prompt"):
        load_prompts(str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        load_prompts(str(tmp_path / "nope.json"))


def _row(method, e, t, measured, projected, g=None):
    return {"method": method, "exit_layer": e, "temperature": t, "label": f"{method} {e} {g}",
            "speedup_measured": measured, "speedup_projected": projected}


def test_central_point_states_what_the_data_say():
    rows = [_row("eesd", 4, 0.0, 0.8, 0.9, 4), _row("eesd", 4, 0.0, 1.1, 1.1, 2), _row("ppsd", 4, 0.0, 0.7, 1.3),
            _row("eesd", 2, 0.0, 1.2, 1.2, 4), _row("ppsd", 2, 0.0, 0.6, 0.95)]
    found = {c["exit_layer"]: c for c in central_point(rows)}
    assert found[4]["supports_paper"] and found[4]["eesd_speedup_measured"] == 0.8
    assert not found[2]["supports_paper"] and not found[2]["eesd_below_1"] and not found[2]["ppsd_at_least_1"]
    assert "disagrees" in found[2]["verdict"] and "shows the paper's point" in found[4]["verdict"]


def test_ctrl_c_keeps_finished_groups(saved_model, tmp_path, monkeypatch, capsys):
    measure = Run.measure

    def interrupted_after_one(self, group):
        if self.cells:
            raise KeyboardInterrupt
        measure(self, group)

    monkeypatch.setattr(Run, "measure", interrupted_after_one)
    status = main(["bench", "--model", saved_model, "--quick", "--json", "--out", str(tmp_path),
                   "--repeats", "1", "--warmup", "0", "--max-new-tokens", "4", "--stages", "2", "--temperatures", "0",
                   "0.8", "--hf-early-exit"])
    report = json.loads(capsys.readouterr().out)
    assert status == 130 and report["interrupted"]
    assert [r["label"] for r in report["results"]] == ["ar E=4 K=2 T=0", "ppsd E=4 K=2 T=0", "eesd E=4 K=2 g=4 T=0"]
    assert report["results"][2]["matches_hf"] is True  # flags override --quick's choices, this one too
    assert json.loads((tmp_path / "bench.json").read_text())["results"] == report["results"]


ROW_FIELDS = {"method", "exit_layer", "stages", "draft_len", "temperature", "acceptance_rate", "tokens_per_second",
              "speedup_measured", "speedup_projected", "ideal_ppsd_speedup", "ideal_eesd_speedup", "efficiency",
              "bubble_fraction", "wasted_stage_slots", "distributed", "tokens_per_second_min",
              "tokens_per_second_max"}


def test_bench_reports_that_cannot_be_written_after_measuring_are_one_line_and_no_empty_file(saved_model, tmp_path,
                                                                                              capsys):
    """The --out folder passes the check before measuring; a report file that cannot be written
    after it (here a folder stands where bench.md goes) is one error line, exit 1, and no empty or
    partial file is left; the table is still printed."""
    (tmp_path / "bench.md").mkdir()
    status = main(["bench", "--model", saved_model, "--quick", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert status == 1
    assert [line for line in captured.err.splitlines() if line.startswith("error:")] == [
        line for line in captured.err.splitlines()[-1:]] and "bench.md" in captured.err.splitlines()[-1]
    assert "ar E=4 K=2 T=0" in captured.out  # the measured table still printed
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".part") or (p.is_file() and p.stat().st_size == 0)]


# What --quick may schedule, counted from its plan (never timed): raise these only with a newly
# measured cost in docs/benchmarks.md and --quick's help (it took 11 minutes when it had grown).
QUICK_DECODES, QUICK_TOKENS = 10, 16


def test_bench_quick_is_a_small_smoke_check(saved_model, tmp_path, capsys):
    status = main(["bench", "--model", saved_model, "--quick", "--json", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert status == 0 and not report["interrupted"]
    assert captured.err.startswith("bench: loading the model")  # said before the load, not after it
    m, b, rows = report["method"], report["baselines"], report["results"]
    assert m["quick"] and not m["hf_early_exit"] and len(m["prompts"]) == 1
    assert [r["label"] for r in rows] == ["ar E=4 K=2 T=0", "ppsd E=4 K=2 T=0", "eesd E=4 K=2 g=4 T=0"]
    # The check it exists for: every decoder's greedy tokens are HF generate()'s.
    assert b["ar_matches_hf_generate"] is True
    assert b["greedy_matches_hf_generate"] is True and b["hf_generate_settings_checked"] == 3
    assert all(r["matches_hf_generate"] is True and r["matches_hf"] is None and r["distributed"] is None
               for r in rows)
    assert b["eesd_hf_settings_checked"] == 0 and "HF assistant_early_exit: not run" in captured.err
    # Per round: our AR and HF generate(), then each setting once (HF's early exit is off, K-worker reruns too).
    decodes = (m["warmup"] + m["repeats"]) * len(m["prompts"]) * (2 + len(rows))
    assert decodes <= QUICK_DECODES and m["max_new_tokens"] <= QUICK_TOKENS
    assert "--quick (a smoke check)" in captured.err
    assert "--quick" in (tmp_path / "bench.md").read_text() and "--quick" in (tmp_path / "bench.html").read_text()
    assert json.loads((tmp_path / "bench.json").read_text())["method"]["quick"] is True
    with open(tmp_path / "bench.csv") as f:
        assert [r["matches_hf_generate"] for r in csv.DictReader(f)] == ["True"] * 3


def test_bench_sweep_on_a_tiny_model(saved_model, tmp_path, capsys):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"name": "a", "category": "code", "prompt": "def f(x):"},
                                   {"name": "b", "category": "prose", "prompt": "The quick brown fox"}]))
    out = tmp_path / "out"
    status = main(["bench", "--model", saved_model, "--json", "--out", str(out), "--prompts", str(prompts),
                   "--no-chat", "--distributed", "off", "--repeats", "2", "--warmup", "1", "--max-new-tokens", "6",
                   "--exit-layers", "4", "--stages", "2", "4", "--draft-lens", "4", "--temperatures", "0", "0.8"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert status == 0 and not report["interrupted"]
    assert not report["method"]["quick"] and report["method"]["hf_early_exit"]
    assert "--no-chat" in report["method"]["command"] and "--quick" not in captured.err
    assert {"cpu", "cores", "torch_threads", "torch", "transformers", "device", "dtype"} <= report["machine"].keys()
    assert len(report["model"]["weights_sha256"]) == 64 and report["model"]["num_layers"] == 8
    b = report["baselines"]
    assert b["ar_tokens_per_second"] > 0 and b["hf_generate_tokens_per_second"] > 0
    assert b["ar_vs_hf_speed_ratio"] == pytest.approx(b["ar_tokens_per_second"] / b["hf_generate_tokens_per_second"])
    assert b["eesd_matches_hf_assistant_early_exit"] is True and b["eesd_hf_settings_checked"] == 1
    assert b["ar_matches_hf_generate"] is True
    rows = report["results"]
    assert len(rows) == 2 * (3 + 2)  # 2 temperatures x (AR, PPSD, EESD g=4 at K=2; AR, PPSD at K=4)
    assert b["greedy_matches_hf_generate"] is True and b["hf_generate_settings_checked"] == 5
    for row in rows:
        assert ROW_FIELDS <= row.keys()
        assert row["tokens"] == 6 * 2 and row["repeats"] == 2 and row["distributed"] is None
        assert row["matches_hf_generate"] is (True if row["temperature"] == 0.0 else None)
        if row["method"] == "ar":
            assert row["speedup_measured"] == 1.0 and row["acceptance_rate"] is None
        else:
            assert 0.0 <= row["acceptance_rate"] <= 1.0 and row["speedup_projected"] > 0
    greedy_eesd = [r for r in rows if r["method"] == "eesd" and r["temperature"] == 0.0]
    assert all(r["matches_hf"] is True and r["hf_tokens_per_second"] > 0 for r in greedy_eesd)
    assert "x AR meas" in captured.err  # the table goes to stderr when stdout carries JSON
    with open(out / "bench.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert json.loads((out / "bench.json").read_text())["results"] == rows
    page = (out / "bench.html").read_text()
    assert "Speedup over AR against acceptance rate" in page and "ideal S_PPSD" in page
    assert "| setting |" in (out / "bench.md").read_text()


def test_bad_settings_fail_before_timing(saved_model, tmp_path, capsys):
    assert main(["bench", "--model", saved_model, "--out", str(tmp_path), "--stages", "9"]) == 2
    assert "stages K=9 is out of range: 2 <= K <= 8 (layers)" in capsys.readouterr().err  # refused, not skipped
    assert main(["bench", "--model", saved_model, "--out", str(tmp_path), "--stages", "8", "--exit-layers", "7"]) == 2
    assert "no valid (exit layer, stages) pair for a 8-layer model" in capsys.readouterr().err
    assert main(["bench", "--model", saved_model, "--out", str(tmp_path), "--temperatures", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


def test_csv_flattens_rows():
    row = make_row(Setting("ppsd", 1, 2, 0.0), [cell_from_results("p", "c", [ppsd_run()])],
                   [cell_from_results("p", "c", [ar_run()])], num_layers=2)
    text = bench_report.to_csv({"results": [row]})
    parsed = next(csv.DictReader(io.StringIO(text)))
    assert parsed["stage_utilization"] == "0.600 0.600" and float(parsed["speedup_projected"]) == pytest.approx(1.2)
