"""How fast a Run decodes as a ZeroGPU call against the same Run in the server's own process:
`python tools/research/zerogpu_bench.py [--repeats 3] [--tokens 64]`.

The call goes through the stand-in `spaces` of tests/spaces_standin.py (forked, daemonic,
pickled both ways, on the copy of a thread that used torch's CPU threads), the same form both
ways: AR and PPSD on the stage threads (worker processes cannot start in the call), one timed run
each. Rounds alternate the two, so a slow spell hits both; it prints one RESULT line per method:
the median wall of each, and the forked call's speed as a fraction of the in-process one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    import pytest
    import torch

    import ppsd
    import spaces_standin
    from app import AppState, view, zerogpu
    from app.handlers import on_decode
    from app.request import RunRequest

    with pytest.MonkeyPatch.context() as monkeypatch:
        spaces_standin.install(monkeypatch)
        state = AppState.from_environment()
        torch.set_num_threads(2)
        state.cache.get(ppsd.DEFAULT_MODEL, warm=True)  # this thread has now used two CPU threads
        request = RunRequest(prompt="Write a Python function that checks whether a word is a palindrome.",
                             max_new_tokens=args.tokens, repeats=1, workers=True, pipeline="threads")
        ways = {"in-process": partial(on_decode, state),
                "forked": zerogpu.gpu_call(partial(on_decode, state), duration=lambda *a: 60)}
        walls: dict[str, dict[str, list[float]]] = {way: {"ar": [], "ppsd": []} for way in ways}
        list(ways["in-process"](0, request))  # warm-up, untimed
        for round_ in range(args.repeats):
            for way, decode in ways.items():
                with state.stops.running(way) as stop:
                    summary = dict(zip(view.OUTPUTS, list(decode(stop.slot, request))[-1]))["summary"]
                for method in ("ar", "ppsd"):
                    walls[way][method].append(summary[method]["measured"]["wall_seconds"])
                print(f"round {round_ + 1} {way}: AR {walls[way]['ar'][-1]:.2f} s, PPSD {walls[way]['ppsd'][-1]:.2f} s",
                      flush=True)
    for method in ("ar", "ppsd"):
        inside, forked = (statistics.median(walls[way][method]) for way in ("in-process", "forked"))
        print(f"RESULT {method}: in-process {inside:.2f} s, forked call {forked:.2f} s, "
              f"forked speed {inside / forked:.2f}x of in-process ({args.tokens} tokens, median of {args.repeats})")


if __name__ == "__main__":
    main()
