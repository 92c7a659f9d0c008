"""`python -m ppsd bench-pipeline`: real pipeline parallelism, measured.

Tokens/s of greedy decoding, same model, prompts and length, every number measured wall time:
single-process AR (1 and 2 threads), AR on the K-worker pipeline (the fair baseline: each
stage busy 1/K of the time), PPSD on the K-worker pipeline, and, for reference, in-process
PPSD on the projected clock (its measured per-stage costs replayed on K workers). Then PPSD's
measured speedup over pipeline AR against the ideal S_PPSD(a, s) at its measured acceptance, s
the slowest stage's share of the layers (`ppsd.metrics.ideal_ppsd_speedup_slowest_stage`).

Runs are interleaved (repeat, prompt, method) so a change in the machine's other load hits
every method alike; the first `--warmup` repeats are dropped; each method's time per prompt is
the median of the rest. EOS is ignored, so every run generates exactly `--new-tokens` tokens.
A benchmark, not a test: nothing is asserted except that every method's output is identical.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..chat import encode_prompt, use_chat
from ..cli import options
from ..cli.values import check_output_file, thread_count, whole, write_result
from ..compare import Comparison, ExecutorSource
from ..model_source import resolve
from ..config import DEFAULTS, DecodeConfig, balanced_exit_layer
from ..executors.kinds import KINDS, ExecutorKind, WorkerOptions, concurrent_kinds
from ..generate import Result, generate, warm_up
from ..metrics import break_even_acceptance, ideal_ppsd_speedup_slowest_stage, slot_fraction, speedup
from ..model import StagedModel, load_model, model_shape, resolve_device
from ..setup import RunSetup, resolve_config, set_up
from .baselines import hf_generate
from .pipeline_summary import best_over_fastest, overhead, table
from .prompts import CHAT_PROMPTS_FILE, load_prompts, spread
from .run import fixed_length


@dataclass(frozen=True)
class Method:
    """One line of the table: a decoder on an executor, with this process's thread count."""

    label: str
    method: str
    executor: str  # the name of an executor kind (`ppsd.executors.kinds.KINDS`)
    threads: int  # torch threads of this (coordinator) process
    clock: str = "measured"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_model(parser)
    parser.add_argument("--prompts", default=None,
                        help="prompts JSON [{name, category, prompt}] (default: assets/prompts/prompts.json)")
    parser.add_argument("--max-prompts", type=whole(1), default=6, help="first N prompts, spread over categories")
    parser.add_argument("--new-tokens", type=whole(1), default=DEFAULTS.max_new_tokens)
    options.add_stages(parser)
    parser.add_argument("--threads-per-worker", type=thread_count, default=1)
    parser.add_argument("--repeats", type=whole(1), default=5)
    parser.add_argument("--warmup", type=whole(0), default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (workers share one GPU if only one)")
    parser.add_argument("--random-hidden", type=_width, default=None,
                        help="use a random Llama of this width (8 layers, vocab 4096) instead of --model")
    parser.add_argument("--perfect-exit", action="store_true",
                        help="with --random-hidden: layers from E on add nothing, so every draft is "
                             "accepted (a = 1): the upper-bound control, same compute per stage")
    parser.add_argument("--json", default=None, help="also write the results here")


@dataclass
class Measured:
    """The kept (after warm-up) wall times of every method per prompt, and its kept runs."""

    walls: dict[tuple[str, int], list[float]]  # (method label, prompt index) -> seconds per repeat
    runs: dict[str, list[Result]]  # method label -> library results (HF has none)


def _width(text: str) -> int:
    """argparse type of --random-hidden: a width its 4 attention heads split evenly, small enough
    to build in memory."""
    value = whole(4, 4096, why="the random Llama's width")(text)
    if value % 4:
        raise argparse.ArgumentTypeError(f"{value} is not a multiple of 4 (the random Llama's attention heads)")
    return value


def run(args: argparse.Namespace) -> int:
    check_output_file(args.json, "--json")  # before the run, whose results go there
    config, at_once = _checked(args)
    model, prompts, source = _model_and_prompts(args)
    setup = set_up(model, config, exit_head=args.exit_head)
    model, config = setup.model, setup.config
    methods = rows(args.stages, config.draft_len, at_once)
    load_before = os.getloadavg()
    options = WorkerOptions(threads_per_worker=args.threads_per_worker, timeout=60.0)
    executors, startup = {}, {}
    try:
        for kind in at_once:
            started = time.perf_counter()
            executors[kind.name] = kind.ready(setup, warm_up=warm_up, options=options,
                                              progress=lambda text: print(f"{text}…", flush=True))
            startup[kind.name] = time.perf_counter() - started
        print(f"model: {source}; {len(prompts)} prompts x {args.new_tokens} tokens; K={args.stages}, "
              f"E={config.exit_layer}, exit head {setup.head}; pool started and warmed up in "
              f"{startup['processes']:.1f} s (pids {executors['processes'].pids})", flush=True)
        measured = _measure(args, model, config, methods, prompts, executors, setup)
    finally:
        for executor in executors.values():
            executor.close()  # the bench's last run: even the shared pipeline ends with it
    report = _report(args, config, methods, prompts, measured, source, load_before, startup["processes"])
    report["exit_head"] = setup.head
    print(table(report))
    if args.json:
        write_result(args.json, json.dumps(report, indent=2), "--json")
    return 0


RANDOM_LAYERS = 8  # the --random-hidden Llama's depth


def _checked(args: argparse.Namespace) -> tuple[DecodeConfig, tuple[ExecutorKind, ...]]:
    """The run's settings, checked before any model loads or is built: the prompts file, the
    device, E, K, g and N against the model's depth (from its config alone), and that the kinds
    the report compares can run here; with the concurrent kinds that can."""
    if args.prompts:
        load_prompts(args.prompts)  # a FIFO, /dev/full or a folder: refused before the load
    device = resolve_device(args.device)
    layers = RANDOM_LAYERS if args.random_hidden is not None else model_shape(args.model).num_layers
    # E by the name asked for: the model is loaded from its converted directory, whose path names no shipped head.
    config = resolve_config(args.model, layers, DecodeConfig(
        num_stages=args.stages, exit_layer=args.exit_layer, max_new_tokens=args.new_tokens, draft_len=args.draft_len))
    return config, _kinds_here(device, config)


SINGLE = KINDS["in-process"]  # the single-process rows' kind
COMPARED = (KINDS["processes"], KINDS["threads"])  # the kinds the report's comparisons name


def _kinds_here(device: str, config: DecodeConfig) -> tuple[ExecutorKind, ...]:
    """The concurrent kinds that can run on `device`; ValueError saying why where one the report
    compares cannot."""
    here = []
    for kind in concurrent_kinds():
        reason = kind.unavailable(device, config.num_stages)
        if reason is None:
            here.append(kind)
        elif kind in COMPARED:
            raise ValueError(reason)
    return tuple(here)


def rows(num_stages: int, draft_len: int, at_once: tuple[ExecutorKind, ...]) -> list[Method]:
    """The table's methods: single-process AR and HF on 1 and 2 threads, AR and PPSD on each of
    the `at_once` kinds, PPSD projected, EESD."""
    one = SINGLE
    return [
        Method(f"AR, {one.row}, 1 thread", "ar", one.name, 1),
        Method(f"AR, {one.row}, 2 threads", "ar", one.name, 2),
        Method("HF generate(), 1 thread", "hf", one.name, 1),
        Method("HF generate(), 2 threads", "hf", one.name, 2),
        *(Method(f"{name}, {kind.row.format(k=num_stages)}", method, kind.name, 1)
          for kind in at_once for method, name in (("ar", "AR"), ("ppsd", "PPSD"))),
        Method(f"PPSD, {one.row}, projected", "ppsd", one.name, 1, clock="projected"),
        Method(f"EESD g={draft_len}, {one.row}, 1 thread", "eesd", one.name, 1),
    ]


def _measure(args, model: StagedModel, config: DecodeConfig, methods: list[Method], prompts: list[list[int]],
             executors: dict, setup: RunSetup) -> Measured:
    """Every method on every prompt, interleaved (repeat, prompt, executor), warm-up repeats first,
    saying what runs as it goes. The library's decoders run through `ppsd.compare.Comparison`,
    one round on each executor (the page's comparison, on a lent executor); each output is
    checked against the first method's (AR's)."""
    measured = Measured({}, {})
    outputs: dict[tuple[str, int], list[int]] = {}
    total = args.warmup + args.repeats
    by_executor: dict[tuple[str, int], list[Method]] = {}
    for m in methods:
        if m.method != "hf" and not (m.executor == SINGLE.name and m.threads != 1 and m.method == "ar"):
            by_executor.setdefault((m.executor, m.threads), []).append(m)
    for repeat in range(total):
        for i, prompt in enumerate(prompts):
            where = f"repeat {repeat + 1}/{total}{' (warm-up)' if repeat < args.warmup else ''}, prompt {i + 1}/{len(prompts)}"
            found: dict[str, tuple[list[int], float, Result | None]] = {}
            for m in methods:  # outside the comparisons: Hugging Face, and single-process AR on more threads
                if m.method == "hf" or all(m not in group for group in by_executor.values()):
                    print(f"{where}: {m.label}", flush=True)
                    torch.set_num_threads(m.threads)
                    if m.method == "hf":
                        token_ids, wall = hf_generate(model, prompt, args.new_tokens)
                        found[m.label] = (token_ids, wall, None)
                    else:
                        result = generate(model, prompt, replace(config, method=m.method))
                        found[m.label] = (result.token_ids, result.metrics(m.clock).wall_seconds, result)
            for (executor, threads), group in by_executor.items():
                torch.set_num_threads(threads)
                kind = KINDS[executor]
                names = tuple(dict.fromkeys(m.method for m in group))
                comparison = Comparison(replace(setup, prompt_ids=tuple(prompt)), names, kind=kind, rounds=1,
                                        source=ExecutorSource(executors.get(executor)), throttle=float("inf"))
                active = None
                for state in comparison.run():
                    if state.active != active and state.active is not None:
                        active = state.active
                        print(f"{where}: {active.upper()} on {kind.label.replace('K ', f'{config.num_stages} ')}",
                              flush=True)
                runs = state.rounds[0]
                for m in group:
                    result = runs[m.method].result
                    found[m.label] = (result.token_ids, result.metrics(m.clock).wall_seconds, result)
            for m in methods:
                token_ids, wall, result = found[m.label]
                outputs.setdefault((m.label, i), token_ids)
                _check(m, i, token_ids, found[methods[0].label][0], model.hf_model if m.method == "hf" else None)
                if repeat >= args.warmup:
                    measured.walls.setdefault((m.label, i), []).append(wall)
                    if result is not None:
                        measured.runs.setdefault(m.label, []).append(result)
    return measured


def _check(m: Method, i: int, token_ids: list[int], reference: list[int], hf_model) -> None:
    """Every method must commit AR's tokens. HF's `min_new_tokens` masks EOS where our runs
    treat it as an ordinary token, so HF is compared up to AR's first EOS."""
    if hf_model is not None:
        eos = hf_model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        cut = next((n for n, t in enumerate(reference) if t in eos), len(reference))
        token_ids, reference = token_ids[:cut], reference[:cut]
    if token_ids != reference:
        raise SystemExit(f"{m.label} differs from AR on prompt {i}: not exact")


def _model_and_prompts(args) -> tuple[StagedModel, list[list[int]], str]:
    """The model and its held-out prompts; else a random Llama of the tiny model's shape (said so)."""
    directory = Path(resolve(args.model)) if args.random_hidden is None else None
    if directory is not None and (directory / "config.json").exists():
        # A snapshot: the coordinator and the K workers load at different moments, and a
        # checkpoint being retrained would otherwise give them different weights.
        snapshot = shutil.copytree(directory, Path(tempfile.mkdtemp(prefix="ppsd-bench-")) / "model")
        model, tokenizer = load_model(str(snapshot), device=args.device)
        chat = use_chat(tokenizer, args.chat)
        chosen = spread(load_prompts(args.prompts or (CHAT_PROMPTS_FILE if chat else None))[0], args.max_prompts)
        prompts = [encode_prompt(tokenizer, p["prompt"], chat=chat) for p in chosen]
        source = f"{args.model} ({', '.join(p['name'] for p in chosen)})"
    else:
        exit_layer = args.exit_layer or balanced_exit_layer(RANDOM_LAYERS, args.stages)
        model, source = _random_model(args.device, args.random_hidden or 256,
                                      perfect_from=exit_layer if args.perfect_exit else None)
        generator = torch.Generator().manual_seed(0)
        prompts = [torch.randint(1, model.info.vocab_size, (24,), generator=generator).tolist()
                   for _ in range(args.max_prompts)]
    # EOS treated as an ordinary token: every method times exactly the same amount of work.
    return fixed_length(model), prompts, source


def _random_model(device: str, hidden: int, *, perfect_from: int | None) -> tuple[StagedModel, str]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=hidden, intermediate_size=3 * hidden,
                         num_hidden_layers=RANDOM_LAYERS,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                         eos_token_id=None)
    path = tempfile.mkdtemp(prefix="ppsd-bench-")
    hf_model = LlamaForCausalLM(config)
    if perfect_from is not None:
        with torch.no_grad():  # zero outputs, full cost: the residual stream passes layers >= E unchanged
            for layer in hf_model.model.layers[perfect_from:]:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    hf_model.save_pretrained(path)
    model = StagedModel(LlamaForCausalLM.from_pretrained(path).to(device).eval(), name=path)
    perfect = f", layers >= {perfect_from} zeroed (every draft accepted)" if perfect_from is not None else ""
    return model, f"random Llama (hidden {hidden}, {RANDOM_LAYERS} layers, vocab 4096{perfect}) at {path}"


def _report(args, config, methods, prompts, measured: Measured, source, load_before, startup) -> dict:
    walls, runs = measured.walls, measured.runs
    tokens = args.new_tokens * len(prompts)
    wall = {m.label: sum(statistics.median(walls[(m.label, i)]) for i in range(len(prompts))) for m in methods}
    speed = {label: tokens / seconds for label, seconds in wall.items()}
    by = {(m.method, m.executor, m.threads, m.clock): m.label for m in methods}
    single = SINGLE.name
    ar1, ar2 = by[("ar", single, 1, "measured")], by[("ar", single, 2, "measured")]
    hf = by[("hf", single, 1, "measured")]
    at_once = {m.executor: by[("ar", m.executor, 1, "measured")] for m in methods if KINDS[m.executor].concurrent}
    ppsd_label, ar_label = by[("ppsd", "processes", 1, "measured")], at_once["processes"]
    ppsd_threads, ar_threads = by[("ppsd", "threads", 1, "measured")], at_once["threads"]
    ppsd_metrics = [r.metrics("measured") for r in runs[ppsd_label]]
    accepted = sum(m.accepted for m in ppsd_metrics)
    verified = accepted + sum(m.rejected for m in ppsd_metrics)
    acceptance = accepted / verified if verified else 0.0
    slot = slot_fraction(runs[ar_label][0].trace.partition)
    ideal = ideal_ppsd_speedup_slowest_stage(acceptance, slot)
    measured = speedup(wall[ar_label], wall[ppsd_label])
    singles = [m.label for m in methods if m.executor == single and m.clock == "measured" and m.method != "eesd"]
    best_single = min(wall[label] for label in singles)
    threads_gain = speedup(wall[ar1], wall[ar2])  # T: what a second thread gives single-process AR
    # PPSD on the pipeline is S_PPSD(a) x the pipeline's AR; it beats the best single-process
    # decoding when that exceeds best / pipeline AR: the ideal model's a* for that target, at this
    # run's own overhead and slot.
    break_even = break_even_acceptance(speedup(wall[ar_label], best_single), slot)
    utilization = [statistics.mean(u) for u in zip(*(m.stage_utilization for m in ppsd_metrics))]
    return {
        "command": "python -m ppsd " + " ".join(sys.argv[1:]),  # argv[1] is the subcommand
        "model": source, "device": args.device, "prompts": len(prompts), "new_tokens": args.new_tokens,
        "stages": config.num_stages, "exit_layer": config.exit_layer,
        "stage_layers": [[r.start, r.stop] for r in runs[ar_label][0].trace.partition],
        "threads_per_worker": args.threads_per_worker, "repeats": args.repeats, "warmup": args.warmup,
        "pool_startup_seconds": startup,
        "tokens_per_second": speed,
        **best_over_fastest(methods, speed),
        "ppsd_acceptance_rate": acceptance,
        "ppsd_slot_fraction": slot,
        "ideal_ppsd_speedup": ideal,
        "measured_ppsd_speedup_vs_pipeline_ar": measured,
        "measured_over_ideal": measured / ideal,
        "best_single_process": min(singles, key=wall.get),
        "ppsd_speedup_vs_best_single_process_ar": speedup(best_single, wall[ppsd_label]),
        "ppsd_threads_speedup_vs_best_single_process_ar": speedup(best_single, wall[ppsd_threads]),
        "measured_ppsd_speedup_vs_threads_ar": speedup(wall[ar_threads], wall[ppsd_threads]),
        # what the pipeline costs plain AR: its AR over 1-thread single-process AR (1.0: nothing)
        "pipeline_ar_over_ar_1_thread": {kind: speedup(wall[ar1], wall[label]) for kind, label in at_once.items()},
        "ppsd_speedup_vs_single_process_ar_1_thread": speedup(wall[ar1], wall[ppsd_label]),
        "ar_two_thread_gain_T": threads_gain,
        "break_even_acceptance": break_even,
        "hf_over_ar_1_thread": speedup(wall[ar1], wall[hf]),
        "ppsd_stage_utilization_measured": utilization,
        "ar_ms_per_token": {label: overhead(runs[label]) for label in (ar1, *at_once.values()) if label in runs},
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "cpus": len(os.sched_getaffinity(0)),
    }
