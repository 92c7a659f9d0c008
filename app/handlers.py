"""The page's run and model handlers: thin functions from Gradio inputs to outputs. They validate,
load (`app.models`), queue for the device (`app.server.line`), run (`app.runner`) and hand every
snapshot to `app.view`; the E and K sliders' rules live here too. A panel's own events (the
race, the step-through, the theory, the diagram) are in its module in `app.panels`. A handler that needs the server's shared
state (its models, its device line, each session's Stop) takes an `AppState` as its first
argument, which `app.ui` binds; this module holds none.
"""

from __future__ import annotations

import html
import sys
import threading
import time
from typing import Any, Callable, Iterator

import gradio as gr

import ppsd
from ppsd.choice import choose
from ppsd.compare import PLAIN
from ppsd.config import fit_stages, stage_bounds
from ppsd.heads import default_exit_layer
from ppsd.executors.kinds import AUTO
from ppsd.executors.host import usable_cores
from ppsd.model import ModelInfo, model_config, resolve_device
from ppsd.model_source import needs_preparing

from . import lease, view, zerogpu
from .server.line import Background, wait_text
from .panels import run_message
from .page_text import STAGES_LABEL, WORKERS_LABEL
from .models import ModelCache
from .request import CheckedRequest, RunRequest, prompt_text, unicode_text
from .runner import Limit, Snapshot, run_comparison
from .state import AppState
from .server.visitors import visitor

DEFAULT_LAYERS = 30  # the default model's (SmolLM2-135M); replaced on page load / Load for others
FIGURE_SECONDS = 1.0  # live redraw period of the plots (the token streams follow every snapshot)


def _tell(tell: Callable[[str], None]) -> Callable[[str], None]:
    """`tell`, echoed to the server's terminal (a first-use conversion is worth seeing there)."""
    def both(message: str) -> None:
        tell(message)
        print(message, file=sys.stderr, flush=True)
    return both


def _loading(cache: ModelCache, name: str, stop: threading.Event | None = None, *,
             warm: bool | None = None) -> Iterator[str]:
    """Load `name` into `cache` on a thread (and warm it up, per `warm`: `ModelCache.get`),
    yielding what it is doing (first use: download, conversion, weights, warm-up) twice a second;
    re-raises the loader's ValueError. Stop ends the wait, not the load: the model is there for
    the next run."""
    stop = stop or threading.Event()
    loading = Background(lambda tell: cache.get(name, progress=_tell(tell), warm=warm), "model-load")
    for doing in loading.progress(stop, f"Loading {name}"):
        yield f"{doing} (first use only)"
    if not stop.is_set():
        loading.value()


def layer_count(cache: ModelCache, name: str) -> int | None:
    """Decoder layers of model `name`: of the loaded model when `cache` holds it, else from its
    config alone (no weights); None if unreadable."""
    name = name.strip()
    if name in cache:
        return cache.get(name).model.num_layers
    if not cache.offers(name):  # what Load refuses is not read here either
        return None
    try:
        if needs_preparing(name):  # a first download or conversion waits for Run or Load
            return None
        return int(model_config(name).num_hidden_layers)
    except (ValueError, OSError):  # not described yet, or a name the file system refuses: default ranges
        return None


# --------------------------------------------------------------------------- slider rules


def stage_updates(num_layers: int, num_stages: int, exit_layer: int | None = None, model: str = "") -> tuple[Any, Any]:
    """E and K sliders for a model of `num_layers`, in `ppsd.config.stage_bounds`, the pair kept
    valid by lowering the value that did not move (`fit_stages`); E defaults to the shipped
    head's for `model` and K, else the balanced L/K. The ranges never shrink to one value, which
    a Gradio slider refuses."""
    exits, counts = stage_bounds(num_layers)
    num_stages = max(counts.start, min(int(num_stages), counts.stop - 1))  # first: the default E depends on K
    default = default_exit_layer(model, num_layers, num_stages)
    exit_layer, num_stages = fit_stages(num_layers, int(default if exit_layer is None else exit_layer), num_stages)
    balanced = ppsd.balanced_exit_layer(num_layers, num_stages)
    why = f"balanced E = L/K = {balanced}" if default == balanced else \
        f"default E = {default}: the shipped head's (chosen by measured speed); balanced L/K = {balanced}"
    return (gr.update(minimum=exits.start, maximum=max(exits.stop - 1, exits.start + 1), value=exit_layer,
                      info=f"drafts use layers 0…E−1; {why}"),
            gr.update(minimum=counts.start, maximum=max(counts.stop - 1, counts.start + 1), value=num_stages,
                      info=f"K − 1 ≤ L − E: each later stage holds a layer; L = {num_layers}"))


def max_tokens_update(state: AppState, prompt: str, model: str, chat: bool, value: float) -> Any:
    """The max-tokens slider bound by the context left after the prompt, once the model is
    loaded (before that, by the cap alone; Run checks the rest)."""
    try:
        prompt, model = prompt_text(prompt), unicode_text("model", model)
    except ValueError as error:  # a script's raw JSON: said, not a TypeError from the tokenizer
        raise gr.Error(str(error), print_exception=False) from None
    loaded = state.cache.find((model or "").strip() or ppsd.DEFAULT_MODEL)
    if loaded is None or not (prompt or "").strip():
        return gr.skip()
    room = loaded.model.info.max_context - len(loaded.encode(prompt, chat=bool(chat) and loaded.chat))
    top = max(2, min(ppsd.MAX_NEW_TOKENS_CAP, room))
    why = "the demo's cap" if top == ppsd.MAX_NEW_TOKENS_CAP else \
        f"the context of {loaded.model.info.max_context} minus the prompt"
    return gr.update(maximum=top, value=min(int(value), top), info=f"at most {top}: {why}")


def stages_problem(num_stages: Any, workers: bool, pipeline: str | None) -> str:
    """Why K stages cannot run at once here, naming the controls to change ("" when they can):
    said as the slider moves, and again by Run, in the same words."""
    device = resolve_device("auto")
    try:
        k = int(num_stages)
        kind = choose(pipeline or AUTO, k, device)
    except (TypeError, ValueError, OverflowError):
        return ""  # Run refuses the value itself, in words
    if k != num_stages:
        return ""  # 2.5 stages: the same
    if not workers or kind.unavailable(device, k) is None:
        return ""
    cores = usable_cores()
    return (f"K = {k} stages at once need {k} CPU cores, one each; this machine gives {cores}. "
            f"Lower {STAGES_LABEL} to {cores}, or untick “{WORKERS_LABEL}” (the stages then run in turn, "
            "projected clock).")


def on_stages_warning(num_stages: float, workers: bool, pipeline: str | None) -> str:
    return run_message.render(stages_problem(num_stages, workers, pipeline), "warning")


# --------------------------------------------------------------------------- handlers


def ordered(values: dict[str, Any]) -> tuple:
    """A view's values in the order of `view.OUTPUTS`; what it does not name stays as it is."""
    return tuple(values.get(name, gr.skip()) for name in view.OUTPUTS)


def idle_outputs() -> tuple:
    return ordered(view.idle())


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "no-session"


def on_run_form(state: AppState, decode: Callable[..., Iterator[tuple]], request: gr.Request | None,
                *form: Any) -> Iterator[tuple]:
    """Run AR, then PPSD (then EESD) on the prompt and time them, the page's Run button and the `run`
    API: the inputs, in the order of `app.request.FORM`, parsed into a checked request for
    `on_run`; a form that does not parse or check out is refused in words. The last output is
    the run as JSON."""
    try:
        run = RunRequest.from_form(*form).checked()
    except ValueError as error:
        yield ordered(view.failed(str(error)))
        return
    yield from on_run(state, decode, run, request)


def on_run(state: AppState, decode: Callable[..., Iterator[tuple]], run: CheckedRequest,
           request: gr.Request | None = None) -> Iterator[tuple]:
    """Run the comparison `run` asks for, yielding every output at the runner's throttled pace.
    Here, in the server's process: the model loads, then the run waits in line for the device;
    `decode` (`on_decode`, a ZeroGPU call where there is one) runs it, told of this session's
    Stop by its slot."""
    with state.stops.running(_session(request)) as stop:
        try:
            if problem := stages_problem(run.num_stages, run.workers, run.pipeline):
                raise ValueError(problem)
            if request is not None and not state.listeners.wait(_session(request)):
                # Gradio runs an event whether or not its client reads the results: one that never
                # does would hold the device for nothing, while visitors who listen wait.
                print(f"dropped a run: its client opened no event stream within {state.listeners.grace:g} s",
                      file=sys.stderr, flush=True)
                raise ValueError(f"nobody listened for this run's results within {state.listeners.grace:g} s, so "
                                 "it did not start")
            yield ordered({**view.idle(), **view.status("Starting…")})  # no numbers of an earlier run stay up
            if run.model not in state.cache:
                for doing in _loading(state.cache, run.model, stop):
                    yield ordered(view.status(doing, run, "model"))
            with state.line.place(visitor(request, state.proxy_hops), _turn(state, run)) as ticket:
                ahead = state.line.ahead(ticket)
                while ahead > 0 and not stop.is_set():
                    most = wait_text(state.line.longest_wait(ticket))
                    yield ordered(view.status(f"Waiting for the device: {ahead} run{'s' * (ahead > 1)} ahead of yours, "
                                              f"{most} at most…"))
                    ahead = state.line.ahead(ticket, wait=0.5)
                if stop.is_set():
                    yield ordered(view.stopped_before())
                    return
                with state.line.turn(ticket, stop):
                    yield from decode(stop.slot, run)
        except ValueError as error:
            yield ordered(view.failed(str(error)))


def on_decode(state: AppState, stop_slot: int, run: CheckedRequest) -> Iterator[tuple]:
    """The device's part of a Run: the comparison `run` asks for, its outputs as they come. On
    ZeroGPU this is the GPU call, in a forked child: it finds the model in its copy of the
    server's memory, its Stop by `stop_slot` (`app.server.line.StopRegistry.flag`), and chooses the
    pipeline there (`app.runner`); what it refuses reaches the page in words. A model it lacks (a
    reused ZeroGPU worker forked before the server loaded it) it loads and warms up here first,
    saying so twice a second. On ZeroGPU the run ends, with what it has, `lease.MARGIN_SECONDS`
    before the lease this call asked for runs out, and says so."""
    started = time.monotonic()
    stop = state.stops.flag(stop_slot)
    try:
        if not state.cache.ready(run.model):
            for doing in _loading(state.cache, run.model, stop, warm=True):
                yield ordered(view.status(doing, run, "model"))
            if stop.is_set():
                yield ordered(view.stopped_before())
                return
        yield from _updates(run_comparison(run, state.cache, stop=stop, time_limit=state.run_seconds,
                                           shared_limit=_turn(state, run), lease=_lease_left(state, run, started)))
    except ValueError as error:
        yield ordered(view.failed(str(error)))


def _turn(state: AppState, run: CheckedRequest) -> float:
    """`run`'s turn (`AppState.turn_seconds`) on the device its model is loaded on."""
    loaded = state.cache.find(run.model)
    return state.turn_seconds(run, loaded.model.info.device if loaded is not None else resolve_device("auto"))


def _lease_left(state: AppState, run: CheckedRequest, started: float) -> Limit | None:
    """On ZeroGPU's GPU, what is left of the lease the call that started at `started` asked for."""
    loaded = state.cache.find(run.model)
    if loaded is None or not zerogpu.leases_gpu(loaded.model.info.device):
        return None
    leased = state.gpu_lease()(0, run)
    left = leased - lease.MARGIN_SECONDS - (time.monotonic() - started)
    return Limit(left, f"its GPU lease (this Run asked ZeroGPU for {leased} s of GPU)")


def on_stop(state: AppState, request: gr.Request | None = None) -> None:
    """Stop this session's run at its next step; it then shows where it stopped."""
    state.stops.stop(_session(request))


def _updates(snapshots: Iterator[Snapshot]) -> Iterator[tuple]:
    """Outputs for each snapshot, sending only what changed: a long run re-sent in full four
    times a second (thousands of timeline bars, every column's HTML) chokes the browser. Live
    figures are redrawn at most every FIGURE_SECONDS, and whenever a method finishes."""
    sent: list = []
    drawn_at, finished = 0.0, 0
    for snap in snapshots:
        live = snap.state.rounds[0] if snap.state.rounds else {}  # round 1, the one drawn while it decodes
        done = sum(run.done for method, run in live.items() if method != PLAIN)
        figures = snap.done or snap.stopped or done != finished or time.perf_counter() - drawn_at >= FIGURE_SECONDS
        values = ordered(view.snapshot(snap, figures=figures))
        if figures:
            drawn_at, finished = time.perf_counter(), done
        # The last update goes out whole: it is what an API client receives as the result.
        changed = values if snap.done else tuple(
            gr.skip() if i < len(sent) and isinstance(v, str) and v == sent[i] else v for i, v in enumerate(values))
        sent = list(values)
        yield changed


def on_load(state: AppState, name: str) -> Iterator[tuple]:
    """Load (or find cached) model `name`; the status box shows the loading state."""
    ready = gr.update(value="Load", interactive=True)
    try:
        name = unicode_text("model", name).strip() or ppsd.DEFAULT_MODEL
    except ValueError as error:
        yield (model_status(str(error), "error"), gr.skip(), gr.skip(), gr.skip(), ready)
        return
    busy = gr.update(value="Loading…", interactive=False)
    yield (model_status(f"Loading {name}…", "busy"), gr.skip(), gr.skip(), gr.skip(), busy)
    try:
        for doing in _loading(state.cache, name):
            yield (model_status(doing, "busy"), gr.skip(), gr.skip(), gr.skip(), busy)
        loaded = state.cache.get(name)
    except ValueError as error:
        gr.Warning(str(error), title="Model not loaded")
        # which models other visitors loaded is theirs to know: say only that nothing was dropped
        yield (model_status(f"{error} · the models loaded before stay loaded", "error"),
               gr.skip(), gr.skip(), gr.skip(), ready)
        return
    info = loaded.model.info
    e_update, k_update = stage_updates(info.num_layers, 2, model=name)
    status = model_status(f"{_described(info)} (loaded in {loaded.load_seconds:.1f} s, then warmed up untimed"
                          f"{'' if state.cache.warm else ' in each GPU call'})", "ok")
    yield (status, e_update, k_update, gr.skip(), gr.skip())
    # The layer count after the sliders have their new ranges and values: its change redraws the
    # diagram with the sliders' values, which the browser would otherwise still send as the old
    # model's (E = 18 against an 8-layer model's maximum of 7, refused). The status again: the
    # API's answer is this last item.
    yield (status, gr.skip(), gr.skip(), info.num_layers, ready)


def on_page_load(state: AppState, name: str) -> tuple:
    """Fit the E/K sliders to the model in the box from its config alone (no weights)."""
    name = (name or "").strip() or ppsd.DEFAULT_MODEL
    layers = layer_count(state.cache, name)
    if layers is None:
        return gr.skip(), gr.skip(), gr.skip(), model_status("Model not loaded yet: it loads on the first Run.", "idle")
    loaded = name in state.cache
    note = "loaded" if loaded else "loads on the first Run (or press Load)"
    return (*stage_updates(layers, 2, model=name), layers,
            model_status(f"{name}: {layers} layers · {note}", "ok" if loaded else "idle"))  # which model, by name


def after_run(state: AppState, name: str, exit_layer: float, num_stages: float, exit_head: str = "") -> tuple:
    """After a run (which may have loaded the model): the status line (with the exit head that
    drafted), and the E/K ranges fitted to the model, keeping the values the user chose when they fit."""
    cache = state.cache
    try:
        name, exit_head = unicode_text("model", name).strip() or ppsd.DEFAULT_MODEL, unicode_text("exit_head", exit_head)
    except ValueError as error:  # the run said so too
        return model_status(str(error), "error"), gr.skip(), gr.skip(), gr.skip()
    if name not in cache:
        return model_status(f"{name} is not loaded", "idle"), gr.skip(), gr.skip(), gr.skip()
    loaded = cache.get(name)
    info = loaded.model.info
    e_update, k_update = stage_updates(info.num_layers, int(num_stages), int(exit_layer))
    try:
        head = f" · exit head at E = {int(exit_layer)}: {cache.exit_head(exit_head or '', loaded, int(exit_layer)).label}"
    except ValueError:  # the run already said why this head does not fit
        head = ""
    return model_status(f"{_described(info)}{head}", "ok"), e_update, k_update, info.num_layers


def _described(info: ModelInfo) -> str:
    """The loaded model in the status line's words."""
    return f"{info.name}: {info.model_type}, {info.num_layers} layers, {info.device} {info.dtype}"


def model_status(text: str, kind: str) -> str:
    return f'<div class="model-status model-{kind}">{html.escape(text)}</div>'


def on_stages(num_stages: float, layers: int, model: str = "") -> tuple:
    """K moved: E becomes the default for the new K (the shipped head's, or L/K), lowered if needed."""
    return stage_updates(layers, int(num_stages), model=(model or "").strip() or ppsd.DEFAULT_MODEL)


def on_exit(exit_layer: float, num_stages: float, layers: int) -> Any:
    """E moved: K is lowered when the layers after E cannot hold K - 1 stages."""
    return gr.update(value=fit_stages(layers, int(exit_layer), int(num_stages), moved="exit_layer")[1])
