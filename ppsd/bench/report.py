"""Writers for a benchmark report (the dict `run.Run.report` builds): terminal table, JSON, CSV,
Markdown and Plotly HTML. Pure functions of the report; nothing here runs a model or times."""

from __future__ import annotations

import csv
import io
import json
import math

from ..config import stage_layers
from ..metrics import ideal_eesd_speedup, ideal_ppsd_speedup_slowest_stage, slot_fraction

CSV_COLUMNS = (
    "method", "exit_layer", "stages", "draft_len", "temperature", "prompts", "tokens", "repeats",
    "acceptance_rate", "accepted", "rejected", "flushed",
    "tokens_per_second", "tokens_per_second_min", "tokens_per_second_max", "ar_tokens_per_second",
    "speedup_measured", "speedup_measured_min", "speedup_measured_max", "projected_tokens_per_second",
    "ar_projected_tokens_per_second", "speedup_projected", "speedup_projected_min", "speedup_projected_max",
    "speedup_measured_distributed", "ideal_speedup", "ideal_ppsd_speedup", "ideal_eesd_speedup",
    "ideal_eesd_draft_len", "efficiency", "efficiency_clock", "bubble_fraction", "stage_utilization",
    "wasted_stage_slots", "hf_tokens_per_second", "matches_hf", "matches_hf_generate",
)
# Columns of the terminal and Markdown tables: (header, row key, format).
TABLE = (
    ("setting", "label", "{}"), ("accept", "acceptance_rate", "{:.2f}"),
    ("tok/s", "tokens_per_second", "{:.1f}"), ("x AR meas", "speedup_measured", "{:.2f}"),
    ("meas range", None, "speedup_measured"), ("x AR proj", "speedup_projected", "{:.2f}"),
    ("proj range", None, "speedup_projected"), ("x AR K-proc", "speedup_measured_distributed", "{:.2f}"),
    ("ideal", "ideal_speedup", "{:.2f}"), ("/ideal", "efficiency", "{:.2f}"),
    ("bubble", "bubble_fraction", "{:.2f}"), ("wasted", "wasted_stage_slots", "{}"),
    ("HF tok/s", "hf_tokens_per_second", "{:.1f}"), ("=HF", "matches_hf", "{}"),
)


def finite(value):
    """The report with NaN and infinities replaced by None, so it is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _cells(row: dict) -> list[str]:
    out = []
    for _, key, fmt in TABLE:
        if key is None:  # the spread over paired rounds of the speedup named in `fmt`
            out.append(f"{row[fmt + '_min']:.2f}-{row[fmt + '_max']:.2f}")
        else:
            value = row.get(key)
            out.append("-" if value is None else fmt.format(value))
    return out


def _baseline_lines(report: dict) -> list[str]:
    b = report["baselines"]
    lines = []
    if "ar_tokens_per_second" in b:
        lines.append(f"AR {b['ar_tokens_per_second']:.1f} tok/s vs HF generate() {b['hf_generate_tokens_per_second']:.1f} "
                     f"tok/s: ratio {b['ar_vs_hf_speed_ratio']:.3f} (>= 0.95 required: "
                     f"{'ok' if b['ar_within_5_percent_or_faster'] else 'FAILS'}); "
                     f"same tokens: {b['ar_matches_hf_generate']}")
    lines.append(f"Our decoders == HF generate() (greedy, {b.get('hf_generate_settings_checked', 0)} settings): "
                 f"{b.get('greedy_matches_hf_generate')}")
    if report["method"]["hf_early_exit"]:
        lines.append(f"EESD == HF assistant_early_exit (greedy, {b.get('eesd_hf_settings_checked', 0)} settings): "
                     f"{b.get('eesd_matches_hf_assistant_early_exit')}")
    else:
        lines.append("HF assistant_early_exit: not run (--quick leaves it out)")
    return lines


def _central_lines(report: dict) -> list[str]:
    lines = []
    for c in report["central_point"]:
        lines.append(f"E={c['exit_layer']} T={c['temperature']:g}: worst EESD {c['eesd_speedup_measured']:.2f}x "
                     f"measured ({c['eesd_worst']}), worst PPSD {c['ppsd_speedup_projected']:.2f}x projected "
                     f"({c['ppsd_worst']}): {c['verdict']}")
    return lines


def table(report: dict) -> str:
    """A fixed-width table for the terminal, with the baselines and the central point below it."""
    rows = [[h for h, _, _ in TABLE]] + [_cells(r) for r in report["results"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    m = report["machine"]
    head = (f"{'--quick (a smoke check): ' if report['method']['quick'] else ''}"
            f"{report['model']['name']} on {m['device']} ({m['dtype']}), {m['cpu']}, {m['torch_threads']} threads; "
            f"{report['method']['repeats']} repeats after {report['method']['warmup']} warm-up, "
            f"{report['method']['max_new_tokens']} tokens; meas = measured on one device, proj = projected on K workers")
    tail = _baseline_lines(report) + _central_lines(report)
    if report.get("interrupted"):
        tail.append("INTERRUPTED: only the settings finished so far are shown")
    return "\n".join([head, ""] + lines + [""] + tail)


def to_csv(report: dict) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in finite(report["results"]):
        row = dict(row, stage_utilization=" ".join(f"{u:.3f}" for u in row["stage_utilization"] or []))
        writer.writerow(row)
    return buffer.getvalue()


def markdown(report: dict) -> str:
    """The results as Markdown: machine, baselines, the table, the central point."""
    m, meth = report["machine"], report["method"]
    header = "| " + " | ".join(h for h, _, _ in TABLE) + " |"
    rule = "|" + "|".join("---" for _ in TABLE) + "|"
    body = ["| " + " | ".join(_cells(r)) + " |" for r in report["results"]]
    return "\n".join([
        f"Command: `{meth['command']}`", "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m['cores_available']} available), {m['torch_threads']} torch "
        f"threads, device {m['device']}{' (' + m['gpu'] + ')' if m.get('gpu') else ''}, dtype {m['dtype']}, torch "
        f"{m['torch']}, transformers {m['transformers']}, load average at start "
        f"{', '.join(f'{x:.1f}' for x in m['load_average_at_start'] or [])}, {m['date_utc']}.", "",
        f"Model: {report['model']['name']} ({report['model']['num_layers']} layers, weights sha256 "
        f"{(report['model'].get('weights_sha256') or 'n/a')[:16]}). Prompts: "
        f"{', '.join(p['name'] + ' (' + p['category'] + ')' for p in meth['prompts'])} from {meth['prompts_source']}. "
        f"{meth['max_new_tokens']} tokens per run, {meth['repeats']} timed repeats after {meth['warmup']} warm-up.", "",
        *[f"- {line}" for line in _baseline_lines(report)], "",
        header, rule, *body, "",
        *[f"- {line}" for line in _central_lines(report)], "",
        *_category_table(report["results"]),
    ]) + "\n"


def _category_table(rows: list[dict]) -> list[str]:
    """Per task: acceptance rate and speedup (projected for PPSD, measured for EESD)."""
    rows = [r for r in rows if r["method"] != "ar"]
    categories = list(dict.fromkeys(c for r in rows for c in r["by_category"]))
    if not rows:
        return []
    lines = ["Per task: acceptance rate / speedup over AR (PPSD projected, EESD measured).", "",
             "| setting | " + " | ".join(categories) + " |", "|---|" + "---|" * len(categories)]
    for r in rows:
        key = "speedup_projected" if r["method"] == "ppsd" else "speedup_measured"
        cells = []
        for c in categories:
            v = r["by_category"].get(c)
            rate = "-" if v is None or v["acceptance_rate"] is None else f"{v['acceptance_rate']:.2f}"
            cells.append("-" if v is None else f"{rate} / {v[key]:.2f}x")
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return lines


def figures(report: dict) -> list:
    """(1) speedup against acceptance with the ideal curves, (2) speedup per exit layer and stages."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = report["results"]
    layers = report["model"]["num_layers"]
    grid = [i / 100 for i in range(101)]
    fig = go.Figure()
    for e, k in sorted({(r["exit_layer"], r["stages"]) for r in rows if r["method"] == "ppsd"}):
        s = slot_fraction(stage_layers(layers, e, k))
        fig.add_trace(go.Scatter(x=grid, y=[ideal_ppsd_speedup_slowest_stage(a, s) for a in grid], mode="lines",
                                 line={"dash": "dash"},
                                 name=f"ideal S_PPSD, E={e} K={k} (slot {round(s * layers)}/{layers} layers)"))
    for e, g in sorted({(r["exit_layer"], r["draft_len"]) for r in rows if r["method"] == "eesd"}):
        fig.add_trace(go.Scatter(x=grid, y=[ideal_eesd_speedup(a, g, e / layers) for a in grid], mode="lines",
                                 line={"dash": "dot"}, name=f"ideal S_EESD, g={g}, E/L={e}/{layers}"))
    for method, key, clock in (("ppsd", "speedup_projected", "projected on K workers"),
                               ("ppsd", "speedup_measured_distributed", "measured on K worker processes"),
                               ("eesd", "speedup_measured", "measured, one device")):
        mine = [r for r in rows if r["method"] == method and r["acceptance_rate"] is not None
                and r.get(key) is not None]
        if not mine:
            continue
        fig.add_trace(go.Scatter(x=[r["acceptance_rate"] for r in mine], y=[r[key] for r in mine], mode="markers",
                                 marker={"size": 10, "symbol": {"speedup_projected": "circle", "speedup_measured":
                                                                "x"}.get(key, "diamond")},
                                 text=[r["label"] for r in mine], name=f"{method.upper()} ({clock})",
                                 hovertemplate="%{text}<br>a=%{x:.2f}<br>%{y:.2f}x<extra></extra>"))
    fig.add_hline(y=1.0, line={"color": "grey"})
    fig.update_layout(title="Speedup over AR against acceptance rate", xaxis_title="acceptance rate a",
                      yaxis_title="speedup over AR (x)", template="plotly_white", height=520)

    by = make_subplots(rows=1, cols=2, subplot_titles=("PPSD per (E, K): projected on K workers, and measured",
                                                       "EESD per (E, g): measured on one device"))
    for t in sorted({r["temperature"] for r in rows}):
        pp = [r for r in rows if r["method"] == "ppsd" and r["temperature"] == t]
        xs = [f"E={r['exit_layer']} K={r['stages']}" for r in pp]
        by.add_trace(go.Bar(x=xs, y=[r["speedup_projected"] for r in pp], name=f"PPSD projected, T={t:g}"), 1, 1)
        by.add_trace(go.Bar(x=xs, y=[r["speedup_measured"] for r in pp], name=f"PPSD measured one device, T={t:g}",
                            opacity=0.5), 1, 1)
        if any(r.get("speedup_measured_distributed") is not None for r in pp):
            by.add_trace(go.Bar(x=xs, y=[r.get("speedup_measured_distributed") for r in pp],
                                name=f"PPSD measured on K processes (vs AR on them), T={t:g}"), 1, 1)
        ee = [r for r in rows if r["method"] == "eesd" and r["temperature"] == t]
        by.add_trace(go.Bar(x=[f"E={r['exit_layer']} g={r['draft_len']}" for r in ee],
                            y=[r["speedup_measured"] for r in ee], name=f"EESD measured, T={t:g}"), 1, 2)
    by.add_hline(y=1.0, line={"color": "grey"})
    by.update_layout(title="Speedup over AR per exit layer, stage count and draft length", barmode="group",
                     yaxis_title="speedup over AR (x)", template="plotly_white", height=520)
    return [fig, by]


def html(report: dict, *, plotly_js: str = "embed") -> str:
    """One page with both figures; `plotly_js` "embed" works offline, "cdn" keeps the file small."""
    include = True if plotly_js == "embed" else "cdn"
    parts = [f.to_html(full_html=False, include_plotlyjs=include if i == 0 else False)
             for i, f in enumerate(figures(finite(report)))]
    m = report["machine"]
    note = (f"{report['model']['name']} on {m['device']} ({m['dtype']}), {m['cpu']}. Measured: wall time on one "
            f"device, stages in turn. Projected: the same measured stage work replayed on K concurrent workers. "
            f"Command: <code>{report['method']['command']}</code>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>PPSD benchmark</title></head>"
            f"<body style='font-family:sans-serif'><h1>PPSD benchmark</h1><p>{note}</p>"
            + "".join(parts) + "</body></html>")


def files(report: dict, *, plotly_js: str = "embed") -> dict[str, str]:
    """{file name: text}: bench.json, bench.csv, bench.md and bench.html of `report`."""
    return {"bench.json": json.dumps(finite(report), indent=1, allow_nan=False), "bench.csv": to_csv(report),
            "bench.md": markdown(report), "bench.html": html(report, plotly_js=plotly_js)}
