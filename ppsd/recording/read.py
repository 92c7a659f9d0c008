"""Reading a recording, checked through before anything is built from it (`loads`): the bytes
as strict JSON (`parse`: size, UTF-8, nesting and containers counted first, no NaN, no repeated
key), the format and exact version, the type of every field (unknown ones refused), every count
and length, every number's range, every text's characters; then what the recording says of
itself (`Preamble`), which a front end may check (`admit`) before any run is read; then each run
(`runs`: its events bounded by its own sizes, its trace's invariants) and the statistic against
the walls. Anything wrong is one `BadRecording` in one sentence.
"""

from __future__ import annotations

import datetime as _dt
import math
from types import MappingProxyType
from typing import Any, Callable

from ..compare import PLAIN, PlainWay, State
from .fields import Reader, as_choice, as_flag, as_list, as_number, as_text, as_whole, cut, kind_of
from .format import (FORMAT, MAX_CORES, MAX_PIECES, MAX_PROMPT, MAX_ROUNDS, MAX_STAGES, METHODS, MODEL_FIELDS,
                     STAT_TOLERANCE, VERSION, BadRecording, Machine, ModelFacts, Preamble, RunRecord)
from .parse import parse
from .runs import Budget, RunContext, read_run


def loads(data: bytes, *, admit: Callable[[Preamble], None] | None = None) -> RunRecord:
    """The recording in `data`, checked through (see the module's docstring); BadRecording says
    the first thing wrong. `admit`, given, sees the recording's `Preamble` before any run is read
    and raises BadRecording for one its front end would not show: a file of runs no page could
    have made costs no more than its first few fields."""
    return _record(parse(data), admit)


TOP_FIELDS = ("format", "version", "library", "recorded_at", "machine", "model", "settings", "prompt_ids", "note",
              "comparison", "rounds", "pieces", "statistic")


def _record(raw: Any, admit: Callable[[Preamble], None] | None) -> RunRecord:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BadRecording(f"the file is not a PPSD recording (it has no \"format\": \"{FORMAT}\")")
    version = raw.get("version")
    if type(version) is not int or version != VERSION:  # 1.0 and true are not 1
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
    prompt_raw = top.items("prompt_ids", min(MAX_PROMPT, model.max_context - 1))  # a run adds a token at least
    if not prompt_raw:
        raise BadRecording("prompt_ids is empty: every run starts from a prompt")
    comparison, methods, num_rounds, kind, concurrent = _comparison(top.get("comparison"))
    if admit is not None:
        admit(Preamble(model, MappingProxyType(settings), len(prompt_raw), methods, num_rounds, kind, concurrent))
    prompt_ids = tuple(as_whole(t, f"prompt_ids[{i}]", 0, model.vocab_size - 1) for i, t in enumerate(prompt_raw))
    stopped = comparison.flag("stopped")
    compiled, others = _unclean(comparison, num_rounds)
    plain = _plain(comparison.get("plain"))
    note = top.text("note", 4000)
    pieces = _pieces(top.get("pieces"), model.vocab_size)
    ctx = RunContext(prompt_ids, model, concurrent, pieces, Budget())
    rounds, texts = _rounds(top.items("rounds", num_rounds), (*methods, *((PLAIN,) if plain is not None else ())), ctx)
    state = State(methods, num_rounds, kind, concurrent, rounds=tuple(rounds), plain=plain, done=True,
                  stopped=stopped, compiled=compiled, others=others)
    _check_statistic(top.get("statistic"), state)
    return RunRecord(state, MappingProxyType(settings), prompt_ids, model, machine, recorded_at, library,
                     MappingProxyType(pieces), MappingProxyType(texts), note)


def _comparison(raw: Any) -> tuple[Reader, tuple[str, ...], int, str, bool]:
    comparison = Reader(raw, "comparison", ("methods", "num_rounds", "kind", "concurrent", "stopped", "plain"),
                        optional=("compiled", "others"))
    methods = tuple(as_choice(m, "comparison.methods[]", METHODS) for m in comparison.items("methods", 3))
    if not methods or methods != tuple(m for m in METHODS if m in methods):
        raise BadRecording("comparison.methods must name ar, ppsd or eesd, each at most once, in that order")
    return (comparison, methods, comparison.whole("num_rounds", 1, MAX_ROUNDS), comparison.text("kind", 40),
            comparison.flag("concurrent"))


def _unclean(comparison: Reader, num_rounds: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """What kept a round from being clean when it ran, so a replay says "Not a clean result" where
    the live page did: the rounds during which something compiled, and each round's cores used by
    other programs (a file written before they were recorded has neither: nothing is known)."""
    compiled = tuple(as_whole(r, "comparison.compiled[]", 0, num_rounds - 1)
                     for r in as_list(comparison.optional("compiled", []), "comparison.compiled", num_rounds))
    others = tuple(as_number(c, "comparison.others[]", 0.0, MAX_CORES)
                   for c in as_list(comparison.optional("others", []), "comparison.others", num_rounds))
    return compiled, others


def _rounds(rounds_raw: list, expected: tuple[str, ...], ctx: RunContext) -> tuple[list, dict]:
    """Every round's runs (each of `expected` once) and every run's answer, by its token ids."""
    if not rounds_raw:
        raise BadRecording("rounds is empty: a recording holds at least one finished round")
    texts: dict[tuple[int, ...], str] = {}
    rounds = []
    for index, r in enumerate(rounds_raw):
        where = f"round {index + 1}"
        if not isinstance(r, dict):
            raise BadRecording(f"{where} must be an object, not {kind_of(r)}")
        if sorted(r) != sorted(expected):
            raise BadRecording(f"{where} must hold the runs of {', '.join(expected)}, each once")
        runs = {}
        for method in expected:
            run, text = read_run(r[method], f"{where}, {'plain AR' if method == PLAIN else method.upper()}", method,
                                 ctx)
            runs[method] = run
            texts[tuple(run.result.token_ids)] = text
        rounds.append(MappingProxyType(runs))
    return rounds, texts


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
            as_text(value, f"settings.{cut(name)}", kind="sent")
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
        found[as_whole(int(key), "a pieces key", 0, vocab - 1)] = as_text(value, f"pieces[{key}]", 1000, "output")
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
