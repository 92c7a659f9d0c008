"""`bench-pipeline`'s summary, pure functions of its measured rows and its report: PPSD at its
best over the fastest AR, HF `generate()` included (whichever kinds they ran on), where AR's
time per token goes on a pipeline, and the terminal table. Nothing here runs a model or times."""

from __future__ import annotations

from typing import Protocol, Sequence

from ..generate import Result


class Row(Protocol):
    """What the summary reads of a benchmark row (`pipeline.Method`)."""

    label: str
    method: str
    clock: str


# The rows that decode one token at a time with the full model: ours and Hugging Face's `generate()`.
AR_FAMILY = ("ar", "hf")


def best_over_fastest(methods: Sequence[Row], speed: dict[str, float]) -> dict:
    """The summary's first line: PPSD at its best over the fastest AR-family row measured in
    this run (`AR_FAMILY`: HF `generate()` included, which once ran 23.3 tokens/s beside our
    fastest AR's 17.5), whichever kinds each ran on (measured rows only: a projected clock is no
    run), with both rows named and the fastest AR's method ("ar" or "hf") said."""
    measured = [m for m in methods if m.clock == "measured"]
    best = max((m.label for m in measured if m.method == "ppsd"), key=speed.__getitem__)
    fastest = max((m for m in measured if m.method in AR_FAMILY), key=lambda m: speed[m.label])
    return {"best_ppsd_speedup_vs_fastest_ar": speed[best] / speed[fastest.label],
            "best_ppsd_and_fastest_ar": {"ppsd": best, "ar": fastest.label, "ar_method": fastest.method}}


def overhead(results: list[Result]) -> dict[str, float]:
    """Where AR's time per generated token goes on a pipeline, from its measured traces (ms per
    token, prefill left out): the stages' own compute, the hand-overs (from stage k's end to
    stage k+1's start: a message and a wake-up), and the returns (from the last stage's end to
    stage 1's next start: the logits back, the decoder's pick, commit and the next call). AR runs
    one stage at a time, so the three add up to its wall time per token."""
    totals = {"compute": 0.0, "hand_over": 0.0, "return": 0.0}
    tokens = 0
    for result in results:
        events = sorted((e for e in result.trace.events if e.kind != "prefill"), key=lambda e: e.start)
        last = result.trace.num_stages
        tokens += sum(e.stage == last for e in events)
        totals["compute"] += sum(e.end - e.start for e in events)
        for before, after in zip(events, events[1:]):
            gap = max(0.0, after.start - before.end)
            totals["hand_over" if after.stage == before.stage + 1 else "return"] += gap
    return {k: 1e3 * v / tokens for k, v in totals.items()} if tokens else {}


def table(report: dict) -> str:
    """The terminal summary of a report: every row's speed, then the ratios, the fastest of every row first."""
    lines = [f"{'method':<34} {'tokens/s':>9}  (median of {report['repeats']}, measured wall clock"
             f" unless said, {report['device']})"]
    lines += [f"{label:<34} {speed:>9.1f}" for label, speed in report["tokens_per_second"].items()]
    best, fastest = report["best_ppsd_and_fastest_ar"]["ppsd"], report["best_ppsd_and_fastest_ar"]["ar"]
    lines += [
        f"PPSD at its best ({best}, {report['tokens_per_second'][best]:.1f} tokens/s) over the fastest AR, "
        f"HF generate() included ({fastest}, {report['tokens_per_second'][fastest]:.1f} tokens/s) = "
        f"{report['best_ppsd_speedup_vs_fastest_ar']:.3f}",
        f"PPSD acceptance a = {report['ppsd_acceptance_rate']:.3f}; ideal S_PPSD(a, s) = 1 / (1 - a (1 - s)) = "
        f"{report['ideal_ppsd_speedup']:.3f} (K={report['stages']}, s = slowest stage's share of the layers = "
        f"{report['ppsd_slot_fraction']:.3f})",
        f"PPSD measured speedup over pipeline AR = {report['measured_ppsd_speedup_vs_pipeline_ar']:.3f} "
        f"-> {report['measured_over_ideal']:.3f} of ideal",
        f"PPSD over best single-process AR = {report['ppsd_speedup_vs_best_single_process_ar']:.3f}; "
        f"over 1-thread AR = {report['ppsd_speedup_vs_single_process_ar_1_thread']:.3f}",
        f"on threads in 1 process: PPSD over its AR = {report['measured_ppsd_speedup_vs_threads_ar']:.3f}, over "
        f"best single-process AR = {report['ppsd_threads_speedup_vs_best_single_process_ar']:.3f}",
        "pipeline AR / 1-thread AR (overhead; 1.0 is none): processes "
        f"{report['pipeline_ar_over_ar_1_thread']['processes']:.3f}, threads "
        f"{report['pipeline_ar_over_ar_1_thread']['threads']:.3f}",
        f"AR 2 threads / 1 thread T = {report['ar_two_thread_gain_T']:.3f}; best single process: "
        f"{report['best_single_process']}",
        f"break-even acceptance a* (ideal S_PPSD(a*, s) = best single process / pipeline AR) = "
        f"{report['break_even_acceptance']:.3f} "
        f"({'reached' if report['ppsd_acceptance_rate'] >= report['break_even_acceptance'] else 'NOT reached'} "
        f"at a = {report['ppsd_acceptance_rate']:.3f})",
        "PPSD stage utilization (measured) = " + ", ".join(f"{u:.2f}" for u in report["ppsd_stage_utilization_measured"]),
        *(f"{label}: ms per token = " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
          for label, parts in report["ar_ms_per_token"].items()),
        f"load average before {report['loadavg_before'][0]:.2f}, after {report['loadavg_after'][0]:.2f} "
        f"on {report['cpus']} CPUs",
    ]
    return "\n".join(lines)

