"""The accept rule on hand-written logits, and the output distribution of speculative sampling."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from ppsd import DecodeConfig, StagedModel, generate
from ppsd.sampling import Pick, Sampler

from conftest import tiny_llama


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor(probs).clamp_min(1e-30))


class TestGreedyAcceptRule:
    def test_always_accepts_the_argmax(self):
        assert Sampler().verify(torch.tensor([0.1, 3.0, 0.2]), Pick(1, None)) == (True, 1)

    def test_never_accepts_another_token_and_corrects_to_the_argmax(self):
        assert Sampler().verify(torch.tensor([0.1, 3.0, 0.2]), Pick(2, None)) == (False, 1)


class TestSamplingAcceptRule:
    def test_always_accepts_when_the_draft_distribution_is_the_target(self):
        p = [0.2, 0.5, 0.3]
        sampler = Sampler(temperature=1.0, seed=0)
        for token in range(3):
            for _ in range(50):
                assert sampler.verify(logits_of(p), Pick(token, torch.tensor(p))) == (True, token)

    def test_never_accepts_a_token_the_target_excludes(self):
        sampler = Sampler(temperature=1.0, seed=0)
        for _ in range(50):
            # p(0) = 0: reject, and the residual max(0, p - q) puts all mass on token 2.
            verdict = sampler.verify(logits_of([0.0, 0.0, 1.0]), Pick(0, torch.tensor([0.9, 0.1, 0.0])))
            assert verdict == (False, 2)

    def test_sometimes_accepts_at_rate_p_over_q_and_keeps_p(self):
        p, q = [0.5, 0.5, 0.0], torch.tensor([1.0, 0.0, 0.0])
        sampler = Sampler(temperature=1.0, seed=1)
        verdicts = [sampler.verify(logits_of(p), Pick(0, q)) for _ in range(4000)]
        accepted = sum(v.accepted for v in verdicts) / len(verdicts)
        assert abs(accepted - 0.5) < 0.04  # min(1, p(0)/q(0)) = 0.5
        assert {v.token for v in verdicts if not v.accepted} == {1}  # residual: only token 1

    def test_top_p_keeps_the_smallest_nucleus(self):
        probs = Sampler(temperature=1.0, top_p=0.6).probs(logits_of([0.5, 0.3, 0.15, 0.05]))
        assert torch.allclose(probs, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))

    @pytest.mark.parametrize("temperature,top_p", [(1e-308, 1.0), (1e-40, 1.0), (5e-324, 0.5), (1.0, 1e-300)],
                             ids=["T=1e-308", "T=1e-40", "T=5e-324", "top_p=1e-300"])
    def test_tiny_positive_values_choose_the_argmax(self, temperature, top_p):
        logits = torch.tensor([0.5, 2.0, -1.0, 1.9])
        sampler = Sampler(temperature=temperature, top_p=top_p, seed=0)
        assert torch.equal(sampler.probs(logits), torch.tensor([0.0, 1.0, 0.0, 0.0]))
        draft = sampler.pick(logits)
        assert draft.token == 1
        assert sampler.verify(logits, draft) == (True, 1)
        assert sampler.verify(logits, Pick(3, draft.probs)) == (False, 1)  # the residual is the argmax

    def test_a_temperature_below_float32_shares_the_mass_among_tied_maxima(self):
        probs = Sampler(temperature=1e-308).probs(torch.tensor([3.0, 1.0, 3.0]))
        assert torch.equal(probs, torch.tensor([0.5, 0.0, 0.5]))


VOCAB = 6
RUNS = 300


def exact_second_token(model: StagedModel, prompt: list[int], sampler: Sampler) -> list[float]:
    """P(x2) = sum over x1 of P(x1 | prompt) P(x2 | prompt, x1), computed from the full model."""
    with torch.no_grad():
        first = sampler.probs(model.hf_model(torch.tensor([prompt])).logits[0, -1])
        expected = torch.zeros(VOCAB)
        for x1 in range(VOCAB):
            second = sampler.probs(model.hf_model(torch.tensor([prompt + [x1]])).logits[0, -1])
            expected += first[x1] * second
    return expected.tolist()


@pytest.mark.parametrize("temperature,top_p,draft_vocab", [(1.0, 1.0, None), (0.7, 0.8, None), (1.0, 1.0, 3)])
@pytest.mark.parametrize("method", ["eesd", "ppsd"])
def test_speculative_sampling_keeps_the_full_models_distribution(method, temperature, top_p, draft_vocab):
    # draft_vocab 3: a head that can only draft tokens 0-2 (q = 0 elsewhere); 3-5 come from corrections.
    from ppsd.heads import build_head

    model = StagedModel(tiny_llama(vocab=VOCAB, seed=3), name="tiny-vocab")
    if draft_vocab is not None:
        model = model.with_exit_head(build_head("lowrank", model, 4, rank=2, draft_vocab=draft_vocab))
    prompt = [1, 4, 2]
    expected = exact_second_token(model, prompt, Sampler(temperature=temperature, top_p=top_p))
    counts = [0] * VOCAB
    statuses = set()
    for seed in range(RUNS):
        config = DecodeConfig(method=method, max_new_tokens=2, temperature=temperature, top_p=top_p,
                              seed=seed, draft_len=2)
        result = generate(model, prompt, config)
        counts[result.token_ids[1]] += 1
        statuses.add(result.tokens[1].status)
    assert {"accepted", "corrected"} <= statuses  # both branches of the accept rule ran
    support = [i for i, e in enumerate(expected) if e > 0]
    assert all(counts[i] == 0 for i in range(VOCAB) if i not in support)
    f_exp = [expected[i] * RUNS / math.fsum(expected[j] for j in support) for i in support]
    assert chisquare([counts[i] for i in support], f_exp).pvalue > 1e-3
