"""The three decoders, each a generator of `Step`s over an `Executor`.

- `ar`: the reference. One token at a time through every stage.
- `eesd`: draft-then-verify. Draft g tokens with stage 1 and the exit head, verify them in one
  pass of stages 2..K over the cached layer-E states, keep the longest accepted prefix plus one.
- `ppsd`: verify-while-draft (spec: PPSD). Every slot, each stage advances one token; stage K
  accepts or corrects the draft stage 1 made K - 1 slots earlier; a correction flushes the
  tokens in flight behind it and restarts stage 1 from the corrected token.

All three start alike (`_start`: the prefill, then the full model's first token). Every
committed token is the full model's choice, so greedy output is identical across the three.
Decoders know nothing of tokenizers, devices or UIs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Generator, Iterator, NamedTuple

from .config import DecodeConfig
from .executors.base import Executor, Feed, Output
from .sampling import Pick, Sampler
from .steps import Committed, Draft, Drafted, Flushed, Step, Token, Work

Decoder = Callable[[Executor, list[int], DecodeConfig, tuple[int, ...]], Iterator[Step]]


def ar(executor: Executor, prompt: list[int], config: DecodeConfig, eos: tuple[int, ...]) -> Iterator[Step]:
    """Autoregressive decoding: feed the newest token, wait K slots for its successor."""
    sampler, token, position, last = yield from _start(executor, prompt, config)
    slot = 0
    while position < last and token not in eos:
        out = executor.slot(Feed(position, (token,), "verify", from_final=True), slot=slot)
        while out.final_logits is None:
            yield from _work(out)
            slot += 1
            out = executor.slot(None, slot=slot)
        yield from _work(out)
        slot += 1
        token, position = sampler.pick(*out.final_choice(-1)).token, position + 1
        yield Committed(Token(position, token, "verified"))


def eesd(executor: Executor, prompt: list[int], config: DecodeConfig, eos: tuple[int, ...]) -> Iterator[Step]:
    """Early-exit self-speculation, draft then verify (spec: EESD)."""
    sampler, token, position, last = yield from _start(executor, prompt, config)
    while position < last and token not in eos:
        drafts = yield from _draft_run(executor, sampler, position, token, min(config.draft_len, last - position))
        kept = yield from _verify_run(executor, sampler, position, drafts)
        for kept_token in kept:  # the run may end inside them (length or EOS): the rest is dropped
            yield Committed(kept_token)
            token, position = kept_token.id, kept_token.position
            if position == last or token in eos:
                break
        executor.rollback(position)
        yield Flushed(position)


def ppsd(executor: Executor, prompt: list[int], config: DecodeConfig, eos: tuple[int, ...]) -> Iterator[Step]:
    """Pipeline-parallel self-speculative decoding: verify while drafting (spec: PPSD)."""
    sampler, token, position, last = yield from _start(executor, prompt, config)
    drafts: dict[int, Pick] = {}
    feed: Feed | None = Feed(position, (token,), "draft", from_final=True)
    slot = 0
    while position < last and token not in eos:
        out = executor.slot(feed, slot=slot)
        slot += 1
        decision = None
        if out.final_logits is not None:  # stage K finished x_p: decide on the draft for p + 1
            draft = drafts.pop(out.final_position + 1)
            logits, best = out.final_choice(-1)
            verdict = sampler.verify(logits, draft, best)
            decision = "accepted" if verdict.accepted else "corrected"
            token, position = verdict.token, out.final_position + 1
        yield from _work(out, decision=decision)
        if decision is not None:
            yield Committed(Token(position, token, decision, draft.token))
        if out.exit_logits is not None:  # stage 1 drafted the successor of what it was fed
            pick = sampler.pick(*out.exit_choice())
            drafts[feed.position + 1] = pick
            yield Drafted(Draft(feed.position + 1, pick.token))
            feed = Feed(feed.position + 1, (pick.token,), "draft") if feed.position + 1 < last else None
        else:
            feed = None
        if decision == "corrected":
            executor.rollback(position)
            drafts.clear()
            yield Flushed(position)
            feed = Feed(position, (token,), "draft", from_final=True)
    yield Flushed(position)  # work in flight behind the last token is never used


DECODERS: dict[str, Decoder] = {"ar": ar, "eesd": eesd, "ppsd": ppsd}


class Start(NamedTuple):
    """Where every decoder stands after the prologue: its sampler, the first committed token and
    its position, and the last position the run may commit."""

    sampler: Sampler
    token: int
    position: int
    last: int


def _start(executor: Executor, prompt: list[int], config: DecodeConfig) -> Generator[Step, None, Start]:
    """The prologue all three decoders share: run the prompt through every stage and commit the
    full model's choice for its successor."""
    sampler = Sampler(temperature=config.temperature, top_p=config.top_p, seed=config.seed)
    out = executor.push(Feed(0, tuple(prompt), "prefill"))
    yield from _work(out)
    out = executor.flow()
    yield from _work(out)
    start = Start(sampler, sampler.pick(*out.final_choice(-1)).token, len(prompt),
                  last=len(prompt) + config.max_new_tokens - 1)
    yield Committed(Token(start.position, start.token, "verified"))
    return start


def _draft_run(
    executor: Executor, sampler: Sampler, position: int, token: int, count: int
) -> Generator[Step, None, list[Pick]]:
    """Stage 1 drafts `count` tokens after `token` at `position`, each fed back in."""
    drafts: list[Pick] = []
    for i in range(count):
        out = executor.push(Feed(position + i, (token,), "draft", from_final=i == 0))
        yield from _work(out)
        pick = sampler.pick(*out.exit_choice())
        drafts.append(pick)
        token = pick.token
        yield Drafted(Draft(position + i + 1, token))
    return drafts


def _verify_run(
    executor: Executor, sampler: Sampler, position: int, drafts: list[Pick]
) -> Generator[Step, None, list[Token]]:
    """Stages 2..K check `drafts` (the tokens after `position`) in one pass. Returns the tokens to
    keep: the accepted prefix, then the full model's token: the correction, or a bonus token (no
    draft) read from the last position when every draft was accepted."""
    out = executor.push(Feed(position + len(drafts), (drafts[-1].token,), "verify"))
    yield from _work(out)
    out = executor.flow()
    verdicts = [sampler.verify(logits, d, best) for d, (logits, best) in zip(drafts, map(out.final_choice, range(len(drafts))))]
    accepted = next((i for i, v in enumerate(verdicts) if not v.accepted), len(drafts))
    yield from _work(out, decision="accepted" if accepted == len(drafts) else "corrected")
    kept = [Token(position + 1 + i, v.token, "accepted" if v.accepted else "corrected", d.token)
            for i, (v, d) in enumerate(zip(verdicts[: accepted + 1], drafts))]
    if accepted == len(drafts):
        kept.append(Token(position + 1 + accepted, sampler.pick(*out.final_choice(-1)).token, "verified"))
    return kept


def _work(out: Output, *, decision: str | None = None) -> Iterator[Work]:
    """Events of one executor call; the final stage's carries the verdict it produced."""
    last_stage = max((e.stage for e in out.events), default=0)
    for event in out.events:
        if decision is not None and event.stage == last_stage and out.final_logits is not None:
            event = replace(event, decision=decision)
        yield Work(event)
