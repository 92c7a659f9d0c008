"""Where a cold start's time goes: `python tools/research/cold_start.py [--cache DIR] [--tokens 64]`.

The page's default Run, as its handler runs it, on a model cache directory that may be empty
(`--cache`, default a fresh temporary one: the first use's conversion included): prints one
line per phase, with the seconds since the start, as the page would see them (first use's
conversion, the load, the warm-up, the pipeline's start, the first token, the end).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=None, help="PPSD_CACHE for this run (default: a new empty directory)")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    os.environ["PPSD_CACHE"] = args.cache or tempfile.mkdtemp(prefix="ppsd-cold-")

    started = time.perf_counter()
    since = lambda: time.perf_counter() - started  # noqa: E731
    import ppsd
    from app.models import ModelCache
    from app.request import RunRequest
    from app.runner import run_comparison
    from app.state import AppState

    print(f"{since():6.1f} s  imports done (cache {os.environ['PPSD_CACHE']})", flush=True)
    seen: list[str] = []

    def tell(message: str) -> None:
        if message not in seen:
            seen.append(message)
            print(f"{since():6.1f} s  {message}", flush=True)

    state = AppState(cache=ModelCache())
    loaded = state.cache.get(ppsd.DEFAULT_MODEL, progress=tell, warm=False)
    print(f"{since():6.1f} s  loaded ({loaded.load_seconds:.1f} s in the loader)", flush=True)
    state.cache.get(ppsd.DEFAULT_MODEL, warm=True)
    print(f"{since():6.1f} s  warmed up", flush=True)
    from ppsd.choice import choose, concurrent_by_default

    device, k = loaded.model.info.device, 2
    request = RunRequest(prompt="Write a Python function that checks whether a word is a palindrome. Code only.",
                         max_new_tokens=args.tokens, workers=concurrent_by_default(k, device),
                         pipeline=choose("auto", k, device).name)
    first = None
    for snap in run_comparison(request, state.cache, throttle=0.0):
        tell(f"phase {snap.active or 'done'}" + (f": {snap.status}" if snap.status else ""))
        run = snap.state.rounds[-1].get(snap.active or "") if snap.state.rounds else None
        if first is None and run is not None and run.recorder.tokens:
            first = since()
            print(f"{first:6.1f} s  first token on screen ({snap.active})", flush=True)
    print(f"{since():6.1f} s  the default Run is done", flush=True)


if __name__ == "__main__":
    main()
