"""The tiny model (the default until SmolLM2): the shipped folder loads offline, and its training code works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ppsd.heads.corpus import build_corpus
from tools.train_tiny import Shape, TrainConfig, exit_layers, layer_logits, train

MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "models" / "ppsd-tiny"
PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "prompts.json"
shipped = pytest.mark.skipif(not (MODEL_DIR / "model.safetensors").exists(),
                             reason="assets/models/ppsd-tiny/model.safetensors is absent: "
                                    "train it with python tools/train_tiny.py")
ROUND_TRIP = [
    "def f(x):\n    return x + 1\n",
    "class A:\n\tpass\n\n\n",
    "  leading and trailing spaces  \n",
    "unicode: é ü ß 中文 🙂 — “quotes”\r\n",
    "x = {'a': [1, 2.5e-3, None]}  # comment , spaced .\n",
    "",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


@shipped
@pytest.mark.parametrize("text", ROUND_TRIP)
def test_tokenizer_round_trips_exactly(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


@shipped
def test_shipped_model_loads_offline_and_generates(tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32,
                                                 local_files_only=True)
    eos = tokenizer.eos_token_id
    assert model.config.eos_token_id == eos and model.generation_config.eos_token_id == eos
    assert model.generation_config.pad_token_id == eos and model.config.bos_token_id == eos
    assert model.config.num_hidden_layers == 8
    ids = tokenizer("def add(a, b):\n", return_tensors="pt")["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=8, min_new_tokens=8)
    assert out.shape == (1, ids.size(1) + 8)
    assert (MODEL_DIR / "model.safetensors").stat().st_size < 40e6


def test_prompts_are_well_formed():
    prompts = json.loads(PROMPTS.read_text())
    counts = {c: sum(p["category"] == c for p in prompts) for c in ("code", "prose", "math")}
    assert counts["code"] >= 6 and counts["prose"] >= 4 and counts["math"] >= 4
    assert all(p["name"] and p["prompt"] for p in prompts)


def test_corpus_is_deterministic_and_split_by_document():
    a, b = build_corpus(max_chars=50_000), build_corpus(max_chars=50_000)
    assert a == b
    assert sum(map(len, a.train)) == 50_000
    assert "statistics.py" in a.heldout_names and len(a.heldout) == len(a.heldout_names)
    assert not set(a.heldout) & set(build_corpus().train)


def micro_config(tmp_path: Path, *, steps: int, resume: bool = False) -> TrainConfig:
    # Small enough to train in a few seconds on one CPU core, big enough to learn something.
    shape = Shape(vocab_size=300, hidden=32, layers=4, heads=2, intermediate=64,
                  max_positions=64)
    return TrainConfig(out=tmp_path / "model", checkpoint=tmp_path / "run" / "checkpoint.pt",
                       shape=shape, steps=steps, batch_size=8, seq_len=32, lr=1e-2, warmup=5,
                       eval_every=10, eval_windows=4, max_chars=20_000, resume=resume)


def test_training_lowers_the_loss_and_resumes(tmp_path):
    torch.set_num_threads(1)
    history = train(micro_config(tmp_path, steps=40))
    losses = [loss for _, loss in history]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5

    resumed = train(micro_config(tmp_path, steps=50, resume=True))
    assert [step for step, _ in resumed] == list(range(40, 50))
    assert resumed[0][1] < losses[0] - 0.5  # the weights came back, not a fresh init
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["step"] == 50
    assert (tmp_path / "model" / "model.safetensors").exists()


def test_exit_logits_come_from_the_shared_head(tmp_path):
    from transformers import AutoModelForCausalLM

    train(micro_config(tmp_path, steps=2))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    ids = torch.randint(0, 256, (1, 10))
    with torch.no_grad():
        logits = layer_logits(model, ids)
        hidden = model(ids, output_hidden_states=True).hidden_states
    assert exit_layers(4) == [1, 2, 3] and sorted(logits) == [1, 2, 3, 4]
    torch.testing.assert_close(logits[2], model.lm_head(model.model.norm(hidden[2])))
    torch.testing.assert_close(logits[4], model(ids).logits)


def test_evaluation_formulas():
    from tools.evaluate_tiny import distinct_bigram_ratio, ideal_speedup

    # docs/ppsd-algorithm.md: E/L = 1/4 gives 2.0x at a = 0.67 and K = 4x at a = 1.
    assert ideal_speedup(2 / 3, 2, 8) == pytest.approx(2.0)
    assert ideal_speedup(1.0, 2, 8) == pytest.approx(4.0)
    assert ideal_speedup(0.0, 4, 8) == 1.0
    assert distinct_bigram_ratio([1, 2, 1, 2, 1]) == 0.5
    assert distinct_bigram_ratio([1, 2, 3]) == 1.0
