"""Train the embedded model (the shipped asset `assets/models/ppsd-tiny`): a small Llama with
LayerSkip-style early-exit loss.

Run ``python tools/train_tiny.py --out assets/models/ppsd-tiny``. It trains a byte-level BPE
tokenizer on the corpus (``ppsd.corpus``), then a ``LlamaForCausalLM`` whose shared head (final
norm + LM head) is trained at layers L/4, L/2 and 3L/4 as well as at the top, so the model's own
head works as the early-exit draft head PPSD needs. Checkpoints (model, optimizer, step, RNG)
make a killed run resumable with ``--resume``; the output folder is a Hugging Face model folder.

This module knows nothing of decoding: it only trains and measures teacher-forced quality.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from ppsd.heads.corpus import Corpus, build_corpus  # noqa: E402

EOS = "<|endoftext|>"
# Exit layer (as a fraction of L) -> weight of its cross-entropy; the final layer weighs 1.
# L/2 weighs most because K=2 drafts from it; L/4 gets more than 3L/4 because a shallow exit
# needs the push more (3L/4 is close to the top anyway).
EXIT_WEIGHTS = {0.25: 0.4, 0.5: 0.5, 0.75: 0.3}


@dataclass(frozen=True)
class Shape:
    """Model and tokenizer size."""

    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int


SHAPES = {
    "tiny": Shape(vocab_size=4096, hidden=128, layers=8, heads=4, intermediate=384,
                  max_positions=1024),
    "small": Shape(vocab_size=8192, hidden=384, layers=8, heads=6, intermediate=1152,
                   max_positions=2048),
}


@dataclass(frozen=True)
class TrainConfig:
    """One training run; ``checkpoint`` holds resumable state, ``out`` the HF model folder."""

    out: Path
    checkpoint: Path
    shape: Shape = SHAPES["tiny"]
    steps: int = 3000
    batch_size: int = 4
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    seed: int = 0
    eval_every: int = 100
    minutes: float | None = None
    eval_windows: int = 32
    max_chars: int | None = None
    device: str = "cpu"
    resume: bool = False


@dataclass(frozen=True)
class EvalResult:
    """Teacher-forced held-out quality; keys of the dicts are layer counts (L = final)."""

    loss: dict[int, float]
    top1: dict[int, float]


def exit_layers(num_layers: int) -> list[int]:
    """The early-exit layers E trained here: L/4, L/2, 3L/4 (rounded down, at least 1)."""
    return sorted({max(1, int(num_layers * f)) for f in EXIT_WEIGHTS})


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (lossless on any text) with ``<|endoftext|>`` as bos, eos and pad."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    # clean_up_tokenization_spaces would rewrite " ," and similar: fatal for code.
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS,
                                   pad_token=EOS, clean_up_tokenization_spaces=False)


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All documents as one token stream, each followed by eos. Shape (N,), int64."""
    ids: list[int] = []
    for row in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(row)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def build_model(shape: Shape, eos_id: int) -> LlamaForCausalLM:
    """A Llama with tied embeddings and eos as bos/pad, initialised by transformers."""
    config = LlamaConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
        intermediate_size=shape.intermediate, max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        rope_theta=10000.0)
    model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    return model


def layer_logits(model: LlamaForCausalLM, input_ids: torch.Tensor,
                 exit_stride: int = 1) -> dict[int, torch.Tensor]:
    """Next-token logits at each exit layer E and at the top (key L).

    The top's are (B, T, V); the exits' are (B, ceil(T / exit_stride), V), at positions
    0, exit_stride, ... hidden_states[E] is the residual stream after E layers; HF's last entry
    already has the final norm applied, so the exits apply the shared norm + LM head themselves.
    """
    out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    num_layers = model.config.num_hidden_layers
    logits = {e: model.lm_head(model.model.norm(out.hidden_states[e][:, ::exit_stride]))
              for e in exit_layers(num_layers)}
    logits[num_layers] = out.logits
    return logits


def exit_weight(layer: int, num_layers: int) -> float:
    """Loss weight of a layer's head: 1 at the top, EXIT_WEIGHTS at the exits."""
    if layer == num_layers:
        return 1.0
    return next(w for f, w in EXIT_WEIGHTS.items() if max(1, int(num_layers * f)) == layer)


def early_exit_loss(model: LlamaForCausalLM, batch: torch.Tensor,
                    exit_stride: int = 2) -> tuple[torch.Tensor, float]:
    """Weighted sum of per-layer cross-entropies, and the final layer's loss alone.

    The exits see every exit_stride-th position only: with a small model the three extra LM
    head products cost as much as the layers, and a subsample gives the same expected gradient.
    """
    logits = layer_logits(model, batch[:, :-1], exit_stride)
    num_layers = model.config.num_hidden_layers
    losses = {}
    for e, lg in logits.items():
        targets = batch[:, 1:] if e == num_layers else batch[:, 1::exit_stride]
        losses[e] = F.cross_entropy(lg.reshape(-1, lg.size(-1)).float(), targets.reshape(-1))
    total = sum(exit_weight(e, num_layers) * loss for e, loss in losses.items())
    return total, losses[num_layers].item()


def sample_batch(stream: torch.Tensor, batch_size: int, seq_len: int,
                 generator: torch.Generator) -> torch.Tensor:
    """Random windows of seq_len + 1 tokens from the stream. Shape (B, seq_len + 1)."""
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([stream[s:s + seq_len + 1] for s in starts.tolist()])


def heldout_windows(stream: torch.Tensor, seq_len: int, count: int) -> torch.Tensor:
    """Evenly spaced fixed windows of the held-out stream, the same every evaluation."""
    span = seq_len + 1
    last = stream.numel() - span
    starts = torch.linspace(0, last, count).long().tolist()
    return torch.stack([stream[s:s + span] for s in starts])


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, windows: torch.Tensor, batch_size: int = 8) -> EvalResult:
    """Teacher-forced loss and top-1 accuracy per layer head over the held-out windows."""
    model.eval()
    loss_sum: dict[int, float] = {}
    hits: dict[int, float] = {}
    for chunk in windows.split(batch_size):
        chunk = chunk.to(model.device)
        targets = chunk[:, 1:].reshape(-1)
        for e, lg in layer_logits(model, chunk[:, :-1]).items():
            flat = lg.reshape(-1, lg.size(-1)).float()
            loss = F.cross_entropy(flat, targets, reduction="sum").item()
            loss_sum[e] = loss_sum.get(e, 0.0) + loss
            hits[e] = hits.get(e, 0.0) + (flat.argmax(-1) == targets).sum().item()
    model.train()
    n = windows.size(0) * (windows.size(1) - 1)
    return EvalResult(loss={e: v / n for e, v in sorted(loss_sum.items())},
                      top1={e: v / n for e, v in sorted(hits.items())})


def progress_at(step: int, elapsed: float, cfg: TrainConfig) -> float:
    """Share of the run done: by steps, or by wall time when ``minutes`` ends it sooner.

    A wall-time budget keeps the cosine schedule whole on a shared CPU whose speed is unknown
    in advance; the price is that the stopping step depends on the machine's load.
    """
    by_steps = step / cfg.steps
    if cfg.minutes is None:
        return by_steps
    return max(by_steps, elapsed / (60 * cfg.minutes))


def lr_at(step: int, progress: float, cfg: TrainConfig) -> float:
    """Linear warmup over the first steps, then cosine decay to 10% of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model: LlamaForCausalLM, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with decay on matrices only (norm gains stay undecayed)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=False)


def save_checkpoint(path: Path, run: RunState) -> None:
    """Write resumable state atomically, so a kill mid-write keeps the previous checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
             "step": run.step, "generator": run.generator.get_state(),
             "torch_rng": torch.get_rng_state(), "elapsed": run.elapsed}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def export(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Save the Hugging Face model folder (safetensors, configs, tokenizer)."""
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def load_tokenizer(cfg: TrainConfig, corpus: Corpus) -> PreTrainedTokenizerFast:
    """The run's tokenizer: reused from the checkpoint folder on resume, else trained now."""
    tok_dir = cfg.checkpoint.parent / "tokenizer"
    if cfg.resume and (tok_dir / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(tok_dir)
    tokenizer = train_tokenizer(corpus.train, cfg.shape.vocab_size)
    tokenizer.save_pretrained(tok_dir)
    return tokenizer


@dataclass
class RunState:
    """What a training run carries from step to step, and what a checkpoint restores."""

    model: LlamaForCausalLM
    optimizer: torch.optim.Optimizer
    tokenizer: PreTrainedTokenizerFast
    generator: torch.Generator
    step: int = 0
    elapsed: float = 0.0


def start_run(cfg: TrainConfig, tokenizer: PreTrainedTokenizerFast) -> RunState:
    """A fresh model and optimizer, or the checkpoint's when resuming."""
    torch.manual_seed(cfg.seed)
    model = build_model(replace(cfg.shape, vocab_size=len(tokenizer)), tokenizer.eos_token_id)
    model.to(cfg.device).train()
    run = RunState(model, make_optimizer(model, cfg), tokenizer,
                   torch.Generator().manual_seed(cfg.seed))
    if cfg.resume and cfg.checkpoint.exists():
        state = torch.load(cfg.checkpoint, map_location=cfg.device, weights_only=False)
        model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        run.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        run.step, run.elapsed = state["step"], state["elapsed"]
    return run


def train(cfg: TrainConfig) -> list[tuple[int, float]]:
    """Run (or resume) training; return the (step, training loss at the top) history."""
    corpus = build_corpus(max_chars=cfg.max_chars, seed=cfg.seed)
    tokenizer = load_tokenizer(cfg, corpus)
    stream = encode_documents(tokenizer, corpus.train)
    windows = heldout_windows(encode_documents(tokenizer, corpus.heldout), cfg.seq_len,
                              cfg.eval_windows)
    run = start_run(cfg, tokenizer)
    tqdm.write(f"params {sum(p.numel() for p in run.model.parameters()) / 1e6:.2f}M, "
               f"train tokens {stream.numel()}, start step {run.step}")
    return run_steps(cfg, run, stream, windows)


def run_steps(cfg: TrainConfig, run: RunState, stream: torch.Tensor,
              windows: torch.Tensor) -> list[tuple[int, float]]:
    """The optimisation loop with periodic held-out evaluation, checkpoint and export."""
    history = []
    tick = time.perf_counter()
    bar = tqdm(range(run.step, cfg.steps), initial=run.step, total=cfg.steps, mininterval=5)
    for step in bar:
        progress = progress_at(step, run.elapsed + time.perf_counter() - tick, cfg)
        if progress >= 1:
            break
        lr = lr_at(step, progress, cfg)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        batch = sample_batch(stream, cfg.batch_size, cfg.seq_len, run.generator).to(cfg.device)
        total, final = early_exit_loss(run.model, batch)
        run.optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
        run.optimizer.step()
        history.append((step, final))
        bar.set_postfix(loss=f"{final:.3f}", lr=f"{lr:.2e}")
        run.step = step + 1
        if run.step % cfg.eval_every == 0:
            tick = checkpoint(cfg, run, windows, tick)
    checkpoint(cfg, run, windows, tick)
    return history


def checkpoint(cfg: TrainConfig, run: RunState, windows: torch.Tensor, tick: float) -> float:
    """Evaluate, save resumable state and export the model folder; return the new time mark."""
    now = time.perf_counter()
    run.elapsed += now - tick
    report(run.step, run.elapsed, run.step * cfg.batch_size * cfg.seq_len,
           evaluate(run.model, windows))
    save_checkpoint(cfg.checkpoint, run)
    export(run.model, run.tokenizer, cfg.out)
    # Evaluation and saving are not training time: restart the clock after them.
    return time.perf_counter()


def report(step: int, elapsed: float, tokens: int, result: EvalResult) -> None:
    """One log line per evaluation: held-out loss and top-1 for every head."""
    cells = " ".join(f"L{e}: loss {result.loss[e]:.3f} top1 {result.top1[e]:.3f}"
                     for e in result.loss)
    tqdm.write(f"step {step} | {elapsed / 60:.1f} min | {tokens / 1e6:.2f}M tokens | {cells}")


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Command line -> TrainConfig (the only place that reads arguments)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("assets/models/ppsd-tiny"))
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="resumable state (default: runs/<out name>/checkpoint.pt)")
    p.add_argument("--config", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--steps", type=int, default=TrainConfig.steps)
    p.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    p.add_argument("--seq-len", type=int, default=TrainConfig.seq_len)
    p.add_argument("--lr", type=float, default=TrainConfig.lr)
    p.add_argument("--warmup", type=int, default=TrainConfig.warmup)
    p.add_argument("--seed", type=int, default=TrainConfig.seed)
    p.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    p.add_argument("--minutes", type=float, default=None,
                   help="wall-time budget: the LR schedule ends and training stops at it")
    p.add_argument("--max-chars", type=int, default=None, help="cap the training text (a quick run)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    checkpoint = args.checkpoint or Path("runs") / args.out.name / "checkpoint.pt"
    return TrainConfig(out=args.out, checkpoint=checkpoint, shape=SHAPES[args.config],
                       steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                       lr=args.lr, warmup=args.warmup, seed=args.seed,
                       eval_every=args.eval_every, minutes=args.minutes,
                       max_chars=args.max_chars, device=device,
                       resume=args.resume)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    tqdm.write(str({k: str(v) for k, v in asdict(cfg).items()}))
    train(cfg)


if __name__ == "__main__":
    main()
