"""Writing a recording: a finished comparison's `State` (or one `generate` result) as a
`RunRecord` with where, when and with what it ran (`record`, `of_result`, `model_facts`,
`this_machine`), and a `RunRecord` as compact UTF-8 JSON (`dumps`, events as arrays).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import weakref
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

from ..compare import MethodRun, State
from ..generate import Result
from ..steps import Recorder
from .format import FORMAT, MODEL_FIELDS, Machine, ModelFacts, RunRecord

def this_machine(device: str) -> Machine:
    """The machine this process runs on, for a run on `device`, with its load average now."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        name = f"CPU {cpu_model()} ({cores} core{'s' * (cores != 1)})"
    try:
        load = tuple(round(x, 2) for x in os.getloadavg())
    except OSError:  # no load average on this system
        load = (0.0, 0.0, 0.0)
    return Machine(device, name, load)


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, else the platform's words (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


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
    from ..heads.files import fingerprint

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
        "model": {**{k: getattr(record.model, k) for k in MODEL_FIELDS},
                  "eos_token_ids": list(record.model.eos_token_ids)},
        "settings": dict(record.settings),
        "prompt_ids": list(record.prompt_ids),
        "note": record.note,
        "comparison": {"methods": list(state.methods), "num_rounds": state.num_rounds, "kind": state.kind,
                       "concurrent": state.concurrent, "stopped": state.stopped,
                       "compiled": list(state.compiled), "others": list(state.others),
                       "plain": None if state.plain is None else {
                           "threads": state.plain.threads, "words": state.plain.words,
                           "trials": [list(t) for t in state.plain.trials]}},
        "rounds": [{method: _run_json(run, record) for method, run in r.items()} for r in state.rounds],
        "pieces": {str(k): v for k, v in sorted(record.pieces.items())},
        "statistic": _stats_json(state),
    }, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


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
    from .. import __version__

    state = replace(state, rounds=whole, active=None, status="", aborted=False)
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
