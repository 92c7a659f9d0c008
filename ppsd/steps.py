"""The small typed records every decoder yields and every consumer (CLI, app, bench) reads.

A decoder is a generator of `Step`s. `Work` reports one piece of stage work (an `Event`),
`Drafted` a new draft, `Committed` a token of the output, `Flushed` the discarding of everything
from a position on. `Recorder` folds a stream of steps into tokens, drafts and trace events: the
one place where a flush relabels earlier work.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, Union, get_args

Status = Literal["verified", "accepted", "corrected"]
Fate = Literal["pending", "accepted", "rejected", "flushed"]
Kind = Literal["prefill", "draft", "verify", "flushed"]
EVENT_KINDS: tuple[Kind, ...] = get_args(Kind)


@dataclass(frozen=True)
class Token:
    """A committed output token. `draft` is the id drafted for this position, if any."""

    position: int
    id: int
    status: Status
    draft: int | None = None


@dataclass(frozen=True)
class Draft:
    """A token proposed by the exit head for `position`."""

    position: int
    id: int
    fate: Fate = "pending"


@dataclass(frozen=True)
class Event:
    """One piece of work of one stage: layers of `stage` (1-based) run on positions
    [position, position + width). Times are seconds since the run began, on the trace's clock.

    `kept` counts the leading positions whose results survived (width unless a flush cut into
    it); `from_final` marks stage-1 work whose input token came from the final stage's decision;
    `decision` is the final stage's verdict on the draft that this work checked.
    """

    stage: int
    position: int
    kind: Kind
    start: float
    end: float
    token_id: int
    width: int = 1
    kept: int | None = None
    slot: int | None = None
    from_final: bool = False
    decision: Literal["accepted", "corrected"] | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def kept_width(self) -> int:
        if self.kind == "flushed":
            return 0
        return self.width if self.kept is None else self.kept


@dataclass(frozen=True)
class Work:
    event: Event


@dataclass(frozen=True)
class Drafted:
    draft: Draft


@dataclass(frozen=True)
class Committed:
    token: Token


@dataclass(frozen=True)
class Flushed:
    """Everything at positions >= `position` is discarded: drafts, and the stage work on them."""

    position: int


Step = Union[Work, Drafted, Committed, Flushed]


@dataclass
class Recorder:
    """Folds steps into the run's record; consumers call `add` as steps arrive (live) or at once."""

    tokens: list[Token] = field(default_factory=list)
    drafts: list[Draft] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def add(self, step: Step) -> None:
        if isinstance(step, Work):
            self.events.append(step.event)
        elif isinstance(step, Drafted):
            self.drafts.append(step.draft)
        elif isinstance(step, Committed):
            self.tokens.append(step.token)
            if step.token.draft is not None:
                fate = "accepted" if step.token.status == "accepted" else "rejected"
                self._resolve(lambda d: d.position == step.token.position, fate)
        elif isinstance(step, Flushed):
            self._flush(step.position)
        else:
            raise TypeError(f"not a step: {step!r}")

    def _resolve(self, matches, fate: Fate) -> None:
        self.drafts = [replace(d, fate=fate) if d.fate == "pending" and matches(d) else d for d in self.drafts]

    def _flush(self, position: int) -> None:
        self._resolve(lambda d: d.position >= position, "flushed")
        flushed = []
        for event in self.events:
            if event.kind != "flushed" and event.position >= position:
                event = replace(event, kind="flushed")
            elif event.kind != "flushed" and event.position + event.kept_width > position:
                event = replace(event, kept=position - event.position)
            flushed.append(event)
        self.events = flushed

    @property
    def pending(self) -> list[Draft]:
        return [d for d in self.drafts if d.fate == "pending"]
