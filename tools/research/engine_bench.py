"""Time the captured-step engine against today's eager one, in one run: ms per token of eager AR
(the in-process executor), Hugging Face generate(), AR and PPSD on the graphed executor; each
stage's step time alone, the overlap factor (t1 + t2) / slot, and host waits per slot.

    python tools/research/engine_bench.py --device cuda                 # a random Llama of the default model's shape, bf16
    python tools/research/engine_bench.py --device cpu --model default  # the real default model (fp32 on a CPU)

The random model has SmolLM2-135M's exact shape (30 layers, width 576, 9/3 heads, vocab 49,152)
and drafts with an untrained `layer` head of the shipped head's shape (E = 18, 8,192 draft tokens),
which costs what the trained one costs; its acceptance is its own, so PPSD's speed at the
shipped head's acceptance is also given, projected from the measured slot time (and said so).
Median of --repeats after --warmup untimed runs; every ratio is from this one run. Prints RESULT
lines and writes --json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ppsd import DecodeConfig, StagedModel, generate  # noqa: E402
from ppsd.bench.run import fixed_length  # noqa: E402
from ppsd.config import stage_layers  # noqa: E402
from ppsd.executors import InProcessExecutor  # noqa: E402
from ppsd.executors.runtime import GraphedExecutor  # noqa: E402
from ppsd.heads import build_head  # noqa: E402
from ppsd.setup import set_up  # noqa: E402
from ppsd.static_cache import bucket_for  # noqa: E402
from ppsd.trace import Stopwatch  # noqa: E402

SHIPPED_ACCEPTANCE = 0.532  # greedy PPSD on the 12 held-out chat prompts, CPU, assets/heads card


def main(argv: list[str] | None = None) -> int:
    args = _arguments().parse_args(argv)
    torch.set_num_threads(args.threads)
    model, source, prompt = _model(args)
    model = fixed_length(model)
    partition = stage_layers(model.num_layers, args.exit_layer, 2)
    config = DecodeConfig(exit_layer=args.exit_layer, num_stages=2, max_new_tokens=args.new_tokens)
    eager = InProcessExecutor(model, partition, Stopwatch())
    graphed = GraphedExecutor(model, partition, compiled=args.compiled)

    def run(method: str, executor, threads: int = args.threads):
        def decode():
            torch.set_num_threads(threads)
            return generate(model, prompt, DecodeConfig(**{**vars(config), "method": method}), executor=executor)
        return decode

    def hf():
        torch.set_num_threads(args.threads)
        ids = torch.tensor([prompt], device=model.info.device)
        model.hf_model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                do_sample=False, eos_token_id=None, pad_token_id=0)

    methods = {"eager AR (in-process)": run("ar", eager), "HF generate()": hf,
               "graphed AR": run("ar", graphed), "graphed PPSD": run("ppsd", graphed)}
    if args.compiled:  # the fastest AR a CPU has may use every core: both, compiled and eager, on them all
        cores = len(os.sched_getaffinity(0))
        in_turn = GraphedExecutor(model, partition, compiled=True, stage_threads=False)
        methods |= {f"eager AR (in-process), {cores} threads": run("ar", eager, cores),
                    f"compiled AR in turn, {cores} threads": run("ar", in_turn, cores)}
    with torch.inference_mode():
        timed, results = _timed(methods, args)
        extra = {"host_waits_per_slot": _host_waits(run("ppsd", graphed), args.device),
                 "alone": _stage_alone_ms(graphed, args.device, bucket_for(len(prompt) + args.new_tokens)),
                 "sweep": {e: _sweep_point(model, e, prompt, args) for e in args.sweep_exit_layers}}
    report = _report(args, model, source, timed, results["graphed PPSD"], extra)
    _print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, help="'default' or a path: a real model instead of the random one")
    parser.add_argument("--layers", type=int, default=30, help="random model: layers (30 = the default model)")
    parser.add_argument("--hidden", type=int, default=576, help="random model: width")
    parser.add_argument("--exit-layer", type=int, default=18)
    parser.add_argument("--prompt-tokens", type=int, default=48, help="random model: prompt length")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--perfect-exit", action="store_true",
                        help="random model: layers from E on add nothing and the head drafts the whole "
                             "vocabulary, so every draft is accepted (a = 1): the upper-bound control")
    parser.add_argument("--compiled", action="store_true",
                        help="on a CPU: the graphed executor's steps compiled (Inductor, C++ wrapper), stages on threads")
    parser.add_argument("--sweep-exit-layers", type=int, nargs="*", default=[],
                        help="CUDA: also each stage's step time alone at these E (an untrained head of the same shape)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", default=None)
    return parser


def _timed(methods: dict, args) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Seconds of each kept repeat per method, interleaved (a drifting machine hits every method
    alike), and each method's last result."""
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    timed: dict[str, list[float]] = {label: [] for label in methods}
    results: dict[str, object] = {}
    for repeat in range(args.warmup + args.repeats):
        for label, method in methods.items():
            sync()
            started = time.perf_counter()
            result = method()
            sync()
            elapsed = time.perf_counter() - started
            print(f"{label}, {'repeat' if repeat >= args.warmup else 'warm-up'} {repeat}: {elapsed:.3f} s", flush=True)
            if repeat >= args.warmup:
                timed[label].append(elapsed)
                results[label] = result
    return timed, results


def _report(args, model: StagedModel, source: str, timed: dict, ppsd_result, extra: dict) -> dict:
    ms = {label: statistics.median(t) / args.new_tokens * 1e3 for label, t in timed.items()}
    slots = max(e.slot for e in ppsd_result.trace.events if e.slot is not None) + 1
    slot_ms = statistics.median(timed["graphed PPSD"]) * 1e3 / slots
    accepted = sum(t.status == "accepted" for t in ppsd_result.tokens)
    verified = sum(t.status in ("accepted", "corrected") for t in ppsd_result.tokens)
    t1, t2 = extra["alone"].get(0, float("nan")), extra["alone"].get(1, float("nan"))
    span, during, host = _slot_spans(ppsd_result, slot_ms) if args.device.startswith("cuda") else (None, {}, None)
    projected = slot_ms * (SHIPPED_ACCEPTANCE + (1 - SHIPPED_ACCEPTANCE) * 2)  # 1 slot accepted, K = 2 corrected
    return {
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "model": source, "dtype": model.info.dtype, "torch": torch.__version__, "threads": args.threads,
        "compiled": args.compiled, "new_tokens": args.new_tokens, "repeats": args.repeats, "warmup": args.warmup,
        "exit_layer": args.exit_layer, "ms_per_token": ms,
        "graphed_ar_vs_eager_ar": ms["eager AR (in-process)"] / ms["graphed AR"],
        "graphed_ppsd_vs_graphed_ar": ms["graphed AR"] / ms["graphed PPSD"],
        "ppsd_acceptance": accepted / verified if verified else 0.0, "ppsd_slots": slots, "ppsd_slot_ms": slot_ms,
        "stage_alone_ms": {"stage 1 (layers 0..E + head)": t1, "stage 2 (layers E..L + LM head)": t2},
        "overlap_factor": (t1 + t2) / slot_ms,
        "ppsd_slot_gpu_span_ms": span, "ppsd_stage_ms_during_slots": during, "ppsd_host_ms_per_slot": host,
        "stage_alone_ms_by_exit_layer": extra["sweep"], "host_waits_per_slot": extra["host_waits_per_slot"],
        "projected_ppsd_ms_per_token_at_shipped_acceptance": {
            "acceptance": SHIPPED_ACCEPTANCE, "ms_per_token": projected, "vs_graphed_ar": ms["graphed AR"] / projected,
            "how": "projected: measured PPSD slot time x (a + 2 (1 - a)), a = the shipped head's CPU acceptance"},
    }


def _print(report: dict) -> None:
    ms, (t1, t2) = report["ms_per_token"], report["stage_alone_ms"].values()
    for label, value in ms.items():
        print(f"RESULT {label}: {value:.3f} ms/token")
    print(f"RESULT graphed AR / eager AR speed: {report['graphed_ar_vs_eager_ar']:.2f}x; graphed PPSD / graphed AR: "
          f"{report['graphed_ppsd_vs_graphed_ar']:.2f}x at this model's acceptance {report['ppsd_acceptance']:.3f}")
    print(f"RESULT stage alone: t1 {t1:.3f} ms, t2 {t2:.3f} ms; PPSD slot {report['ppsd_slot_ms']:.3f} ms; "
          f"overlap (t1 + t2) / slot = {report['overlap_factor']:.2f}")
    print(f"RESULT host waits per slot (graphed PPSD): {report['host_waits_per_slot']}")
    if report["ppsd_host_ms_per_slot"] is not None:
        during = report["ppsd_stage_ms_during_slots"]
        print(f"RESULT PPSD slot on the GPU (first start to last end, median): {report['ppsd_slot_gpu_span_ms']:.3f} ms; "
              f"stages during it {during[1]:.3f} / {during[2]:.3f} ms; host {report['ppsd_host_ms_per_slot']:.3f} ms a slot")
    for e, (a1, a2) in report["stage_alone_ms_by_exit_layer"].items():
        print(f"RESULT E = {e}: stage 1 alone {a1:.3f} ms, stage 2 alone {a2:.3f} ms")
    projected = report["projected_ppsd_ms_per_token_at_shipped_acceptance"]
    print(f"RESULT projected graphed PPSD at a = {SHIPPED_ACCEPTANCE}: {projected['ms_per_token']:.3f} ms/token, "
          f"{projected['vs_graphed_ar']:.2f}x graphed AR (projected from the measured slot)")


def _model(args) -> tuple[StagedModel, str, list[int]]:
    if args.model:
        from ppsd import DEFAULT_MODEL, load_model

        name = DEFAULT_MODEL if args.model == "default" else args.model
        from ppsd.bench.prompts import CHAT_PROMPTS_FILE, load_prompts
        from ppsd.chat import encode_prompt

        model, tokenizer = load_model(name, device=args.device)
        setup = set_up(model, DecodeConfig(exit_layer=args.exit_layer, num_stages=2))
        question = load_prompts(str(CHAT_PROMPTS_FILE))[0][0]  # a held-out chat question: real acceptance
        prompt = encode_prompt(tokenizer, question["prompt"], chat=True)
        return setup.model, f"{name} with {setup.head}, prompt {question['name']!r}", prompt
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                         num_hidden_layers=args.layers, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=args.hidden // 9, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
                         eos_token_id=None, pad_token_id=None, bos_token_id=None)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    with torch.device(args.device):  # initialised where it runs: seconds, not a CPU's minute
        hf_model = LlamaForCausalLM(config).to(dtype).eval()
    hf_model.config._attn_implementation = "sdpa"
    if args.perfect_exit:
        with torch.no_grad():  # zero outputs, full cost: the residual stream passes layers >= E unchanged
            for layer in hf_model.model.layers[args.exit_layer:]:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    model = StagedModel(hf_model, name="random-smollm2-shape")
    drafts = None if args.perfect_exit else 8192
    head = build_head("layer", model, args.exit_layer, draft_vocab=drafts)
    perfect = ", layers >= E zeroed (every draft accepted)" if args.perfect_exit else ""
    prompt = torch.randint(1, config.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0))
    return model.with_exit_head(head), (f"random Llama ({args.layers} layers, width {args.hidden}, 9/3 heads, "
                                        f"vocab 49152{perfect}) with an untrained layer head at E = {args.exit_layer}, "
                                        f"{drafts or 49152} draft tokens"), prompt.tolist()


def _slot_spans(result, slot_ms: float) -> tuple[float, dict[int, float], float]:
    """From a measured (CUDA-event) PPSD trace: the median slot's span on the GPU (first stage's
    start to last stage's end), each stage's median time during slots, and the host's share of
    a slot (the wall slot less the span)."""
    by_slot: dict[int, list] = {}
    for event in result.trace.events:
        if event.slot is not None:
            by_slot.setdefault(event.slot, []).append(event)
    spans = [max(e.end for e in es) - min(e.start for e in es) for es in by_slot.values() if len(es) > 1]
    span = statistics.median(spans) * 1e3 if spans else float("nan")
    during = {k: statistics.median(e.duration for es in by_slot.values() for e in es if e.stage == k) * 1e3
              for k in (1, 2)}
    return span, during, slot_ms - span


def _sweep_point(model: StagedModel, exit_layer: int, prompt: list[int], args) -> tuple[float, float]:
    """Stage times alone at another E: an untrained layer head there, the steps captured by a short run."""
    at = model.with_exit_head(build_head("layer", model, exit_layer, draft_vocab=8192))
    executor = GraphedExecutor(at, stage_layers(model.num_layers, exit_layer, 2))
    generate(at, prompt, DecodeConfig(exit_layer=exit_layer, num_stages=2, max_new_tokens=8), executor=executor)
    alone = _stage_alone_ms(executor, args.device, bucket_for(len(prompt) + 8))
    return alone.get(0, float("nan")), alone.get(1, float("nan"))


def _host_waits(run, device: str) -> float:
    """Blocking host waits per PPSD slot in one untimed run: device and event synchronisations,
    scalar reads of device tensors and device-to-host copies to pageable memory."""
    if not device.startswith("cuda"):
        return float("nan")  # a CPU makes no host waits: it computes on the host
    from torch.utils._python_dispatch import TorchDispatchMode

    count = {"waits": 0}

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default) and \
                    args[0].is_cuda:
                count["waits"] += 1
            return func(*args, **kwargs)

    patched = [(torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"), (torch.cuda.Stream, "synchronize")]
    originals = [getattr(owner, name) for owner, name in patched]

    def counting(original):
        def wrapper(*a, **k):
            count["waits"] += 1
            return original(*a, **k)
        return wrapper

    with contextlib.ExitStack() as stack:
        for (owner, name), original in zip(patched, originals):
            setattr(owner, name, counting(original))
            stack.callback(setattr, owner, name, original)
        stack.enter_context(Reads())
        result = run()
    slots = max(e.slot for e in result.trace.events if e.slot is not None) + 1
    calls = slots + 2  # the prologue's push and flow are calls too
    return count["waits"] / calls


def _stage_alone_ms(executor: GraphedExecutor, device: str, bucket: int) -> dict[int, float]:
    """Each stage's captured one-token step replayed alone (stage 1 drafting), median ms."""
    if not device.startswith("cuda"):
        return {}
    out = {}
    for k in range(len(executor.partition)):
        graph = executor.how.graphs.get((k, bucket, k == 0))
        if graph is None:
            continue
        times = []
        for _ in range(200):
            begun, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begun.record()
            graph[0].replay()
            ended.record()
            ended.synchronize()
            times.append(begun.elapsed_time(ended))
        out[k] = statistics.median(times)
    return out


if __name__ == "__main__":
    sys.exit(main())
