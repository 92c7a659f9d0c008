"""The Hugging Face references of the bench: greedy `generate()` and its draft-then-verify early
exit (`assistant_early_exit`) on the same weights, device and dtype, timed, and the token check
that compares their output with ours. Nothing here decides what is run or when."""

from __future__ import annotations

import time
from typing import Sequence

from ..model import StagedModel, eos_ids
from ..setup import device_sync


def hf_generate(model: StagedModel, prompt_ids: list[int], new_tokens: int, **kwargs) -> tuple[list[int], float]:
    """Hugging Face `generate()` greedy on the same weights, device and dtype: (token ids, seconds).

    `min_new_tokens` masks EOS until `new_tokens` are out, so HF too generates exactly that many.
    """
    import torch

    ids = torch.tensor([prompt_ids], device=model.hf_model.device)
    pad = (eos_ids(model.hf_model) or (0,))[0]  # one unpadded sequence: any id serves, HF only asks for one
    sync = device_sync(model) or (lambda: None)
    sync()
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      pad_token_id=pad, **kwargs)
    sync()
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - started


def hf_assisted_early_exit(model: StagedModel, prompt_ids: list[int], new_tokens: int, *, exit_layer: int,
                           draft_len: int) -> tuple[list[int], float]:
    """HF's draft-then-verify early exit (`assistant_early_exit=E`), g drafts per round: a constant
    schedule and no confidence cut-off, so it drafts exactly what our EESD drafts."""
    return hf_generate(model, prompt_ids, new_tokens, assistant_early_exit=exit_layer,
                       num_assistant_tokens=draft_len, num_assistant_tokens_schedule="constant",
                       assistant_confidence_threshold=0.0)


def same_output(ours: Sequence[int], theirs: Sequence[int], eos: Sequence[int]) -> bool:
    """Equal up to our first EOS: HF's `min_new_tokens` bans EOS where ours emits it, so the two
    can only be compared on the common prefix before it."""
    cut = next((i for i, t in enumerate(ours) if t in eos), len(ours))
    return list(ours[:cut]) == list(theirs[:cut])
