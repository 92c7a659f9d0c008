"""The training objective of an exit head: its settings, the batches and held-out windows it
sees, the frozen teacher (the full model), the distillation loss, and teacher-forced acceptance.

Boundary: tensors in, losses and rates out; the loop, checkpoints and the command line are
`train`, the text is `data`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..model import StagedModel
from .exits import TRAINED_HEAD_TYPES, shared_head

LR_SCHEDULES = ("constant", "cosine")


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
class Acceptance:
    """Teacher-forced greedy agreement with the full model on the same positions."""

    shared: float
    head: float
    positions: int


def batch_at(ids: torch.Tensor, step: int, config: TrainConfig) -> torch.Tensor:
    """(B, T) random windows for step `step`: a function of (seed, step) alone, so resumable."""
    if ids.numel() < config.seq_len + 1:
        raise ValueError(f"training data has {ids.numel()} tokens, fewer than seq_len={config.seq_len}")
    return torch.stack([ids[s: s + config.seq_len] for s in _picks(config, step, ids.numel() - config.seq_len + 1)])


def _picks(config: TrainConfig, step: int, count: int) -> list[int]:
    """`batch_size` draws from [0, count) for step `step`, a function of (seed, step) alone."""
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    return torch.randint(0, count, (config.batch_size,), generator=generator).tolist()


def eval_windows(ids: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """(N, T) consecutive held-out windows covering at most `eval_tokens` tokens."""
    ids = ids[: config.eval_tokens]
    count = ids.numel() // config.seq_len
    if count == 0:
        raise ValueError(f"held-out data has {ids.numel()} tokens, fewer than seq_len={config.seq_len}")
    return ids[: count * config.seq_len].view(count, config.seq_len)


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
        picked = _picks(config, step, len(self.states[-1]))
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
