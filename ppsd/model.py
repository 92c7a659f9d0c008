"""The early-exit staged model: a thin wrapper over a Hugging Face Llama-family causal LM.

It embeds tokens, runs any contiguous range of decoder layers on one or a few tokens against a
KV cache, and applies an exit head at layer E or the final head. It knows nothing of drafts,
stages or speculation: decoders decide which layers run when. Its one forward, `run_static`,
runs Hugging Face's own decoder layers on the one KV cache, `ppsd.static_cache.StaticKVCache`
(whose `truncate` is the one rollback): every executor, the heads' tests and the research tools
read layers through it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Protocol

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from .assets import ASSETS
from .model_source import (DEFAULT_MODEL, UNREACHABLE, Progress, config_source, first_line, gguf_shape, hub_reachable,
                           resolve)

# Architectures whose decoder stacks expose model.model.{embed_tokens, layers, norm, rotary_emb}
# and whose layers only need (hidden, mask, position_embeddings, cache): verified exact in tests.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
DEVICE_VARIABLE = "PPSD_DEVICE"  # what "auto" means when set: cpu or cuda (the page's --device)


class ExitHead(Protocol):
    """Maps hidden states after layer E, (1, T, hidden) at the (T,) device tensor of positions
    `position`, to the (V,) next-token logits of the last one; `cache` is the step's
    `ppsd.static_cache.CacheView`. Heads read the cache and never write it, so rollback stays in
    one place."""

    def __call__(self, hidden: torch.Tensor, position: torch.Tensor, cache) -> torch.Tensor: ...


class SharedExitHead(nn.Module):
    """LayerSkip-style exit: the model's own final norm and LM head applied at layer E."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, hidden: torch.Tensor, position: torch.Tensor, cache) -> torch.Tensor:
        return self.lm_head(self.norm(hidden[0, -1]))


@dataclass(frozen=True)
class ModelInfo:
    """What a decoder or a UI needs to know about a loaded model, without touching tensors."""

    name: str
    model_type: str
    num_layers: int
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    device: str
    dtype: str


class StagedModel:
    """A Llama-family causal LM whose layers can be run range by range."""

    def __init__(self, hf_model: nn.Module, *, name: str = "model", exit_head: ExitHead | None = None):
        config = hf_model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported architecture {config.model_type!r} ({type(hf_model).__name__}); "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        self.hf_model = hf_model.eval()
        self._decoder = hf_model.model
        self.layers = self._decoder.layers
        self.exit_head: ExitHead = exit_head or SharedExitHead(self._decoder.norm, hf_model.lm_head)
        # A head given on purpose is kept by `ppsd.setup.set_up`; a bare model gets the default one.
        self.exit_head_given = exit_head is not None
        self.info = ModelInfo(
            name=name,
            model_type=config.model_type,
            num_layers=len(self.layers),
            vocab_size=hf_model.lm_head.out_features,
            max_context=_max_context(config),
            eos_token_ids=eos_ids(hf_model),
            device=str(next(hf_model.parameters()).device),
            dtype=str(next(hf_model.parameters()).dtype).removeprefix("torch."),
        )
        self._device = next(hf_model.parameters()).device
        self._bool_mask = config._attn_implementation != "eager"

    @property
    def num_layers(self) -> int:
        return self.info.num_layers

    def with_exit_head(self, exit_head: ExitHead) -> "StagedModel":
        """The same weights with another exit head (the shared model object is left untouched)."""
        staged = StagedModel(self.hf_model, name=self.info.name, exit_head=exit_head)
        staged.info = self.info  # what the caller knows of the model (its EOS, say) stays as it is
        return staged

    def embed(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """(1, T, hidden) input embeddings of `token_ids` (a list, or a (1, T) device tensor)."""
        if not isinstance(token_ids, torch.Tensor):
            token_ids = torch.tensor([token_ids], dtype=torch.long, device=self._device)
        return self._decoder.embed_tokens(token_ids)

    def run_static(self, hidden: torch.Tensor, layers: range, *, positions: torch.Tensor, cache) -> torch.Tensor:
        """Run decoder `layers` on `hidden` (1, T, hidden) at `positions` (T,), a device tensor,
        writing and reading `cache`, a `ppsd.static_cache.CacheView` (`StaticKVCache.at` makes one
        for a piece run eagerly): no Python value of the position reaches a kernel, so the same
        ops run at every position and a captured step replays at any. Keys past a query's
        position are masked (stale entries after a rollback, the bucket's unwritten tail)."""
        position_ids = positions.unsqueeze(0)
        rotary = self._decoder.rotary_emb(hidden, position_ids)
        mask = (cache.key_index[None, :] <= positions[:, None])[None, None]  # (1, 1, T, bucket): allowed keys
        if not self._bool_mask:  # eager attention takes an additive mask
            mask = torch.zeros_like(mask, dtype=hidden.dtype).masked_fill(~mask, torch.finfo(hidden.dtype).min)
        for index in layers:
            hidden = self.layers[index](hidden, attention_mask=mask, position_ids=position_ids,
                                        past_key_values=cache, use_cache=True, position_embeddings=rotary)
        return hidden

    def exit_logits(self, hidden: torch.Tensor, *, position: torch.Tensor, cache) -> torch.Tensor:
        """(V,) float32 exit-head logits for the last token of `hidden` (after layer E)."""
        return self.exit_head(hidden, position, cache).float()

    def final_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(T, V) float32 logits of the full model for every token of `hidden` (after layer L)."""
        return self.hf_model.lm_head(self._decoder.norm(hidden))[0].float()


def _max_context(config) -> int:
    limit = getattr(config, "max_position_embeddings", None) or 2048
    # Masks here are plain causal; a sliding window would change the model beyond its width.
    window = getattr(config, "sliding_window", None)
    uses_window = getattr(config, "use_sliding_window", True)
    if window and uses_window:
        limit = min(limit, window)
    return int(limit)


def eos_ids(hf_model: nn.Module) -> tuple[int, ...]:
    """The EOS ids of `hf_model`'s generation config, else of its config (a fixed-length bench
    model keeps these on its weights though its own `ModelInfo` has none)."""
    generation = getattr(hf_model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    if eos is None:
        eos = getattr(hf_model.config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


# A 2.2M-parameter model trained here: fast, for tests and quick experiments (not the default).
TINY_MODEL = str(ASSETS / "models" / "ppsd-tiny")


def resolve_device(device: str | None) -> str:
    """`auto`/None -> PPSD_DEVICE when set (the page's `--device`), else cuda when present, else
    cpu; an explicit device is checked, not assumed."""
    if device in (None, "auto"):
        device = os.environ.get(DEVICE_VARIABLE, "").strip().lower() or "auto"
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA GPU is available; use --device cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not one of: cpu, cuda, auto")
    return device


def default_dtype(device: str) -> torch.dtype:
    """fp32 on CPU (exact and fast enough); bf16 on GPUs that support it, else fp16."""
    if device == "cpu":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def load_model(
    name_or_path: str = DEFAULT_MODEL, *, device: str | None = None, dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> tuple[StagedModel, object]:
    """Load a causal LM and its tokenizer: the default model, a GGUF file, a local directory or a
    hub id (`ppsd.model_source.resolve`; `progress` hears of a first-use download or conversion).

    Never runs remote code. Any failure (missing, offline, not a causal LM, unsupported
    architecture) raises ValueError with a one-line reason naming the model.
    """
    device = resolve_device(device)
    name = str(name_or_path).strip()
    source = resolve(name, progress=progress)
    return _weights(name, source, device=device, dtype=dtype or default_dtype(device)), _tokenizer(name, source)


def load_weights(name: str, *, device: str, dtype: torch.dtype, progress: Progress | None = None) -> StagedModel:
    """The model alone (no tokenizer) on an explicit device such as "cuda:1"; errors as in
    `load_model`. Pipeline workers load their stage through this."""
    return _weights(name, resolve(name, progress=progress), device=device, dtype=dtype)


def model_config(name: str, *, progress: Progress | None = None):
    """The checkpoint's config (cheap: no weights, once a GGUF is converted), refused unless it is
    a supported architecture."""
    return _config(name, resolve(name, progress=progress))


@dataclass(frozen=True)
class ModelShape:
    """What checks made before a load need of a model: its decoder layers and usable context."""

    num_layers: int
    max_context: int


def model_shape(name: str, *, progress: Progress | None = None) -> ModelShape:
    """The shape of model `name` from its config alone, its weights never read, hashed or
    converted (`ppsd.model_source.config_source`): cheap enough for every value's check before a
    load (`progress` hears of a hub download of a model not here at all). Refused, as
    `load_model` refuses, unless a supported architecture."""
    source = config_source(name, progress=progress)
    if source.lower().endswith(".gguf") and Path(source).is_file():
        architecture, layers, context = gguf_shape(source)
        _supported(name, architecture)
        return ModelShape(layers, context)
    # The file's fields alone: building the config class costs 3 s of imports on a busy CPU.
    fields, _ = _loaded(name, source, lambda: PretrainedConfig.get_config_dict(source, **_hub_options(source)))
    _supported(name, fields.get("model_type"))
    layers = fields.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool):
        raise ValueError(f"cannot load model {name!r}: its config gives no layer count (num_hidden_layers)")
    return ModelShape(layers, _max_context(SimpleNamespace(**fields)))


def shape_tokenizer(name: str):
    """Model `name`'s tokenizer when it can be read without its weights being read or hashed (a
    converted model, a directory, a hub id in the local cache), for a prompt's length checked
    before a load; None when it cannot yet (a GGUF not converted)."""
    source = config_source(name)
    return None if source.lower().endswith(".gguf") else _tokenizer(name, source)


def _weights(name: str, source: str, *, device: str, dtype: torch.dtype) -> StagedModel:
    """The model `name`, whose files `resolve` found at `source` (resolved once per load)."""
    _config(name, source)
    hf_model = _loaded(name, source, lambda: AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, trust_remote_code=False, attn_implementation="sdpa", **_hub_options(source)).to(device))
    return StagedModel(hf_model, name=name)


def _tokenizer(name: str, source: str):
    return _loaded(name, source, lambda: AutoTokenizer.from_pretrained(source, trust_remote_code=False,
                                                                       **_hub_options(source)))


def _config(name: str, source: str):
    config = _loaded(name, source, lambda: AutoConfig.from_pretrained(source, trust_remote_code=False,
                                                                      **_hub_options(source)))
    _supported(name, config.model_type)
    return config


def _loaded(name: str, source: str, load):
    """`load()`, every loader failure (missing, offline, not a causal LM) one ValueError naming the model."""
    try:
        return load()
    except Exception as error:  # noqa: BLE001 - every loader failure becomes one clear message
        reason = UNREACHABLE if _hub_options(source) else first_line(error, 300)
        raise ValueError(f"cannot load model {name!r}: {reason}") from None


def _supported(name: str, model_type: str) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model {name!r} has unsupported architecture {model_type!r}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def _hub_options(source: str) -> dict:
    """Read a hub id from the local hub cache alone when the hub cannot be reached: transformers
    would otherwise retry the network for half a minute before failing."""
    if Path(source).is_dir() or hub_reachable():
        return {}
    return {"local_files_only": True}
