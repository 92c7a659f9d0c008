"""The Gradio page: `create_*` panels and thin handlers that turn runner snapshots into the
outputs of the page through the pure functions of `app.render`.

Nothing here decodes or times: `app.runner` does. Nothing loads a model before a user asks for
one (a Run or a Load click), so building the page is cheap and safe to import.
"""

from __future__ import annotations

import html
import json
import os
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr

import ppsd
from ppsd.heads import default_exit_layer
from ppsd.model import model_config, resolve_device
from ppsd.model_source import needs_preparing

from . import render, view
from .runner import (DEFAULT_REPEATS, MAX_REPEATS, Background, DeviceLine, ModelCache, RunRequest, Snapshot,
                     run_comparison, workers_available)

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "assets" / "prompts" / "chat.json"  # held-out questions for the default (instruct) model
CSS = ROOT / "assets" / "styles" / "app.css"
DEFAULT_LAYERS = 30  # the default model's (SmolLM2-135M); replaced on page load / Load for others
REPLAY_SECONDS = 4.0  # screen time of the slowest lane in the race replay
REPLAY_FPS = 12
QUEUE_SIZE = 16  # runs that may wait for the device; one more is told the demo is busy
RUN_HANDLERS = QUEUE_SIZE + 4  # run handlers at once (waiting in line or refused): below Gradio's 40 threads
FIGURE_SECONDS = 1.0  # live redraw period of the plots (the token streams follow every snapshot)

BUILTIN_EXAMPLES = (
    {"name": "fibonacci", "category": "code", "prompt": "Write a Python function for the n-th Fibonacci number."},
    {"name": "sky", "category": "science", "prompt": "Why is the sky blue?"},
    {"name": "speed", "category": "math", "prompt": "A car drives 150 km in 2 hours. What is its average speed?"},
)

INTRO = """
# Pipeline-Parallel Self-Speculative Decoding

**The picture.** A language model writes one word-piece (a *token*) at a time, and every token
passes through all of its layers, one after another: 30 layers here. Cut those layers into
**K** groups, the *stages* in the diagram, and give each stage its own worker, like stations on
an assembly line. Plain decoding (*autoregressive*, **AR**) keeps only one station busy: the next
token cannot start before the last one has left the line.

**The trick.** The first station can *guess* the next token early: after its first **E** layers, a
small *exit head* (a layer trained to predict the final answer from halfway through) proposes a
*draft*. The guess goes down the line at once, while the last station *verifies* the token before it.
If the full model agrees, the guess is **accepted** and a token came out after one station's time
instead of K. If not, the full model's own token is kept (**corrected**) and the guesses queued
behind the wrong one are thrown away (**flushed**).

**Why it is safe.** Every token that is kept is the full model's own choice, so the text is
*identical* to plain decoding; only the speed changes. The **acceptance rate** (the share of
guesses that were right) decides how much faster it is.

Press **Run**: the page decodes the same prompt with AR, then with PPSD (and, if ticked, with
**EESD**, which drafts several tokens and then verifies them in one go), and shows where each stage
works, waits and wastes. The default model is **SmolLM2-135M-Instruct** (30 layers), asked through
its chat template; its drafts come from an exit head trained for this demo on the model's own
answers (K = 2, E = 18). Method: Li et al., [arXiv 2509.19368](https://arxiv.org/abs/2509.19368).
"""

TIMELINE_CAPTION = """
Each bar is one stage working on one token (hover for position, token, slot and decision); gaps are
idle stage time, the pipeline's bubbles. In PPSD, stage 1 keeps drafting while the later stages
verify; a red × is a correction: the final stage rejected a draft and the work in flight behind it
turns orange (flushed). AR on the same pipeline keeps only one stage busy at a time. With **K worker
processes** the times are measured: each stage ran in its own process, at the same time as the others,
and stamped its own work on one clock. In **one process** the stages ran in turn, and the times are
their measured costs replayed as if each stage had its own worker (projected clock).
"""



def allowed_models() -> tuple[str, ...] | None:
    """Which model names the page may load: PPSD_MODELS, comma-separated, or "*" for any name a
    visitor types. Unset: any, except on a Hugging Face Space (SPACE_ID is set), where only the
    default model loads unless the owner sets PPSD_MODELS."""
    setting = os.environ.get("PPSD_MODELS", "").strip()
    if setting == "*" or (not setting and not os.environ.get("SPACE_ID")):
        return None
    names = tuple(n.strip() for n in setting.split(",") if n.strip())
    return names or (ppsd.DEFAULT_MODEL,)


CACHE = ModelCache(allowed=allowed_models())  # process-wide: every visitor shares the loaded models
LINE = DeviceLine(QUEUE_SIZE)  # one decode at a time on the device, in arrival order
_STOPS: dict[str, threading.Event] = {}  # session -> its running comparison's Stop


def _gpu(fn: Callable) -> Callable:
    """`spaces.GPU` on Hugging Face ZeroGPU (only when the package is importable), else as is."""
    try:
        import spaces  # noqa: PLC0415 - optional, present only on Spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=120)(fn)


def load_examples(path: Path = PROMPTS) -> list[dict]:
    """Held-out prompts from assets/prompts/prompts.json if present and well formed, else a few
    built-in ones (code, prose, math)."""
    try:
        items = json.loads(path.read_text())
        examples = [dict(name=str(i["name"]), category=str(i["category"]), prompt=str(i["prompt"]))
                    for i in items if str(i.get("prompt", "")).strip()]
    except (OSError, ValueError, KeyError, TypeError):
        return list(BUILTIN_EXAMPLES)
    if not examples:
        return list(BUILTIN_EXAMPLES)
    # A few per category keeps the list short enough to present.
    chosen, per_category = [], {}
    for item in examples:
        if per_category.get(item["category"], 0) < 3:
            per_category[item["category"]] = per_category.get(item["category"], 0) + 1
            chosen.append(item)
    return chosen


def _tell(tell: Callable[[str], None]) -> Callable[[str], None]:
    """`tell`, echoed to the server's terminal (a first-use conversion is worth seeing there)."""
    def both(message: str) -> None:
        tell(message)
        print(message, file=sys.stderr, flush=True)
    return both


def _loading(name: str, stop: threading.Event | None = None) -> Iterator[str]:
    """Load `name` into CACHE on a thread, yielding what it is doing (first use: download,
    conversion, weights, warm-up) twice a second; re-raises the loader's ValueError. Stop ends
    the wait, not the load: the model is there for the next run."""
    stop = stop or threading.Event()
    loading = Background(lambda tell: CACHE.get(name, progress=_tell(tell)), "model-load")
    for doing in loading.progress(stop, f"Loading {name}"):
        yield f"{doing} (first use only)"
    if not stop.is_set():
        loading.value()


def layer_count(name: str, cache: ModelCache = CACHE) -> int | None:
    """Decoder layers of model `name` from its config alone (no weights), None if unreadable."""
    name = name.strip()
    if name in cache:
        return cache.get(name).model.num_layers
    if needs_preparing(name):  # a first download or conversion waits for Run or Load
        return None
    try:
        return int(model_config(name).num_hidden_layers)
    except ValueError:  # a model not described yet just keeps the default ranges
        return None


# --------------------------------------------------------------------------- slider rules


def stage_updates(num_layers: int, stages: int, exit_layer: int | None = None, model: str = "") -> tuple[Any, Any]:
    """E and K sliders for a model of `num_layers`: E in [1, L - 1], K in [2, L], and the pair
    kept valid (K - 1 <= L - E: stages 2..K hold a layer each) by lowering the value that did not
    move; E defaults to the shipped head's for `model` and K, else the balanced L/K. The ranges
    never shrink to one value, which a Gradio slider refuses."""
    stages = max(2, min(int(stages), num_layers))
    default = default_exit_layer(model, num_layers, stages)
    exit_layer = max(1, min(int(default if exit_layer is None else exit_layer), num_layers - stages + 1))
    balanced = ppsd.balanced_exit_layer(num_layers, stages)
    why = f"balanced E = L/K = {balanced}" if default == balanced else \
        f"default E = {default}: the shipped head's (chosen by measured speed); balanced L/K = {balanced}"
    return (gr.update(minimum=1, maximum=max(num_layers - 1, 2), value=exit_layer,
                      info=f"drafts use layers 0…E−1; {why}"),
            gr.update(minimum=2, maximum=max(num_layers, 3), value=stages, info=_stages_info(num_layers)))


def _stages_info(num_layers: int) -> str:
    return f"K − 1 ≤ L − E: each later stage holds a layer; L = {num_layers}"


def max_tokens_update(prompt: str, model: str, chat: bool, value: float) -> Any:
    """The max-tokens slider bound by the context left after the prompt, once the model is
    loaded (before that, by the cap alone; Run checks the rest)."""
    loaded = CACHE.find((model or "").strip() or ppsd.DEFAULT_MODEL)
    if loaded is None or not (prompt or "").strip():
        return gr.skip()
    room = loaded.model.info.max_context - len(loaded.encode(prompt, chat=bool(chat) and loaded.chat))
    top = max(2, min(ppsd.MAX_NEW_TOKENS_CAP, room))
    why = "the demo's cap" if top == ppsd.MAX_NEW_TOKENS_CAP else \
        f"the context of {loaded.model.info.max_context} minus the prompt"
    return gr.update(maximum=top, value=min(int(value), top), info=f"at most {top}: {why}")


# --------------------------------------------------------------------------- handlers


def ordered(values: dict[str, Any]) -> tuple:
    """A view's values in the order of `view.OUTPUTS`; what it does not name stays as it is."""
    return tuple(values.get(name, gr.skip()) for name in view.OUTPUTS)


def idle_outputs() -> tuple:
    return ordered(view.idle())


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "no-session"


@_gpu
def on_run(prompt: str, model: str, exit_layer: float, stages: float, eesd: bool, draft_len: float,
           max_new_tokens: float, temperature: float, top_p: float, seed: float,
           exit_head: str = "", workers: bool = False, chat: bool = True, repeats: float = DEFAULT_REPEATS,
           request: gr.Request | None = None) -> Iterator[tuple]:
    """Run the comparison, yielding every output at the runner's throttled pace. The model loads
    before the run joins the line for the device; Stop (this session's) is heard at every step."""
    stop = _STOPS[_session(request)] = threading.Event()
    run = RunRequest(prompt=prompt or "", model=(model or "").strip() or ppsd.DEFAULT_MODEL,
                     exit_layer=exit_layer, stages=stages, eesd=bool(eesd), draft_len=draft_len,
                     max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                     exit_head=exit_head or "", workers=bool(workers), chat=bool(chat), repeats=repeats)
    try:
        if not run.prompt.strip():
            raise ValueError("The prompt is empty: type some text for the model to continue, or click an example.")
        yield ordered({**view.idle(), **view.status("Starting…")})  # no numbers of an earlier run stay up
        if run.model not in CACHE:
            for doing in _loading(run.model, stop):
                yield ordered(view.status(doing, run, "model"))
        with LINE.place() as ticket:
            ahead = LINE.ahead(ticket)
            while ahead > 0 and not stop.is_set():
                yield ordered(view.status(f"Waiting for the device: {ahead} run{'s' * (ahead > 1)} ahead of yours…"))
                ahead = LINE.ahead(ticket, wait=0.5)
            if stop.is_set():
                yield ordered(view.status("Stopped before decoding began. Press Run to start again."))
                return
            yield from _updates(run_comparison(run, CACHE, stop=stop))
    except ValueError as error:
        yield ordered(view.failed(str(error)))
    finally:
        if _STOPS.get(_session(request)) is stop:
            del _STOPS[_session(request)]


def on_stop(request: gr.Request | None = None) -> None:
    """Stop this session's run at its next step; it then shows where it stopped."""
    stop = _STOPS.get(_session(request))
    if stop is not None:
        stop.set()


def _updates(snapshots: Iterator[Snapshot]) -> Iterator[tuple]:
    """Outputs for each snapshot, sending only what changed: a long run re-sent in full four
    times a second (thousands of timeline bars, every column's HTML) chokes the browser. Live
    figures are redrawn at most every FIGURE_SECONDS, and whenever a method finishes."""
    sent: list = []
    drawn_at, finished = 0.0, 0
    for snap in snapshots:
        done = sum(run.done for run in snap.runs.values())
        figures = snap.done or snap.stopped or done != finished or time.perf_counter() - drawn_at >= FIGURE_SECONDS
        values = ordered(view.snapshot(snap, figures=figures))
        if figures:
            drawn_at, finished = time.perf_counter(), done
        # The last update goes out whole: it is what an API client receives as the result.
        changed = values if snap.done else tuple(
            gr.skip() if i < len(sent) and isinstance(v, str) and v == sent[i] else v for i, v in enumerate(values))
        sent = list(values)
        yield changed


def on_replay(race: dict | None) -> Iterator[str]:
    """Animate the finished run: every lane commits its tokens at its recorded (projected) times."""
    if not race:
        yield '<div class="race-note">Run a comparison first; its race replays here.</div>'
        return
    lanes, pieces = race["lanes"], race["pieces"]
    piece = lambda token_id: pieces.get(token_id, "?")  # noqa: E731
    longest = max(lane.total for lane in lanes) or 1e-3
    stretch = REPLAY_SECONDS / longest
    started = time.perf_counter()
    while True:
        at = (time.perf_counter() - started) / stretch
        yield render.render_race(lanes, piece, at=min(at, longest), clock=race["clock"], stretch=stretch)
        if at >= longest:
            return
        time.sleep(1 / REPLAY_FPS)


def on_load(name: str) -> Iterator[tuple]:
    """Load (or find cached) model `name`; the status box shows the loading state."""
    name = (name or "").strip() or ppsd.DEFAULT_MODEL
    busy = gr.update(value="Loading…", interactive=False)
    yield (_status(f"Loading {name}…", "busy"), gr.skip(), gr.skip(), gr.skip(), busy)
    ready = gr.update(value="Load", interactive=True)
    try:
        for doing in _loading(name):
            yield (_status(doing, "busy"), gr.skip(), gr.skip(), gr.skip(), busy)
        loaded = CACHE.get(name)
    except ValueError as error:
        gr.Warning(str(error), title="Model not loaded")
        kept = ", ".join(CACHE.names()) or "none"
        yield (_status(f"{error} · still loaded: {kept}", "error"), gr.skip(), gr.skip(), gr.skip(), ready)
        return
    info = loaded.model.info
    e_update, k_update = stage_updates(info.num_layers, 2, model=name)
    yield (_status(f"{info.name}: {info.model_type}, {info.num_layers} layers, {info.device} {info.dtype} "
                   f"(loaded in {loaded.load_seconds:.1f} s, then warmed up untimed)", "ok"),
           e_update, k_update, info.num_layers, ready)


def on_page_load(name: str) -> tuple:
    """Fit the E/K sliders to the model in the box from its config alone (no weights)."""
    layers = layer_count(name or ppsd.DEFAULT_MODEL)
    if layers is None:
        return gr.skip(), gr.skip(), gr.skip(), _status("Model not loaded yet: it loads on the first Run.", "idle")
    e_update, k_update = stage_updates(layers, 2, model=name or ppsd.DEFAULT_MODEL)
    loaded = (name or "").strip() in CACHE
    note = "loaded" if loaded else "loads on the first Run (or press Load)"
    return e_update, k_update, layers, _status(f"{layers} layers · {note}", "ok" if loaded else "idle")


def after_run(name: str, exit_layer: float, stages: float, exit_head: str = "") -> tuple:
    """After a run (which may have loaded the model): the status line (with the exit head that
    drafted), and the E/K ranges fitted to the model, keeping the values the user chose when they fit."""
    name = (name or "").strip() or ppsd.DEFAULT_MODEL
    if name not in CACHE:
        kept = ", ".join(CACHE.names()) or "none"
        return _status(f"{name} is not loaded (loaded: {kept})", "idle"), gr.skip(), gr.skip(), gr.skip()
    loaded = CACHE.get(name)
    info = loaded.model.info
    e_update, k_update = stage_updates(info.num_layers, int(stages), int(exit_layer))
    try:
        head = f" · exit head at E = {int(exit_layer)}: {CACHE.exit_head(exit_head or '', loaded, int(exit_layer)).label}"
    except ValueError:  # the run already said why this head does not fit
        head = ""
    status = _status(f"{info.name}: {info.model_type}, {info.num_layers} layers, {info.device} {info.dtype}{head}", "ok")
    return status, e_update, k_update, info.num_layers


def _status(text: str, kind: str) -> str:
    return f'<div class="model-status model-{kind}">{html.escape(text)}</div>'


def on_stages(stages: float, layers: int, model: str = "") -> tuple:
    """K moved: E becomes the default for the new K (the shipped head's, or L/K), lowered if needed."""
    return stage_updates(layers, int(stages), model=(model or "").strip() or ppsd.DEFAULT_MODEL)


def on_exit(exit_layer: float, stages: float, layers: int) -> Any:
    """E moved: K is lowered when the layers after E cannot hold K - 1 stages."""
    return gr.update(value=max(2, min(int(stages), layers - int(exit_layer) + 1)))


def on_settings(exit_layer: float, stages: float, draft_len: float, layers: int, eesd: bool = False):
    """Redraw the theory curves when E, K, g or the EESD choice change (no run needed: it is a
    formula); EESD's curve only when EESD will run."""
    return render.render_theory(stages=int(stages), draft_len=int(draft_len), exit_fraction=int(exit_layer) / layers,
                                eesd=bool(eesd))


# --------------------------------------------------------------------------- panels


def create_controls() -> dict[str, Any]:
    """Prompt, examples, model box and every decoding setting, with Run and Stop."""
    c: dict[str, Any] = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=320):
            c["prompt"] = gr.Textbox(label="Prompt", lines=4, placeholder="Type a prompt, or click an example below",
                                     elem_id="prompt")
            c["chat"] = gr.Checkbox(value=True, label="Chat: ask the model (its chat template)", elem_id="chat",
                                    info="Off: raw completion, the model continues the text. Models without a "
                                         "chat template always continue the text.")
            examples = load_examples()
            gr.Examples(examples=[[e["prompt"]] for e in examples], inputs=[c["prompt"]], cache_examples=False,
                        example_labels=[f"{e['category']} · {e['name']}" for e in examples],
                        label="Examples (never cached: every timing is live)", elem_id="examples")
            with gr.Row():
                c["run"] = gr.Button("▶ Run AR vs PPSD", variant="primary", elem_id="run", scale=3)
                c["stop"] = gr.Button("■ Stop", variant="stop", elem_id="stop", scale=1)
            c["message"] = gr.HTML(view.message(), elem_id="run-message")
        with gr.Column(scale=2, min_width=300):
            with gr.Row(equal_height=True):
                c["model"] = gr.Textbox(label="Model (the default, a local directory, a .gguf file or a hub id)",
                                        value=ppsd.DEFAULT_MODEL,
                                        scale=4, elem_id="model")
                c["load"] = gr.Button("Load", scale=1, min_width=80, elem_id="load")
            c["model_status"] = gr.HTML(_status("Model not loaded yet: it loads on the first Run.", "idle"))
            c["layers"] = gr.State(DEFAULT_LAYERS)
            e_default = default_exit_layer(ppsd.DEFAULT_MODEL, DEFAULT_LAYERS, 2)
            with gr.Row():
                c["stages"] = gr.Slider(2, DEFAULT_LAYERS, value=2, step=1, label="Stages K", elem_id="stages")
                c["exit_layer"] = gr.Slider(1, DEFAULT_LAYERS - 1, value=e_default, step=1, label="Exit layer E",
                                            elem_id="exit-layer")
            with gr.Row():
                c["max_new_tokens"] = gr.Slider(1, ppsd.MAX_NEW_TOKENS_CAP, value=64, step=1,
                                                label="Max new tokens", elem_id="max-new-tokens")
                c["eesd"] = gr.Checkbox(value=False, label="Also run EESD (draft then verify)", elem_id="eesd")
            c["repeats"] = gr.Slider(1, MAX_REPEATS, value=DEFAULT_REPEATS, step=1, elem_id="repeats",
                                     label="Timed runs of each method",
                                     info="The first is shown live; the rest run back to back, AR and PPSD "
                                          "interleaved, and the headline gives the median speedup and its range.")
            c["workers"] = gr.Checkbox(
                value=workers_available(2, resolve_device("auto")) is None, elem_id="workers",
                label="Run on K worker processes, one per stage (measured clock)",
                info="Real pipeline parallelism: each stage in its own process on its own cores (or GPU), "
                     "started once and reused. Off: one process runs the stages in turn and the page "
                     "shows their costs replayed on K workers (projected clock).")
            with gr.Accordion("Sampling and EESD settings", open=False):
                with gr.Row():
                    c["draft_len"] = gr.Slider(1, 16, value=4, step=1, label="EESD draft length g")
                    c["temperature"] = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                with gr.Row():
                    c["top_p"] = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                    c["seed"] = gr.Number(value=0, step=1, label="Seed", info="a whole number, 0 to 2^63 − 1")
                c["exit_head"] = gr.Textbox(
                    label="Exit head", value="", elem_id="exit-head",
                    placeholder="empty: the shipped trained head for this model and E if any, else the shared head; "
                                "'shared'; or a directory written by `python -m ppsd train-head`",
                    info="Made for this model and this E, or refused with the reason. Output stays the "
                         "full model's either way; only the drafts (and so the speed) change.")
    return c


def create_results() -> tuple[dict[str, Any], gr.Column]:
    """Headline, the method columns with their token streams, timeline, theory and numbers.
    Returns the components by name and the EESD column (shown when EESD is enabled)."""
    r: dict[str, Any] = {"headline": gr.HTML(elem_id="headline")}
    gr.HTML(render.render_legend())
    titles = {"ar": ("AR", "autoregressive, the reference"),
              "ppsd": ("PPSD", "verify while drafting, K stages"),
              "eesd": ("EESD", "draft g tokens, then verify")}
    columns = {}
    r["drafts"] = gr.Checkbox(value=False, label="Show the drafts inline (rejected ones struck through, in-flight ones dashed)", elem_id="drafts",
                              info="Off: each stream shows only its committed text, so AR's and PPSD's can be compared "
                                   "word for word. Hover a token for its draft either way.")
    with gr.Row(equal_height=False, elem_id="columns"):
        for method, (name, sub) in titles.items():
            with gr.Column(min_width=260, visible=method != "eesd", elem_id=f"col-{method}") as columns[method]:
                gr.HTML(f'<div class="col-title">{name} <span>{sub}</span></div>')
                r[method] = (gr.HTML(elem_id=f"stats-{method}"), gr.HTML(elem_id=f"stream-{method}"))
    r["timeline"] = gr.Plot(label="Pipeline timeline", elem_id="timeline", show_label=False)
    gr.Markdown(TIMELINE_CAPTION, elem_classes=["caption"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            r["theory"] = gr.Plot(label="Theory", elem_id="theory", show_label=False)
        with gr.Column(scale=3, min_width=320):
            r["metrics"] = gr.HTML(elem_id="metrics")
    return r, columns["eesd"]


def create_race() -> tuple[gr.HTML, gr.Button]:
    """The race replay: lanes that commit tokens at their recorded pace."""
    with gr.Accordion("Race replay: the streams side by side at their recorded pace", open=True):
        race = gr.HTML('<div class="race-note">Run a comparison; its race replays here.</div>', elem_id="race")
        replay = gr.Button("↻ Replay the race", size="sm")
    return race, replay


def create_steps() -> dict[str, Any]:
    """The step-through: the finished PPSD run, one pipeline slot at a time."""
    s: dict[str, Any] = {}
    with gr.Accordion("Step through PPSD, slot by slot", open=True, elem_id="steps"):
        with gr.Row():
            s["previous"] = gr.Button("◀ Previous", size="sm", scale=1, elem_id="step-previous")
            s["slot"] = gr.Slider(1, 2, value=1, step=1, label="Slot", scale=6, elem_id="step-slot")
            s["next"] = gr.Button("Next ▶", size="sm", scale=1, elem_id="step-next")
        s["view"] = gr.HTML(view.step(None, 0), elem_id="step-view")
    return s


def on_step(race: dict | None, slot: float, move: int = 0) -> tuple:
    """Show slot `slot` + `move` (1-based on the slider), kept inside the run's slots."""
    count = len(race["steps"]) if race and race.get("steps") else 1
    slot = max(1, min(int(slot) + move, count))
    return gr.update(value=slot), view.step(race, slot - 1)


def on_steps_ready(race: dict | None) -> tuple:
    """After a run: the slider spans its slots, and shows the first."""
    count = len(race["steps"]) if race and race.get("steps") else 1
    return gr.update(maximum=max(count, 2), value=1), view.step(race, 0)


def on_diagram(exit_layer: float, stages: float, layers: int) -> str:
    return view.diagram(layers, exit_layer, stages)


SHOW_DRAFTS_JS = "(on) => { document.querySelector('#columns').classList.toggle('show-drafts', on); }"
RUN_INPUTS = ("prompt", "model", "exit_layer", "stages", "eesd", "draft_len", "max_new_tokens", "temperature",
              "top_p", "seed", "exit_head", "workers", "chat", "repeats")  # on_run's parameters, in order


def create_demo() -> gr.Blocks:
    """The whole page. Builds components and wires events; loads no model."""
    with gr.Blocks(title="PPSD: pipeline-parallel self-speculative decoding") as demo:
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                gr.Markdown(INTRO, elem_id="intro")
            with gr.Column(scale=2, min_width=300):
                diagram = gr.HTML(view.diagram(DEFAULT_LAYERS, default_exit_layer(ppsd.DEFAULT_MODEL, DEFAULT_LAYERS, 2),
                                               2), elem_id="diagram")
        c = create_controls()
        c["diagram"] = diagram
        r, eesd_column = create_results()
        race, replay = create_race()
        steps = create_steps()
        with gr.Accordion("Raw numbers (JSON; also the last output of the `run` API)", open=False):
            r["summary"] = gr.JSON(show_label=False, elem_id="summary")
        r["message"], r["race"] = c["message"], gr.State(None)
        for method in ("ar", "ppsd", "eesd"):
            r[f"stats_{method}"], r[f"stream_{method}"] = r.pop(method)
        outputs = [r[name] for name in view.OUTPUTS]
        quiet = dict(api_visibility="private", show_progress="hidden")
        run_event = c["run"].click(
            on_run, [c[name] for name in RUN_INPUTS], outputs, api_name="run", concurrency_limit=RUN_HANDLERS,
            concurrency_id="run", show_progress="hidden", trigger_mode="once",
        )
        run_event.then(after_run, [c["model"], c["exit_layer"], c["stages"], c["exit_head"]],
                       [c["model_status"], c["exit_layer"], c["stages"], c["layers"]], **quiet)
        run_event.then(max_tokens_update, [c["prompt"], c["model"], c["chat"], c["max_new_tokens"]],
                       c["max_new_tokens"], **quiet)
        replay_after = run_event.success(on_replay, r["race"], race, **quiet)
        run_event.success(on_steps_ready, r["race"], [steps["slot"], steps["view"]], **quiet)
        for name, move in (("previous", -1), ("next", +1)):
            steps[name].click(partial(on_step, move=move), [r["race"], steps["slot"]], [steps["slot"], steps["view"]],
                              **quiet)
        steps["slot"].input(on_step, [r["race"], steps["slot"]], [steps["slot"], steps["view"]], **quiet)
        replay_event = replay.click(on_replay, r["race"], race, api_name="replay", show_progress="hidden")
        c["stop"].click(on_stop, None, None, cancels=[replay_after, replay_event], api_name="stop",
                        concurrency_limit=None, show_progress="hidden")
        c["load"].click(on_load, c["model"], [c["model_status"], c["exit_layer"], c["stages"], c["layers"],
                                                c["load"]],
                        api_name="load", concurrency_limit=2, concurrency_id="load", show_progress="hidden")
        for name in ("prompt", "chat"):
            c[name].change(max_tokens_update, [c["prompt"], c["model"], c["chat"], c["max_new_tokens"]],
                           c["max_new_tokens"], trigger_mode="always_last", **quiet)
        c["stages"].input(on_stages, [c["stages"], c["layers"], c["model"]], [c["exit_layer"], c["stages"]], **quiet)
        c["exit_layer"].input(on_exit, [c["exit_layer"], c["stages"], c["layers"]], c["stages"], **quiet)
        settings = [c["exit_layer"], c["stages"], c["draft_len"], c["layers"], c["eesd"]]
        for name in ("exit_layer", "stages", "draft_len"):
            c[name].release(on_settings, settings, r["theory"], **quiet)
        c["eesd"].change(on_settings, settings, r["theory"], **quiet)
        for name in ("exit_layer", "stages", "layers"):
            c[name].change(on_diagram, [c["exit_layer"], c["stages"], c["layers"]], c["diagram"], **quiet)
        c["eesd"].change(_toggle_eesd, c["eesd"], [eesd_column, c["run"]], **quiet)
        r["drafts"].change(None, r["drafts"], None, js=SHOW_DRAFTS_JS)  # in the browser: no server call
        demo.load(idle_outputs, None, outputs, **quiet)
        demo.load(on_page_load, c["model"], [c["exit_layer"], c["stages"], c["layers"], c["model_status"]], **quiet)
    # Gradio's own queue is a backstop far above LINE's bound, which answers "busy" in words.
    demo.queue(max_size=4 * RUN_HANDLERS)
    return demo


def _toggle_eesd(on: bool) -> tuple:
    return gr.update(visible=on), gr.update(value="▶ Run AR vs PPSD vs EESD" if on else "▶ Run AR vs PPSD")


def launch_kwargs() -> dict[str, Any]:
    """What Gradio 6 takes at launch rather than in Blocks: theme and CSS, and `show_error`, so
    input Gradio itself refuses (a value past a slider's maximum) reaches an API client in words."""
    return {"theme": gr.themes.Soft(primary_hue="emerald", secondary_hue="blue"), "css_paths": [CSS],
            "show_error": True}
