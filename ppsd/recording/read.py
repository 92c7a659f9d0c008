"""Reading a recording, checked through before anything is built from it (`loads`): its size,
its text (UTF-8), its nesting (checked before parsing), JSON with no NaN, the format and
version, the type of every field (unknown ones refused), every count and length, every number's
range, each trace's own invariants (`Trace.validate`), and the statistic against the walls.
Anything wrong is one `BadRecording` in one sentence.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from types import MappingProxyType
from typing import Any, Mapping

from ..compare import PLAIN, PlainWay, State
from ..config import MAX_NEW_TOKENS_CAP, DecodeConfig
from ..generate import Result
from ..steps import Draft, Event, Recorder, Token
from ..trace import Trace
from .fields import Reader, as_choice, as_flag, as_number, as_text, as_whole, cut, kind_of
from .format import (CLOCKS, DECISIONS, FATES, FORMAT, KINDS, MAX_BYTES, MAX_DEPTH, MAX_EVENTS, MAX_PIECES,
                     MAX_PROMPT, MAX_ROUNDS, MAX_SECONDS, MAX_STAGES, MAX_TEXT, METHODS, MODEL_FIELDS, STATUSES,
                     STAT_TOLERANCE, VERSION, BadRecording, Machine, ModelFacts, RecordedRun, RunRecord)

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


TOP_FIELDS = ("format", "version", "library", "recorded_at", "machine", "model", "settings", "prompt_ids", "note",
              "comparison", "rounds", "pieces", "statistic")


def _record(raw: Any) -> RunRecord:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BadRecording(f"the file is not a PPSD recording (it has no \"format\": \"{FORMAT}\")")
    version = raw.get("version")
    if version != VERSION or isinstance(version, bool):
        raise BadRecording(f"the recording is format version {cut(repr(version))}; this version of ppsd reads "
                           f"version {VERSION} only")
    top = Reader(raw, "the recording", TOP_FIELDS)
    library = top.text("library", 40)
    recorded_at = top.text("recorded_at", 40)
    try:
        _dt.datetime.strptime(recorded_at, "%Y-%m-%dT%H:%M:%SZ")  # the label shows its first 16 characters
    except ValueError:
        raise BadRecording(f"recorded_at {cut(recorded_at)!r} is not a UTC time like 2026-12-07T03:40:00Z") from None
    machine = _machine(top.get("machine"))
    model = _model(top.get("model"))
    settings = _settings(top.get("settings"))
    prompt_ids = tuple(as_whole(t, f"prompt_ids[{i}]", 0, model.vocab_size - 1)
                       for i, t in enumerate(top.items("prompt_ids", MAX_PROMPT)))
    if not prompt_ids:
        raise BadRecording("prompt_ids is empty: every run starts from a prompt")
    note = top.text("note", 4000)
    pieces = _pieces(top.get("pieces"), model.vocab_size)
    comparison = Reader(top.get("comparison"), "comparison",
                         ("methods", "num_rounds", "kind", "concurrent", "stopped", "plain"))
    methods = tuple(as_choice(m, "comparison.methods[]", METHODS) for m in comparison.items("methods", 3))
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
            raise BadRecording(f"{where} must be an object, not {kind_of(r)}")
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
    m = Reader(raw, "machine", ("device", "name", "load_average"))
    load = m.items("load_average", 3)
    if len(load) != 3:
        raise BadRecording("machine.load_average must be 3 numbers (1, 5 and 15 minutes)")
    return Machine(m.text("device", 40), m.text("name", 200),
                   tuple(as_number(x, "machine.load_average[]", 0.0, 1e6) for x in load))


def _model(raw: Any) -> ModelFacts:
    m = Reader(raw, "model", (*MODEL_FIELDS, "eos_token_ids"))
    vocab = m.whole("vocab_size", 1, 1 << 24)
    eos = tuple(as_whole(t, "model.eos_token_ids[]", 0, vocab - 1) for t in m.items("eos_token_ids", 16))
    return ModelFacts(name=m.text("name", 1000), sha256=m.text("sha256", 64), model_type=m.text("model_type", 100),
                      num_layers=m.whole("num_layers", 2, MAX_STAGES * 64), vocab_size=vocab,
                      max_context=m.whole("max_context", 1, 1 << 24), eos_token_ids=eos, dtype=m.text("dtype", 40),
                      head=m.text("head", 1000), head_sha256=m.text("head_sha256", 64), chat=m.flag("chat"))


def _settings(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise BadRecording(f"settings must be an object, not {kind_of(raw)}")
    if len(raw) > 64:
        raise BadRecording("settings has more than 64 fields")
    for name, value in raw.items():
        as_text(name, "a settings name", 40)
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRecording(f"settings.{name} is not a finite number")
        if isinstance(value, str):
            as_text(value, f"settings.{cut(name)}")
        elif not (value is None or isinstance(value, (bool, int, float))):
            raise BadRecording(f"settings.{cut(name)} must be text, a number, true or false, or null, "
                               f"not {kind_of(value)}")
    return dict(raw)


def _pieces(raw: Any, vocab: int) -> dict[int, str]:
    if not isinstance(raw, dict):
        raise BadRecording(f"pieces must be an object, not {kind_of(raw)}")
    if len(raw) > MAX_PIECES:
        raise BadRecording(f"pieces has {len(raw)} entries, more than the {MAX_PIECES} it may have")
    found = {}
    for key, value in raw.items():
        if not (key.isascii() and key.isdigit() and len(key) < 9):
            raise BadRecording(f"pieces key {cut(key)!r} is not a token id")
        found[as_whole(int(key), "a pieces key", 0, vocab - 1)] = as_text(value, f"pieces[{key}]", 1000)
    return found


def _plain(raw: Any) -> PlainWay | None:
    if raw is None:
        return None
    p = Reader(raw, "comparison.plain", ("threads", "words", "trials"))
    trials = []
    for t in p.items("trials", 8):
        if not (isinstance(t, list) and len(t) == 3):
            raise BadRecording("comparison.plain.trials[] must be [threads, seconds, finished]")
        trials.append((as_whole(t[0], "comparison.plain.trials[].threads", 1, 4096),
                       as_number(t[1], "comparison.plain.trials[].seconds"),
                       as_flag(t[2], "comparison.plain.trials[].finished")))
    return PlainWay(p.whole("threads", 1, 4096), p.text("words", 200), tuple(trials))


RUN_FIELDS = ("config", "clock", "concurrent", "device", "partition", "wall", "tokens", "drafts", "events", "text")


def _run(raw: Any, where: str, method: str, prompt_ids: tuple[int, ...], model: ModelFacts, concurrent: bool,
         pieces: Mapping[int, str]) -> tuple[MethodRun, str]:
    r = Reader(raw, where, RUN_FIELDS)
    vocab = model.vocab_size
    config = _config(r.get("config"), f"{where}: config", method, model.num_layers)
    clock = as_choice(r.get("clock"), f"{where}: clock", CLOCKS)
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
        position = as_whole(t[0], f"{w}.position", 0, max_position)
        if position != len(prompt_ids) + i:
            raise BadRecording(f"{w} is at position {position}, not {len(prompt_ids) + i}: tokens follow the prompt "
                               "one after another")
        tokens.append(Token(position, as_whole(t[1], f"{w}.id", 0, vocab - 1), as_choice(t[2], f"{w}.status", STATUSES),
                            None if t[3] is None else as_whole(t[3], f"{w}.draft", 0, vocab - 1)))
    drafts = []
    for i, d in enumerate(r.items("drafts", MAX_EVENTS)):
        w = f"{where}: drafts[{i}]"
        if not (isinstance(d, list) and len(d) == 3):
            raise BadRecording(f"{w} must be [position, id, fate]")
        drafts.append(Draft(as_whole(d[0], f"{w}.position", 0, max_position), as_whole(d[1], f"{w}.id", 0, vocab - 1),
                            as_choice(d[2], f"{w}.fate", FATES)))
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


def _config(raw: Any, where: str, method: str, num_layers: int) -> DecodeConfig:
    c = Reader(raw, where, ("method", "exit_layer", "num_stages", "draft_len", "max_new_tokens", "temperature",
                             "top_p", "seed"))
    expected = "ar" if method == PLAIN else method
    if c.get("method") != expected:
        raise BadRecording(f"{where}.method must be {expected}, not {cut(repr(c.get('method')))}")
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
    start, stop = as_whole(raw[0], f"{where}[0]", 0, num_layers), as_whole(raw[1], f"{where}[1]", 0, num_layers)
    if stop <= start:
        raise BadRecording(f"{where} holds no layer")
    return range(start, stop)


def _event(raw: Any, where: str, num_stages: int, max_position: int, vocab: int) -> Event:
    if not (isinstance(raw, list) and len(raw) == 11):
        raise BadRecording(f"{where} must be [stage, position, kind, start, end, token_id, width, kept, slot, "
                           "from_final, decision]")
    stage, position, kind, start, end, token_id, width, kept, slot, from_final, decision = raw
    width = as_whole(width, f"{where}.width", 1, max_position + 1)
    return Event(stage=as_whole(stage, f"{where}.stage", 1, num_stages),
                 position=as_whole(position, f"{where}.position", 0, max_position), kind=as_choice(kind, f"{where}.kind",
                                                                                                KINDS),
                 start=as_number(start, f"{where}.start"), end=as_number(end, f"{where}.end"),
                 token_id=as_whole(token_id, f"{where}.token_id", 0, vocab - 1), width=width,
                 kept=None if kept is None else as_whole(kept, f"{where}.kept", 0, width),
                 slot=None if slot is None else as_whole(slot, f"{where}.slot", 0, 1 << 30),
                 from_final=as_flag(from_final, f"{where}.from_final"),
                 decision=as_choice(decision, f"{where}.decision", DECISIONS))


def _check_statistic(raw: Any, state: State) -> None:
    """The statistic the recording states must be the one its runs give: a tampered wall or a
    hand-edited headline number is refused rather than shown."""
    s = Reader(raw, "statistic", ("walls", "measured", "projected", "shown"))
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
