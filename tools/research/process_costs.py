"""Does a stage compute slower in a worker process than in the caller's? Time the same stage work
here and in fresh child processes (fork and spawn), each pinned to one core with one thread.

    python tools/research/process_costs.py --exit-layer 18

On worker processes, AR's stages took about 5 ms a token more than in one process
(docs/benchmarks.md, the overhead split). This separates the process itself (its own copy of the
weights, its pinned thread, how it was started) from the pipeline around it: each process loads
the model, prefills a context, then times one token through layers [0, E) (stage 1), layers
[E, L) (stage 2) and the final norm + LM head, `--repeats` times (the first 10 left out), medians
in ms. Then AR runs on the 2-worker pipeline and every thread's CPU seconds (from /proc) are set
beside the wall time (CPU time near the wall time: no thread spins while it waits), and the wall
time is taken again with the worker moved onto stage 1's core. Not part of the library.
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ppsd import DEFAULT_MODEL, DecodeConfig, generate, load_model  # noqa: E402
from ppsd.chat import encode_prompt  # noqa: E402
from ppsd.executors.distributed.pool import shared_pipeline  # noqa: E402
from ppsd.setup import set_up  # noqa: E402
from ppsd.static_cache import StaticKVCache  # noqa: E402

CONTEXT = 80  # positions cached before the timed token: about a chat prompt and a short answer


def token_times(model, parts: list[tuple[str, range | None]], *, repeats: int = 0, stop=None,
                skip: int = 10) -> dict[str, list[float]]:
    """Seconds of one token (after CONTEXT cached positions) through each part in turn, by name: a
    part is a range of decoder layers, or None for the final norm + LM head. `repeats` times after
    `skip` untimed ones, or, with `stop` (an Event), until it is set."""
    times: dict[str, list[float]] = {name: [] for name, _ in parts}
    with torch.inference_mode():
        cache = StaticKVCache.for_model(model.hf_model)
        view = cache.at(range(model.num_layers), 0, CONTEXT)
        model.run_static(model.embed(list(range(100, 100 + CONTEXT))), range(model.num_layers),
                         positions=view.write, cache=view)
        token = model.embed([123])
        i = 0
        while (not stop.is_set()) if stop is not None else i < repeats + skip:
            cache.truncate(CONTEXT)
            hidden = token
            for name, layers in parts:
                started = time.perf_counter()
                if layers is None:
                    model.final_logits(hidden)
                else:
                    view = cache.at(layers, CONTEXT, 1)
                    hidden = model.run_static(hidden, layers, positions=view.write, cache=view)
                if i >= skip:
                    times[name].append(time.perf_counter() - started)
            i += 1
    return times


def measure(tag: str, core: int, model_name: str, exit_layer: int, repeats: int) -> None:
    """Pin to `core`, one thread, and print the median ms of each part of one token."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    model, _ = load_model(model_name)
    parts = [("stage 1", range(0, exit_layer)), ("stage 2", range(exit_layer, model.num_layers)), ("LM head", None)]
    times = token_times(model, parts, repeats=repeats)
    medians = "  ".join(f"{part} {statistics.median(t) * 1e3:6.2f}" for part, t in times.items())
    print(f"{tag:<14} core {core}  {medians}", flush=True)


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of every thread of process `pid`, by "tid name"."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            fields = Path(task, "stat").read_text().rsplit(") ", 1)[1].split()
            name = Path(task, "comm").read_text().strip()
        except OSError:  # the thread ended
            continue
        out[f"{Path(task).name} {name}"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def pin_process(pid: int, cores: set[int]) -> None:
    """Move every thread of process `pid` to `cores`."""
    for task in glob.glob(f"/proc/{pid}/task/*"):
        os.sched_setaffinity(int(Path(task).name), cores)


def pipeline_cpu(model_name: str, runs: int, tokens: int) -> None:
    """AR on the 2-worker pipeline: wall time per token, each busy thread's CPU time, and the wall
    time with the worker moved onto stage 1's core (alternating with its own core, `runs` times
    each, medians): what handing each token from one core to the other costs."""
    torch.set_num_threads(1)
    model, tokenizer = load_model(model_name)
    ids = encode_prompt(tokenizer, "Why does Earth have seasons?", chat=True)
    config = set_up(model, DecodeConfig(method="ar", max_new_tokens=tokens), prompt_ids=ids).config
    pool = shared_pipeline(model, config, threads_per_worker=1, timeout=60.0)

    def ms_per_token() -> float:
        started = time.perf_counter()
        made = len(generate(model, ids, config, executor=pool).token_ids)
        return (time.perf_counter() - started) * 1e3 / made

    try:
        generate(model, ids, config, executor=pool)  # warm-up
        worker = pool.pids[0]
        own_core = os.sched_getaffinity(worker)
        pids = {"coordinator": os.getpid(), "worker": worker}
        before = {name: thread_cpu_seconds(pid) for name, pid in pids.items()}
        started = time.perf_counter()
        made = sum(len(generate(model, ids, config, executor=pool).token_ids) for _ in range(runs))
        wall = time.perf_counter() - started
        after = {name: thread_cpu_seconds(pid) for name, pid in pids.items()}
        stage1_core = {min(os.sched_getaffinity(0) - own_core or os.sched_getaffinity(0))}
        walls: dict[str, list[float]] = {"own core": [], "stage 1's core": []}
        for _ in range(runs):
            for name, cores in (("own core", own_core), ("stage 1's core", stage1_core)):
                pin_process(worker, cores)
                walls[name].append(ms_per_token())
        pin_process(worker, own_core)
    finally:
        pool.close()
    print(f"AR on 2 worker processes: {wall * 1e3 / made:.1f} ms a token of wall time; CPU ms a token:")
    for name in pids:
        for thread, seconds in after[name].items():
            used = seconds - before[name].get(thread, 0.0)
            if used * 1e3 / made >= 0.5:
                print(f"  {name:<12} thread {thread:<24} {used * 1e3 / made:6.1f}")
    print("worker on " + ", on ".join(f"{name} {statistics.median(t):.1f}" for name, t in walls.items())
          + f" ms a token (medians of {runs}, alternating)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--exit-layer", type=int, default=18)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--runs", type=int, default=6, help="AR runs on the pipeline (each way)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per pipeline run")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))[:2]
    job = (args.model, args.exit_layer, args.repeats)
    for core in cores:
        measure("this process", core, *job)
    for method in ("fork", "spawn"):
        for core in cores:
            child = multiprocessing.get_context(method).Process(target=measure, args=(f"child, {method}", core, *job))
            child.start()
            child.join()
    pipeline_cpu(args.model, args.runs, args.tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
