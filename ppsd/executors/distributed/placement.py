"""Where each stage of a pipeline runs and what it holds: cores or GPU per rank, thread
pinning, the weights a stage keeps, and the check that every stage holds the caller's weights.

Boundary: no messages and no scheduling; used by the coordinator (`pipeline`) and the
workers (`worker`) alike.
"""

from __future__ import annotations

import os

import torch

from ...model import StagedModel, default_dtype, load_weights
from .. import host
from .wire import PipelineSpec


def sync_device(device: str) -> None:
    """Wait for queued GPU work, so a timestamp says when the work ended, not when it was queued."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def load_stage_weights(spec: PipelineSpec, device: str) -> StagedModel:
    """The model's weights alone (workers need no tokenizer), as `load_model` loads them."""
    dtype = getattr(torch, spec.dtype) if spec.dtype else default_dtype(spec.device)
    return load_weights(spec.model, device=device, dtype=dtype)


def weights_fingerprint(model: StagedModel, layers: range) -> float:
    """Sum of |w| over the decoder layers `layers` (and the LM head's, seen by the last stage
    and by the caller alike): equal weights give equal sums, up to summation order."""
    total = sum(p.detach().double().abs().sum().item() for i in layers for p in model.layers[i].parameters())
    if layers.stop == model.num_layers:
        total += model.hf_model.lm_head.weight.detach().double().abs().sum().item()
    return total


def cores_of(rank: int, threads: int, cores: list[int]) -> set[int]:
    """Rank `rank`'s cores: [rank t, (rank+1) t) of `cores`, wrapping round when there are too few."""
    return {cores[(rank * threads + i) % len(cores)] for i in range(threads)}


def pin_threads(cores: set[int]) -> None:
    """Set the affinity of every thread of this process (sched_setaffinity(0) moves only the caller's)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # the thread ended meanwhile
            pass


def place(spec: PipelineSpec, rank: int) -> str:
    """Pin this worker (`rank` on this host): its own cores (CPU) or GPU (cuda:rank mod count)."""
    torch.set_num_threads(spec.threads_per_worker)
    if spec.device == "cuda":
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
        return device
    os.sched_setaffinity(0, cores_of(rank, spec.threads_per_worker, sorted(os.sched_getaffinity(0))))
    return "cpu"


def keep_stage(model: StagedModel, layers: range, *, last: bool) -> None:
    """Free every decoder layer outside `layers`, the embeddings and the exit head (stage 1's, on
    rank 0), and the LM head unless this is the last stage."""
    decoder = model.hf_model.model
    for index in range(len(decoder.layers)):
        if index not in layers:
            decoder.layers[index] = torch.nn.Identity()
    decoder.embed_tokens = None
    model.exit_head = None
    if not last:
        model.hf_model.lm_head = torch.nn.Identity()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class StageOnePinning:
    """While a run lasts, the coordinator's process computes stage 1: it gets the workers'
    thread count and (CPU) every one of its threads is pinned to stage 1's cores; `release`
    gives back what the caller had."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self._caller: tuple[int, set[int]] | None = None  # torch threads and cores outside runs

    def hold(self) -> None:
        if self._caller is not None:
            return
        self._caller = torch.get_num_threads(), host.process_cores()
        torch.set_num_threads(self.spec.threads_per_worker)
        if self.spec.device == "cpu":
            host.pinning(self._caller[1])
            pin_threads(cores_of(0, self.spec.threads_per_worker, sorted(self._caller[1])))

    def release(self) -> None:
        if self._caller is None:
            return
        threads, cores = self._caller
        self._caller = None
        torch.set_num_threads(threads)
        if self.spec.device == "cpu":
            pin_threads(cores)
            host.unpinned(cores)
