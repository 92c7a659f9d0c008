"""Every executor kind in `KINDS`, call by call against the in-process executor: the same events
(times apart), the same logits (float noise apart), argmax ids that are the reference logits'
argmax, for AR, EESD and PPSD, K = 2 and 3, balanced and unbalanced stages; greedy output is
in-process AR's; a sampled PPSD run draws the in-process run's tokens with the same seed.
A new kind gets a factory here. Nothing here asserts speed."""

from __future__ import annotations

import pytest
import torch

import ppsd
from ppsd import DecodeConfig
from ppsd.config import stage_layers
from ppsd.executors import InProcessExecutor
from ppsd.executors.runtime import GraphedExecutor
from ppsd.executors.kinds import KINDS
from ppsd.executors.stacked import StackedExecutor
from ppsd.executors.runtime import ThreadedExecutor
from ppsd.trace import Stopwatch

from conftest import tiny_llama
from test_distributed import NEW_TOKENS, PROMPTS, Twin

# Each kind as a test builds it here (eager steps: the graphed kind's compiled CPU steps have a
# test of their own in test_graphed.py, its CUDA graphs and the stacked kind's in device checks).
FACTORIES = {
    "in-process": lambda model, partition: InProcessExecutor(model, partition, Stopwatch()),
    "threads": ThreadedExecutor,
    "graphed": GraphedExecutor,
    "stacked": StackedExecutor,
}
# Worker processes start once per module and are checked the same way, with the same `Twin`.
ELSEWHERE = {"processes": "tests/test_distributed.py::test_every_call_returns_what_the_in_process_executor_returns"}
SHAPES = [(2, 4), (3, 3), (2, 3)]  # (K, E): balanced, three stages, unbalanced (3 and 5 layers)


@pytest.fixture(scope="module")
def model():
    return ppsd.StagedModel(tiny_llama(), name="tiny-llama")


class Checked(Twin):
    """`Twin` that also holds the candidate's argmax ids to the reference's logits."""

    def _check(self, ref, got):
        got = super()._check(ref, got)
        if got.exit_best is not None:
            assert got.exit_best == int(torch.argmax(ref.exit_logits))
        if got.final_best is not None:
            assert list(got.final_best) == ref.final_logits.argmax(-1).tolist()
        return got


def _close(executor) -> None:
    close = getattr(executor, "close", None)
    if close is not None:
        close()


def test_every_kind_has_a_conformance_case():
    assert set(FACTORIES) | set(ELSEWHERE) == set(KINDS)


@pytest.mark.parametrize("num_stages,exit_layer", SHAPES)
@pytest.mark.parametrize("method", ["ppsd", "eesd", "ar"])
@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_every_call_returns_what_the_in_process_executor_returns(model, kind, method, num_stages, exit_layer):
    partition = stage_layers(model.num_layers, exit_layer, num_stages)
    config = DecodeConfig(method=method, exit_layer=exit_layer, num_stages=num_stages, max_new_tokens=NEW_TOKENS)
    expected = ppsd.generate(model, PROMPTS["long"], DecodeConfig(method="ar", exit_layer=exit_layer,
                                                                  num_stages=num_stages, max_new_tokens=NEW_TOKENS))
    candidate = FACTORIES[kind](model, partition)
    try:
        twin = Checked(InProcessExecutor(model, partition, Stopwatch()), candidate)
        result = ppsd.generate(model, PROMPTS["long"], config, executor=twin)
    finally:
        _close(candidate)
    assert twin.calls > NEW_TOKENS
    assert result.token_ids == expected.token_ids  # greedy: in-process AR's tokens
    if method != "ar":  # both verdicts, so flushes and rollbacks happen
        assert {t.status for t in result.tokens} >= {"accepted", "corrected"}


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_sampling_is_the_same_draw_as_in_process(model, kind):
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=7)
    expected = ppsd.generate(model, PROMPTS["short"], config)
    candidate = FACTORIES[kind](model, stage_layers(model.num_layers, 4, 2))
    try:
        assert ppsd.generate(model, PROMPTS["short"], config, executor=candidate).token_ids == expected.token_ids
    finally:
        _close(candidate)
