"""What a hostile recording costs the page's Open: `python tools/research/hostile_recordings.py
[--limit 30] [--memory-mb 3000]`, from the repository root.

Builds the uploads of issue 57, item 1, from a shipped recording (assets/runs/), each about 2 MB:
- `prompt-k30`: 10^6 prompt ids, K = 30 stages (E = 1), no events (a trace check that lists
  every missing position wrote K x 10^6 strings);
- `prompt-k256`: the same on a claimed 256-layer model, K = 256;
- `wide-flushed`: 10^6 prompt ids and 400 "flushed" events each as wide as the run allows (a
  dependency walk over every position of each).
and one that the page's own check of the settings lets through:
- `long-prompt`: a prompt of the page's 100,000 characters (four bytes each), 400,000 prompt ids,
  a claimed context of 2^24, K = 10, every run a sound prefill (the trace budget is what ends it).
Each is opened as the page opens an upload (`app.panels.recording.on_upload`, the view included)
in a child process of its own, under `--limit` seconds and an address-space cap of
`--memory-mb` (with `--library`, read by `ppsd.recording.loads` alone, without the page's check
of the settings); the child reports the open's seconds, its answer, and its peak RSS over what it
had before (`resource.getrusage`). Meanwhile a second thread of that child opens a shipped
recording, as another visitor would, and its seconds are reported too: the numbers
docs/app.md ("Recorded runs") quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPT_IDS = 10**6
WIDE_EVENTS = 400


def shipped_base() -> dict:
    path = sorted((ROOT / "assets" / "runs").glob("*processes*.json"))[0]
    return json.loads(path.read_text(encoding="utf-8"))


def _stage_layers(layers: int, exit_layer: int, stages: int) -> list[list[int]]:
    sys.path.insert(0, str(ROOT))
    from ppsd.config import stage_layers

    return [[r.start, r.stop] for r in stage_layers(layers, exit_layer, stages)]


def prompt_flood(stages: int) -> dict:
    """10^6 prompt ids, K stages at E = 1, every run's events, tokens and drafts left empty."""
    raw = shipped_base()
    layers = max(raw["model"]["num_layers"], stages)
    raw["model"].update(num_layers=layers, max_context=1 << 24)
    raw["prompt_ids"] = [0] * PROMPT_IDS
    raw["settings"].update(num_stages=stages, exit_layer=1)
    for r in raw["rounds"]:
        for run in r.values():
            run["config"].update(num_stages=stages, exit_layer=1)
            run.update(partition=_stage_layers(layers, 1, stages), events=[], tokens=[], drafts=[])
    return raw


def wide_flushed() -> dict:
    """10^6 prompt ids; round 1's AR run a sound prefill then 400 flushed events, each as wide as
    a run's positions allow, stage 1 and 2 in turn."""
    raw = prompt_flood(2)
    raw["settings"].update(exit_layer=18)
    for r in raw["rounds"]:
        for run in r.values():
            run["config"].update(exit_layer=18)
            run["partition"] = [[0, 18], [18, 30]]
    run = raw["rounds"][0]["ar"]
    n = len(raw["prompt_ids"])
    width = n + run["config"]["max_new_tokens"] + 65
    events = [[k, 0, "prefill", 0.001 * k, 0.001 * k + 0.0005, 0, n - 1, None, None, False, None] for k in (1, 2)]
    for i in range(WIDE_EVENTS):
        t = 0.01 + 1e-5 * i
        events.append([1 + i % 2, 0, "flushed", t, t + 5e-6, 0, width, None, None, False, None])
    run["events"] = events
    return raw


def long_prompt(stages: int = 10) -> dict:
    """The most the page's own check lets through: a prompt of 100,000 four-byte characters (the
    page's cap), as many prompt ids as its bytes could give (400,000), a claimed context of 2^24,
    K = 10 at E = 1, and every run a sound trace: each stage's prefill over the whole prompt."""
    raw = prompt_flood(stages)
    raw["settings"]["prompt"] = "\U0001F600" * 100_000
    n = 400_000
    raw["prompt_ids"] = [0] * n
    for r in raw["rounds"]:
        for run in r.values():
            run["events"] = [[k, 0, "prefill", 0.001 * k, 0.001 * k + 0.0005, 0, n - 1, None, None, False, None]
                             for k in range(1, stages + 1)]
    return raw


CASES = {"prompt-k30": lambda: prompt_flood(30), "prompt-k256": lambda: prompt_flood(256),
         "wide-flushed": wide_flushed, "long-prompt": long_prompt}


def child(path: str, limit_mb: int, library: bool) -> None:
    """Open `path` as the page does (`library`: with `ppsd.recording.loads` alone, no check of
    the page's), a shipped recording beside it; print one JSON line."""
    if limit_mb:
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb * 2**20, limit_mb * 2**20))
    sys.path.insert(0, str(ROOT))
    from app import replay, view
    from app.handlers import ordered
    from app.panels import Shows, recording as panel
    from ppsd.recording import BadRecording, loads

    shows = Shows(lambda snap: ordered(view.snapshot(snap)), lambda: ordered(view.idle()))
    shipped = next(iter(replay.shipped().values()))
    panel.on_shipped(shipped.name, shows)  # imports and first-use costs out of the numbers
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    other: dict = {}

    def visitor() -> None:
        time.sleep(0.2)
        began = time.perf_counter()
        out = panel.on_shipped(shipped.name, shows)
        other.update(seconds=time.perf_counter() - began, ok="recording-ok" in out[-1])

    beside = threading.Thread(target=visitor, daemon=True)
    beside.start()
    began = time.perf_counter()
    try:
        if library:
            try:
                loads(Path(path).read_bytes())
                said = "opened"
            except BadRecording as error:
                said = str(error)
        else:
            said = panel.on_upload(path, shows)[-1]
    except MemoryError:
        said = "MemoryError"
    seconds = time.perf_counter() - began
    beside.join(60)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(json.dumps({"seconds": round(seconds, 2), "peak_rss_growth_mb": round(grown, 1),
                      "said": said[-220:], "shipped_beside_s": round(other.get("seconds", -1), 2),
                      "shipped_ok": other.get("ok")}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=30.0, help="seconds each open may take")
    parser.add_argument("--memory-mb", type=int, default=3000, help="the child's address-space cap (0: none)")
    parser.add_argument("--library", action="store_true", help="read with ppsd.recording.loads alone")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("cases", nargs="*", default=list(CASES))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.library)
        return
    with tempfile.TemporaryDirectory() as folder:
        for name in args.cases:
            path = Path(folder) / f"{name}.json"
            path.write_text(json.dumps(CASES[name](), separators=(",", ":"), ensure_ascii=False), encoding="utf-8")
            size = path.stat().st_size / 1e6
            began = time.perf_counter()
            try:
                done = subprocess.run([sys.executable, __file__, "--child", str(path), str(args.memory_mb),
                                       *(["--library"] if args.library else [])],
                                      capture_output=True, text=True, timeout=args.limit, cwd=ROOT)
                lines = done.stdout.strip().splitlines()
                result = lines[-1] if lines else f"no answer (exit {done.returncode}): {done.stderr[-300:]}"
            except subprocess.TimeoutExpired:
                result = f"still parsing after {args.limit:.0f} s (stopped)"
            print(f"{name}: {size:.2f} MB, {time.perf_counter() - began:.1f} s with start-up: {result}", flush=True)


if __name__ == "__main__":
    main()
