"""Token choice shared by every decoder: greedy or temperature/top-p sampling, and the
speculative-sampling accept rule (Leviathan et al. 2023; Chen et al. 2023).

Works on (V,) float logits; knows nothing of models or pipelines.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Pick(NamedTuple):
    """A chosen token and the distribution it was drawn from (None when greedy)."""

    token: int
    probs: torch.Tensor | None


class Verdict(NamedTuple):
    """The full model's decision on one draft: keep it, or replace it with `token`."""

    accepted: bool
    token: int


class Sampler:
    """Greedy when temperature == 0, else temperature + nucleus (top-p) sampling, seeded.

    Any positive temperature and top_p in (0, 1] work: a temperature too small for float32 acts as
    its limit (the argmax), and a tiny top_p keeps the top token."""

    def __init__(self, *, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The (V,) float32 distribution after temperature and top-p, on the CPU."""
        logits = logits.float().cpu()
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if probs.isnan().any():
            # A temperature so small that logits / T overflows float32 (1e-40, 1e-308): take the
            # limit T -> 0, all mass on the argmax (shared among ties), i.e. greedy's choice.
            probs = (logits == logits.max()).float()
            probs /= probs.sum()
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the crossing token included).
            outside = torch.cumsum(sorted_probs, 0) - sorted_probs >= self.top_p
            # The top token always stays: a top_p below float32's range (1e-300) rounds to 0 in
            # the comparison and would otherwise leave no token at all.
            outside[0] = False
            sorted_probs[outside] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            probs /= probs.sum()
        return probs

    def pick(self, logits: torch.Tensor, best: int | None = None) -> Pick:
        """Choose the next token from `logits`: argmax (`best`, when the caller already has it), or
        a draw from `probs(logits)`."""
        if self.greedy:
            return Pick(_argmax(logits, best), None)
        probs = self.probs(logits)
        return Pick(self._draw(probs), probs)

    def verify(self, logits: torch.Tensor, draft: Pick, best: int | None = None) -> Verdict:
        """Accept `draft` (drawn from q) against the full model's `logits` (p).

        Greedy: accept iff the draft is p's argmax. Sampling: accept with probability
        min(1, p(d) / q(d)), else draw from normalize(max(0, p - q)); the committed token is then
        distributed exactly as p. `best`: p's argmax, when the caller already has it.
        """
        if self.greedy:
            token = _argmax(logits, best)
            return Verdict(token == draft.token, token)
        p, q = self.probs(logits), draft.probs
        ratio = p[draft.token] / q[draft.token]
        if torch.rand((), generator=self.generator) < ratio:
            return Verdict(True, draft.token)
        residual = torch.clamp(p - q, min=0.0)
        total = residual.sum()
        return Verdict(False, self._draw(residual / total if total > 0 else p))

    def _draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))


def _argmax(logits: torch.Tensor, best: int | None) -> int:
    # A host read of a device tensor waits for the device: skipped when the executor read it already.
    return int(torch.argmax(logits)) if best is None else best
