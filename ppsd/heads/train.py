"""`python -m ppsd train-head`: train an early-exit head by self-distillation.

The base model is frozen. One full forward pass per batch gives both the hidden state after layer
E (the head's input) and the full model's next-token distribution p at every position (the
teacher); the head's distribution q at the same position is pulled towards it by KL(p || q) at
temperature 1. That is the quantity greedy and sampled PPSD care about: a draft is accepted when
the head agrees with the full model.

Training is seeded (batch b is drawn from a generator seeded by (seed, b), so a resumed run sees
the same batches as an uninterrupted one) and resumable (`checkpoint.pt` in the output
directory). Every `eval_every` steps it measures the held-out greedy acceptance rate,
teacher-forced: the share of held-out positions where argmax q == argmax p.

This module knows nothing of decoders' internals or UIs; head types and their files are
`ppsd.heads`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..assets import ASSETS
from ..chat import encode_prompt, has_chat_template
from .exits import (TRAINED_HEAD_TYPES, HeadConfig, build_head, fingerprint, pipeline_stages, save_exit_head,
                    shared_head)
from ..model import DEFAULT_MODEL, StagedModel, load_model
from ..model_source import is_default

CHECKPOINT_FILE = "checkpoint.pt"
LOSS = "KL(p_full || q_head) per token, temperature 1, teacher = full model at the same position"
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".tex")
PROMPTS_DIR = ASSETS / "prompts"
CHAT_PROMPTS, RAW_PROMPTS = PROMPTS_DIR / "chat.json", PROMPTS_DIR / "prompts.json"
LR_SCHEDULES = ("constant", "cosine")
SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run (the CLI's flags, validated)."""

    exit_layer: int
    head_type: str = "lowrank"
    rank: int = 64
    draft_vocab: int | None = None  # draft only the most frequent tokens of the training data
    steps: int = 300
    lr: float = 1e-3
    lr_schedule: str = "constant"  # or "cosine": from lr down to 0 at the last step
    ce_weight: float = 0.0  # adds CE against the teacher's argmax (greedy agreement) to the KL
    cache_features: bool = False  # one teacher pass over the data, kept in memory (fp16), then epochs on it
    batch_size: int = 8
    seq_len: int = 256
    seed: int = 0
    eval_every: int = 100
    eval_tokens: int = 8192
    checkpoint_every: int = 50

    def validated(self, num_layers: int) -> "TrainConfig":
        if not 1 <= self.exit_layer < num_layers:
            raise ValueError(f"exit layer E={self.exit_layer} is out of range: 1 <= E < {num_layers} (layers)")
        if self.head_type not in TRAINED_HEAD_TYPES:
            raise ValueError(f"head type {self.head_type!r} cannot be trained; choose one of: "
                             f"{', '.join(TRAINED_HEAD_TYPES)}")
        if self.draft_vocab is not None and self.draft_vocab < 1:
            raise ValueError(f"draft_vocab={self.draft_vocab} is out of range: >= 1")
        for name in ("rank", "steps", "batch_size", "eval_every", "eval_tokens", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is out of range: >= 1")
        if self.seq_len < 2:
            raise ValueError(f"seq_len={self.seq_len} is out of range: >= 2")
        if not (math.isfinite(self.ce_weight) and self.ce_weight >= 0):
            raise ValueError(f"ce_weight={self.ce_weight} is out of range: 0 <= W < inf")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr={self.lr} is out of range: 0 < lr < inf")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr schedule {self.lr_schedule!r} is unknown; choose one of: {', '.join(LR_SCHEDULES)}")
        return self


@dataclass(frozen=True)
class TokenData:
    """Token ids to train and evaluate on (1-D, documents concatenated), and where they came from."""

    train: torch.Tensor
    heldout: torch.Tensor
    description: str


@dataclass(frozen=True)
class Acceptance:
    """Teacher-forced greedy agreement with the full model on the same positions."""

    shared: float
    head: float
    positions: int


@dataclass
class TrainResult:
    head: torch.nn.Module
    steps: int
    before: Acceptance  # at the start of this run (a resumed run starts from its checkpoint)
    after: Acceptance
    history: list[dict] = field(default_factory=list)  # {"step", "loss", "acceptance"?}


# --- data -----------------------------------------------------------------------------------------


def read_texts(data: str | None, heldout: str | None = None, *, max_chars: int = 4_000_000
               ) -> tuple[list[str], list[str], str]:
    """(train texts, held-out texts, description) from a file, a folder, or the embedded corpus."""
    if data is None:
        from .corpus import build_corpus

        corpus = build_corpus(max_chars=max_chars)
        description = (f"embedded corpus (ppsd.corpus: Python stdlib sources and pydoc topics), first "
                       f"{max_chars:,} characters of training documents; held out: {len(corpus.heldout)} "
                       f"whole documents ({', '.join(corpus.heldout_names[:5])}, ...)")
        return corpus.train, corpus.heldout, description
    train, desc = _read_path(data, max_chars)
    if heldout is not None:
        held, held_desc = _read_path(heldout, max_chars)
        return train, held, f"{desc}; held out: {held_desc}"
    if len(train) >= 2:  # whole documents: every 10th, or the last one of fewer than 10
        held_out = set(range(9, len(train), 10)) or {len(train) - 1}
        kept = [t for i, t in enumerate(train) if i not in held_out]
        held = [t for i, t in enumerate(train) if i in held_out]
        return kept, held, f"{desc}; held out: {len(held)} whole documents (every 10th, or the last)"
    cut = int(len(train[0]) * 0.9)  # one document: its last 10 % is held out
    return [train[0][:cut]], [train[0][cut:]], f"{desc}; held out: its last 10%"


def _read_path(path: str, max_chars: int) -> tuple[list[str], str]:
    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    else:
        raise ValueError(f"data {path!r} not found: give a text file or a folder of text files")
    texts, digest, budget = [], hashlib.sha256(), max_chars
    for file in files:
        if budget <= 0:
            break
        text = file.read_text(encoding="utf-8", errors="replace")[:budget]
        if text.strip():
            texts.append(text)
            digest.update(text.encode())
            budget -= len(text)
    if not texts:
        raise ValueError(f"data {path!r} holds no text (files ending in {', '.join(TEXT_SUFFIXES)})")
    chars = sum(map(len, texts))
    return texts, f"{path} ({len(texts)} documents, {chars:,} characters, sha256 {digest.hexdigest()[:12]})"


def read_chat_answers(path: str) -> TokenData:
    """Chat transcripts from a JSONL file of {"prompt", "prompt_ids", "answer_ids"} (what
    tools/build_chat_data.py writes), concatenated. About a tenth of the prompts are held out, by
    a hash of their text, with every answer to them (a greedy and a sampled answer never straddle
    the split)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"data {path!r} not found: give a JSONL file of chat answers")
    try:
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        sequences = [list(r["prompt_ids"]) + list(r["answer_ids"]) for r in rows]
        held = {i for i, r in enumerate(rows) if hashlib.sha256(r["prompt"].encode()).digest()[0] % 10 == 9}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"data {path!r} is not a JSONL file of chat answers: {error}") from None
    if len(sequences) < 2:
        raise ValueError(f"data {path!r} holds {len(sequences)} transcripts; at least 2 are needed")
    held = held or {len(sequences) - 1}
    flat = lambda picked: torch.tensor([t for i, q in enumerate(sequences) if (i in held) == picked for t in q])  # noqa: E731
    answers = sum(len(r["answer_ids"]) for r in rows)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()[:12]
    sampled = sum(r.get("temperature", 0.0) > 0 for r in rows)
    description = (f"{file.name}: {len(rows)} chat transcripts, the base model's own answers ({len(rows) - sampled} "
                   f"greedy, {sampled} sampled; {answers:,} answer tokens), sha256 {digest}; held out: "
                   f"{len(held)} whole transcripts (a tenth of the prompts, by hash)")
    return TokenData(train=flat(False), heldout=flat(True), description=description)


def tokenize(tokenizer, texts: list[str]) -> torch.Tensor:
    """Documents concatenated, each followed by EOS when the tokenizer has one."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + eos
    return torch.tensor(ids, dtype=torch.long)


def batch_at(ids: torch.Tensor, step: int, config: TrainConfig) -> torch.Tensor:
    """(B, T) random windows for step `step`: a function of (seed, step) alone, so resumable."""
    if ids.numel() < config.seq_len + 1:
        raise ValueError(f"training data has {ids.numel()} tokens, fewer than seq_len={config.seq_len}")
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    starts = torch.randint(0, ids.numel() - config.seq_len + 1, (config.batch_size,), generator=generator)
    return torch.stack([ids[s: s + config.seq_len] for s in starts.tolist()])


def eval_windows(ids: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """(N, T) consecutive held-out windows covering at most `eval_tokens` tokens."""
    ids = ids[: config.eval_tokens]
    count = ids.numel() // config.seq_len
    if count == 0:
        raise ValueError(f"held-out data has {ids.numel()} tokens, fewer than seq_len={config.seq_len}")
    return ids[: count * config.seq_len].view(count, config.seq_len)


# --- distillation ---------------------------------------------------------------------------------


class CachedTeacher:
    """The teacher's pass over every training window, run once: the hidden states a head at E
    reads (layers E-1 and E) and the final normed state, in float16 (half the memory; the teacher
    logits are recomputed from it per batch). Batches are then whole windows drawn by (seed,
    step), so a resumed run sees the same batches; each step costs the head alone."""

    def __init__(self, model: StagedModel, ids: torch.Tensor, config: TrainConfig, *, progress: bool) -> None:
        windows = ids[: ids.numel() // config.seq_len * config.seq_len].view(-1, config.seq_len)
        if len(windows) == 0:
            raise ValueError(f"training data has {ids.numel()} tokens, fewer than seq_len={config.seq_len}")
        self.model = model
        layers = (config.exit_layer - 1, config.exit_layer, -1)
        kept: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
        with torch.no_grad():
            for chunk in tqdm(windows.split(config.batch_size), disable=not progress, desc="teacher pass",
                              unit="batch"):
                states = model.hf_model.model(chunk.to(model.hf_model.device), output_hidden_states=True,
                                              use_cache=False).hidden_states
                for k in layers:
                    kept[k].append(states[k].to(torch.float16).cpu())
        self.states = {k: torch.cat(v) for k, v in kept.items()}

    def batch(self, step: int, config: TrainConfig, vocab: torch.Tensor | None) -> tuple[dict, torch.Tensor]:
        """(states by layer index, -1 the final one; teacher logits) of step `step`'s windows."""
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        picked = torch.randint(0, len(self.states[-1]), (config.batch_size,), generator=generator)
        weight = self.model.hf_model.lm_head.weight
        states = {k: v[picked].to(device=weight.device, dtype=weight.dtype) for k, v in self.states.items()}
        return states, teacher_logits(self.model, states[-1], vocab)


@torch.no_grad()
def teacher(model: StagedModel, ids: torch.Tensor, vocab: torch.Tensor | None = None
            ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(hidden states: embeddings then after each layer, each (B, T, H), the last one normed;
    full-model logits (B, T, V), or over the token ids `vocab` only) of one frozen forward pass.
    The heads take what they need: `hidden_states[E]`."""
    hf = model.hf_model
    states = hf.model(ids.to(hf.device), output_hidden_states=True, use_cache=False).hidden_states
    return states, teacher_logits(model, states[-1], vocab)


@torch.no_grad()
def teacher_logits(model: StagedModel, final: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
    """The full model's logits from its final normed states, over `vocab` only when given."""
    lm_head = model.hf_model.lm_head
    return lm_head(final) if vocab is None else F.linear(final, lm_head.weight[vocab])


def distill_loss(head_logits: torch.Tensor, teacher_logits: torch.Tensor, ce_weight: float = 0.0) -> torch.Tensor:
    """Mean over positions of KL(p || q), p the teacher, q the head (both temperature 1), plus
    `ce_weight` times the cross-entropy of q against the teacher's argmax: the greedy draft."""
    log_q = F.log_softmax(head_logits.float(), dim=-1).flatten(0, -2)
    log_p = F.log_softmax(teacher_logits.float(), dim=-1).flatten(0, -2)
    loss = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    if ce_weight:
        loss = loss + ce_weight * F.nll_loss(log_q, log_p.argmax(-1))
    return loss


@torch.no_grad()
def acceptance(model: StagedModel, head: torch.nn.Module, windows: torch.Tensor, exit_layer: int) -> Acceptance:
    """Teacher-forced greedy acceptance of the shared head and of `head` on the same windows."""
    shared = shared_head(model)
    agree_shared = agree_head = total = 0
    for window in windows.split(4):
        states, logits = teacher(model, window)
        target = logits.argmax(-1)
        agree_shared += (shared.lm_head(shared.norm(states[exit_layer])).argmax(-1) == target).sum().item()
        agree_head += (head.draft_ids(head.batch_logits(states)) == target).sum().item()
        total += target.numel()
    return Acceptance(shared=agree_shared / total, head=agree_head / total, positions=total)


class _Frozen:
    """Base weights need no gradients: without this, backward through the shared LM head would
    also compute a (V, H) gradient for it at every step. Restored on exit."""

    def __init__(self, model: StagedModel) -> None:
        self.params = [p for p in model.hf_model.parameters() if p.requires_grad]

    def __enter__(self) -> None:
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc) -> None:
        for p in self.params:
            p.requires_grad_(True)


def train_head(
    model: StagedModel, data: TokenData, config: TrainConfig, *,
    out: str | Path | None = None, resume: bool = False, progress: bool = True,
) -> TrainResult:
    """Distil a head of `config.head_type` at `config.exit_layer`; checkpoint into `out` if given."""
    config = config.validated(model.num_layers)
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(config.seed)
        head = build_head(config.head_type, model, config.exit_layer, rank=config.rank,
                          draft_vocab=config.draft_vocab)
    if config.draft_vocab is not None:
        head.adapter.draft_vocab.copy_(frequent_tokens(data.train, config.draft_vocab, model.info.vocab_size))
    head.adapter.float()  # trained in float32 whatever the base dtype; cast at load time
    optimizer = torch.optim.AdamW(head.adapter.parameters(), lr=config.lr, weight_decay=0.0)
    windows = eval_windows(data.heldout, config)
    start, history = 0, []
    checkpoint = Path(out) / CHECKPOINT_FILE if out is not None else None
    if checkpoint is not None and checkpoint.is_file():
        if not resume:
            raise ValueError(f"{checkpoint} exists: pass --resume to continue it, or choose another --out")
        start, history = _restore(checkpoint, head, optimizer, model, config)
    before = acceptance(model, head, windows, config.exit_layer)
    cached = CachedTeacher(model, data.train, config, progress=progress) if config.cache_features else None
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, disable=not progress,
               desc=f"train-head E={config.exit_layer}", unit="step")
    head.train()
    with _Frozen(model):
        for step in bar:
            for group in optimizer.param_groups:  # a function of the step alone: resumable
                group["lr"] = learning_rate(config, step)
            # With a draft vocabulary the teacher is renormalised over what the head can draft.
            if cached is not None:
                states, target = cached.batch(step, config, head.draft_vocab)
            else:
                states, target = teacher(model, batch_at(data.train, step, config), head.draft_vocab)
            loss = distill_loss(head.batch_logits(states), target, config.ce_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            record = {"step": step + 1, "loss": round(loss.item(), 5)}
            done = step + 1 == config.steps
            if (step + 1) % config.eval_every == 0 or done:
                head.eval()
                record["acceptance"] = round(acceptance(model, head, windows, config.exit_layer).head, 5)
                head.train()
                bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{record['acceptance']:.3f}")
            history.append(record)
            if checkpoint is not None and ((step + 1) % config.checkpoint_every == 0 or done):
                _save_checkpoint(checkpoint, head, optimizer, model, config, step + 1, history)
    head.eval()
    after = acceptance(model, head, windows, config.exit_layer)
    return TrainResult(head=head, steps=max(start, config.steps), before=before, after=after, history=history)


def learning_rate(config: TrainConfig, step: int) -> float:
    """The learning rate of step `step` (0-based) under `config.lr_schedule`."""
    if config.lr_schedule == "cosine":
        return config.lr * 0.5 * (1.0 + math.cos(math.pi * step / config.steps))
    return config.lr


def frequent_tokens(ids: torch.Tensor, count: int, vocab_size: int) -> torch.Tensor:
    """The `count` most frequent token ids of `ids` (ties by lower id), sorted: a draft vocabulary."""
    counts = torch.bincount(ids, minlength=vocab_size).double()
    counts -= torch.arange(vocab_size, dtype=torch.float64) / (2.0 * vocab_size)  # ties: lower id first
    return counts.topk(min(count, vocab_size)).indices.sort().values


def _identity(model: StagedModel, config: TrainConfig) -> dict:
    return {"fingerprint": fingerprint(model)["sha256"], "exit_layer": config.exit_layer,
            "head_type": config.head_type, "rank": config.rank, "draft_vocab": config.draft_vocab,
            "lr_schedule": config.lr_schedule, "ce_weight": config.ce_weight, "cache_features": config.cache_features,
            "seed": config.seed,
            "batch_size": config.batch_size, "seq_len": config.seq_len}


def _save_checkpoint(path: Path, head, optimizer, model, config, step: int, history: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "adapter": head.adapter.state_dict(), "optimizer": optimizer.state_dict(),
             "identity": _identity(model, config), "history": history}
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)  # atomic: a kill mid-write leaves the old checkpoint


def _restore(path: Path, head, optimizer, model, config) -> tuple[int, list[dict]]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    saved, current = state["identity"], _identity(model, config)
    different = [k for k in current if saved.get(k) != current[k]]
    if different:
        raise ValueError(f"{path} was made with other settings ({', '.join(different)}): "
                         f"cannot resume it; choose another --out")
    head.adapter.load_state_dict(state["adapter"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"], list(state["history"])


# --- PPSD decodes on prompts (the card's second measurement) ---------------------------------------


def decode_acceptance(model: StagedModel, head, prompts: list[list[int]], exit_layer: int, *,
                      max_new_tokens: int = 64, stages: int | None = None) -> dict:
    """Greedy PPSD acceptance rate (accepted / verified drafts, pooled over prompts) with the
    shared head and with `head`, on K = `stages` (default: the K whose balanced exit is E)."""
    from ..config import DecodeConfig
    from ..generate import generate

    stages = stages or pipeline_stages(model.num_layers, exit_layer)
    config = DecodeConfig(method="ppsd", exit_layer=exit_layer, stages=stages, max_new_tokens=max_new_tokens)
    rates = {"stages": stages, "prompts": len(prompts), "max_new_tokens": max_new_tokens}
    for name, staged in (("shared", model.with_exit_head(shared_head(model))), ("head", model.with_exit_head(head))):
        accepted = verified = 0
        for ids in prompts:
            m = generate(staged, ids, config).metrics()
            accepted += m.accepted
            verified += m.accepted + m.rejected
        rates[name] = accepted / verified if verified else None
    return rates


# --- command line ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainConfig(exit_layer=1)
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"{DEFAULT_MODEL} (default), a local directory, a .gguf file or a hub id")
    parser.add_argument("--exit-layer", type=int, default=None, help="E (default: L/2)")
    parser.add_argument("--data", default=None,
                        help="a JSONL file of chat answers (tools/build_chat_data.py), a text file or a folder "
                             "of text files (default: the embedded corpus, ppsd.corpus)")
    parser.add_argument("--heldout", default=None, help="held-out text file or folder (default: split from --data)")
    parser.add_argument("--max-chars", type=int, default=4_000_000, help="read at most this much text")
    parser.add_argument("--head-type", default=defaults.head_type, choices=TRAINED_HEAD_TYPES)
    parser.add_argument("--rank", type=int, default=defaults.rank, help="adapter rank (lowrank only)")
    parser.add_argument("--draft-vocab", type=int, default=None,
                        help="draft only the D most frequent tokens of the training data (default: all)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--lr-schedule", default=defaults.lr_schedule, choices=LR_SCHEDULES)
    parser.add_argument("--cache-features", action="store_true",
                        help="run the teacher once over the data and train epochs on its states (fast, "
                             "needs about 3 x 2 x hidden bytes of memory per training token)")
    parser.add_argument("--ce-weight", type=float, default=defaults.ce_weight,
                        help="add this times the cross-entropy against the teacher's argmax (default 0: KL only)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every, help="held-out acceptance period")
    parser.add_argument("--eval-tokens", type=int, default=defaults.eval_tokens, help="held-out tokens measured")
    parser.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every)
    parser.add_argument("--prompts", default=None,
                        help="prompts JSON [{name, prompt}] for greedy PPSD acceptance before/after "
                             "(default model: assets/prompts/chat.json, through its chat template)")
    parser.add_argument("--decode-tokens", type=int, default=64, help="new tokens per prompt decode (default 64)")
    parser.add_argument("--stages", type=int, default=None,
                        help="the K this head's E is for: its default E with K stages, and the K of the "
                             "prompt decodes (default: the K whose balanced E is nearest)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    parser.add_argument("--save-dtype", default="float32", choices=tuple(SAVE_DTYPES),
                        help="dtype of the saved weights; the final evaluation uses them so rounded")
    parser.add_argument("--out", required=True, help="directory for the head, its card and checkpoint")
    parser.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar")


def run(args: argparse.Namespace) -> int:
    model, tokenizer = load_model(args.model, device=args.device)
    exit_layer = args.exit_layer if args.exit_layer is not None else max(1, model.num_layers // 2)
    config = TrainConfig(
        exit_layer=exit_layer, head_type=args.head_type, rank=args.rank, draft_vocab=args.draft_vocab,
        steps=args.steps, lr=args.lr, lr_schedule=args.lr_schedule, ce_weight=args.ce_weight,
        cache_features=args.cache_features,
        batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed, eval_every=args.eval_every,
        eval_tokens=args.eval_tokens, checkpoint_every=args.checkpoint_every,
    ).validated(model.num_layers)
    if args.data and args.data.endswith(".jsonl"):
        data = read_chat_answers(args.data)
    else:
        train_texts, heldout_texts, description = read_texts(args.data, args.heldout, max_chars=args.max_chars)
        data = TokenData(tokenize(tokenizer, train_texts), tokenize(tokenizer, heldout_texts), description)
    description = data.description
    began = time.perf_counter()
    result = train_head(model, data, config, out=args.out, resume=args.resume, progress=not args.no_progress)
    seconds = time.perf_counter() - began
    save_dtype = SAVE_DTYPES[args.save_dtype]
    if save_dtype != torch.float32:  # evaluate exactly the weights that will be saved
        with torch.no_grad():
            for parameter in result.head.adapter.parameters():
                parameter.copy_(parameter.to(save_dtype).float())
        result.after = acceptance(model, result.head, eval_windows(data.heldout, config), exit_layer)
    evaluation = {
        "description": (f"Teacher-forced on {result.after.positions} held-out tokens ({config.seq_len}-token "
                        "windows): share of positions where the head's argmax equals the full model's. "
                        f"Measured on {model.info.device} ({model.info.dtype})."),
        "acceptance_shared": result.after.shared,
        "acceptance_trained": result.after.head,
        "positions": result.after.positions,
        "notes": [],
    }
    stages = args.stages or pipeline_stages(model.num_layers, exit_layer)
    chat = has_chat_template(tokenizer)
    prompts_path = Path(args.prompts) if args.prompts else CHAT_PROMPTS if chat else RAW_PROMPTS
    if args.prompts or is_default(args.model):
        evaluation.update(_prompt_evaluation(model, tokenizer, result.head, prompts_path, exit_layer,
                                             args.decode_tokens, chat=chat, stages=stages))
    head_config = HeadConfig(
        head_type=config.head_type, exit_layer=exit_layer, base_model=model.info.name,
        base_fingerprint=fingerprint(model), rank=config.rank if config.head_type == "lowrank" else None,
        draft_vocab=config.draft_vocab, stages=stages,
        training={"loss": LOSS + (f" + {config.ce_weight:g} x CE(argmax p, q)" if config.ce_weight else ""),
                  "data": description, "steps": result.steps, "lr": config.lr,
                  "lr_schedule": config.lr_schedule, "teacher": "cached once" if config.cache_features else "per step",
                  "batch_size": config.batch_size, "seq_len": config.seq_len, "seed": config.seed,
                  "train_tokens": data.train.numel(), "device": model.info.device,
                  "wall_seconds_this_run": round(seconds, 1), "weights_dtype": args.save_dtype,
                  "history": result.history},
        evaluation=evaluation,
    )
    save_exit_head(result.head, args.out, head_config, dtype=save_dtype)
    print(f"head saved to {args.out}: E={exit_layer}, {result.steps} steps, held-out greedy acceptance "
          f"(teacher-forced, {result.after.positions} positions) shared {result.after.shared:.3f} -> "
          f"trained {result.after.head:.3f}")
    if "ppsd_prompts" in evaluation:
        p = evaluation["ppsd_prompts"]
        print(f"greedy PPSD acceptance on {p['prompts']} prompts (K={p['stages']}): "
              f"shared {p['shared']:.3f} -> trained {p['head']:.3f}")
    return 0


def _prompt_evaluation(model, tokenizer, head, path: Path, exit_layer: int, max_new_tokens: int, *,
                       chat: bool, stages: int) -> dict:
    try:
        entries = json.loads(path.read_text())
        prompts = [encode_prompt(tokenizer, e["prompt"], chat=chat) for e in entries]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"prompts {str(path)!r} unreadable: {error}") from None
    rates = decode_acceptance(model, head, [p for p in prompts if p], exit_layer, max_new_tokens=max_new_tokens,
                              stages=stages)
    how = "through the chat template" if chat else "as raw text"
    note = (f"Greedy PPSD decodes (in process, K={rates['stages']}, {rates['max_new_tokens']} new tokens) of the "
            f"{rates['prompts']} prompts in {path.name} ({how}): acceptance rate (accepted / verified drafts) "
            f"shared {rates['shared']:.3f}, trained {rates['head']:.3f}.")
    return {"ppsd_prompts": rates, "notes": [note]}
