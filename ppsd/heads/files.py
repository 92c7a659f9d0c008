"""A saved exit head: the directory, and the metadata that binds it to one base model and one
exit layer E.

    head_config.json     what the head is and what it was made for (HeadConfig)
    adapter.safetensors  the head's own weights (float32, or float16 where size matters)
    README.md            the head card: base model, E, training data, acceptance before/after

`load_exit_head` refuses a head made for another model (weights fingerprint) or another E.
"""

from __future__ import annotations

import hashlib
import json
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..model import StagedModel
from ..model_source import shown
from ..paths import problem
from .exits import TRAINED_HEAD_TYPES, build_head

CONFIG_FILE = "head_config.json"
WEIGHTS_FILE = "adapter.safetensors"
CARD_FILE = "README.md"
FORMAT_VERSION = 1
# Probe values are compared with this tolerance: loose enough that a float32 checkpoint loaded in
# bf16 or fp16 still matches (bf16 keeps ~3 significant digits), tight enough that two different
# trainings or random seeds never do.
PROBE_RTOL, PROBE_ATOL = 2e-2, 1e-3
PROBE_VALUES = 16  # per probed tensor


def _probed_tensors(model: StagedModel) -> dict[str, torch.Tensor]:
    hf = model.hf_model
    layers = hf.model.layers
    return {
        "embed_tokens": hf.model.embed_tokens.weight,
        "lm_head": hf.lm_head.weight,
        "norm": hf.model.norm.weight,
        "layers.0.q_proj": layers[0].self_attn.q_proj.weight,
        f"layers.{len(layers) // 2}.up_proj": layers[len(layers) // 2].mlp.up_proj.weight,
        f"layers.{len(layers) - 1}.down_proj": layers[-1].mlp.down_proj.weight,
    }


def fingerprint(model: StagedModel) -> dict:
    """Architecture plus a probe of weight values, and a sha256 naming them.

    The probe is PROBE_VALUES evenly spaced entries of a few tensors (first, middle and last
    layer, embeddings, norm, LM head): any retraining moves them. Hashing every weight would read
    gigabytes per load and would change with the dtype the model happens to be loaded in; the probe
    is compared with a tolerance instead, so one head serves a model in float32, bf16 or fp16.
    """
    config = model.hf_model.config
    architecture = {
        "model_type": config.model_type,
        "num_layers": model.num_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
        "vocab_size": model.info.vocab_size,
    }
    probe = {name: probe_values(tensor) for name, tensor in _probed_tensors(model).items()}
    # The hash rounds to bf16 so the same checkpoint in another dtype usually keeps its name;
    # matching is decided by `fingerprint_matches`, not by the hash.
    rounded = {k: torch.tensor(v).to(torch.bfloat16).float().tolist() for k, v in probe.items()}
    digest = hashlib.sha256(json.dumps([architecture, rounded], sort_keys=True).encode()).hexdigest()
    return {"sha256": digest, "architecture": architecture, "probe": probe}


def probe_values(tensor: torch.Tensor) -> list[float]:
    """PROBE_VALUES evenly spaced entries of `tensor`, first and last included. The indices are
    computed in float64: float32 rounds past the end of tensors of more than 2^24 elements."""
    flat = tensor.detach().reshape(-1)
    index = torch.linspace(0, flat.numel() - 1, PROBE_VALUES, dtype=torch.float64).round().long()
    return [float(v) for v in flat[index.to(flat.device)].float().cpu()]


def fingerprint_matches(saved: dict, current: dict) -> bool:
    """Same architecture and probe values equal up to a dtype's rounding."""
    if saved.get("architecture") != current["architecture"]:
        return False
    if set(saved.get("probe", {})) != set(current["probe"]):
        return False
    return all(
        torch.allclose(torch.tensor(saved["probe"][k]), torch.tensor(v), rtol=PROBE_RTOL, atol=PROBE_ATOL)
        for k, v in current["probe"].items()
    )


# --- saving and loading ----------------------------------------------------------------------------


class NotAHead(ValueError):
    """The path names no readable head (missing, not a head, unreadable, another format): what a
    server shows a visitor neutrally, as it says nothing a visitor should learn of its files. A
    readable head that does not fit the model or E raises plain ValueError, with what it was made for."""


@dataclass(frozen=True)
class HeadConfig:
    """Everything `head_config.json` holds: what the head is, for which model and E, how made."""

    head_type: str
    exit_layer: int
    base_model: str
    base_fingerprint: dict
    rank: int | None = None
    draft_vocab: int | None = None  # drafts only from this many tokens (None: all of them)
    stages: int | None = None  # the pipeline depth K its E was chosen for (None: the K whose balanced E it is)
    training: dict = field(default_factory=dict)  # data, steps, lr, batch_size, seq_len, seed, loss
    evaluation: dict = field(default_factory=dict)  # held-out acceptance before/after, and how measured
    format_version: int = FORMAT_VERSION

    @classmethod
    def read(cls, directory: Path) -> "HeadConfig":
        path = directory / CONFIG_FILE
        wrong = problem(path, "file")  # never opened unless a regular file: a FIFO would wait for ever
        if wrong is not None:
            raise NotAHead(f"{directory} is not a saved exit head: {CONFIG_FILE} {wrong}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            config = cls(**data)
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as error:
            raise NotAHead(f"{path} is not a valid head config: {error}") from None
        wrong = config.wrong_field()
        if wrong is not None:  # caught here, or it surfaces later as "'str' object has no attribute 'get'"
            raise NotAHead(f"{path} is not a valid head config: {wrong}")
        return config

    def wrong_field(self) -> str | None:
        """What is wrong with the fields' JSON types (a field of the wrong type, a fingerprint
        without its parts), or None: a config read from a file may hold anything."""
        for name, kind in typing.get_type_hints(type(self)).items():
            value = getattr(self, name)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                return f"{name} is {type(value).__name__}, not {getattr(kind, '__name__', kind)}"
        fingerprint = self.base_fingerprint
        probe = fingerprint.get("probe")
        if not (isinstance(fingerprint.get("sha256"), str) and isinstance(fingerprint.get("architecture"), dict)
                and isinstance(probe, dict)
                and all(isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                         for v in values) for values in probe.values())):
            return "base_fingerprint needs sha256 (text), architecture (an object) and probe (lists of numbers)"
        return None


def save_exit_head(head: nn.Module, directory: str | Path, config: HeadConfig, *,
                   dtype: torch.dtype = torch.float32) -> Path:
    """Write weights (in `dtype`; loading casts them to the model's), head_config.json and the card
    into `directory` (created if needed)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if config.head_type not in TRAINED_HEAD_TYPES:
        raise ValueError(f"only trained heads are saved ({', '.join(TRAINED_HEAD_TYPES)}), not {config.head_type!r}")
    weights = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).cpu().contiguous()
               for k, v in head.adapter.state_dict().items()}
    save_file(weights, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(asdict(config), indent=2) + "\n")
    (directory / CARD_FILE).write_text(render_card(config))
    return directory


def saved_head(path: str | Path) -> tuple[Path, HeadConfig]:
    """The folder and config of the head saved at `path` (its folder, or its head_config.json),
    read without any model, so that a path that holds none is refused before weights load:
    NotAHead when it is not a head this version reads."""
    directory = Path(path)
    if directory.name == CONFIG_FILE and problem(directory, "file") is None:
        directory = directory.parent
    wrong = problem(directory, "folder")
    if wrong is not None:
        raise NotAHead(f"exit head {shown(str(path))} {wrong}: give the directory train-head wrote")
    config = HeadConfig.read(directory)
    if config.format_version != FORMAT_VERSION:
        raise NotAHead(f"exit head {directory} has format {config.format_version}; this version reads {FORMAT_VERSION}")
    if config.head_type not in TRAINED_HEAD_TYPES:
        raise NotAHead(f"exit head {directory} has unknown type {config.head_type!r}")
    return directory, config


def load_exit_head(path: str | Path, model: StagedModel, exit_layer: int) -> nn.Module:
    """Load a saved head for `model` at `exit_layer`, in the model's device and dtype.

    Raises NotAHead (a ValueError) if the path is not a readable head, and ValueError, with what
    the head was made for, if it was made for another model (architecture or weights fingerprint differ: a
    head only helps the weights it was distilled from) or for another exit layer E.
    """
    from safetensors.torch import load_file

    directory, config = saved_head(path)
    current = fingerprint(model)
    if not fingerprint_matches(config.base_fingerprint, current):
        raise ValueError(
            f"exit head {directory} was trained for model {config.base_model!r} "
            f"(fingerprint {config.base_fingerprint.get('sha256', '?')[:12]}), not for {model.info.name!r} "
            f"(fingerprint {current['sha256'][:12]}): train one for this model with `python -m ppsd train-head`"
        )
    if config.exit_layer != exit_layer:
        raise ValueError(
            f"exit head {directory} was trained for exit layer E={config.exit_layer}, not E={exit_layer}: "
            f"use --exit-layer {config.exit_layer} or train a head for E={exit_layer}"
        )
    head = build_head(config.head_type, model, exit_layer, rank=config.rank or 1, draft_vocab=config.draft_vocab)
    weights_path = directory / WEIGHTS_FILE
    wrong = problem(weights_path, "file")
    if wrong is not None:
        raise NotAHead(f"exit head {directory} has no weights: {WEIGHTS_FILE} {wrong}")
    try:
        head.adapter.load_state_dict(load_file(str(weights_path)))
    except RuntimeError as error:
        raise NotAHead(f"exit head {directory} has weights that do not fit its config: {str(error)[:200]}") from None
    return head.to(device=model.hf_model.device, dtype=model.hf_model.dtype).eval()


def render_card(config: HeadConfig) -> str:
    """The README.md written next to a saved head."""
    t, e = config.training, config.evaluation
    lines = [
        f"# Early-exit head: {config.head_type}, E = {config.exit_layer}",
        "",
        f"A `{config.head_type}` exit head{f' (rank {config.rank})' if config.rank else ''} for **{config.base_model}** "
        f"({config.base_fingerprint['architecture']['model_type']}, "
        f"{config.base_fingerprint['architecture']['num_layers']} layers), drafting from the hidden state "
        f"after layer E = {config.exit_layer}. Base weights fingerprint `{config.base_fingerprint['sha256'][:16]}`; "
        "`ppsd.heads.load_exit_head` refuses any other model or exit layer.",
        "",
        "Use: `python -m ppsd generate --model BASE --exit-layer "
        f"{config.exit_layer} --exit-head THIS_DIR --prompt ...`",
        "",
        "## Training",
        "",
        f"- Self-distillation, base model frozen: {t.get('loss', '?')}",
        f"- Data: {t.get('data', '?')}",
        f"- Steps: {t.get('steps', '?')}, batch {t.get('batch_size', '?')} x {t.get('seq_len', '?')} tokens, "
        f"lr {t.get('lr', '?')} ({t.get('lr_schedule', 'constant')}), seed {t.get('seed', '?')}, "
        f"device {t.get('device', '?')}, weights saved as {t.get('weights_dtype', 'float32')}",
        f"- Draft vocabulary: {'all tokens' if config.draft_vocab is None else f'the {config.draft_vocab} most frequent tokens of the training data'}",
        "",
        "## Greedy acceptance rate (measured)",
        "",
        e.get("description", "Not measured."),
        "",
    ]
    rows = []
    if "acceptance_shared" in e and "acceptance_trained" in e:
        rows.append((f"teacher-forced, {e.get('positions', '?')} held-out positions",
                     e["acceptance_shared"], e["acceptance_trained"]))
    prompts = e.get("ppsd_prompts")
    if prompts and prompts.get("shared") is not None:
        rows.append((f"greedy PPSD, K={prompts['stages']}, {prompts['prompts']} prompts x "
                     f"{prompts['max_new_tokens']} tokens", prompts["shared"], prompts["head"]))
    if rows:
        lines += ["| measurement | shared head (before) | trained head (after) |", "|---|---|---|"]
        lines += [f"| {name} | {before:.3f} | {after:.3f} |" for name, before, after in rows]
        lines.append("")
    for extra in e.get("notes", []):
        lines += [extra, ""]
    return "\n".join(lines)
