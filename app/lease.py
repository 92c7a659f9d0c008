"""The GPU lease a Run asks ZeroGPU for: its size (`gpu_seconds`), the words the page shows
before Run (`note`), and what to do when ZeroGPU refuses it (`advice`). Plain arithmetic on the
page's form; nothing here loads, decodes or imports `spaces`.

What ZeroGPU does with the number (the real `spaces` package, 0.51): it multiplies the duration
by the GPU's factor (`DURATION_FACTOR`, 1.5 on the current fleet), checks the product against
what the visitor has left of a daily quota (`ANONYMOUS_DAILY_SECONDS` for a visitor not signed
in), and refuses the call (HTTP 429) when it does not fit. Shorter leases also wait less in its
queue. So the lease is sized from what a Run really costs on the GPU, not from the slowest way
it could run.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ppsd.choice import EAGER_GPU_TOKEN_SECONDS, gpu_cost

from .request import MAX_PROMPT_CHARS, MAX_RUN_SECONDS, RunRequest

# A run's decoding costs what its kind costs on a whole GPU (`ppsd.choice.gpu_cost`: on the
# captured steps, graphed PPSD's measured 4.93 ms a token; with the stages in turn, eager, 21.4
# ms), this many times over, because ZeroGPU lends about half a card.
CARD_SHARE = 2
EAGER_TOKEN_SECONDS = CARD_SHARE * EAGER_GPU_TOKEN_SECONDS  # the slowest way a token runs there
# The call's set-up. Projected, not measured on ZeroGPU (no ZeroGPU was reachable from the build
# machine): a fresh worker's CUDA start and the weights onto the card (270 MB) plus the warm-up's
# few tokens of every method. A reused worker pays neither this nor its kind's captures (`gpu_cost`);
# the lease does not know which it gets, so it asks for both.
SETUP_SECONDS = 8.0
# What the package multiplies the lease by, read from the card's driver (`spaces/zero/configs.json`,
# `duration_factor`): 1.0 on an H200, 1.5 on an RTX PRO 6000 Blackwell (the current fleet). The
# product is both the time granted and the quota charged; the page assumes the larger.
DURATION_FACTOR = 1.5
# A run in a ZeroGPU call ends this long before its lease does (`app.handlers.on_decode`): its last
# snapshot and the call's close fit in it, and the package has no lease past it to abort.
MARGIN_SECONDS = 2.0
ANONYMOUS_DAILY_SECONDS = 120  # a visitor not signed in, a day (Hugging Face's ZeroGPU page)
PROMPT_CHARS_PER_TOKEN = 1  # a prompt's tokens when its model's tokenizer is not at hand: at most one a character


def gpu_seconds(request: RunRequest | None, run_seconds: float = MAX_RUN_SECONDS,
                count_tokens: Callable[[RunRequest], int] | None = None) -> int:
    """Seconds of GPU to ask ZeroGPU for the run `request`: the set-up, then what the run costs on
    its kind (`ppsd.choice.gpu_cost`: the captures first, on a kind that captures, and every token
    of every timed run), its decoding on half a card and never more than the run's own time limit
    allows. `count_tokens` gives the prompt's tokens (default: its
    characters). The default run on a GPU (64 tokens, 2 timed runs of AR, PPSD and plain AR on
    the captured steps, 2-3 buckets) asks for 14-15 s. A request that does not check out (it
    will be refused in words), or None (a form that does not parse), asks for the least."""
    if request is None:
        return math.ceil(SETUP_SECONDS)
    try:
        run = request.checked()
        prompt = count_tokens(run) if count_tokens else len(run.prompt) // PROMPT_CHARS_PER_TOKEN
        cost = gpu_cost(run.pipeline if run.workers else None, run.config, methods=len(run.methods),
                        rounds=run.rounds, prompt_tokens=prompt)
        decode, capture = CARD_SHARE * cost.decode_seconds, cost.capture_seconds  # a token: the docs's 9.86 or 42.8 ms
    except (TypeError, ValueError, OverflowError):
        decode = capture = 0.0
    return math.ceil(SETUP_SECONDS + capture + min(decode, run_seconds))


def duration(run_seconds: float, count_tokens: Callable[[RunRequest], int] | None = None) -> Callable[..., int]:
    """`spaces.GPU`'s `duration` for the page's decode call: (stop slot, request) -> seconds."""
    return lambda slot, request: gpu_seconds(request, run_seconds, count_tokens)


def of_form(*form: Any) -> RunRequest | None:
    """The request of the page's run inputs (`RunRequest.from_form`), or None where they do not parse."""
    try:
        return RunRequest.from_form(*form)
    except ValueError:
        return None


def charged(seconds: int) -> int:
    """What ZeroGPU counts against a visitor's quota for a lease of `seconds`."""
    return round(seconds * DURATION_FACTOR)


def note(seconds: int) -> str:
    """What the page says before Run, on ZeroGPU: the lease, what it costs, how often it fits."""
    runs = ANONYMOUS_DAILY_SECONDS // max(charged(seconds), 1)
    return (f"This Run asks ZeroGPU for {seconds} s of GPU, counted as {charged(seconds)} s of your daily "
            f"quota ({ANONYMOUS_DAILY_SECONDS} s a day without signing in: {runs} such Run{'s' * (runs != 1)}). "
            "Fewer tokens or timed runs ask for less.")


def advice(seconds: int) -> str:
    """What to do when ZeroGPU refused a lease of `seconds`."""
    return (f"This Run asked for {seconds} s of GPU ({charged(seconds)} s of quota): lower Max new tokens or "
            "Timed runs to ask for less, or sign in to Hugging Face for a larger daily quota, or try again later.")


def counter(find: Callable[[str], Any]) -> Callable[[RunRequest], int]:
    """Prompt tokens by the loaded model's tokenizer when `find(model)` has it, else by characters
    (also past `MAX_PROMPT_CHARS`: such a prompt is refused before any tokenizer reads it)."""

    def count(request: RunRequest) -> int:
        loaded = find(request.model)
        if loaded is None or len(request.prompt) > MAX_PROMPT_CHARS:
            return len(request.prompt) // PROMPT_CHARS_PER_TOKEN
        return len(loaded.encode(request.prompt, chat=bool(request.chat) and loaded.chat))

    return count
