"""Recorded runs on the page: a finished `Snapshot` as a `ppsd.recording.RunRecord` (`record`),
and a recording as the `Snapshot` the live run ended with (`snapshot`), which drives the same
panels through the same `RunView`, labelled "recorded on <device>, <date>; not run now". A
replay loads no model: token text comes from the recording (`RecordedLoaded`).

Files: `read_upload` reads at most `ppsd.recording.MAX_BYTES` of an upload (never copied
elsewhere); `shipped` lists the recordings in assets/runs/. No Gradio events here (the panel is
`app.panels.recording`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Callable, Mapping

from gradio import utils as gradio_utils

from ppsd.model import ModelInfo
from ppsd.recording import (MAX_BYTES, BadRecording, Machine, Preamble, RunRecord, loads, model_facts,
                            record as record_state, this_machine)
from ppsd.setup import check_prompt_length

from .models import Loaded
from .request import FORM, CheckedRequest, RunRequest
from .runner import Snapshot
from .server.uploads import discard

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "assets" / "runs"  # the shipped recordings
# A prompt's tokens are at most its UTF-8 bytes (byte-level and byte-fallback tokenizers give a
# token a byte at worst) and what a chat template adds around it (the default model's, 30).
TEMPLATE_TOKENS = 1024


@dataclass(frozen=True)
class RecordedModel:
    """A recorded model's facts, where a `Loaded` has its weights: only `info` is read."""

    info: ModelInfo


@dataclass(frozen=True)
class RecordedLoaded(Loaded):
    """A `Loaded` whose text comes from a recording: `pieces` (token id -> its text) and `texts`
    (a run's token ids -> its answer), no tokenizer."""

    pieces: Mapping[int, str] = dataclasses.field(default_factory=dict)
    texts: Mapping[tuple[int, ...], str] = dataclasses.field(default_factory=dict)
    has_chat: bool = False

    @property
    def piece(self) -> Callable[[int], str]:
        return lambda token_id: self.pieces.get(token_id, "")

    @property
    def chat(self) -> bool:
        return self.has_chat

    def decode(self, ids: list[int]) -> str:
        return self.texts.get(tuple(ids), "".join(self.pieces.get(i, "") for i in ids))

    def encode(self, text: str, *, chat: bool = False) -> list[int]:
        raise ValueError("a recorded run has no tokenizer: it cannot encode new text")


@dataclass(frozen=True)
class Replayed(Snapshot):
    """The snapshot a recorded run ended with; `recorded`: where and when, for every panel."""

    recorded: str = ""
    load_average: tuple[float, ...] = ()  # the recording host's (1, 5, 15 min)


def snapshot(rec: RunRecord) -> Replayed:
    """The finished snapshot of `rec`, as the live run's last one (BadRecording when its settings
    are not the page's)."""
    s = rec.state
    admit(Preamble(rec.model, rec.settings, len(rec.prompt_ids), s.methods, s.num_rounds, s.kind, s.concurrent))
    request = _request(rec.settings)
    _check_settings(request, rec)
    m = rec.model
    info = ModelInfo(name=m.name, model_type=m.model_type, num_layers=m.num_layers, vocab_size=m.vocab_size,
                     max_context=m.max_context, eos_token_ids=m.eos_token_ids, device=rec.machine.device, dtype=m.dtype)
    loaded = RecordedLoaded(m.name, RecordedModel(info), None, 0.0, key=f"recording:{m.sha256}", pieces=rec.pieces,
                            texts=rec.texts, has_chat=m.chat)
    first = rec.state.rounds[0]["ppsd"]
    # What every panel of a replay says, in the note too (the message beside Run, the API's summary).
    said = f"Recorded on {rec.machine.name}, {rec.date}; not run now"
    return Replayed(request, loaded, rec.state, first.config.num_stages, head=m.head,
                    note=f"{said}. {rec.note}" if rec.note else f"{said}.", recorded=said,
                    load_average=rec.machine.load_average)


def admit(pre: Preamble) -> None:
    """The page's check of what a recording says of itself, before any of its runs is read
    (`ppsd.recording.loads(admit=...)`): AR and PPSD compared, the settings the page's own, as
    many rounds and the same methods as recorded, K and E within the recorded model's layers,
    the prompt and new tokens within its context, and no more prompt tokens than the recorded
    prompt's text could give. A file whose runs no page could have made is refused here."""
    if pre.methods[:2] != ("ar", "ppsd"):
        raise BadRecording(f"the recording holds {', '.join(m.upper() for m in pre.methods)} alone (a "
                           "`generate --record` run): the page replays comparisons of AR and PPSD")
    request = _request(pre.settings)
    if request.rounds != pre.num_rounds:
        raise BadRecording(f"settings.repeats = {request.repeats} does not match the {pre.num_rounds} rounds "
                           "recorded")
    if tuple(request.methods) != pre.methods:
        raise BadRecording("settings.eesd does not match the methods recorded")
    try:
        config = request.config.resolved(pre.model.num_layers)
        check_prompt_length(pre.prompt_tokens, pre.model.max_context, config.max_new_tokens)
    except ValueError as error:
        raise BadRecording(f"the recorded settings do not fit the recorded model: {error}") from None
    most = len(request.prompt.encode("utf-8")) + TEMPLATE_TOKENS
    if pre.prompt_tokens > most:
        raise BadRecording(f"prompt_ids holds {pre.prompt_tokens:,} tokens, more than the {most:,} the recorded "
                           "prompt's text could give")


def _request(settings: Mapping) -> CheckedRequest:
    unknown = sorted(set(settings) - set(FORM))
    if unknown:
        raise BadRecording(f"settings.{unknown[0][:40]} is not a setting of the page")
    # A setting the page gained after the recording was made takes its default (the run had no such choice).
    defaults = {f.name: f.default for f in fields(RunRequest) if f.default is not MISSING}
    missing = [name for name in FORM if name not in settings and name not in defaults]
    if missing:
        raise BadRecording(f"settings lacks {missing[0]}")
    try:
        return RunRequest.from_form(*(settings.get(name, defaults.get(name)) for name in FORM)).checked()
    except (TypeError, ValueError) as error:
        raise BadRecording(f"the recorded settings are not the page's: {error}") from None


def _check_settings(request: CheckedRequest, rec: RunRecord) -> None:
    """The page's settings must be the ones the recorded runs ran with: the headline and the cards
    read some of them from the request."""
    config = rec.state.rounds[0]["ppsd"].config
    for name, ran in (("num_stages", config.num_stages), ("max_new_tokens", config.max_new_tokens),
                      ("draft_len", config.draft_len), ("temperature", config.temperature),
                      ("top_p", config.top_p), ("seed", config.seed)):
        if getattr(request, name) != ran:
            raise BadRecording(f"settings.{name} = {getattr(request, name)} does not match the runs' {ran}")


def open_bytes(data: bytes) -> Replayed:
    """The finished snapshot of the recording in `data`, checked through (BadRecording says why
    not): its settings against the page (`admit`) before any of its runs is read."""
    return snapshot(loads(data, admit=admit))


def read_upload(path: str | Path) -> bytes:
    """At most MAX_BYTES + 1 bytes of the file at `path` (an upload in Gradio's temporary folder):
    a larger file is refused by `loads` without reading the rest. The upload is then deleted:
    Gradio would otherwise serve it by its path for an hour, to anyone who has the link. Only a
    file in Gradio's upload folder is (never one outside it), and only the upload's own copy
    (`app.server.uploads`), so another visitor's upload of the same file stays."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_BYTES + 1)
    except OSError as error:
        raise BadRecording(f"the file could not be read: {error.strerror or error}") from None
    finally:
        discard(path, gradio_utils.get_upload_folder())


def shipped() -> dict[str, Path]:
    """The shipped recordings, by file name, in name order."""
    return {p.name: p for p in sorted(RUNS.glob("*.json"))}


# --------------------------------------------------------------------------- saving a live run


def record(snap: Snapshot, machine: Machine | None = None) -> RunRecord:
    """The recording of the finished live snapshot `snap` (ValueError unless it is done)."""
    if not snap.done or isinstance(snap, Replayed):
        raise ValueError("only a finished live run is saved")
    runs = [run for r in snap.state.rounds for run in r.values()]
    setup = snap.state.rounds[0]["ppsd"].setup
    piece = snap.loaded.piece
    ids = {i for run in runs if run.result is not None for i in (
        *run.result.token_ids, *(d.id for d in run.result.drafts), *(t.draft for t in run.result.tokens
                                                                    if t.draft is not None),
        *(e.token_id for e in run.result.trace.events))}
    pieces = {i: piece(i) for i in sorted(ids)}
    texts = {tuple(run.result.token_ids): snap.loaded.decode(run.result.token_ids) for run in runs
             if run.result is not None}
    facts = model_facts(setup.model, head=snap.head, chat=snap.loaded.chat)
    settings = {name: getattr(snap.request, name) for name in FORM}  # as sent, not what was checked from it
    return record_state(snap.state, settings=settings, model=facts, machine=machine or this_machine(snap.device),
                        pieces=pieces, texts=texts, note=snap.note)


def file_name(rec: RunRecord) -> str:
    """A recording's file name, by device and date: ppsd-cpu-processes-2026-12-07T0340Z.json."""
    device = rec.machine.device.replace(":", "")
    return f"ppsd-{device}-{rec.state.kind}-{rec.recorded_at[:16].replace(':', '')}Z.json"


__all__ = ["BadRecording", "RecordedLoaded", "Replayed", "admit", "file_name", "open_bytes", "read_upload",
           "record", "shipped", "snapshot"]
