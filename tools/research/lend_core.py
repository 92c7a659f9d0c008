"""Would lending the idle core to stage 1 pay? Time stage 1 on one and on two threads, alone and
beside a busy stage 2 on the other core.

    python tools/research/lend_core.py --exit-layer 18

On 2 workers PPSD's stage 1 is busy about 95 % of the time and stage 2 about 57 %: stage 1 sets
the slot. An executor could give stage 1 a second intra-op thread on stage 2's core. That pays
only if two threads make stage 1 faster alone, and do not lose it all when stage 2 computes on
that core at the same time. This times one token through layers [0, E) (stage 1) in four cases:
one thread on core 0 or two threads on cores 0 and 1, each with core 1 idle or with a child
process running stage 2's work (layers [E, L) and the LM head) there without pause. Medians in
ms; with stage 2 busy, its own ms per token is given too. Not part of the library.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ppsd import DEFAULT_MODEL, load_model  # noqa: E402
from process_costs import token_times  # noqa: E402  (its neighbour in tools/research/)


def busy_stage2(model_name: str, exit_layer: int, core: int, ready, stop, result) -> None:
    """Run stage 2's work on `core` without pause until `stop`; report its median ms."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    model, _ = load_model(model_name)
    ready.set()
    times = token_times(model, [("layers", range(exit_layer, model.num_layers)), ("LM head", None)], stop=stop)
    per_token = [a + b for a, b in zip(times["layers"], times["LM head"])]
    result.put(statistics.median(per_token) * 1e3 if per_token else float("nan"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--exit-layer", type=int, default=18)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores")
    model, _ = load_model(args.model)
    stage1 = range(0, args.exit_layer)
    context = multiprocessing.get_context("spawn")
    print("stage 1 threads  core 1      stage 1 ms  stage 2 ms")
    for busy in (False, True):
        for threads in (1, 2):
            child = None
            if busy:
                ready, stop, result = context.Event(), context.Event(), context.Queue()
                child = context.Process(target=busy_stage2, args=(args.model, args.exit_layer, cores[1], ready, stop,
                                                                  result))
                child.start()
                ready.wait()
                time.sleep(1.0)  # its first tokens out of the way
            os.sched_setaffinity(0, set(cores[:threads]))
            torch.set_num_threads(threads)
            ms = statistics.median(token_times(model, [("stage 1", stage1)], repeats=args.repeats, skip=5)["stage 1"]) * 1e3
            other = ""
            if child is not None:
                stop.set()
                other = f"{result.get():10.2f}"
                child.join()
            print(f"{threads:>15}  {'stage 2' if busy else 'idle':<10} {ms:10.2f}  {other}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
