"""Probe (issue 22, lever "Head inputs"): does an exit head that also reads the full model's
final-layer state of an earlier position agree more often with the full model?

Question. With K = 2 pipeline stages, when stage 1 drafts the token after position p from the
layer-E state h_E[p] (E = 18 of SmolLM2-135M-Instruct's 30 layers), stage 2 has already finished
the full model's final-layer state f[p-2] (lag 2: free) and is computing f[p-1] (lag 1: stage 1
may have to wait for it). EAGLE's strongest input is a final-layer feature. How much does giving
the head f[p-2] or f[p-1] raise its agreement with the full model's argmax over h_E[p] alone?

Method (teacher-forced, NOT greedy PPSD acceptance):
- Data: chat transcripts written by tools/build_chat_data.py. About a tenth of the distinct
  prompts is held out by the same hash as `ppsd.heads.data.read_chat_answers` (sha256 of the
  prompt, first byte % 10 == 9), so the shipped head never trained on them either.
- Positions: answer positions only, p = P-1 .. N-2 (P prompt tokens, N in all), i.e. every
  position whose next token is an answer token. Target: the FULL model's argmax at p from the
  teacher pass (not the transcript's token: sampled answers are not the argmax).
- One teacher pass (inference mode, float32, batched, right-padded) keeps, in float16:
  h_E[p] = hidden_states[E]; f[q] = hidden_states[-1], the final state AFTER the model's final
  norm (what the LM head reads), for q = P-3 .. N-2, so f[p], f[p-1], f[p-2] are all there; the
  shipped head's pre-norm output at p (a forward hook on its adapter) and its top-2 drafts.
- Heads of identical shape, parameters and FLOPs for every input set: h' = base + down(silu(
  up([norm1(base), norm2(lag2), norm3(lag1)]))), an unused slot fed zeros (RMSNorm(0) = 0: it
  carries nothing and gets no gradient), `down` zero-initialised, then the model's frozen final
  norm and LM head restricted to the shipped head's 8,192-token draft vocabulary. Input sets:
  A base only, B base + f[p-2], C base + f[p-1], D base + both. Two bases: `hE` (h_E[p]: the head
  starts as the shared head) and `shipped` (the frozen shipped `layer` head's output: it starts
  as the shipped head, and the MLP learns a correction on top).
- Each head: same seed (same initial weights), same batches (drawn by (seed, step)), same steps
  and lr (AdamW, cosine); loss CE on the full model's argmax (positions whose argmax lies outside
  the draft vocabulary are left out of the CE) + `--kl-weight` (default 0) x KL(p || q), p the
  full model's distribution renormalised over the draft vocabulary. Reported: held-out top-1 and top-2
  agreement with the full model's argmax (a miss whenever it lies outside the draft vocabulary).

    nice -n 5 python tools/research/probe_head_inputs.py --data assets/data/smollm2-135m-instruct-chat-answers.jsonl.gz \
        --out docs/bench/heads/probe-head-inputs.json --steps 400

`--stage1-cost` instead times stage 1 (layers [0, E) + the shipped head, one position, one
thread) at a batch of 1 and of 2 candidates, what top-2 drafting would cost it:

    nice -n 5 python tools/research/probe_head_inputs.py --stage1-cost --repeats 300 \
        --out docs/bench/heads/stage1-batch2-cost.json

Not part of the library; it reads the shipped head from assets/heads/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ppsd.chat import encode_prompt  # noqa: E402
from ppsd.heads import load_exit_head  # noqa: E402
from ppsd.heads.data import open_jsonl  # noqa: E402
from ppsd.model import load_model  # noqa: E402
from ppsd.static_cache import StaticKVCache  # noqa: E402

SLOTS = ("base", "lag2", "lag1")
INPUT_SETS = {"A": ("base",), "B": ("base", "lag2"), "C": ("base", "lag1"), "D": ("base", "lag2", "lag1")}
DESCRIBED = {"A": "base alone", "B": "base + f[p-2] (lag 2)", "C": "base + f[p-1] (lag 1)",
             "D": "base + f[p-2] + f[p-1]"}
BASES = {"hE": "h_E[p] (layer-18 state; starts as the shared head)",
         "shipped": "the shipped layer head's output at p (frozen; starts as the shipped head)"}
DEFAULT_RUNS = ["hE/A", "hE/B", "hE/C", "hE/D", "shipped/A", "shipped/B", "shipped/C"]
DEFAULT_HEAD = "assets/heads/smollm2-135m-instruct-e18"  # relative to the repository root


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="assets/data/smollm2-135m-instruct-chat-answers.jsonl.gz")
    parser.add_argument("--out", default="docs/bench/heads/probe-head-inputs.json")
    parser.add_argument("--head", default=DEFAULT_HEAD, help="the shipped head (draft vocabulary, reference)")
    parser.add_argument("--exit-layer", type=int, default=18)
    parser.add_argument("--limit", type=int, default=0, help="first N transcripts only (0: all)")
    parser.add_argument("--batch-seqs", type=int, default=8, help="transcripts per teacher batch")
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, help="BASE/SET pairs, e.g. hE/A shipped/B")
    parser.add_argument("--width", type=int, default=1536, help="the MLP's hidden width")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=1024, help="positions per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--kl-weight", type=float, default=0.0, help="0: CE on the argmax alone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stage1-cost", action="store_true",
                        help="instead: time stage 1 (layers [0, E) + the shipped head) at batch 1 and 2, one thread")
    parser.add_argument("--repeats", type=int, default=300, help="timed steps per batch size (--stage1-cost)")
    return parser.parse_args(argv)


def load_rows(path: str, limit: int) -> list[dict]:
    """Transcripts, each with `held` set by the hash `ppsd.heads.data.read_chat_answers` uses."""
    with open_jsonl(path) as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    rows = rows[:limit] if limit else rows
    for row in rows:
        row["held"] = hashlib.sha256(row["prompt"].encode()).digest()[0] % 10 == 9
    return rows


class Features(dict):
    """Per answer position: base inputs (`hE`, `shipped`, float16), `at` (index of f[p] in
    `final`), `target` (full argmax id), `held`, `shipped_top2` (ids); `final` holds f[q]."""


def _keep(parts: dict, row: dict, b: int, states: tuple, adapted: torch.Tensor, drafts: torch.Tensor,
          exit_layer: int, offset: int) -> int:
    """Append one transcript's answer positions to `parts`; returns the new length of `final`."""
    start, count = len(row["prompt_ids"]) - 1, len(row["answer_ids"])
    picked = slice(start, start + count)
    parts["hE"].append(states[exit_layer][b, picked].half())
    parts["shipped"].append(adapted[b, picked].half())
    parts["final"].append(states[-1][b, start - 2: start + count].half())
    parts["at"].append(torch.arange(count) + offset + 2)
    parts["held"].append(torch.full((count,), row["held"]))
    parts["shipped_top2"].append(drafts[b, picked])
    return offset + count + 2


@torch.inference_mode()
def teacher_pass(model, head, rows: list[dict], args: argparse.Namespace) -> Features:
    """One frozen pass over every transcript (shortest first, right-padded: causal attention
    keeps padding out of every real position)."""
    hf, captured, parts, offset = model.hf_model, {}, defaultdict(list), 0
    hook = head.adapter.register_forward_hook(lambda module, inputs, output: captured.update(out=output))
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["prompt_ids"]) + len(rows[i]["answer_ids"]))
    batches = [order[i: i + args.batch_seqs] for i in range(0, len(order), args.batch_seqs)]
    for batch in tqdm(batches, desc="teacher pass", unit="batch"):
        seqs = [rows[i]["prompt_ids"] + rows[i]["answer_ids"] for i in batch]
        width = max(map(len, seqs))
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
        states = hf.model(ids, output_hidden_states=True, use_cache=False).hidden_states
        drafts = head.draft_vocab[head.batch_logits(states).topk(2, dim=-1).indices]
        for b, i in enumerate(batch):
            offset = _keep(parts, rows[i], b, states, captured["out"], drafts, args.exit_layer, offset)
    hook.remove()
    features = Features({k: torch.cat(v) for k, v in parts.items()})
    weight = hf.lm_head.weight
    features["target"] = torch.cat([F.linear(chunk.float(), weight).argmax(-1)
                                    for chunk in features["final"][features["at"]].split(4096)])
    return features


class ProbeHead(nn.Module):
    """base + down(silu(up(concat of the normed slots))), unused slots zero; `down` starts at zero."""

    def __init__(self, hidden: int, width: int, used: tuple[str, ...], eps: float) -> None:
        super().__init__()
        self.used = used
        self.norms = nn.ModuleList(nn.RMSNorm(hidden, eps=eps) for _ in SLOTS)
        self.up = nn.Linear(len(SLOTS) * hidden, width, bias=False)
        self.down = nn.Linear(width, hidden, bias=False)
        nn.init.zeros_(self.down.weight)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        base = inputs["base"]
        slots = [norm(inputs[s]) if s in self.used else torch.zeros_like(base) for s, norm in zip(SLOTS, self.norms)]
        return base + self.down(F.silu(self.up(torch.cat(slots, dim=-1))))


def gather(features: Features, base: str, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Float32 inputs of the positions `rows`: base, f[p-2], f[p-1], and f[p] (the teacher's)."""
    at = features["at"][rows]
    final = features["final"]
    return {"base": features[base][rows].float(), "lag2": final[at - 2].float(), "lag1": final[at - 1].float(),
            "f": final[at].float()}


class Scorer:
    """The frozen final norm + LM head over the draft vocabulary, and the targets' draft indices."""

    def __init__(self, model, vocab: torch.Tensor) -> None:
        self.norm = model.hf_model.model.norm
        self.weight = model.hf_model.lm_head.weight.detach()[vocab].float()
        self.vocab = vocab
        self.index = torch.full((model.hf_model.lm_head.out_features,), -100, dtype=torch.long)
        self.index[vocab] = torch.arange(len(vocab))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(hidden), self.weight)


def loss_of(scorer: Scorer, head: ProbeHead, inputs: dict, target: torch.Tensor, kl_weight: float) -> torch.Tensor:
    """CE on the full argmax's draft index (-100 outside the vocabulary: ignored) + KL(p || q)."""
    log_q = F.log_softmax(scorer.logits(head(inputs)), dim=-1)
    loss = F.nll_loss(log_q, scorer.index[target], ignore_index=-100)
    if kl_weight:
        with torch.no_grad():
            log_p = F.log_softmax(F.linear(inputs["f"], scorer.weight), dim=-1)  # f is already normed
        loss = loss + kl_weight * F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    return loss


def train(features: Features, scorer: Scorer, base: str, name: str, args: argparse.Namespace) -> tuple:
    """A probe head for input set `name` on base `base`; (head, seconds, last losses)."""
    torch.manual_seed(args.seed)
    hidden = features["hE"].shape[1]
    head = ProbeHead(hidden, args.width, INPUT_SETS[name], scorer.norm.variance_epsilon)
    optimiser = torch.optim.AdamW(head.parameters(), lr=args.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.5 * (1 + torch.cos(torch.tensor(torch.pi * step / args.steps)).item()))
    pool = torch.nonzero(~features["held"]).squeeze(1)
    start, losses = time.perf_counter(), []
    for step in tqdm(range(args.steps), desc=f"train {base}/{name}", unit="step"):
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        rows = pool[torch.randint(0, len(pool), (args.batch,), generator=generator)]
        loss = loss_of(scorer, head, gather(features, base, rows), features["target"][rows], args.kl_weight)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        schedule.step()
        losses.append(loss.item())
    return head, time.perf_counter() - start, losses


@torch.inference_mode()
def agreement(features: Features, scorer: Scorer, base: str, head: ProbeHead) -> dict:
    """Held-out top-1 and top-2 agreement of `head`'s drafts with the full model's argmax."""
    held = torch.nonzero(features["held"]).squeeze(1)
    top1 = top2 = 0
    for rows in held.split(4096):
        drafts = scorer.vocab[scorer.logits(head(gather(features, base, rows))).topk(2, dim=-1).indices]
        hits = drafts == features["target"][rows, None]
        top1 += hits[:, 0].sum().item()
        top2 += hits.any(-1).sum().item()
    return {"top1": round(top1 / len(held), 4), "top2": round(top2 / len(held), 4)}


def reference(features: Features, scorer: Scorer) -> dict:
    """The shipped head's own held-out top-1/top-2, and the draft vocabulary's ceiling."""
    held = features["held"]
    target = features["target"][held]
    hits = features["shipped_top2"][held] == target[:, None]
    return {"shipped_top1": round(hits[:, 0].float().mean().item(), 4),
            "shipped_top2": round(hits.any(-1).float().mean().item(), 4),
            "argmax_in_draft_vocab": round((scorer.index[target] >= 0).float().mean().item(), 4)}


def data_summary(rows: list[dict], features: Features, args: argparse.Namespace) -> dict:
    held = features["held"]
    return {"file": args.data, "sha256": hashlib.sha256(Path(args.data).read_bytes()).hexdigest()[:12],
            "transcripts": len(rows), "held_out_transcripts": sum(r["held"] for r in rows),
            "distinct_prompts": len({r["prompt"] for r in rows}),
            "held_out_prompts": len({r["prompt"] for r in rows if r["held"]}),
            "sampled_transcripts": sum(r.get("temperature", 0.0) > 0 for r in rows),
            "train_positions": int((~held).sum()), "held_out_positions": int(held.sum()),
            "tokens_through_teacher": sum(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)}


def one_head(features: Features, scorer: Scorer, base: str, name: str, args: argparse.Namespace) -> dict:
    """Train and evaluate one probe head: its result row."""
    head, seconds, losses = train(features, scorer, base, name, args)
    zero = ProbeHead(head.up.in_features // len(SLOTS), args.width, INPUT_SETS[name], 1e-6)
    row = {"base": base, "set": name, "inputs": DESCRIBED[name], **agreement(features, scorer, base, head),
           "train_seconds": round(seconds, 1), "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
           "params": sum(p.numel() for p in zero.parameters())}
    if name == "A":  # zero-initialised: where every head of this base starts
        row["at_init"] = agreement(features, scorer, base, zero)
    return row


def run_heads(features: Features, scorer: Scorer, args: argparse.Namespace, save) -> list[dict]:
    """Every BASE/SET of `--runs`, one result row each, printed and saved as it comes."""
    results = []
    for run in args.runs:
        base, _, name = run.partition("/")
        if base not in BASES or name not in INPUT_SETS:
            raise SystemExit(f"unknown run {run!r}: BASE in {list(BASES)}, SET in {list(INPUT_SETS)}")
        results.append(one_head(features, scorer, base, name, args))
        print(json.dumps(results[-1]), flush=True)
        save(results)
    return results


@torch.inference_mode()
def stage1_cost(args: argparse.Namespace) -> dict:
    """Median ms of one stage-1 draft step (layers [0, E) at one position, then the shipped head)
    for a batch of 1 and of 2 candidates (top-2 drafting; the prompt's cache copied per row),
    interleaved, one intra-op thread, after a warm-up. The head's logits are those of row 0 only
    (as the drafting code reads them); both rows go through its layer and its LM-head slice."""
    torch.set_num_threads(1)
    model, tokenizer = load_model()
    model = model.with_exit_head(load_exit_head(ROOT / args.head, model, args.exit_layer))
    ids = encode_prompt(tokenizer, "Explain how rainbows form, in three short paragraphs.", chat=True)
    layers, caches, times = range(args.exit_layer), {}, {1: [], 2: []}
    for batch in times:
        caches[batch] = StaticKVCache.for_model(model.hf_model, batch=batch)
        view = caches[batch].at(layers, 0, len(ids))
        model.run_static(model.embed(ids).expand(batch, -1, -1), layers, positions=view.write, cache=view)
    step = model.embed([ids[-1]])
    for repeat in range(args.repeats + 20):
        for batch, cache in caches.items():
            start = time.perf_counter()
            view = cache.at(layers, len(ids), 1)
            hidden = model.run_static(step.expand(batch, -1, -1), layers, positions=view.write, cache=view)
            model.exit_logits(hidden, position=view.write, cache=view).argmax()
            if repeat >= 20:  # the first 20 are the warm-up
                times[batch].append(time.perf_counter() - start)
            cache.truncate(len(ids))
    median = {b: sorted(t)[len(t) // 2] * 1e3 for b, t in times.items()}
    return {"command": "nice -n 5 python " + " ".join([sys.argv[0], *sys.argv[1:]]),
            "what": stage1_cost.__doc__.replace("\n    ", " ").strip(), "exit_layer": args.exit_layer,
            "prompt_tokens": len(ids), "repeats": args.repeats, "threads": 1,
            "median_ms": {"batch_1": round(median[1], 3), "batch_2": round(median[2], 3)},
            "batch_2_over_batch_1": round(median[2] / median[1], 3)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stage1_cost:
        result = stage1_cost(args)
        print(json.dumps(result, indent=2))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    clock = {"start": time.perf_counter()}
    model, _ = load_model()
    head = load_exit_head(ROOT / args.head, model, args.exit_layer)
    model.hf_model.requires_grad_(False)
    rows = load_rows(args.data, args.limit)
    clock["loaded"] = time.perf_counter()
    features = teacher_pass(model, head, rows, args)
    clock["teacher"] = time.perf_counter()
    scorer = Scorer(model, head.draft_vocab)
    summary = {"data": data_summary(rows, features, args), "reference": reference(features, scorer)}
    print(json.dumps(summary), flush=True)

    def save(results: list[dict]) -> None:
        now = time.perf_counter()
        report = {
            "command": "nice -n 5 python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
            "question": __doc__.split("\n\n")[1].replace("\n", " "),
            "final_state": "hidden_states[-1]: after the model's final norm (what the LM head reads)",
            "bases": BASES, "settings": {k: v for k, v in vars(args).items() if k not in ("data", "out")},
            **summary, "heads": results, "complete": len(results) == len(args.runs),
            "seconds": {"load": round(clock["loaded"] - clock["start"], 1),
                        "teacher_pass": round(clock["teacher"] - clock["loaded"], 1),
                        "training_and_eval": round(now - clock["teacher"], 1), "total": round(now - clock["start"], 1)},
            "torch_threads": torch.get_num_threads(),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    run_heads(features, scorer, args, save)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
