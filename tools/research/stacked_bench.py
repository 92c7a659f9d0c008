"""Time the stacked engine against the fastest AR, in one run on one device: ms per token of eager
AR (in process), Hugging Face generate(), graphed AR, stacked AR, and graphed and stacked PPSD at
forced acceptances (0, 0.5, 0.75, 1 by default); the stacked slot's time and the host's time a
slot; then, with --real, the default model with its shipped head (acceptance measured, not
forced) when its files are on this machine.

    python tools/research/stacked_bench.py --device cuda --json docs/bench/engine/h100-stacked.json
    python tools/research/stacked_bench.py --dry-run      # a tiny shape on the CPU: the script end to end

The random model has SmolLM2-135M's shape (tools/research/engine_bench.py) and drafts with an untrained
`layer` head at the balanced E = 15 (8,192 draft tokens). Forced acceptance is for timing only:
each verdict is a seeded coin, the work is the real work, the tokens are not the model's, and
every PPSD row and the JSON say so. Median of --repeats after --warmup untimed runs, the methods
interleaved; every ratio is from this one run. Prints RESULT lines and writes --json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_bench import _model, _timed  # noqa: E402

from ppsd import DecodeConfig, generate  # noqa: E402
from ppsd.bench.forced import FORCED_NOTE, ForcedAcceptance  # noqa: E402
from ppsd.bench.run import fixed_length  # noqa: E402
from ppsd.config import stage_layers  # noqa: E402
from ppsd.executors import InProcessExecutor  # noqa: E402
from ppsd.executors.runtime import GraphedExecutor  # noqa: E402
from ppsd.executors.stacked import StackedExecutor  # noqa: E402
from ppsd.trace import Stopwatch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = _arguments().parse_args(argv)
    if args.dry_run:  # a tiny shape, one repeat: proves the script runs, measures nothing worth keeping
        args.device, args.layers, args.hidden, args.exit_layer = "cpu", 4, 72, 2
        args.new_tokens, args.repeats, args.warmup, args.prompt_tokens = 12, 1, 0, 8
    torch.set_num_threads(args.threads)
    args.model, args.perfect_exit = None, False
    model, source, prompt = (None, "", []) if args.skip_random else _model(args)
    report = {"device": _device_name(args.device), "torch": torch.__version__, "dry_run": args.dry_run,
              "threads": args.threads, "forced_acceptance": FORCED_NOTE}
    if not args.skip_random:
        report["random"] = _measure(args, fixed_length(model), source, prompt, forced=True)
    if args.real:
        report["real"] = _real(args)
    _print(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=30, help="random model: layers (30 = the default model)")
    parser.add_argument("--hidden", type=int, default=576, help="random model: width")
    parser.add_argument("--exit-layer", type=int, default=15, help="the balanced E for K = 2")
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--acceptance", type=float, nargs="*", default=[0.0, 0.5, 0.75, 1.0],
                        help="forced acceptances PPSD is timed at (timing only: the tokens are not the model's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--real", action="store_true", help="then the default model and its shipped head, if here")
    parser.add_argument("--skip-random", action="store_true", help="the real model alone (with --real)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--dry-run", action="store_true", help="a tiny shape on the CPU, one repeat")
    parser.add_argument("--json", default=None)
    return parser


def _measure(args, model, source: str, prompt: list[int], *, forced: bool) -> dict:
    """Every method on `model`, interleaved; PPSD at each forced acceptance (or unforced)."""
    partition = stage_layers(model.num_layers, args.exit_layer, 2)
    config = DecodeConfig(exit_layer=args.exit_layer, num_stages=2, max_new_tokens=args.new_tokens)
    vocab = model.info.vocab_size
    eager = InProcessExecutor(model, partition, Stopwatch())
    graphed = GraphedExecutor(model, partition)
    stacked = StackedExecutor(model, partition)
    slots: dict[str, list] = {}

    def run(method: str, executor, label: str, acceptance: float | None = None):
        def decode():
            wrapped = executor if acceptance is None else ForcedAcceptance(executor, acceptance, vocab_size=vocab, seed=0)
            before = (stacked.stats.slots, stacked.stats.host_seconds)
            result = generate(model, prompt, DecodeConfig(**{**vars(config), "method": method}), executor=wrapped)
            if executor is stacked:
                slots[label] = [stacked.stats.slots - before[0], stacked.stats.host_seconds - before[1], result]
            return result
        return decode

    def hf():
        ids = torch.tensor([prompt], device=model.info.device)
        model.hf_model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                do_sample=False, eos_token_id=None, pad_token_id=0)

    methods = {"eager AR (in-process)": run("ar", eager, "eager AR"), "HF generate()": hf,
               "graphed AR": run("ar", graphed, "graphed AR"), "stacked AR": run("ar", stacked, "stacked AR")}
    for a in (args.acceptance if forced else [None]):
        tag = f", forced a = {a}" if a is not None else ""
        methods[f"graphed PPSD{tag}"] = run("ppsd", graphed, f"graphed PPSD{tag}", a)
        methods[f"stacked PPSD{tag}"] = run("ppsd", stacked, f"stacked PPSD{tag}", a)
    with torch.inference_mode():
        timed, results = _timed(methods, args)
    ms = {label: statistics.median(t) / args.new_tokens * 1e3 for label, t in timed.items()}
    fastest_ar = min((v, k) for k, v in ms.items() if "AR" in k or "generate" in k)
    out = {"model": source, "dtype": model.info.dtype, "exit_layer": args.exit_layer, "new_tokens": args.new_tokens,
           "repeats": args.repeats, "chain_steps": stacked.engine.steps,
           "stage_layers": [len(r) for r in partition], "ms_per_token": ms,
           "fastest_ar": {"method": fastest_ar[1], "ms_per_token": fastest_ar[0]}, "ppsd": {}}
    for label, (count, host, result) in slots.items():
        if "PPSD" not in label:
            continue
        spans = _slot_spans(result)
        accepted = sum(t.status == "accepted" for t in result.tokens)
        verified = sum(t.status in ("accepted", "corrected") for t in result.tokens)
        out["ppsd"][label] = {
            "acceptance": accepted / verified if verified else 0.0,
            "vs_fastest_ar": fastest_ar[0] / ms[label],
            "vs_graphed_ppsd": ms[label.replace("stacked", "graphed")] / ms[label],
            "slot_ms_median": spans, "slot_vs_fastest_ar_token": spans / fastest_ar[0],
            "host_ms_per_slot": host / count * 1e3 if count else float("nan"),
            "host_ms_per_slot_note": ("launching and reading, the wait for the device excluded" if
                                      args.device.startswith("cuda") else "on a CPU the host computes the slot"),
        }
    return out


def _slot_spans(result) -> float:
    """The median stacked slot's time, ms: its events' span (CUDA events on a GPU)."""
    by_slot: dict[int, list] = {}
    for event in result.trace.events:
        if event.slot is not None:
            by_slot.setdefault(event.slot, []).append(event)
    spans = [max(e.end for e in es) - min(e.start for e in es) for es in by_slot.values()]
    return statistics.median(spans) * 1e3 if spans else float("nan")


def _real(args) -> dict:
    from ppsd import DEFAULT_MODEL
    from ppsd.heads import default_exit_layer
    from ppsd.model_source import default_available

    if not default_available():
        return {"skipped": "the default model's files are not on this machine"}
    args.model = "default"
    args.exit_layer = default_exit_layer(DEFAULT_MODEL, 30, 2)
    model, source, prompt = _model(args)
    return _measure(args, fixed_length(model), source, prompt, forced=False)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"


def _print(report: dict) -> None:
    print(f"RESULT device: {report['device']}{' (dry run: a tiny shape, nothing to keep)' if report['dry_run'] else ''}")
    print(f"RESULT PPSD rows at a forced a: {report['forced_acceptance']}")
    for part in ("random", "real"):
        measured = report.get(part)
        if measured is None:
            continue
        if "skipped" in measured:
            print(f"RESULT {part}: skipped, {measured['skipped']}")
            continue
        print(f"RESULT {part}: {measured['model']}; stages {measured['stage_layers']}, chain {measured['chain_steps']} steps")
        for label, value in measured["ms_per_token"].items():
            print(f"RESULT   {label}: {value:.3f} ms/token")
        print(f"RESULT   fastest AR: {measured['fastest_ar']['method']}, {measured['fastest_ar']['ms_per_token']:.3f} ms/token")
        for label, p in measured["ppsd"].items():
            print(f"RESULT   {label}: {p['vs_fastest_ar']:.2f}x the fastest AR, {p['vs_graphed_ppsd']:.2f}x graphed PPSD, "
                  f"acceptance {p['acceptance']:.3f}; slot {p['slot_ms_median']:.3f} ms "
                  f"({p['slot_vs_fastest_ar_token']:.2f}x an AR token), host {p['host_ms_per_slot']:.3f} ms a slot")


if __name__ == "__main__":
    sys.exit(main())
