"""Issue 56, item 5, "A what-if of equal work": a forced-acceptance run (`ppsd.bench.forced`)
decodes the same number of tokens with every method, its coin accepts the share of drafts it
was set to (up to one whole draft), and the page's ideal is taken at the forced a, with the
difference from the measured acceptance said once.

Real runs of the shipped tiny model (assets/models/ppsd-tiny), which never writes its own EOS in
a short answer: here its EOS is set to a token its AR answer reaches a third of the way in, as
the default model's chat answer ends at its EOS (47 of 64 tokens in the issue).
"""

from __future__ import annotations

import html
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import ppsd
from app.analysis import forced_sentence
from app.models import ModelCache
from app.panels import headline
from app.request import RunRequest
from app.reading import RunView
from app.runner import run_comparison
from app.words import ratio_text
from ppsd.metrics import ideal_ppsd_speedup_slowest_stage

TINY = Path(__file__).resolve().parent.parent / "assets" / "models" / "ppsd-tiny"
PROMPT, TOKENS = "def fibonacci(n):", 24


def _early_eos(model: ppsd.StagedModel, tokenizer) -> int:
    """A token id whose first appearance in AR's answer is a third of the way in."""
    setup = ppsd.setup.set_up_text(model, tokenizer, PROMPT, ppsd.DecodeConfig(method="ar", max_new_tokens=TOKENS))
    ids = ppsd.generate(setup.model, list(setup.prompt_ids), setup.config).token_ids
    return next(t for i, t in enumerate(ids) if i >= TOKENS // 3 and t not in ids[:i])


@pytest.fixture(scope="module")
def eos_cache():
    from transformers import AutoTokenizer

    def loader(name, device=None, progress=None):
        model, _ = ppsd.load_model(str(TINY), device="cpu")
        tokenizer = AutoTokenizer.from_pretrained(str(TINY))
        model.info = replace(model.info, eos_token_ids=(_early_eos(model, tokenizer),))
        return model, tokenizer

    torch.set_num_threads(1)
    return ModelCache(device="cpu", loader=loader)


def _run(cache, forced):
    request = RunRequest(prompt=PROMPT, model="tiny", max_new_tokens=TOKENS, repeats=1, chat=False,
                         forced_acceptance=forced)
    snap = list(run_comparison(request, cache, throttle=0.0))[-1]
    return snap, RunView.of(snap).reading


def test_without_a_what_if_ar_stops_at_its_eos(eos_cache):
    snap, c = _run(eos_cache, None)
    assert TOKENS // 3 <= c.ar.tokens < TOKENS and c.ppsd.tokens == c.ar.tokens  # the model's own answer ends


@pytest.mark.parametrize("forced", [0.2, 0.5, 0.9])
def test_a_what_if_decodes_equal_work_and_takes_its_ideal_at_the_forced_a(eos_cache, forced):
    snap, c = _run(eos_cache, forced)
    tokens = {m: len(run.result.token_ids) for m, run in RunView.of(snap).runs.items()}
    assert tokens == {m: TOKENS for m in tokens}, tokens  # the same stop for every method: equal work
    judged = c.ppsd.accepted + c.ppsd.rejected
    assert abs(c.ppsd.accepted - forced * judged) < 1  # the coin accepts a of the judged drafts, whole drafts only
    ideal = ideal_ppsd_speedup_slowest_stage(forced, c.ppsd.slot_fraction)
    assert c.ideal == pytest.approx(ideal)
    page = html.unescape(re.sub(r"<[^>]+>", "", headline.render_headline(c)))
    assert f"ideal SPPSD(forced a={forced:.2f}, K=2) = {ratio_text(ideal)}" in page
    said = forced_sentence(c)
    assert said in page and f"accepted {c.ppsd.accepted} of the {judged} drafts PPSD judged" in said
    assert f"Every method decoded exactly {TOKENS} tokens" in said
    assert f"to the same {TOKENS} tokens" in page
