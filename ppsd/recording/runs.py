"""Reading one run of a recording (`read_run`): its config against the model, its clock, its
partition, its tokens and drafts, then its events bounded by the run's own sizes before any is
built (how many, how wide, and what checking them will cost, against the file's `Budget`), and
last its trace's invariants (`Trace.validate`, which stops at the first broken one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..compare import PLAIN
from ..config import MAX_NEW_TOKENS_CAP, DecodeConfig
from ..steps import Draft, Event, Recorder, Token
from .fields import Reader, as_choice, as_flag, as_number, as_whole, cut
from .format import (CLOCKS, DECISIONS, FATES, KINDS, MAX_EVENTS, MAX_RUN_WORK, MAX_STAGES, MAX_TRACE_WORK, STATUSES,
                     WIDTH_SLACK, BadRecording, ModelFacts, RecordedRun)

RUN_FIELDS = ("config", "clock", "concurrent", "device", "partition", "wall", "tokens", "drafts", "events", "text")


class Budget:
    """The trace work a file may cost (MAX_TRACE_WORK positions, MAX_RUN_WORK a run), spent
    before the work is done."""

    def __init__(self, total: int = MAX_TRACE_WORK) -> None:
        self.left = total

    def spend(self, amount: int, where: str) -> None:
        if amount > MAX_RUN_WORK:
            raise BadRecording(f"{where}: its trace would cost {amount:,} positions to check, more than the "
                               f"{MAX_RUN_WORK:,} a run may")
        if amount > self.left:
            raise BadRecording(f"{where}: the traces would cost more than the {MAX_TRACE_WORK:,} positions a "
                               "recording may to check")
        self.left -= amount


@dataclass(frozen=True)
class RunContext:
    """What every run of a recording is read against."""

    prompt_ids: tuple[int, ...]
    model: ModelFacts
    concurrent: bool
    pieces: Mapping[int, str]
    budget: Budget


def read_run(raw: Any, where: str, method: str, ctx: RunContext) -> tuple[RecordedRun, str]:
    """The run in `raw`, checked through, and its answer's text."""
    r = Reader(raw, where, RUN_FIELDS)
    model, prompt_len = ctx.model, len(ctx.prompt_ids)
    config = _config(r.get("config"), f"{where}: config", method, model.num_layers)
    if prompt_len + config.max_new_tokens > model.max_context:
        raise BadRecording(f"{where}: a prompt of {prompt_len} tokens and {config.max_new_tokens} new ones do not fit "
                           f"the model's context of {model.max_context}")
    clock = as_choice(r.get("clock"), f"{where}: clock", CLOCKS)
    on_pipeline = ctx.concurrent and method != PLAIN
    if clock != ("measured" if on_pipeline or method == PLAIN else "projected"):
        raise BadRecording(f"{where}: clock {clock} does not fit a run "
                           f"{'on the worker pipeline' if on_pipeline else 'in one process'}")
    trace_concurrent = r.flag("concurrent")
    if trace_concurrent != on_pipeline:
        raise BadRecording(f"{where}: concurrent does not fit the comparison")
    partition = _partition(r, where, config, model.num_layers)
    wall = r.number("wall")
    max_position = prompt_len + config.max_new_tokens + 64  # drafts and their work run ahead of the answer
    tokens = _tokens(r, where, config, prompt_len, max_position, model.vocab_size)
    drafts = []
    for i, d in enumerate(r.items("drafts", MAX_EVENTS)):
        w = f"{where}: drafts[{i}]"
        if not (isinstance(d, list) and len(d) == 3):
            raise BadRecording(f"{w} must be [position, id, fate]")
        drafts.append(Draft(as_whole(d[0], f"{w}.position", 0, max_position),
                            as_whole(d[1], f"{w}.id", 0, model.vocab_size - 1), as_choice(d[2], f"{w}.fate", FATES)))
    events = _events(r, where, config.num_stages, max_position, model.vocab_size,
                     prompt_len + len(tokens) + len(drafts) + WIDTH_SLACK, ctx.budget)
    device = r.text("device", 40)
    text = r.text("text", kind="output")
    run = RecordedRun(ctx.prompt_ids, config, partition, device, concurrent=trace_concurrent,
                      recorder=Recorder(tokens, drafts, events), setup=None, clock=clock)  # no model behind it
    try:
        run.result = run.finish(wall)  # its trace validated, as a live run's
    except ValueError as error:
        raise BadRecording(f"{where}: the trace breaks its own rules ({error})") from None
    if events and max(e.end for e in events) > wall + 1e-6 and clock == "measured":
        raise BadRecording(f"{where}: work ends after the run's wall of {wall:.3f} s")
    missing = sorted({t.id for t in tokens} - set(ctx.pieces))
    if missing:
        raise BadRecording(f"{where}: token {missing[0]} has no text in pieces")
    return run, text


def _partition(r: Reader, where: str, config: DecodeConfig, num_layers: int) -> tuple[range, ...]:
    partition = tuple(_range(p, f"{where}: partition[{k}]", num_layers)
                      for k, p in enumerate(r.items("partition", config.num_stages)))
    if len(partition) != config.num_stages or partition[0].start != 0 or partition[-1].stop != num_layers or any(
            a.stop != b.start for a, b in zip(partition, partition[1:])):
        raise BadRecording(f"{where}: partition must cut the model's {num_layers} layers into its "
                           f"{config.num_stages} stages, in order")
    return partition


def _tokens(r: Reader, where: str, config: DecodeConfig, prompt_len: int, max_position: int,
            vocab: int) -> list[Token]:
    tokens = []
    for i, t in enumerate(r.items("tokens", config.max_new_tokens)):
        w = f"{where}: tokens[{i}]"
        if not (isinstance(t, list) and len(t) == 4):
            raise BadRecording(f"{w} must be [position, id, status, draft]")
        position = as_whole(t[0], f"{w}.position", 0, max_position)
        if position != prompt_len + i:
            raise BadRecording(f"{w} is at position {position}, not {prompt_len + i}: tokens follow the prompt "
                               "one after another")
        tokens.append(Token(position, as_whole(t[1], f"{w}.id", 0, vocab - 1), as_choice(t[2], f"{w}.status", STATUSES),
                            None if t[3] is None else as_whole(t[3], f"{w}.draft", 0, vocab - 1)))
    return tokens


def _events(r: Reader, where: str, num_stages: int, max_position: int, vocab: int, per_stage: int,
            budget: Budget) -> list[Event]:
    """The run's events, bounded before any is built: a stage's work covers at most `per_stage`
    positions (its prompt, tokens and drafts once each, and WIDTH_SLACK), so there are at most K
    times as many events; the rows and widths a check walks are spent from `budget` first."""
    raw = r.items("events", min(MAX_EVENTS, num_stages * per_stage))
    budget.spend(num_stages * (max_position + 1), where)
    events, covered = [], [0] * (num_stages + 1)
    for i, e in enumerate(raw):
        event = _event(e, f"{where}: events[{i}]", num_stages, max_position, vocab)
        covered[event.stage] += event.width
        if covered[event.stage] > per_stage:
            raise BadRecording(f"{where}: stage {event.stage}'s work covers more than the {per_stage:,} positions "
                               "its prompt, tokens and drafts allow")
        events.append(event)
    budget.spend(sum(covered), where)
    return events


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
    position = as_whole(position, f"{where}.position", 0, max_position)
    width = as_whole(width, f"{where}.width", 1, max_position + 1 - position)  # no work past the run's last position
    return Event(stage=as_whole(stage, f"{where}.stage", 1, num_stages), position=position,
                 kind=as_choice(kind, f"{where}.kind", KINDS),
                 start=as_number(start, f"{where}.start"), end=as_number(end, f"{where}.end"),
                 token_id=as_whole(token_id, f"{where}.token_id", 0, vocab - 1), width=width,
                 kept=None if kept is None else as_whole(kept, f"{where}.kept", 0, width),
                 slot=None if slot is None else as_whole(slot, f"{where}.slot", 0, 1 << 30),
                 from_final=as_flag(from_final, f"{where}.from_final"),
                 decision=as_choice(decision, f"{where}.decision", DECISIONS))
