"""The static KV cache: preallocated keys and values written at positions held on the device.

Boundary: storage and its bookkeeping only. A `StaticKVCache` holds, for every decoder layer, a
zero-filled (1, kv_heads, capacity, head_dim) key and value buffer. A step writes through a
`CacheView`, which carries the step's write positions as a device tensor and the length bucket
its attention reads, so the same kernels serve every position and a captured CUDA graph can be
replayed at any of them. Which keys a query may see is the mask's business (`StagedModel`):
entries past a query's position are masked, and overwritten before any query reaches them.

Rollback (`truncate`) moves host-side lengths only. The lengths are the caller's promise of what
the buffers hold, checked on every `advance`, so a gap or an overlap is still caught on the host.
"""

from __future__ import annotations

import torch


def bucket_for(length: int) -> int:
    """The attention length a step covering positions [0, length) reads: a power of two, at least
    64, so a run of a few hundred tokens needs a handful of captured shapes, not one per token."""
    return max(64, 1 << (max(length, 1) - 1).bit_length())


def buckets_to(length: int) -> tuple[int, ...]:
    """Every bucket a run writing positions [0, length) reads, smallest first."""
    top, bucket, found = bucket_for(length), bucket_for(1), []
    while bucket <= top:
        found.append(bucket)
        bucket *= 2
    return tuple(found)


def run_reach(prompt_tokens: int, max_new_tokens: int, num_stages: int, draft_len: int) -> int:
    """The furthest a run may write: the prompt, every new token, and past the last one the
    tokens still in flight (one a stage, or EESD's g drafts and their check), bounded above."""
    return prompt_tokens + max_new_tokens + num_stages * (draft_len + 1)


class StaticKVCache:
    """Keys and values of `num_layers` layers in preallocated buffers; grown (and reallocated)
    only by `reserve`, which is why a captured step must be captured again after it grows."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype,
                 device: torch.device | str, layers: range | None = None, batch: int = 1) -> None:
        self.num_layers, self.kv_heads, self.head_dim, self.batch = num_layers, kv_heads, head_dim, batch
        self.dtype, self.device = dtype, torch.device(device)
        self.layers = range(num_layers) if layers is None else layers  # those with buffers (a worker's own)
        self.capacity = 0
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.key_index = torch.empty(0, dtype=torch.long, device=self.device)  # arange(capacity)
        self._lengths = [0] * num_layers

    @classmethod
    def for_model(cls, hf_model, layers: range | None = None, *, batch: int = 1) -> "StaticKVCache":
        """The cache of `hf_model`'s decoder layers (only `layers`' buffers, when given); `batch`
        rows of each (a research tool times top-2 drafting; every executor runs one)."""
        config = hf_model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        weight = next(hf_model.parameters())
        return cls(config.num_hidden_layers, config.num_key_value_heads, head_dim, dtype=weight.dtype,
                   device=weight.device, layers=layers, batch=batch)

    def reserve(self, length: int) -> bool:
        """Room for positions [0, length), in whole buckets. True when the buffers were reallocated
        (what they held is copied over)."""
        if length <= self.capacity:
            return False
        capacity = bucket_for(length)
        with torch.inference_mode(False):  # plain tensors: runs update them in and out of inference mode
            self._allocate(capacity)
            self.key_index = torch.arange(capacity, device=self.device)
        self.capacity = capacity
        return True

    def _allocate(self, capacity: int) -> None:
        """New buffers of `capacity` positions holding what the old ones held."""
        self.keys = [self._grown(old, i, capacity) for i, old in enumerate(self.keys)]
        self.values = [self._grown(old, i, capacity) for i, old in enumerate(self.values)]

    def _grown(self, old: torch.Tensor | None, index: int, capacity: int) -> torch.Tensor | None:
        if index not in self.layers:
            return None
        # Zeros, not garbage: a masked score multiplies its value by 0, and 0 x NaN is NaN.
        new = torch.zeros((self.batch, self.kv_heads, capacity, self.head_dim), dtype=self.dtype, device=self.device)
        if old is not None:
            new[:, :, :self.capacity] = old
        return new

    def at(self, layers: range, position: int, width: int) -> "CacheView":
        """The view of a piece run eagerly (the K-process pipeline's stages): room made, `layers`'
        host lengths advanced (checked), writes at [position, position + width)."""
        self.reserve(position + width)
        self.advance(layers, position, width)
        return self.view(self.key_index[position:position + width], bucket_for(position + width))

    def view(self, write: torch.Tensor, bucket: int) -> "CacheView":
        """What one step's layers see: writes at device positions `write` (T,), reads `bucket` keys."""
        if bucket > self.capacity:
            raise RuntimeError(f"bucket {bucket} exceeds the cache's capacity {self.capacity}: reserve first")
        return CacheView(self, write, bucket)

    def length(self, layer_idx: int) -> int:
        """Number of positions the caller has written (and kept) for `layer_idx`."""
        return self._lengths[layer_idx]

    def advance(self, layers: range, position: int, width: int) -> None:
        """Record that `layers` wrote positions [position, position + width): they must hold
        exactly `position` (tokens are causal and contiguous, so anything else is a caller's bug)."""
        for index in layers:
            if self._lengths[index] != position:
                raise RuntimeError(f"layer {index} caches {self._lengths[index]} tokens, expected {position}")
            self._lengths[index] = position + width

    def truncate(self, length: int) -> None:
        """Forget every position >= `length`: host lengths only (stale entries stay, masked)."""
        self._lengths = [min(current, length) for current in self._lengths]


class CacheView:
    """The cache as one step's attention layers call it (`update`, Hugging Face's protocol) and as
    a layer exit head reads it (`keys_values`): fixed shapes, positions on the device."""

    def __init__(self, cache: StaticKVCache, write: torch.Tensor, bucket: int) -> None:
        self.cache, self.write, self.bucket = cache, write, bucket

    @property
    def key_index(self) -> torch.Tensor:
        """(bucket,) the key positions this view's attention reads."""
        return self.cache.key_index[:self.bucket]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write (1, kv_heads, T, dim) keys/values at the view's positions; return the bucket's."""
        self.cache.keys[layer_idx].index_copy_(2, self.write, key)
        self.cache.values[layer_idx].index_copy_(2, self.write, value)
        return self.keys_values(layer_idx)

    def keys_values(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.cache.keys[layer_idx][:, :, :self.bucket], self.cache.values[layer_idx][:, :, :self.bucket])
