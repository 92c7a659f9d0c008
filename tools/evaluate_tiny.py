"""Measure the embedded model on held-out Python: the numbers its model card reports
(`assets/models/ppsd-tiny/README.md`, the asset this script rebuilds).

Run ``python tools/evaluate_tiny.py --model assets/models/ppsd-tiny [--json]``. For the final
layer and every early exit E (shared head: final norm + LM head at hidden_states[E]) it reports
teacher-forced loss, perplexity, top-1 accuracy and acceptance (exit argmax == full argmax);
then greedy continuations of code prompts with their distinct-bigram ratio, the acceptance greedy
PPSD would see on them, the ideal PPSD speedup that implies, and Hugging Face ``generate``'s
greedy tokens/s on the machine it runs on.

This module knows nothing of the decoders: acceptance is computed teacher-forced, which for
greedy decoding equals PPSD's acceptance rate (every verification commits the full model's token).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from ppsd.heads.corpus import build_corpus  # noqa: E402
from ppsd.metrics import ideal_ppsd_speedup_slowest_stage  # noqa: E402
from tools.train_tiny import exit_layers, heldout_windows, layer_logits  # noqa: E402

# Prompts end without their last newline: byte-level BPE merges a newline with the next line's
# indent, so a bare trailing "\n" token is rare in training and derails the continuation.
HAND_PROMPTS = ("def fibonacci(n):",
                "class Stack:\n    \"\"\"A last-in, first-out queue.\"\"\"")
NEW_TOKENS = 64
# Prompts cut from held-out files: this many lines ending at a `def` line.
PROMPT_LINES = 8


@dataclass(frozen=True)
class LayerStats:
    """Teacher-forced quality of one head; acceptance is against the final layer's argmax."""

    loss: float
    perplexity: float
    top1: float
    acceptance: float


@dataclass(frozen=True)
class Sample:
    """One greedy continuation and its per-exit acceptance (the PPSD rate on it)."""

    prompt: str
    continuation: str
    new_tokens: int
    distinct_bigrams: float
    acceptance: dict[int, float]


def ideal_speedup(acceptance: float, exit_layer: int, num_layers: int) -> float:
    """S_PPSD with balanced stages K = L/E, so the slot is E/L: 1 / (1 - a (1 - E/L)) (ppsd.metrics)."""
    return ideal_ppsd_speedup_slowest_stage(acceptance, exit_layer / num_layers)


def distinct_bigram_ratio(ids: list[int]) -> float:
    """Share of distinct token bigrams; low values mean the text loops."""
    pairs = list(zip(ids, ids[1:]))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


@torch.no_grad()
def teacher_forced(model: PreTrainedModel, windows: torch.Tensor) -> dict[int, LayerStats]:
    """Per-head loss, perplexity, top-1 and acceptance over windows (N, T + 1)."""
    num_layers = model.config.num_hidden_layers
    sums: dict[int, list[float]] = {}
    for chunk in windows.split(8):
        targets = chunk[:, 1:].reshape(-1)
        logits = {e: lg.reshape(-1, lg.size(-1)).float()
                  for e, lg in layer_logits(model, chunk[:, :-1]).items()}
        full = logits[num_layers].argmax(-1)
        for e, lg in logits.items():
            row = sums.setdefault(e, [0.0, 0.0, 0.0])
            row[0] += F.cross_entropy(lg, targets, reduction="sum").item()
            row[1] += (lg.argmax(-1) == targets).sum().item()
            row[2] += (lg.argmax(-1) == full).sum().item()
    n = windows.size(0) * (windows.size(1) - 1)
    return {e: LayerStats(loss=s[0] / n, perplexity=math.exp(s[0] / n), top1=s[1] / n,
                          acceptance=s[2] / n) for e, s in sorted(sums.items())}


def heldout_prompts(names: list[str], texts: list[str], count: int) -> list[str]:
    """Up to ``count`` prompts, one per held-out Python file: the lines up to its first def."""
    prompts = []
    for name, text in zip(names, texts):
        lines = text.splitlines(keepends=True)
        defs = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
        if name.endswith(".py") and defs and len(prompts) < count:
            cut = defs[len(defs) // 2]  # a def in the middle of the file, past the imports
            prompts.append("".join(lines[max(0, cut - PROMPT_LINES + 1):cut + 1]).rstrip("\n"))
    return prompts


@torch.no_grad()
def greedy_sample(model: PreTrainedModel, tokenizer, prompt: str) -> Sample:
    """Greedy continuation, then teacher-forced exit-vs-full agreement on the generated part."""
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=NEW_TOKENS)
    start = ids.size(1)
    new = seq[0, start:].tolist()
    num_layers = model.config.num_hidden_layers
    logits = layer_logits(model, seq[:, :-1])
    # Position p predicts token p + 1: the generated tokens are predicted at start - 1 onwards.
    full = logits[num_layers][0, start - 1:].argmax(-1)
    acceptance = {e: (logits[e][0, start - 1:].argmax(-1) == full).float().mean().item()
                  for e in exit_layers(num_layers)}
    return Sample(prompt=prompt, continuation=tokenizer.decode(new), new_tokens=len(new),
                  distinct_bigrams=distinct_bigram_ratio(new), acceptance=acceptance)


@torch.no_grad()
def ar_tokens_per_second(model: PreTrainedModel, tokenizer, prompts: list[str]) -> float:
    """Hugging Face greedy ``generate`` throughput, exactly NEW_TOKENS per prompt."""
    model.generate(tokenizer(prompts[0], return_tensors="pt")["input_ids"], do_sample=False,
                   max_new_tokens=4)  # warm-up: first-call allocation is not decoding speed
    tokens, seconds = 0, 0.0
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        tick = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
        seconds += time.perf_counter() - tick
        tokens += out.size(1) - ids.size(1)
    return tokens / seconds


def evaluate(model_dir: str, *, windows: int = 64, seq_len: int = 256,
             prompts: int = 10) -> dict:
    """Every number of the model card, as one JSON-ready dict."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    corpus = build_corpus()
    code = [(n, t) for n, t in zip(corpus.heldout_names, corpus.heldout) if n.endswith(".py")]
    names, texts = [n for n, _ in code], [t for _, t in code]
    stream = torch.tensor([i for t in texts for i in
                           tokenizer(t, add_special_tokens=False)["input_ids"]
                           + [tokenizer.eos_token_id]])
    tf = teacher_forced(model, heldout_windows(stream, seq_len, windows))
    prompt_texts = list(HAND_PROMPTS) + heldout_prompts(names, texts, prompts)
    samples = [greedy_sample(model, tokenizer, p) for p in prompt_texts]
    num_layers = model.config.num_hidden_layers
    greedy_acc = {e: sum(s.acceptance[e] * s.new_tokens for s in samples)
                  / sum(s.new_tokens for s in samples) for e in exit_layers(num_layers)}
    return {
        "model": model_dir,
        "layers": num_layers,
        "parameters": sum(p.numel() for p in model.parameters()),
        "heldout_files": names,
        "teacher_forced": {"tokens": windows * seq_len,
                           "layers": {e: asdict(s) for e, s in tf.items()},
                           "ideal_ppsd_speedup": {e: ideal_speedup(tf[e].acceptance, e, num_layers)
                                                  for e in exit_layers(num_layers)}},
        "greedy": {"prompts": len(samples), "max_new_tokens": NEW_TOKENS,
                   "distinct_bigrams_mean": sum(s.distinct_bigrams for s in samples) / len(samples),
                   "distinct_bigrams_min": min(s.distinct_bigrams for s in samples),
                   "acceptance": greedy_acc,
                   "ideal_ppsd_speedup": {e: ideal_speedup(a, e, num_layers)
                                          for e, a in greedy_acc.items()},
                   "samples": [asdict(s) for s in samples]},
        "ar_tokens_per_s": ar_tokens_per_second(model, tokenizer, prompt_texts[:4]),
        "torch_threads": torch.get_num_threads(),
        # The CPU may be shared: the 1-minute load average puts tokens/s in context.
        "load_average_1min": os.getloadavg()[0],
    }


def render_table(report: dict) -> str:
    """The report as the plain-text table the model card quotes (also from parsed JSON)."""
    L = report["layers"]
    tf, gr = report["teacher_forced"], report["greedy"]
    lines = [f"model {report['model']}: {report['parameters'] / 1e6:.2f}M parameters, L={L}",
             f"teacher-forced on {tf['tokens']} held-out Python tokens",
             "| head | loss | ppl | top-1 | acceptance a (TF) | ideal S_PPSD (TF) | "
             "acceptance a (greedy) | ideal S_PPSD (greedy) |", "|---|---|---|---|---|---|---|---|"]
    for e, s in tf["layers"].items():
        if int(e) == L:
            lines.append(f"| final (L={L}) | {s['loss']:.3f} | {s['perplexity']:.2f} | "
                         f"{s['top1']:.3f} | - | - | - | - |")
        else:
            lines.append(f"| exit E={e} (K={L / int(e):.3g}) | {s['loss']:.3f} | "
                         f"{s['perplexity']:.2f} | "
                         f"{s['top1']:.3f} | {s['acceptance']:.3f} | "
                         f"{tf['ideal_ppsd_speedup'][e]:.2f}x | {gr['acceptance'][e]:.3f} | "
                         f"{gr['ideal_ppsd_speedup'][e]:.2f}x |")
    lines += [f"greedy: {gr['prompts']} prompts x {gr['max_new_tokens']} new tokens, distinct "
              f"bigrams mean {gr['distinct_bigrams_mean']:.3f}, "
              f"min {gr['distinct_bigrams_min']:.3f}",
              f"AR (HF generate, greedy, CPU, {report['torch_threads']} threads): "
              f"{report['ar_tokens_per_s']:.1f} tokens/s "
              f"(1-min load average {report['load_average_1min']:.1f})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="assets/models/ppsd-tiny")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--windows", type=int, default=64, help="teacher-forced windows of 256 tokens")
    p.add_argument("--prompts", type=int, default=10, help="prompts cut from held-out files")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report = evaluate(args.model, windows=args.windows, prompts=args.prompts)
    print(json.dumps(report, indent=1) if args.json else render_table(report))


if __name__ == "__main__":
    main()
