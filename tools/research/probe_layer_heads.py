"""Probe (issue 22, lever "Capacity and initialisation"): does a `layer` exit head at E = 18 agree
more often with the full model when it starts from one of the model's own later layers, or has
two layers instead of one?

Variants, all trained and measured alike:
- `zero`: the shipped design. A copy of layer E-1 with its two output projections zeroed, so the
  untrained head is exactly the shared head.
- `copyE`: a copy of layer E, the layer the head stands in for, outputs kept (not zeroed).
- `copyLast`: a copy of the last layer, outputs kept.
- `two`: two `zero` layers in a row (twice the parameters; stage 1 pays about one more layer).
- `copyE+1`: copies of layers E and E+1, outputs kept (what the model itself does next, except
  that attention reads layer E-1's cached keys and values instead of each layer's own).

Every head's attention reads layer E-1's keys and values, as the shipped head does, so it writes
nothing to the KV cache and rollback needs nothing from it.

Training: the shipped head's recipe at a smaller budget: the teacher's pass cached once
(`CachedTeacher`), `--steps` steps of 16 x 256 tokens, AdamW, lr 1e-3 with a cosine decay, loss
KL(p || q) + 1 x CE(argmax p, q) over the shipped head's 8,192-token draft vocabulary (the same
vocabulary for every variant), the same seed and batches for each. Data: the kept chat transcripts
(`assets/data/...jsonl.gz`), a tenth of the prompts held out by hash as `train-head` does.

Measured per head:
- teacher-forced agreement with the full model's argmax on held-out transcript windows (the
  figure `train-head` prints), and
- greedy PPSD acceptance (accepted / verified drafts, in process, K = 2) on the 12 held-out chat
  prompts of assets/prompts/chat.json, 64 new tokens each: the figure the issue's table asks for.

    python tools/research/probe_layer_heads.py --out docs/bench/heads/probe-layer-heads.json --steps 400

`--exit-layer` trains the same variants at another E (lever "E chosen by measured speed"): the
shipped head is then measured at its own E = 18 as the reference; `--data` points at another
build of the transcripts (the probes of 2026-12-04 used the kept file of commit 225e500, 1,120
transcripts: `git show 225e500:assets/data/smollm2-135m-instruct-chat-answers.jsonl.gz`).

Not part of the library.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ppsd.chat import encode_prompt  # noqa: E402
from ppsd.config import DecodeConfig  # noqa: E402
from ppsd.cli.train_head import ppsd_acceptance  # noqa: E402
from ppsd.bench.prompts import CHAT_PROMPTS_FILE  # noqa: E402
from ppsd.heads import default_exit_layer, load_exit_head, shipped_head  # noqa: E402
from ppsd.heads.data import read_chat_answers  # noqa: E402
from ppsd.heads.distill import (CachedTeacher, TrainConfig, acceptance, distill_loss, eval_windows,  # noqa: E402
                                learning_rate)
from ppsd.heads.exits import LayerAdapter, LayerExitHead  # noqa: E402
from ppsd.model import load_model  # noqa: E402
from ppsd.model_source import DEFAULT_MODEL  # noqa: E402

VARIANTS = ("zero", "copyE", "copyLast", "two", "copyE+1")
DATA = ROOT / "assets/data/smollm2-135m-instruct-chat-answers.jsonl.gz"
PROMPTS = CHAT_PROMPTS_FILE


def copied(layer: nn.Module) -> LayerAdapter:
    """A LayerAdapter that is `layer` as it is: the output projections LayerAdapter zeroes are
    copied back."""
    adapter = LayerAdapter(layer)
    adapter.o_proj.weight.data.copy_(layer.self_attn.o_proj.weight.data)
    adapter.mlp.down_proj.weight.data.copy_(layer.mlp.down_proj.weight.data)
    return adapter


class Stacked(nn.Module):
    """Adapters in a row, each reading the same keys and values; it looks like one LayerAdapter
    to LayerExitHead (`q_proj` for the dtype, `head_dim` for the keys)."""

    def __init__(self, adapters: list[LayerAdapter]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(adapters)
        self.head_dim = adapters[0].head_dim

    @property
    def q_proj(self) -> nn.Module:
        return self.layers[0].q_proj

    def forward(self, hidden, keys, values, rotary, position):
        for layer in self.layers:
            hidden = layer(hidden, keys, values, rotary, position)
        return hidden


def build(variant: str, model, exit_layer: int, vocab: torch.Tensor) -> LayerExitHead:
    layers = model.hf_model.model.layers
    head = LayerExitHead(model, exit_layer, draft_vocab=len(vocab))  # a `zero` head
    adapters = {"zero": None, "copyE": [copied(layers[exit_layer])], "copyLast": [copied(layers[-1])],
                "two": [LayerAdapter(layers[exit_layer - 1]), LayerAdapter(layers[exit_layer - 1])],
                "copyE+1": [copied(layers[exit_layer]), copied(layers[exit_layer + 1])]}[variant]
    if adapters is not None:
        adapter = adapters[0] if len(adapters) == 1 else Stacked(adapters)
        adapter.register_buffer("draft_vocab", vocab.clone())
        head.adapter = adapter
    head.adapter.draft_vocab.copy_(vocab)
    head.adapter.requires_grad_(True)  # copies of frozen layers come frozen
    return head.float()


def train(head: LayerExitHead, cached: CachedTeacher, config: TrainConfig, name: str) -> list[dict]:
    optimizer = torch.optim.AdamW(head.adapter.parameters(), lr=config.lr, weight_decay=0.0)
    history = []
    head.train()
    for step in tqdm(range(config.steps), desc=f"train {name}", unit="step", mininterval=30):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step)
        states, target = cached.batch(step, config, head.draft_vocab)
        loss = distill_loss(head.batch_logits(states), target, config.ce_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % 50 == 0:
            history.append({"step": step + 1, "loss": round(loss.item(), 4)})
    head.eval()
    return history


def greedy_acceptance(model, head, prompts: list[list[int]], exit_layer: int, tokens: int) -> float:
    """Greedy PPSD's acceptance with `head`, K = 2, in process: `train-head`'s measure."""
    config = DecodeConfig(method="ppsd", exit_layer=exit_layer, num_stages=2, max_new_tokens=tokens)
    return ppsd_acceptance(model.with_exit_head(head), prompts, config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/bench/heads/probe-layer-heads.json")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--exit-layer", type=int, default=None, help="default: the shipped head's E")
    parser.add_argument("--data", default=str(DATA))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    shipped_e = default_exit_layer(DEFAULT_MODEL, model.num_layers, 2)
    exit_layer = args.exit_layer or shipped_e
    shipped = load_exit_head(shipped_head(model, shipped_e), model, shipped_e)
    vocab = shipped.draft_vocab.clone()
    data = read_chat_answers(args.data)
    config = TrainConfig(exit_layer=exit_layer, head_type="layer", draft_vocab=len(vocab), steps=args.steps,
                         lr=1e-3, lr_schedule="cosine", ce_weight=1.0, cache_features=True, batch_size=16,
                         seq_len=256, seed=0).validated(model.num_layers)
    windows = eval_windows(data.heldout, config)
    prompts = [encode_prompt(tokenizer, e["prompt"], chat=True) for e in json.loads(PROMPTS.read_text())]
    began = time.perf_counter()
    cached = CachedTeacher(model, data.train, config, progress=True)
    result = {"question": __doc__.split("\n\n")[0], "data": data.description, "train_tokens": data.train.numel(),
              "config": {k: getattr(config, k) for k in ("steps", "lr", "lr_schedule", "ce_weight", "batch_size",
                                                         "seq_len", "seed")},
              "teacher_seconds": round(time.perf_counter() - began, 1), "threads": args.threads,
              "exit_layer": exit_layer,
              "decode": f"greedy PPSD, K = 2, in process, {len(prompts)} prompts of {PROMPTS.name} x "
                        f"{args.decode_tokens} new tokens", "heads": []}
    reference = acceptance(model, shipped, windows, shipped_e)
    result["shipped"] = {"exit_layer": shipped_e, "teacher_forced": round(reference.head, 4),
                         "shared": round(reference.shared, 4), "positions": reference.positions,
                         "greedy": round(greedy_acceptance(model, shipped, prompts, shipped_e, args.decode_tokens), 4)}
    print(json.dumps({"shipped": result["shipped"]}), flush=True)
    with torch.no_grad():
        model.hf_model.requires_grad_(False)
    for variant in args.variants:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            head = build(variant, model, exit_layer, vocab)
        at_init = acceptance(model, head, windows, exit_layer).head
        began = time.perf_counter()
        history = train(head, cached, config, variant)
        row = {"variant": variant, "params": sum(p.numel() for p in head.adapter.parameters()),
               "at_init": round(at_init, 4), "teacher_forced": round(acceptance(model, head, windows, exit_layer).head, 4),
               "train_seconds": round(time.perf_counter() - began, 1), "history": history}
        row["greedy"] = round(greedy_acceptance(model, head, prompts, exit_layer, args.decode_tokens), 4)
        print(json.dumps({k: v for k, v in row.items() if k != "history"}), flush=True)
        result["heads"].append(row)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
