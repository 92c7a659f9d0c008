"""Ten default Runs as a fresh server serves them, once the captured steps are ready (issue 56's
goal): each Run's kind and why, whether it is clean or the fault it names, plain AR against AR on
the same steps, and the headline's number. Compare with `python -m ppsd bench-pipeline` on the
same machine and prompt.

    python tools/research/default_runs.py [--runs 10] [--forced 0.2,0.5,0.9] [--json out.json]

It starts what `python app.py` starts (`app.runner.prestart`: the worker processes, the captured
steps compiled or loaded in the background), waits until they are ready, then runs the page's
default request (the first example, the stages at once, "auto") `--runs` times in this process,
then the what-if at each `--forced` acceptance (the same request, every verdict a seeded coin).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    from app import analysis
    from app.models import ModelCache
    from app.page_text import load_examples
    from app.panels import headline
    from app.request import RunRequest
    from app.reading import RunView
    from app.runner import READY, prestart, run_comparison
    from ppsd import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--forced", default="", help="what-if acceptances, comma-separated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cache = ModelCache(device="cpu")
    began = time.monotonic()
    print(prestart(cache, DEFAULT_MODEL, progress=print), flush=True)
    while READY.compiling():
        time.sleep(2)
    print(f"background: {READY.words()} ({time.monotonic() - began:.0f} s after start)", flush=True)
    rows = []
    forced = [float(a) for a in args.forced.split(",") if a]
    for n, a in enumerate([None] * args.runs + forced):
        load = os.getloadavg()[0]
        request = RunRequest(prompt=load_examples()[0]["prompt"], workers=True, forced_acceptance=a)
        t0 = time.monotonic()
        snap = list(run_comparison(request, cache, throttle=1.0))[-1]
        c = RunView.of(snap).reading
        stats = c.stats
        row = dict(run=n + 1, load_before=round(load, 2), seconds=round(time.monotonic() - t0, 1), kind=snap.pipeline,
                   note=snap.note, unclean=analysis.unclean_reason(c), compiled=list(snap.state.compiled),
                   others=[round(cores, 2) for cores in snap.state.others],
                   plain_over_ar=round((stats.median("plain", clock="measured") or 0) /
                                       (stats.median("ar", clock="measured") or 1), 3),
                   against_fastest=round(stats.against_fastest() or 0, 3), fastest=c.fastest[0],
                   plain_threads=snap.plain.threads if snap.plain else None, acceptance=c.acceptance,
                   forced=a, measured_acceptance=c.ppsd.acceptance_rate, tokens=(c.ar.tokens, c.ppsd.tokens),
                   speedup=round(c.speedup, 3), ideal=round(c.ideal, 3),
                   headline=re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", headline.speedup_headline(c))).strip())
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
