"""A recording's format: its name, version and bounds, the typed record (`RunRecord`, with where
and when it ran: `Machine`, `ModelFacts`), the one error a bad file gets (`BadRecording`), and
the run a recording rebuilds (`RecordedRun`). Data only: writing is `write`, reading `read`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..compare import MethodRun, State
from ..trace import Trace

FORMAT = "ppsd-recording"
VERSION = 1
# A recording of the page's default run (64 tokens, 3 rounds, AR, PPSD and plain AR, K = 2) is
# about 0.1 MB (90 kB measured); one of the longest the page allows (1024 tokens, 9 rounds, EESD
# too) about 16 times the tokens and 3 times the rounds, some 5 MB. The cap bounds what one
# upload can make the server parse and build.
MAX_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 8  # the format nests 6 deep (rounds -> method -> events -> event); a parser's recursion is bounded
# Objects and lists in one file, counted before parsing: each costs the parser 60-200 bytes of
# memory where it costs the file 2 ("[]"). A shipped recording has one every 58 bytes, a file of
# nothing but drafts one every 20 (400,000 in 8 MB); 2.7 million empty lists cost 155 MB and 1.9 s.
MAX_CONTAINERS = 500_000
MAX_ROUNDS = 16
MAX_STAGES = 256
MAX_CORES = 4096.0  # the cores other programs may have used in a round: no machine here has more
MAX_EVENTS = 200_000  # per run: every stage's work of MAX_NEW_TOKENS_CAP tokens, drafts and flushes included
MAX_PROMPT = 1 << 20  # and never past the model's context less the run's new tokens, as every entry point checks
# A stage's work may cover, in all, the prompt, each token and each draft once, and this many
# more positions (measured: AR covers tokens - 1, PPSD its drafts, EESD at most tokens + drafts).
WIDTH_SLACK = 64
# Checking a trace costs, for each run, a row of positions a stage (K x (prompt + new tokens +
# 64)) and the positions its events cover (each event's width). A run may spend 2^23 of them
# (64 MB of rows), a file 2^25 (about 1 s of checking); the page's largest run, K = 30 on the
# default model's full 8,192-token context with 1,024 new tokens, spends about 0.6 million.
MAX_RUN_WORK = 1 << 23
MAX_TRACE_WORK = 1 << 25
MAX_TEXT = 1 << 20  # characters of one text (a run's answer, the prompt)
MAX_PIECES = 1 << 18
MAX_SECONDS = 7 * 24 * 3600.0  # no timed run is longer than a week
METHODS = ("ar", "ppsd", "eesd")
CLOCKS = ("measured", "projected")
STATUSES = ("verified", "accepted", "corrected")
FATES = ("pending", "accepted", "rejected", "flushed")
KINDS = ("prefill", "draft", "verify", "flushed")
DECISIONS = (None, "accepted", "corrected")
STAT_TOLERANCE = 1e-9  # seconds: the recorded statistic against the one its runs give


MODEL_FIELDS = ("name", "sha256", "model_type", "num_layers", "vocab_size", "max_context", "dtype", "head",
                 "head_sha256", "chat")


class BadRecording(ValueError):
    """A recording that cannot be opened, and why, in one sentence."""


@dataclass(frozen=True)
class Preamble:
    """What a recording says of itself before its runs: the model, the front end's settings, how
    many prompt tokens, the comparison's methods, rounds, kind and clock. `loads(admit=...)`
    hands it to a front end's check before any run is read (its values checked for type and
    range only)."""

    model: "ModelFacts"
    settings: Mapping[str, Any]
    prompt_tokens: int
    methods: tuple[str, ...]
    num_rounds: int
    kind: str
    concurrent: bool


@dataclass(frozen=True)
class Machine:
    """Where a run was recorded: `device` as torch names it ("cpu", "cuda:0"), `name` in words (the
    CPU model and its cores, or the GPU), and the host's load average (1, 5, 15 min) then."""

    device: str
    name: str
    load_average: tuple[float, float, float]


@dataclass(frozen=True)
class ModelFacts:
    """The model a run used, as far as showing the run needs: `ppsd.model.ModelInfo`'s fields and
    the sha256 of its weights; the exit head that drafted, by label and sha256."""

    name: str
    sha256: str
    model_type: str
    num_layers: int
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    dtype: str
    head: str
    head_sha256: str
    chat: bool  # it has a chat template (the prompt was a chat turn when the settings asked for one)


@dataclass(frozen=True)
class RunRecord:
    """A finished comparison: its `state` (every round's runs, rebuilt with their results; no
    model behind them), the `settings` the front end ran it with (flat plain values), the
    prompt's token ids, the text of every token id that appears (`pieces`) and of every run's
    answer (`texts`, keyed by its token ids), where, when and with what it ran, and what the
    front end said of it (`note`)."""

    state: State
    settings: Mapping[str, Any]
    prompt_ids: tuple[int, ...]
    model: ModelFacts
    machine: Machine
    recorded_at: str  # ISO 8601, UTC, to the second
    library: str  # the ppsd version that recorded it
    pieces: Mapping[int, str]
    texts: Mapping[tuple[int, ...], str]
    note: str = ""
    version: int = VERSION

    @property
    def date(self) -> str:
        """The date and time in words: "2026-12-07 03:40 UTC"."""
        return self.recorded_at[:16].replace("T", " ") + " UTC"


# --------------------------------------------------------------------------- where and with what


@dataclass
class RecordedRun(MethodRun):
    """A finished run read from a recording. It never changes, so its walls and its projected
    trace are computed once (a page reads them dozens of times per snapshot)."""

    _known: dict = field(default_factory=dict, repr=False, compare=False, kw_only=True)

    def wall(self, clock: str | None = None) -> float:
        key = ("wall", clock or self.clock)
        if key not in self._known:
            self._known[key] = super().wall(clock)
        return self._known[key]

    def shown(self) -> Trace:
        if "shown" not in self._known:
            self._known["shown"] = super().shown()
        return self._known["shown"]
