"""A finished comparison as one file, and back: `RunRecord` holds everything a comparison
(`ppsd.compare.State`) produced, with where and when it ran, and `dumps` / `loads` turn it into
JSON bytes and back. `loads` checks a file before anything is built from it: its size
(`MAX_BYTES`), its text (UTF-8), its nesting (`MAX_DEPTH`), its format and version, the type of
every field, every count and length, every number's range, and each trace's own invariants
(`Trace.validate`); anything wrong is one `BadRecording` (a ValueError) in words.

The settings a front end ran with (the page's form) travel as a flat mapping of plain values
that this module checks for type only: what they mean is the front end's (`app.replay`). No
Gradio, no tokenizer: token text travels as recorded pieces and texts.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import weakref
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .compare import PLAIN, MethodRun, PlainWay, State
from .config import MAX_NEW_TOKENS_CAP, DecodeConfig
from .generate import Result
from .steps import Draft, Event, Recorder, Token
from .trace import Trace

__all__ = ["FORMAT", "MAX_BYTES", "MAX_DEPTH", "VERSION", "BadRecording", "Machine", "ModelFacts", "RunRecord",
           "dumps", "loads", "model_facts", "record", "this_machine", "weights_sha256"]

FORMAT = "ppsd-recording"
VERSION = 1
# A recording of the page's default run (64 tokens, 3 rounds, AR, PPSD and plain AR, K = 2) is
# about 0.1 MB (90 kB measured); one of the longest the page allows (1024 tokens, 9 rounds, EESD
# too) about 16 times the tokens and 3 times the rounds, some 5 MB. The cap bounds what one
# upload can make the server parse and build.
MAX_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 8  # the format nests 6 deep (rounds -> method -> events -> event); a parser's recursion is bounded
MAX_ROUNDS = 16
MAX_STAGES = 256
MAX_EVENTS = 200_000  # per run: every stage's work of MAX_NEW_TOKENS_CAP tokens, drafts and flushes included
MAX_PROMPT = 1 << 20
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


class BadRecording(ValueError):
    """A recording that cannot be opened, and why, in one sentence."""


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


def this_machine(device: str) -> Machine:
    """The machine this process runs on, for a run on `device`, with its load average now."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = _cpu_name()
    try:
        load = tuple(round(x, 2) for x in os.getloadavg())
    except OSError:  # no load average on this system
        load = (0.0, 0.0, 0.0)
    return Machine(device, name, load)


def _cpu_name() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return f"CPU {model} ({cores} core{'s' * (cores != 1)})"


def weights_sha256(module) -> str:
    """sha256 of every parameter and buffer of a torch module (an exit head), by name, in its own
    dtype: the identity of those exact weights. Tied tensors count once."""
    import torch

    digest = hashlib.sha256()
    seen: set[int] = set()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        if flat.dtype in (torch.bfloat16, torch.float16):
            flat = flat.view(torch.int16)  # numpy has no bf16: its bytes are read as int16
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(flat.numpy().tobytes())
    return digest.hexdigest()


_HASHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # module -> sha256, hashed once per weights


def _hashed(module, how) -> str:
    if module not in _HASHES:
        _HASHES[module] = how(module)
    return _HASHES[module]


def model_facts(model, *, head: str, chat: bool) -> ModelFacts:
    """The facts of `model` (a `ppsd.model.StagedModel` with the exit head that drafted, as a
    `RunSetup` holds it): its weights named by their fingerprint's sha256 (`ppsd.heads.files`,
    the identity an exit head is checked against), the head by `weights_sha256`."""
    from .heads.files import fingerprint

    info = model.info
    return ModelFacts(name=info.name, sha256=_hashed(model.hf_model, lambda _: fingerprint(model)["sha256"]),
                      model_type=info.model_type, num_layers=info.num_layers, vocab_size=info.vocab_size,
                      max_context=info.max_context, eos_token_ids=tuple(info.eos_token_ids), dtype=info.dtype,
                      head=head, head_sha256=_hashed(model.exit_head, weights_sha256), chat=chat)


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- to JSON


def dumps(record: RunRecord) -> bytes:
    """The recording as UTF-8 JSON bytes (compact: events as arrays)."""
    state = record.state
    return json.dumps({
        "format": FORMAT, "version": record.version, "library": record.library, "recorded_at": record.recorded_at,
        "machine": {"device": record.machine.device, "name": record.machine.name,
                    "load_average": list(record.machine.load_average)},
        "model": {**{k: getattr(record.model, k) for k in _MODEL_FIELDS},
                  "eos_token_ids": list(record.model.eos_token_ids)},
        "settings": dict(record.settings),
        "prompt_ids": list(record.prompt_ids),
        "note": record.note,
        "comparison": {"methods": list(state.methods), "num_rounds": state.num_rounds, "kind": state.kind,
                       "concurrent": state.concurrent, "stopped": state.stopped,
                       "plain": None if state.plain is None else {
                           "threads": state.plain.threads, "words": state.plain.words,
                           "trials": [list(t) for t in state.plain.trials]}},
        "rounds": [{method: _run_json(run, record) for method, run in r.items()} for r in state.rounds],
        "pieces": {str(k): v for k, v in sorted(record.pieces.items())},
        "statistic": _stats_json(state),
    }, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


_MODEL_FIELDS = ("name", "sha256", "model_type", "num_layers", "vocab_size", "max_context", "dtype", "head",
                 "head_sha256", "chat")


def _run_json(run: MethodRun, record: RunRecord) -> dict:
    result = run.result
    if result is None:
        raise ValueError(f"{run.method} did not finish: only a finished run is recorded")
    c, trace = result.config, result.trace
    return {
        "config": {"method": c.method, "exit_layer": c.exit_layer, "num_stages": c.num_stages,
                   "draft_len": c.draft_len, "max_new_tokens": c.max_new_tokens, "temperature": c.temperature,
                   "top_p": c.top_p, "seed": c.seed},
        "clock": run.clock, "concurrent": trace.concurrent, "device": trace.device,
        "partition": [[r.start, r.stop] for r in trace.partition],
        "wall": result.measured_wall_seconds,
        "tokens": [[t.position, t.id, t.status, t.draft] for t in result.tokens],
        "drafts": [[d.position, d.id, d.fate] for d in result.drafts],
        "events": [[e.stage, e.position, e.kind, e.start, e.end, e.token_id, e.width, e.kept, e.slot, e.from_final,
                    e.decision] for e in trace.events],
        "text": record.texts.get(tuple(result.token_ids), ""),
    }


def _stats_json(state: State) -> dict:
    stats = state.stats()
    return {"walls": {m: list(w) for m, w in stats.walls.items()},
            "measured": {m: list(w) for m, w in stats.measured.items()},
            "projected": {m: list(w) for m, w in stats.projected.items()},
            "shown": stats.shown()}


# --------------------------------------------------------------------------- from JSON, checked


def loads(data: bytes) -> RunRecord:
    """The recording in `data`, checked through (see the module's docstring); BadRecording says
    the first thing wrong."""
    if not isinstance(data, (bytes, bytearray)):
        raise BadRecording("a recording is read as bytes")
    if len(data) > MAX_BYTES:
        raise BadRecording(f"the file is {len(data) / 1e6:.1f} MB, over the {MAX_BYTES / 1e6:.1f} MB a recording "
                           "may have")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadRecording(f"the file is not UTF-8 text (byte {error.start} is 0x{data[error.start]:02x}): "
                           "not a recording") from None
    _check_depth(text)
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise BadRecording(f"the file is not JSON (line {error.lineno}, column {error.colno}: {error.msg}): "
                           "not a recording") from None
    return _record(raw)


def _no_constant(name: str) -> Any:
    raise BadRecording(f"the file holds {name}, which is no number a recording may hold")


def _check_depth(text: str) -> None:
    """BadRecording when brackets outside strings nest deeper than MAX_DEPTH (before parsing: a
    parser recurses once per level, and 100,000 levels would exhaust its stack)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise BadRecording(f"the file nests deeper than {MAX_DEPTH} levels: not a recording")
        elif ch in "]}":
            depth -= 1


class _Reader:
    """Typed reads of a parsed JSON object, each naming where it is (`where`) when wrong."""

    def __init__(self, obj: Any, where: str, fields: tuple[str, ...]) -> None:
        if not isinstance(obj, dict):
            raise BadRecording(f"{where} must be an object, not {_kind(obj)}")
        unknown = sorted(set(obj) - set(fields))
        if unknown:
            raise BadRecording(f"{where} has a field this version does not know: {_cut(unknown[0])!r}")
        missing = [f for f in fields if f not in obj]
        if missing:
            raise BadRecording(f"{where} lacks the field {missing[0]!r}")
        self.obj, self.where = obj, where

    def get(self, name: str) -> Any:
        return self.obj[name]

    def text(self, name: str, limit: int = MAX_TEXT) -> str:
        return _text(self.obj[name], f"{self.where}.{name}", limit)

    def whole(self, name: str, low: int = 0, high: int | None = None) -> int:
        return _whole(self.obj[name], f"{self.where}.{name}", low, high)

    def number(self, name: str, low: float = 0.0, high: float = MAX_SECONDS) -> float:
        return _number(self.obj[name], f"{self.where}.{name}", low, high)

    def flag(self, name: str) -> bool:
        return _flag(self.obj[name], f"{self.where}.{name}")

    def items(self, name: str, limit: int) -> list:
        return _list(self.obj[name], f"{self.where}.{name}", limit)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true or false", type(None): "null",
            int: "a whole number", float: "a number"}.get(type(value), type(value).__name__)


def _cut(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "…"


def _text(value: Any, where: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise BadRecording(f"{where} must be text, not {_kind(value)}")
    if len(value) > limit:
        raise BadRecording(f"{where} is {len(value)} characters long, more than the {limit} it may have")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRecording(f"{where} holds a lone surrogate, which is no text") from None
    return value


def _whole(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecording(f"{where} must be a whole number, not {_kind(value)}")
    if value < low or (high is not None and value > high):
        raise BadRecording(f"{where} = {value} is out of range: {low} <= value" + (f" <= {high}" if high is not None
                                                                                     else ""))
    return value


def _number(value: Any, where: str, low: float = 0.0, high: float = MAX_SECONDS) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecording(f"{where} must be a number, not {_kind(value)}")
    if not (math.isfinite(value) and low <= value <= high):
        raise BadRecording(f"{where} = {value} is out of range: {low:g} <= value <= {high:g}")
    return float(value)


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise BadRecording(f"{where} must be true or false, not {_kind(value)}")
    return value


def _list(value: Any, where: str, limit: int) -> list:
    if not isinstance(value, list):
        raise BadRecording(f"{where} must be a list, not {_kind(value)}")
    if len(value) > limit:
        raise BadRecording(f"{where} has {len(value)} items, more than the {limit} it may have")
    return value


def _choice(value: Any, where: str, allowed: tuple) -> Any:
    if not isinstance(value, (str, type(None))) or value not in allowed:
        shown = ", ".join("null" if a is None else str(a) for a in allowed)
        raise BadRecording(f"{where} must be one of {shown}, not {_cut(repr(value))}")
    return value


TOP_FIELDS = ("format", "version", "library", "recorded_at", "machine", "model", "settings", "prompt_ids", "note",
              "comparison", "rounds", "pieces", "statistic")


def _record(raw: Any) -> RunRecord:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BadRecording(f"the file is not a PPSD recording (it has no \"format\": \"{FORMAT}\")")
    version = raw.get("version")
    if version != VERSION or isinstance(version, bool):
        raise BadRecording(f"the recording is format version {_cut(repr(version))}; this version of ppsd reads "
                           f"version {VERSION} only")
    top = _Reader(raw, "the recording", TOP_FIELDS)
    library = top.text("library", 40)
    recorded_at = top.text("recorded_at", 40)
    try:
        when = _dt.datetime.strptime(recorded_at, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise BadRecording(f"recorded_at {_cut(recorded_at)!r} is not a UTC time like 2026-12-07T03:40:00Z") from None
    del when
    machine = _machine(top.get("machine"))
    model = _model(top.get("model"))
    settings = _settings(top.get("settings"))
    prompt_ids = tuple(_whole(t, f"prompt_ids[{i}]", 0, model.vocab_size - 1)
                       for i, t in enumerate(top.items("prompt_ids", MAX_PROMPT)))
    if not prompt_ids:
        raise BadRecording("prompt_ids is empty: every run starts from a prompt")
    note = top.text("note", 4000)
    pieces = _pieces(top.get("pieces"), model.vocab_size)
    comparison = _Reader(top.get("comparison"), "comparison",
                         ("methods", "num_rounds", "kind", "concurrent", "stopped", "plain"))
    methods = tuple(_choice(m, "comparison.methods[]", METHODS) for m in comparison.items("methods", 3))
    if not methods or methods != tuple(m for m in METHODS if m in methods):
        raise BadRecording("comparison.methods must name ar, ppsd or eesd, each at most once, in that order")
    num_rounds = comparison.whole("num_rounds", 1, MAX_ROUNDS)
    kind = comparison.text("kind", 40)
    concurrent = comparison.flag("concurrent")
    stopped = comparison.flag("stopped")
    plain = _plain(comparison.get("plain"))
    texts: dict[tuple[int, ...], str] = {}
    rounds = []
    rounds_raw = top.items("rounds", num_rounds)
    if not rounds_raw:
        raise BadRecording("rounds is empty: a recording holds at least one finished round")
    for index, r in enumerate(rounds_raw):
        where = f"round {index + 1}"
        if not isinstance(r, dict):
            raise BadRecording(f"{where} must be an object, not {_kind(r)}")
        expected = (*methods, *((PLAIN,) if plain is not None else ()))
        if sorted(r) != sorted(expected):
            raise BadRecording(f"{where} must hold the runs of {', '.join(expected)}, each once")
        runs = {}
        for method in expected:
            run, text = _run(r[method], f"{where}, {'plain AR' if method == PLAIN else method.upper()}", method,
                             prompt_ids, model, concurrent, pieces)
            runs[method] = run
            texts[tuple(run.result.token_ids)] = text
        rounds.append(MappingProxyType(runs))
    state = State(methods, num_rounds, kind, concurrent, rounds=tuple(rounds), plain=plain, done=True,
                  stopped=stopped)
    _check_statistic(top.get("statistic"), state)
    return RunRecord(state, MappingProxyType(settings), prompt_ids, model, machine, recorded_at, library,
                     MappingProxyType(pieces), MappingProxyType(texts), note)


def _machine(raw: Any) -> Machine:
    m = _Reader(raw, "machine", ("device", "name", "load_average"))
    load = m.items("load_average", 3)
    if len(load) != 3:
        raise BadRecording("machine.load_average must be 3 numbers (1, 5 and 15 minutes)")
    return Machine(m.text("device", 40), m.text("name", 200),
                   tuple(_number(x, "machine.load_average[]", 0.0, 1e6) for x in load))


def _model(raw: Any) -> ModelFacts:
    m = _Reader(raw, "model", (*_MODEL_FIELDS, "eos_token_ids"))
    vocab = m.whole("vocab_size", 1, 1 << 24)
    eos = tuple(_whole(t, "model.eos_token_ids[]", 0, vocab - 1) for t in m.items("eos_token_ids", 16))
    return ModelFacts(name=m.text("name", 1000), sha256=m.text("sha256", 64), model_type=m.text("model_type", 100),
                      num_layers=m.whole("num_layers", 2, MAX_STAGES * 64), vocab_size=vocab,
                      max_context=m.whole("max_context", 1, 1 << 24), eos_token_ids=eos, dtype=m.text("dtype", 40),
                      head=m.text("head", 1000), head_sha256=m.text("head_sha256", 64), chat=m.flag("chat"))


def _settings(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise BadRecording(f"settings must be an object, not {_kind(raw)}")
    if len(raw) > 64:
        raise BadRecording("settings has more than 64 fields")
    for name, value in raw.items():
        _text(name, "a settings name", 40)
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRecording(f"settings.{name} is not a finite number")
        if isinstance(value, str):
            _text(value, f"settings.{_cut(name)}")
        elif not (value is None or isinstance(value, (bool, int, float))):
            raise BadRecording(f"settings.{_cut(name)} must be text, a number, true or false, or null, "
                               f"not {_kind(value)}")
    return dict(raw)


def _pieces(raw: Any, vocab: int) -> dict[int, str]:
    if not isinstance(raw, dict):
        raise BadRecording(f"pieces must be an object, not {_kind(raw)}")
    if len(raw) > MAX_PIECES:
        raise BadRecording(f"pieces has {len(raw)} entries, more than the {MAX_PIECES} it may have")
    found = {}
    for key, value in raw.items():
        if not (key.isascii() and key.isdigit() and len(key) < 9):
            raise BadRecording(f"pieces key {_cut(key)!r} is not a token id")
        found[_whole(int(key), "a pieces key", 0, vocab - 1)] = _text(value, f"pieces[{key}]", 1000)
    return found


def _plain(raw: Any) -> PlainWay | None:
    if raw is None:
        return None
    p = _Reader(raw, "comparison.plain", ("threads", "words", "trials"))
    trials = []
    for t in p.items("trials", 8):
        if not (isinstance(t, list) and len(t) == 3):
            raise BadRecording("comparison.plain.trials[] must be [threads, seconds, finished]")
        trials.append((_whole(t[0], "comparison.plain.trials[].threads", 1, 4096),
                       _number(t[1], "comparison.plain.trials[].seconds"),
                       _flag(t[2], "comparison.plain.trials[].finished")))
    return PlainWay(p.whole("threads", 1, 4096), p.text("words", 200), tuple(trials))


RUN_FIELDS = ("config", "clock", "concurrent", "device", "partition", "wall", "tokens", "drafts", "events", "text")


def _run(raw: Any, where: str, method: str, prompt_ids: tuple[int, ...], model: ModelFacts, concurrent: bool,
         pieces: Mapping[int, str]) -> tuple[MethodRun, str]:
    r = _Reader(raw, where, RUN_FIELDS)
    vocab = model.vocab_size
    config = _config(r.get("config"), f"{where}: config", method, model.num_layers)
    clock = _choice(r.get("clock"), f"{where}: clock", CLOCKS)
    on_pipeline = concurrent and method != PLAIN
    if clock != ("measured" if on_pipeline or method == PLAIN else "projected"):
        raise BadRecording(f"{where}: clock {clock} does not fit a run "
                           f"{'on the worker pipeline' if on_pipeline else 'in one process'}")
    trace_concurrent = r.flag("concurrent")
    if trace_concurrent != on_pipeline:
        raise BadRecording(f"{where}: concurrent does not fit the comparison")
    partition = tuple(_range(p, f"{where}: partition[{k}]", model.num_layers)
                      for k, p in enumerate(r.items("partition", MAX_STAGES)))
    if len(partition) != config.num_stages or partition[0].start != 0 or partition[-1].stop != model.num_layers or any(
            a.stop != b.start for a, b in zip(partition, partition[1:])):
        raise BadRecording(f"{where}: partition must cut the model's {model.num_layers} layers into its "
                           f"{config.num_stages} stages, in order")
    wall = r.number("wall")
    max_position = len(prompt_ids) + config.max_new_tokens + 64  # drafts and their work run ahead of the answer
    tokens = []
    for i, t in enumerate(r.items("tokens", config.max_new_tokens)):
        w = f"{where}: tokens[{i}]"
        if not (isinstance(t, list) and len(t) == 4):
            raise BadRecording(f"{w} must be [position, id, status, draft]")
        position = _whole(t[0], f"{w}.position", 0, max_position)
        if position != len(prompt_ids) + i:
            raise BadRecording(f"{w} is at position {position}, not {len(prompt_ids) + i}: tokens follow the prompt "
                               "one after another")
        tokens.append(Token(position, _whole(t[1], f"{w}.id", 0, vocab - 1), _choice(t[2], f"{w}.status", STATUSES),
                            None if t[3] is None else _whole(t[3], f"{w}.draft", 0, vocab - 1)))
    drafts = []
    for i, d in enumerate(r.items("drafts", MAX_EVENTS)):
        w = f"{where}: drafts[{i}]"
        if not (isinstance(d, list) and len(d) == 3):
            raise BadRecording(f"{w} must be [position, id, fate]")
        drafts.append(Draft(_whole(d[0], f"{w}.position", 0, max_position), _whole(d[1], f"{w}.id", 0, vocab - 1),
                            _choice(d[2], f"{w}.fate", FATES)))
    events = [_event(e, f"{where}: events[{i}]", config.num_stages, max_position, vocab)
              for i, e in enumerate(r.items("events", MAX_EVENTS))]
    device = r.text("device", 40)
    text = r.text("text")
    trace = Trace(events=tuple(events), partition=partition, prompt_len=len(prompt_ids),
                  length=len(prompt_ids) + len(tokens), clock="measured", device=device, concurrent=trace_concurrent)
    try:
        trace.validate()
    except ValueError as error:
        raise BadRecording(f"{where}: the trace breaks its own rules ({error})") from None
    if events and max(e.end for e in events) > wall + 1e-6 and clock == "measured":
        raise BadRecording(f"{where}: work ends after the run's wall of {wall:.3f} s")
    missing = sorted({t.id for t in tokens} - set(pieces))
    if missing:
        raise BadRecording(f"{where}: token {missing[0]} has no text in pieces")
    result = Result(prompt_ids, tuple(tokens), tuple(drafts), trace, config, wall)
    recorder = Recorder(list(tokens), list(drafts), list(events))
    run = RecordedRun(prompt_ids, config, partition, device, concurrent=trace_concurrent, recorder=recorder,
                      setup=None, clock=clock, result=result)  # no model behind a recorded run
    return run, text


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


def _config(raw: Any, where: str, method: str, num_layers: int) -> DecodeConfig:
    c = _Reader(raw, where, ("method", "exit_layer", "num_stages", "draft_len", "max_new_tokens", "temperature",
                             "top_p", "seed"))
    expected = "ar" if method == PLAIN else method
    if c.get("method") != expected:
        raise BadRecording(f"{where}.method must be {expected}, not {_cut(repr(c.get('method')))}")
    config = DecodeConfig(method=expected, exit_layer=c.whole("exit_layer", 1, num_layers - 1),
                          num_stages=c.whole("num_stages", 2, min(num_layers, MAX_STAGES)),
                          draft_len=c.whole("draft_len", 1, 64),
                          max_new_tokens=c.whole("max_new_tokens", 1, MAX_NEW_TOKENS_CAP),
                          temperature=c.number("temperature", 0.0, 100.0), top_p=c.number("top_p", 0.0, 1.0),
                          seed=c.whole("seed", 0, 2 ** 63 - 1))
    try:
        return config.resolved(num_layers)
    except ValueError as error:
        raise BadRecording(f"{where}: {error}") from None


def _range(raw: Any, where: str, num_layers: int) -> range:
    if not (isinstance(raw, list) and len(raw) == 2):
        raise BadRecording(f"{where} must be [first layer, last layer + 1]")
    start, stop = _whole(raw[0], f"{where}[0]", 0, num_layers), _whole(raw[1], f"{where}[1]", 0, num_layers)
    if stop <= start:
        raise BadRecording(f"{where} holds no layer")
    return range(start, stop)


def _event(raw: Any, where: str, num_stages: int, max_position: int, vocab: int) -> Event:
    if not (isinstance(raw, list) and len(raw) == 11):
        raise BadRecording(f"{where} must be [stage, position, kind, start, end, token_id, width, kept, slot, "
                           "from_final, decision]")
    stage, position, kind, start, end, token_id, width, kept, slot, from_final, decision = raw
    width = _whole(width, f"{where}.width", 1, max_position + 1)
    return Event(stage=_whole(stage, f"{where}.stage", 1, num_stages),
                 position=_whole(position, f"{where}.position", 0, max_position), kind=_choice(kind, f"{where}.kind",
                                                                                                KINDS),
                 start=_number(start, f"{where}.start"), end=_number(end, f"{where}.end"),
                 token_id=_whole(token_id, f"{where}.token_id", 0, vocab - 1), width=width,
                 kept=None if kept is None else _whole(kept, f"{where}.kept", 0, width),
                 slot=None if slot is None else _whole(slot, f"{where}.slot", 0, 1 << 30),
                 from_final=_flag(from_final, f"{where}.from_final"),
                 decision=_choice(decision, f"{where}.decision", DECISIONS))


def _check_statistic(raw: Any, state: State) -> None:
    """The statistic the recording states must be the one its runs give: a tampered wall or a
    hand-edited headline number is refused rather than shown."""
    s = _Reader(raw, "statistic", ("walls", "measured", "projected", "shown"))
    stats = state.stats()
    for name in ("walls", "measured", "projected"):
        given, expected = s.get(name), getattr(stats, name)
        if not isinstance(given, dict) or sorted(given) != sorted(expected) or any(
                not _same_walls(given[m], expected[m]) for m in expected):
            raise BadRecording(f"statistic.{name} does not match the recorded runs' walls: the file was changed "
                               "after it was recorded")
    if s.get("shown") != stats.shown():
        raise BadRecording("statistic.shown does not match the round the recorded runs give")


def _same_walls(given: Any, expected: tuple) -> bool:
    if not isinstance(given, list) or len(given) != len(expected):
        return False
    for g, e in zip(given, expected):
        if (g is None) != (e is None):
            return False
        if e is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or abs(g - e) > STAT_TOLERANCE):
            return False
    return True


def record(state: State, *, settings: Mapping[str, Any], model: ModelFacts, machine: Machine,
           pieces: Mapping[int, str], texts: Mapping[tuple[int, ...], str], note: str = "",
           recorded_at: str | None = None) -> RunRecord:
    """A `RunRecord` of the finished comparison `state` (ValueError unless it is done with at
    least one whole round: a recording is of a finished run)."""
    if not state.done or state.stopped and not state.rounds:
        raise ValueError("only a finished comparison is recorded")
    whole = tuple(r for r in state.rounds if all(run.done for run in r.values()) and set(state.methods) <= set(r))
    if not whole:
        raise ValueError("the comparison has no finished round to record")
    from . import __version__

    state = _replace_rounds(state, whole)
    first = next(iter(whole[0].values()))
    return RunRecord(state, dict(settings), tuple(first.prompt_ids), model, machine, recorded_at or now_utc(),
                     __version__, dict(pieces), dict(texts), note)


def of_result(result: Result, setup, tokenizer, *, kind: str, settings: Mapping[str, Any]) -> RunRecord:
    """A recording of one `generate` run (`result` of `setup`, a `ppsd.setup.RunSetup`, on an
    executor of `kind`): a comparison of one method and one round."""
    concurrent = result.trace.concurrent
    run = MethodRun(tuple(setup.prompt_ids), result.config, result.trace.partition, result.trace.device,
                    concurrent=concurrent, recorder=Recorder(list(result.tokens), list(result.drafts),
                                                             list(result.trace.events)),
                    setup=setup, clock="measured" if concurrent else "projected", result=result)
    state = State((result.config.method,), 1, kind, concurrent, rounds=(MappingProxyType({run.method: run}),),
                  done=True)
    ids = {*result.token_ids, *(d.id for d in result.drafts), *(e.token_id for e in result.trace.events)}
    pieces = {i: tokenizer.decode([i]) for i in sorted(ids)}
    texts = {tuple(result.token_ids): tokenizer.decode(result.token_ids, skip_special_tokens=True)}
    return record(state, settings=settings, model=model_facts(setup.model, head=setup.head, chat=setup.chat),
                  machine=this_machine(setup.model.info.device), pieces=pieces, texts=texts)


def _replace_rounds(state: State, rounds: tuple) -> State:
    from dataclasses import replace

    return replace(state, rounds=rounds, active=None, status="", aborted=False)
