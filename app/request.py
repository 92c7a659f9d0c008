"""What a visitor asks for: one comparison's settings as the page's form sends them
(`RunRequest`, its fields in `FORM`'s order), and the same checked once (`CheckedRequest`), the
one home of each check on a run's settings (the GPU lease such a run needs on ZeroGPU is
`app.lease`'s). Plain data: nothing here loads or decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import ppsd
from ppsd import DecodeConfig
from ppsd.chat import check_text, unicode_text
from ppsd.compare import PLAIN  # plain AR's key: the comparison's one definition
from ppsd.config import DEFAULTS, real_number, whole_number

# Timed runs of each method: the page shows their median speedup and its range. Two (issue 50): a
# default Run on a quiet 2-core CPU took about 29 s with three, over the 30 s asked for once warm;
# the statistic is the same (each method's median over its rounds; of two, their mean).
DEFAULT_REPEATS = 2
MAX_REPEATS = 9
MAX_RUN_SECONDS = 300.0  # how long one comparison may hold the device; past it, it ends with what it has
SHARED_RUN_SECONDS = 60.0  # how long while another visitor waits: one script cannot keep a newcomer out for long
# A prompt's characters, counted before any tokenizer reads it (a 50 MB prompt took 4 GB to
# tokenize): far past what any model here reads (the default's 8,192 tokens are ~30,000 characters).
MAX_PROMPT_CHARS = 100_000


@dataclass(frozen=True)
class RunRequest:
    """What the user asked for; `exit_layer` None means the model's default (`ppsd.setup`). The
    order of the fields is `FORM`: the page's run inputs and the arguments of the `run` API, by
    position. Defaults are `ppsd.config.DEFAULTS`."""

    prompt: str
    model: str = ppsd.DEFAULT_MODEL
    exit_layer: int | None = DEFAULTS.exit_layer
    num_stages: int = DEFAULTS.num_stages
    eesd: bool = False
    draft_len: int = DEFAULTS.draft_len
    max_new_tokens: int = DEFAULTS.max_new_tokens
    temperature: float = DEFAULTS.temperature
    top_p: float = DEFAULTS.top_p
    seed: int = DEFAULTS.seed
    exit_head: str = ""  # "" or "auto": the shipped head if one fits; "shared"; or a train-head directory
    workers: bool = False  # the K stages at once (measured clock), instead of in turn in one process (projected)
    chat: bool = True  # the prompt as a chat user turn (when the model has a template), else raw text
    repeats: int = DEFAULT_REPEATS  # timed runs of each method, interleaved; the first is shown live
    pipeline: str = "auto"  # with `workers`: a concurrent kind's name (`ppsd.executors.kinds`), or "auto"
    # A what-if: every verdict on a draft a seeded coin of this probability (`ppsd.bench.forced`),
    # for timing only: the tokens are then not the model's answer. None: off, the model's own verdicts.
    forced_acceptance: float | None = None

    @classmethod
    def from_form(cls, *values: Any) -> "RunRequest":
        """The request of the page's run inputs, given in the order of `FORM` (those left out keep
        their defaults): boxes must be true or false (`boolean`), empty text becomes its default;
        numbers stay as sent, for `config` and `rounds` to check."""
        form = dict(zip(FORM, values))
        form.update({name: boolean(name, form[name]) for name in ("eesd", "workers", "chat") if name in form})
        form.update({name: form[name] or "" for name in ("prompt", "exit_head") if name in form})
        form["pipeline"] = form.get("pipeline") or "auto"
        form["model"] = (form.get("model") or "").strip() or ppsd.DEFAULT_MODEL
        if form.get("forced_acceptance") in ("", "off"):  # the page's "off" choice
            form["forced_acceptance"] = None
        return cls(**form)

    def checked(self) -> "CheckedRequest":
        """This request checked, once (`CheckedRequest`); ValueError in words for the first value
        that does not check out."""
        return CheckedRequest(**{name: getattr(self, name) for name in FORM})

    @property
    def methods(self) -> tuple[str, ...]:
        return ("ar", "ppsd", "eesd") if self.eesd else ("ar", "ppsd")

    def phases(self) -> tuple[str, ...]:
        """What a run goes through, in order: the model, the workers, each method, plain AR in
        this process (with workers), the repeats (the keys `Snapshot.active` takes, "model"
        before there is a snapshot)."""
        repeats = ("repeats",) if self.repeats != 1 else ()
        workers = ("workers",) if self.workers else ()
        return ("model", *workers, *self.methods, *((PLAIN,) if self.workers else ()), *repeats)


@dataclass(frozen=True)
class CheckedRequest(RunRequest):
    """A `RunRequest` whose values checked out: the one place each is checked, with its one
    message, before anything loads (`RunRequest.checked` builds it; `dataclasses.replace` checks
    again). The page's form, its API and `app.record` each build one; everything downstream takes
    it as true. Its texts are valid Unicode and the prompt neither blank nor past
    `MAX_PROMPT_CHARS`; `rounds` is `repeats`, whole and in [1, MAX_REPEATS]; `forced` is
    `forced_acceptance`, None (off) or in [0, 1] on a greedy run; `config` is the run's settings
    as typed, every number whole or real as its field is, for `ppsd.setup` to resolve against the
    model (a form or an API client may send 2.5 layers, NaN or a seed past 2^63, and none of it is
    rounded away). Which kind runs it is the library's to check, against the device
    (`ppsd.choice.ReadyKinds.for_run`)."""

    rounds: int = field(init=False)
    forced: float | None = field(init=False)
    config: DecodeConfig = field(init=False)

    def __post_init__(self) -> None:
        prompt = prompt_text(self.prompt)
        for name in TEXTS[1:]:  # the prompt's own check above says its length first
            unicode_text(name, getattr(self, name))
        wanted = "a question for the model" if self.chat else "some text for the model to continue"
        check_text(prompt, empty=f"The prompt is empty: type {wanted}, or click an example.")
        object.__setattr__(self, "rounds", _within("repeats", whole_number("repeats", self.repeats), 1, MAX_REPEATS))
        object.__setattr__(self, "forced", _forced(self.forced_acceptance, self.temperature))
        object.__setattr__(self, "config", _config(self))

    def checked(self) -> "CheckedRequest":
        return self


def _within(name: str, value: float, low: float, high: float) -> Any:
    """`value`, else ValueError naming `name` and its range when it is outside [low, high]."""
    if not low <= value <= high:
        raise ValueError(f"{name}={value} is out of range: {low} <= {name} <= {high}")
    return value


def _forced(acceptance: Any, temperature: Any) -> float | None:
    """The forced acceptance, checked: None (off) or a real number in [0, 1]; forced verdicts
    replace the greedy choice, so a sampled run (temperature > 0) is refused in words."""
    if acceptance is None:
        return None
    a = _within("forced_acceptance", real_number("forced_acceptance", acceptance), 0, 1)
    if real_number("temperature", temperature) != 0:
        raise ValueError("forced acceptance replaces the greedy choice: set Temperature to 0 to use it")
    return a


def _config(request: RunRequest) -> DecodeConfig:
    """The run's settings as typed (ValueError names the bad value)."""
    return DecodeConfig(
        method="ppsd",
        exit_layer=None if request.exit_layer is None else whole_number("exit_layer", request.exit_layer),
        num_stages=whole_number("stages", request.num_stages), draft_len=whole_number("draft_len", request.draft_len),
        max_new_tokens=whole_number("max_new_tokens", request.max_new_tokens),
        temperature=real_number("temperature", request.temperature), top_p=real_number("top_p", request.top_p),
        seed=whole_number("seed", request.seed),
    )


def boolean(name: str, value: Any) -> bool:
    """A checkbox's value: True or False only, else ValueError naming `name` (through `bool()`,
    the string "false" was true, and a script's typo ran something it did not ask for)."""
    if isinstance(value, bool):
        return value
    given = ascii(value)
    raise ValueError(f"{name} must be true or false, not {given if len(given) <= 40 else given[:40] + '…'}")


def prompt_text(prompt: Any) -> str:
    """`prompt` as valid Unicode text of at most `MAX_PROMPT_CHARS` characters, else ValueError
    in words: checked before any tokenizer reads it."""
    text = "" if prompt is None else str(prompt)
    if len(text) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt is {len(text):,} characters long; the demo takes at most {MAX_PROMPT_CHARS:,}")
    return unicode_text("prompt", text)


TEXTS = ("prompt", "model", "exit_head", "pipeline")  # the run's text fields, each checked by `unicode_text`, prompt first
FORM = tuple(f.name for f in fields(RunRequest))  # the page's run inputs, in the order it sends them
