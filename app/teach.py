"""Teaching views of a finished run: a static picture of the pipeline and a slot-by-slot
step-through of its trace, as HTML strings.

Pure: records in, HTML out. Nothing here runs a model, touches a tensor or knows Gradio; token
text arrives through `piece(token_id) -> str`, as in `app.token_stream`, and is always escaped.

A slot (spec: Words, "the time one stage needs for one token") is found by replaying the trace
with every piece of work costing one unit: `Trace.project` on unit durations, so a piece's slot
is its start. It follows from recording order and `ppsd.trace.dependencies` alone, so a measured
trace and its projection give the same slots. Start times would not do: projected with measured
costs, a fast stage 1 runs ahead of the stages behind it, so slot-mates rarely share a start.
Prefill fills the pipeline in the first K slots; decode slot s (the executor's `Event.slot`) is
slot K + s here. Work must span one position, prefill aside: EESD's verification covers g, and
its dependency names only the first, so its slots would be wrong and `slots` refuses it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from typing import Literal, Sequence

from app.token_stream import Piece, deciding_events, render_tokens
from ppsd.config import DecodeConfig
from ppsd.steps import Event, Token
from ppsd.trace import Trace

Decision = Literal["accepted", "corrected"]


# --------------------------------------------------------------------------- the pipeline


MAX_MIDDLE_BOXES = 2  # more stages between the first and the last are drawn as one box


def pipeline_diagram(num_layers: int, exit_layer: int, num_stages: int) -> str:
    """K boxes left to right: stage 1 (layers [0, E) + exit head, drafts), the stages that
    `DecodeConfig.partition` gives, stage K verifying; arrows for the token flow and a one-line
    caption.

    Raises ValueError for an exit layer or stage count the model cannot hold.
    """
    ranges = DecodeConfig(exit_layer=exit_layer, num_stages=num_stages).resolved(num_layers).partition(num_layers)
    boxes = [_box("stage 1", ranges[0], "+ exit head: drafts the next token", "teach-stage-first")]
    middle = ranges[1:-1]
    if len(middle) > MAX_MIDDLE_BOXES:  # one box for all of them: K boxes in a column would not fit
        boxes.append(_box(f"stages 2–{num_stages - 1}", range(middle[0].start, middle[-1].stop),
                         f"{len(middle)} stages, each passes the hidden state on", "teach-stage-middle"))
    else:
        boxes += [_box(f"stage {k}", layers, "passes the hidden state on", "teach-stage-middle")
                  for k, layers in enumerate(middle, start=2)]
    boxes.append(_box(f"stage {num_stages}", ranges[-1], "+ LM head: verifies each draft", "teach-stage-last"))
    arrow = '<div class="teach-arrow" aria-hidden="true"><span>hidden state</span>→</div>'
    caption = (f"Each slot every stage works on one token: stage 1 drafts from the first {exit_layer} of "
               f"{num_layers} layers, and stage {num_stages} checks that draft with the full model {num_stages - 1} "
               f"slot{'s' if num_stages > 2 else ''} later.")
    return (f'<figure class="teach-pipeline"><div class="teach-stages">{arrow.join(boxes)}</div>'
            '<div class="teach-loop">↺ each draft is stage 1\'s next input; a correction restarts '
            f"stage 1 from the full model's token</div><figcaption>{caption}</figcaption></figure>")


def _box(name: str, layers: range, role: str, cls: str) -> str:
    return (f'<div class="teach-stage {cls}"><div class="teach-stage-name">{name}</div>'
            f'<div class="teach-stage-layers">{_layers(layers)}</div><div class="teach-stage-role">{role}</div></div>')


def _layers(layers: range) -> str:
    return f"layer {layers.start}" if len(layers) == 1 else f"layers {layers.start}–{layers.stop - 1}"


# --------------------------------------------------------------------------- slots


@dataclass(frozen=True)
class Slot:
    """One pipeline slot: each stage's work in it, and what the final stage committed.

    `work[k - 1]` is stage k's event (its positions, kind, kept or flushed), None when the stage
    idled (a bubble); `committed` are the positions of the tokens committed in this slot;
    `decision` the final stage's verdict on the draft for `committed[0]`, if it judged one.
    `index` is 0-based; pages show it 1-based.
    """

    index: int
    work: tuple[Event | None, ...]
    committed: tuple[int, ...]
    decision: Decision | None
    partition: tuple[range, ...]


def slots(trace: Trace) -> list[Slot]:
    """The trace's work grouped into slots (see the module docstring), measured or projected."""
    wide = [e for e in trace.events if e.kind != "prefill" and e.width > 1]
    if wide:
        raise ValueError(f"slots need one position per piece of work, prefill aside; {wide[0].kind} work on "
                         f"stage {wide[0].stage} spans {wide[0].width} (EESD traces are not supported)")
    # Unit costs make the replay's clock count slots; the library's own replay keeps one rule.
    unit = replace(trace, events=tuple(replace(e, start=0.0, end=1.0) for e in trace.events)).project()
    at = [round(e.start) for e in unit.events]
    count = max(at, default=-1) + 1
    grid: list[list[Event | None]] = [[None] * trace.num_stages for _ in range(count)]
    for event, index in zip(trace.events, at):
        grid[index][event.stage - 1] = event
    found = []
    for index, work in enumerate(grid):
        final = work[-1]
        committed = () if final is None else tuple(
            p for p in sorted(deciding_events([final], trace.num_stages)) if p >= trace.prompt_len)
        decision = final.decision if final is not None and committed else None
        found.append(Slot(index, tuple(work), committed, decision, trace.partition))
    return found


# --------------------------------------------------------------------------- step-through


def render_slot(slot_list: Sequence[Slot], index: int, tokens: Sequence[Token], piece: Piece) -> str:
    """Slot `index` in plain words, one row per stage, then the text committed up to it."""
    if not slot_list:
        return '<div class="teach-slot teach-empty">The step-through appears here after a run.</div>'
    slot = _checked(slot_list, index)
    by_position = {t.position: t for t in tokens}
    rows = []
    for k, event in enumerate(slot.work, start=1):
        state, text = _describe(slot_list, slot, k, event, by_position, piece)
        rows.append(f'<tr class="teach-row teach-{state}"><th scope="row">stage {k}</th><td>{text}</td></tr>')
    done = max((p for s in slot_list[: index + 1] for p in s.committed), default=-1)
    text = render_tokens([t for t in tokens if t.position <= done], piece,
                         placeholder="nothing committed yet", label="the text committed by this slot")
    return (f'<div class="teach-slot"><div class="teach-caption step-caption">{html.escape(step_caption(slot_list, index))}'
            f'</div><table class="teach-table"><tbody>{"".join(rows)}</tbody></table>'
            f'<div class="teach-committed-label">committed so far</div>{text}</div>')


def _describe(slot_list: Sequence[Slot], slot: Slot, k: int, event: Event | None,
              by_position: dict[int, Token], piece: Piece) -> tuple[str, str]:
    """(CSS state, escaped sentence) for stage k's work in `slot`."""
    if event is None:
        return "idle", "idle (bubble)"
    layers, p = _layers(slot.partition[k - 1]), event.position
    if event.kind == "flushed":
        why = _flusher(slot_list, slot.index, p)
        reason = ("the run ended before it was needed" if why is None
                  else f"it was behind the correction in slot {why + 1}")
        return "flushed", f"flushed: ran {layers} on token {p} {_quote(piece, event.token_id)}, but {reason}"
    if event.kind == "prefill":
        text = f"reads the prompt (tokens {p}–{p + event.width - 1}) through {layers}"
        first = by_position.get(slot.committed[0]) if slot.committed else None
        if first is not None:
            text += f", and the LM head picks the first token {_quote(piece, first.id)}"
        return "prefill", text
    if k == 1 and event.kind == "draft":  # AR's stage 1 only forwards: it has no exit head to ask
        drafted = by_position.get(p + 1)
        made = "" if drafted is None or drafted.draft is None else " " + _quote(piece, drafted.draft)
        return "draft", (f"drafts token {p + 1}{made} from token {p} {_quote(piece, event.token_id)} "
                         f"with {layers} + exit head")
    if k < len(slot.work):
        return "verify", f"carries token {p} {_quote(piece, event.token_id)} through {layers}"
    return _verdict(slot, event, by_position, piece)


def _verdict(slot: Slot, event: Event, by_position: dict[int, Token], piece: Piece) -> tuple[str, str]:
    """The final stage's sentence: what it finished and what it decided."""
    done = f"finishes token {event.position} {_quote(piece, event.token_id)}"
    token = by_position.get(slot.committed[0]) if slot.committed else None
    if token is None:
        return "verify", done
    final = _quote(piece, token.id)
    if slot.decision is None or token.draft is None:
        return "verify", f"{done} and commits token {token.position} {final} (no draft to check)"
    draft = _quote(piece, token.draft)
    if slot.decision == "accepted":
        return "accepted", f"{done}, verifies token {token.position} {draft}: accepted"
    return "corrected", f"{done}, verifies token {token.position} {draft}: corrected to {final}"


def _flusher(slot_list: Sequence[Slot], index: int, position: int) -> int | None:
    """The first correction at or after slot `index` that discards work on `position`."""
    for slot in slot_list[index:]:
        if slot.decision == "corrected" and slot.committed[0] <= position:
            return slot.index
    return None


def _flushed_by(slot_list: Sequence[Slot], index: int) -> list[Event]:
    """The work the correction in slot `index` discards; work in flight behind it began at most
    K - 1 slots earlier, so only those slots are searched."""
    window = range(max(0, index - len(slot_list[index].work) + 1), index + 1)
    return [e for i in window for e in slot_list[i].work
            if e is not None and e.kind == "flushed" and _flusher(slot_list, i, e.position) == index]


def _quote(piece: Piece, token_id: int) -> str:
    return html.escape(repr(piece(token_id)))


def step_caption(slot_list: Sequence[Slot], index: int) -> str:
    """"Slot i of n: ..." with a one-sentence summary of what happened in it (plain text)."""
    if not slot_list:
        return "No slots yet: run a decode first."
    slot = _checked(slot_list, index)
    head = f"Slot {index + 1} of {len(slot_list)}: "
    busy = [e for e in slot.work if e is not None]
    if any(e.kind == "prefill" for e in busy):
        picks = ", and the full model picks the first token" if slot.committed else ", filling the pipeline"
        return head + f"the prompt passes stage {busy[0].stage}{picks}."
    if slot.decision == "accepted":
        return head + f"the draft for token {slot.committed[0]} is right: one more token for one slot."
    if slot.decision == "corrected":
        wasted = _flushed_by(slot_list, index)
        behind = len({e.position for e in wasted})
        flushed = (f"the {behind} tokens in flight behind it are flushed" if behind != 1
                   else "the 1 token in flight behind it is flushed")
        return head + (f"the draft for token {slot.committed[0]} is wrong: the full model's token is kept, and "
                       f"{flushed} ({len(wasted)} stage-slot{'s' if len(wasted) != 1 else ''} of work wasted).")
    if slot.committed:
        return head + f"the final stage commits token {slot.committed[0]}."
    idle = len(slot.work) - len(busy)
    first = slot.work[0]
    if first is not None and first.from_final:
        return head + (f"stage 1 starts from token {first.position}, the full model's own; the "
                       f"{idle} stage{'s' if idle != 1 else ''} behind it idle (bubbles) until it arrives.")
    return head + f"{len(busy)} stage{'s' if len(busy) != 1 else ''} busy, {idle} idle (bubbles)."


def _checked(slot_list: Sequence[Slot], index: int) -> Slot:
    if not 0 <= index < len(slot_list):
        raise ValueError(f"slot index {index} is out of range: 0 <= index < {len(slot_list)}")
    return slot_list[index]
