"""The Gradio page: its layout (the controls and settings, then each panel of `app.panels` where
it stands) and the Run event, its handlers (`app.handlers`) bound to the server's `AppState` that
`create_demo` is given (or builds from the environment, when called: importing this reads
nothing). A panel is one module in `app.panels` and one `place` here; every panel placed is
wired the same way (`wire(made, page)`), and the run's outputs are the results panels' in
`app.view.PANELS` order.

Nothing here decodes, times or renders a result. Nothing loads a model before a user asks for
one (a Run or a Load click), so building the page is cheap and safe to import.
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import gradio as gr
from starlette.middleware import Middleware

import ppsd
from ppsd.config import DEFAULTS, MAX_DRAFT_LEN
from ppsd.choice import concurrent_by_default
from ppsd.executors.kinds import AUTO, concurrent_kinds
from ppsd.heads import default_exit_layer
from ppsd.model import resolve_device

from . import kind_words, view, zerogpu
from .components import Slider, refusing_quietly
from .handlers import (DEFAULT_LAYERS, after_run, idle_outputs, max_tokens_update, model_status, on_decode, on_exit,
                       on_load, on_page_load, on_run_form, on_stages, on_stages_warning, on_stop, ordered)
from .page_text import STAGES_LABEL, TITLE, WORKERS_LABEL, load_examples
from .panels import (QUIET, Page, Shows, columns, compile_status, exit_head, gpu_lease, headline, intro, metrics, race,
                     recording, rounds, run_message, steps, summary, theory, timeline)
from .request import DEFAULT_REPEATS, FORM, MAX_REPEATS
from .server.guard import Guard, RequestLimits
from .server.limits import DELETE_UPLOADS, MAX_UPLOAD_BYTES
from .server.sessions import sweep_sessions
from .state import AppState
from .server.visitors import distrust_forwarded_headers

ROOT = Path(__file__).resolve().parent.parent
CSS = ROOT / "assets" / "styles" / "app.css"


Made = dict[ModuleType, Any]  # each panel placed on the page -> its components (its `create()`)


def place(made: Made, panel: ModuleType, *args: Any) -> Any:
    """`panel`'s components, created here in the layout and kept in `made` for the wiring."""
    made[panel] = panel.create(*args)
    return made[panel]


def _name(panel: ModuleType) -> str:
    return panel.__name__.rpartition(".")[2]


def create_controls(made: Made) -> dict[str, Any]:
    """Prompt (a default one filled in, so Run works with nothing typed), examples, Run and Stop
    with the message box beside them, and Chat: the top of the side column, always on the first
    screen. Returns the form's controls by name (`request.FORM`'s)."""
    c: dict[str, Any] = {}
    examples = load_examples()
    c["prompt"] = gr.Textbox(label="Prompt", lines=3, value=examples[0]["prompt"], elem_id="prompt",
                             placeholder="Type a prompt, or click an example below")
    gr.Examples(examples=[[e["prompt"]] for e in examples], inputs=[c["prompt"]], cache_examples=False,
                example_labels=[f"{e['category']} · {e['name']}" for e in examples],
                label="Examples (never cached: every timing is live)", elem_id="examples")
    with gr.Row():
        c["run"] = gr.Button("▶ Run AR vs PPSD", variant="primary", elem_id="run", scale=3)
        c["stop"] = gr.Button("■ Stop", variant="stop", elem_id="stop", scale=1)
    place(made, run_message)
    place(made, compile_status)  # what compiles meanwhile
    c["chat"] = gr.Checkbox(value=True, label="Chat: ask the model (its chat template)", elem_id="chat",
                            info="Off: raw completion, the model continues the text. Models without a "
                                 "chat template always continue the text.")
    return c


def create_settings(made: Made, run_seconds: float) -> dict[str, Any]:
    """The model box and every decoding setting; `run_seconds` is how long a run may hold the
    device (said beside the timed runs). A K the cores cannot run at once is warned of here, as
    the slider moves."""
    c: dict[str, Any] = {}
    with gr.Row(equal_height=True):
        c["model"] = gr.Textbox(label="Model (the default, a local directory, a .gguf file or a hub id)",
                                value=ppsd.DEFAULT_MODEL, scale=4, elem_id="model")
        c["load"] = gr.Button("Load", scale=1, min_width=80, elem_id="load")
    c["model_status"] = gr.HTML(model_status("Model not loaded yet: it loads on the first Run.", "idle"))
    c["layers"] = gr.State(DEFAULT_LAYERS)
    e_default = default_exit_layer(ppsd.DEFAULT_MODEL, DEFAULT_LAYERS, DEFAULTS.num_stages)
    with gr.Row():
        c["num_stages"] = Slider(2, DEFAULT_LAYERS, value=DEFAULTS.num_stages, step=1, label=STAGES_LABEL,
                                 elem_id="stages")
        c["exit_layer"] = Slider(1, DEFAULT_LAYERS - 1, value=e_default, step=1, label="Exit layer E",
                                 elem_id="exit-layer")
    c["stages_warning"] = gr.HTML(run_message.render(), elem_id="stages-warning")
    place(made, exit_head)
    with gr.Row():
        c["max_new_tokens"] = Slider(1, ppsd.MAX_NEW_TOKENS_CAP, value=DEFAULTS.max_new_tokens, step=1,
                                     label="Max new tokens", elem_id="max-new-tokens")
        c["eesd"] = gr.Checkbox(value=False, label="Also run EESD (draft then verify)", elem_id="eesd")
    c["repeats"] = Slider(1, MAX_REPEATS, value=DEFAULT_REPEATS, step=1, elem_id="repeats",
                          label="Timed runs of each method",
                          info="The first is shown live; the rest run back to back, AR and PPSD "
                               "interleaved, and the headline gives the median speedup; its fold lists every "
                               "round's wall. "
                               f"A run may hold the device {run_seconds:g} s; past that it ends with "
                               "what it has.")
    place(made, rounds, DEFAULT_REPEATS)  # what the extra rounds cost, said before Run
    c["forced_acceptance"] = gr.Dropdown(
        [("off: the model's own drafts", "off"), *((f"a = {i / 10:.1f}", i / 10) for i in range(11))], value="off",
        allow_custom_value=True, label="What if the draft were right a of the time? (forced acceptance)",
        elem_id="forced-acceptance",
        info="Times the same setup with each verdict on a draft a coin of probability a, on both clocks: watch the "
             "speedup climb towards the ideal as a grows. Greedy only. The tokens are then not the model's answer.")
    c.update(_pipeline_controls())
    place(made, gpu_lease)  # ZeroGPU's lease, said before Run
    with gr.Accordion("Sampling and EESD settings", open=False):
        c.update(_sampling_controls())
    return c


def _pipeline_controls() -> dict[str, Any]:
    """Whether the K stages run at once (measured), and on what; the defaults are what can run here."""
    device, k = resolve_device("auto"), DEFAULTS.num_stages
    with gr.Row():
        return {
            "workers": gr.Checkbox(
                value=concurrent_by_default(k, device), elem_id="workers",
                label=WORKERS_LABEL,
                info="Real pipeline parallelism, every number measured. Off: one process runs the stages "
                     "in turn and the page shows their costs replayed on K workers (projected clock)."),
            "pipeline": refusing_quietly(_taking_by_name(gr.Radio(
                [(kind_words.AUTO_CHOICE, AUTO), *((kind_words.of(kind).choice, kind.name) for kind in offered())],
                value=AUTO, label="The stages at once on", elem_id="pipeline",
                info="Processes: each stage pinned to its own cores (or GPU), started once and reused. Captured "
                     "steps: each stage one step, a CUDA graph on its own stream (the default on a GPU), or compiled "
                     "on a CPU (compiled once in the background after start-up, and kept). Auto: captured steps on "
                     "a GPU; on a CPU processes where they can start (else threads in this process) until the "
                     "captured steps are compiled, then the one this machine measured fastest for PPSD."))),
        }


def offered() -> tuple:
    """The kinds the radio offers: those measured fastest somewhere (`ExecutorKind.fastest`). The
    others, threads and stacked, run when "auto" picks them or a request names them (the API)."""
    return tuple(kind for kind in concurrent_kinds() if kind.fastest)


def _taking_by_name(radio: gr.Radio) -> gr.Radio:
    """`radio`, which also takes, sent through the API, the name of a concurrent kind it does not
    offer (docs/app.md, "Kinds off the radio"); any other value it refuses as Gradio does."""
    checked, named = radio.preprocess, {kind.name for kind in concurrent_kinds()}
    radio.preprocess = lambda payload: payload if payload in named else checked(payload)
    return radio


def _sampling_controls() -> dict[str, Any]:
    """EESD's draft length, sampling and the exit head: what a first visit leaves as it is."""
    c: dict[str, Any] = {}
    with gr.Row():
        c["draft_len"] = Slider(1, MAX_DRAFT_LEN, value=DEFAULTS.draft_len, step=1, label="EESD draft length g")
        c["temperature"] = Slider(0.0, 2.0, value=DEFAULTS.temperature, step=0.05, label="Temperature (0 = greedy)")
    with gr.Row():
        c["top_p"] = Slider(0.05, 1.0, value=DEFAULTS.top_p, step=0.05, label="Top-p")
        c["seed"] = gr.Number(value=DEFAULTS.seed, step=1, label="Seed", info="a whole number, 0 to 2^63 − 1")
    c["exit_head"] = gr.Textbox(
        label="Exit head", value="", elem_id="exit-head",
        placeholder="empty: the shipped trained head for this model and E if any, else the shared head; "
                    "'shared'; or a directory written by `python -m ppsd train-head`",
        info="Made for this model and this E, or refused with the reason. Output stays the "
             "full model's either way; only the drafts (and so the speed) change.")
    return c


# Present is a class on the body (assets/styles/app.css does the rest); Plotly redraws its plots
# for their new size on a window resize.
PRESENT_JS = ("(on) => { document.body.classList.toggle('present', on); "
              "setTimeout(() => window.dispatchEvent(new Event('resize')), 100); }")
# P, outside a text box, clicks the Present box: one key in, the same key out. (Present's answers
# are whole, no inner scroll: assets/styles/app.css.)
PRESENT_KEY_JS = ("() => { document.addEventListener('keydown', (e) => { if ((e.key === 'p' || e.key === 'P') "
                  "&& !e.ctrlKey && !e.metaKey && !e.altKey && !e.target.closest('textarea, input:not([type=checkbox]), "
                  "[contenteditable]')) document.querySelector('#present input').click(); }); }")
# Each plot's text alternative is its figure's `layout.meta.alt` (written with the figure, `app.plots.describe`),
# set as the plot's accessible name whenever Plotly draws it.
PLOT_ALT_JS = ("() => { const name = () => document.querySelectorAll('.js-plotly-plot').forEach((plot) => { "
               "const alt = plot.layout && plot.layout.meta && plot.layout.meta.alt; "
               "if (alt && plot.getAttribute('aria-label') !== alt) { plot.setAttribute('role', 'figure'); "
               "plot.setAttribute('aria-label', alt); } }); "
               "new MutationObserver(name).observe(document.body, {childList: true, subtree: true}); name(); }")
SKIP_LINK = '<a class="skip-link" href="#results">Skip to the results (the settings come after them)</a>'


def _bind(handler: Callable, state: AppState, *also: Any) -> Callable:
    """`handler` with `state` (and `also`, the parameters after it) bound, shown to Gradio as the
    handler itself: its name, its docstring (an endpoint's API description), its signature less
    what is bound (Gradio finds a `gr.Request` parameter by its annotation) and a generator
    function when the handler is one (Gradio streams only those). A `functools.partial` would
    hide all four."""
    if inspect.isgeneratorfunction(handler):
        def bound(*args: Any, **kwargs: Any) -> Any:
            yield from handler(state, *also, *args, **kwargs)
    else:
        def bound(*args: Any, **kwargs: Any) -> Any:
            return handler(state, *also, *args, **kwargs)
    functools.update_wrapper(bound, handler)  # its __wrapped__ also resolves the annotations in the handler's module
    signature = inspect.signature(handler)
    names = list(signature.parameters)
    if names[0] != "state":
        raise TypeError(f"{handler.__name__} does not take the state as its first argument")
    taken = names[:1 + len(also)]
    bound.__signature__ = signature.replace(parameters=[signature.parameters[n] for n in names[len(taken):]])
    bound.__annotations__ = {k: v for k, v in handler.__annotations__.items() if k not in taken}
    return bound


def refusing_short_calls(demo: gr.Blocks) -> gr.Blocks:
    """`demo`, whose refusal of a call with too few values (`{"data": []}` over HTTP) is one line
    naming the counts: Gradio's own lists every component's repr, memory addresses included, and
    every value sent, to the caller and to the log. (Patched on the instance, as `refusing_quietly`.)"""
    check = demo.validate_inputs

    def validate_inputs(block_fn: Any, inputs: list[Any]) -> None:
        try:
            check(block_fn, inputs)
        except ValueError:
            message = f"{block_fn.api_name or block_fn.name} takes {len(block_fn.inputs)} values; {len(inputs)} were sent"
            print(f"refused a call: {message}", file=sys.stderr, flush=True)
            raise gr.Error(message, print_exception=False) from None

    demo.validate_inputs = validate_inputs
    return demo


def refusing_foreign_paths(demo: gr.Blocks) -> gr.Blocks:
    """`demo`, whose refusal of a file path that is no upload of its own (a script's call naming
    a file elsewhere on the server) is one line in the log and words to the caller, which name
    no path: Gradio's own is a 24-line traceback a script can repeat at will. (Patched on the
    instance, as `refusing_short_calls`.)"""
    from gradio.exceptions import InvalidPathError

    preprocess = demo.preprocess_data

    async def preprocess_data(block_fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await preprocess(block_fn, *args, **kwargs)
        except InvalidPathError:
            message = "that file is not an upload of this page: open a file through the page's button"
            print(f"refused a file for {block_fn.api_name or block_fn.name}: not an upload", file=sys.stderr,
                  flush=True)
            raise gr.Error(message, print_exception=False) from None

    demo.preprocess_data = preprocess_data
    return demo


def create_demo(state: AppState | None = None) -> gr.Blocks:
    """The whole page, its handlers sharing `state` (None: `AppState.from_environment()`, built
    now). Builds components and wires events; loads no model."""
    if state is None:
        state = AppState.from_environment()
    distrust_forwarded_headers()  # the device line counts visitors by address: no client names its own
    made: Made = {}
    # Uploads older than an hour are deleted (Gradio's own sweep of the files it stored).
    with gr.Blocks(title="PPSD: pipeline-parallel self-speculative decoding", delete_cache=DELETE_UPLOADS) as demo:
        gr.HTML(SKIP_LINK, elem_id="skip")  # the first Tab stop: the results before some 30 settings
        with gr.Row(equal_height=False, elem_id="title-row"):
            gr.HTML(f'<h1 class="page-title">{TITLE}</h1>')
            present = gr.Checkbox(value=False, label="Present (key P)", elem_id="present", scale=0, min_width=260,
                                  info="For a room: large type, one timed run, a short headline. P again to leave.")
        with gr.Row(equal_height=False, elem_id="first-screen"):
            with gr.Column(scale=2, min_width=420, elem_id="side"):
                c = create_controls(made)
                place(made, recording)  # Save and Open: on the first screen, under Run
                place(made, intro, DEFAULT_LAYERS)
                with gr.Column(elem_id="settings"):
                    c.update(create_settings(made, state.run_seconds))
            with gr.Column(scale=3, min_width=520, elem_id="results"):
                place(made, headline)
                gr.HTML(headline.render_glossary(), elem_id="glossary")  # where a student first meets the terms
                place(made, columns)
                # Beside the controls, right under the answers (issue 58): in Present it stands beside them.
                place(made, timeline)
                place(made, race)
        with gr.Row(equal_height=False, elem_id="analysis-row"):
            with gr.Column(scale=2, min_width=320):
                place(made, theory)
            with gr.Column(scale=3, min_width=320):
                place(made, metrics)
        place(made, steps)
        place(made, summary)
        outputs = run_outputs(made)
        run_handlers, run_event = _wire_runs(state, c, outputs)
        page = Page(demo, c, run_event, outputs, {_name(panel): components for panel, components in made.items()},
                    Shows(lambda snap: ordered(view.snapshot(snap)), idle_outputs), state.gpu_lease())
        for panel, components in made.items():
            panel.wire(components, page)
        c["stop"].click(_bind(on_stop, state), None, None, cancels=page.cancels, api_name="stop",
                        concurrency_limit=None, show_progress="hidden")
        _wire_settings(state, c)
        present.change(None, present, None, js=PRESENT_JS)
        demo.load(None, None, None, js=PRESENT_KEY_JS)
        demo.load(None, None, None, js=PLOT_ALT_JS)
        present.change(lambda on: 1 if on else DEFAULT_REPEATS, present, c["repeats"], **QUIET)
        demo.load(idle_outputs, None, outputs, **QUIET)
        demo.load(_bind(on_page_load, state), c["model"], [c["exit_layer"], c["num_stages"], c["layers"],
                                                             c["model_status"]], **QUIET)
    # Gradio's own queue is a backstop far above the device line's bound, which answers "busy" in words.
    demo.queue(max_size=4 * run_handlers)
    sweep_sessions(demo, state.session_seconds)  # an API script's sessions are never closed: forget idle ones
    Guard(state.proxy_hops, state.listeners).attach(demo)  # what `RequestLimits` holds each request to
    return refusing_foreign_paths(refusing_short_calls(demo))


def run_outputs(made: Made) -> list:
    """The run's output components in `app.view.OUTPUTS` order: each results panel's
    (`view.PANELS`), from the components made for it; a panel not placed fails here, at start-up,
    naming its module."""
    missing = [_name(panel) for panel in view.PANELS if panel not in made]
    if missing:
        raise RuntimeError(f"results panels not placed on the page: {', '.join(missing)}")
    return [made[panel].outputs()[name] for panel in view.PANELS for name in panel.OUTPUTS]


def _wire_runs(state: AppState, c: dict[str, Any], outputs: list) -> tuple[int, Any]:
    """Run, Load, and what follows a Run of the form (the sliders). Returns how many run handlers
    may run at once (every run that may wait in line and a few refused ones, below Gradio's 40
    threads) and the Run event, which the panels follow."""
    run_handlers = state.line.max_waiting + 4
    # The device's part of a run, a GPU call on ZeroGPU, leased per call from the run's request.
    # The state is bound before `spaces.GPU` wraps it: ZeroGPU pickles the call's arguments to its
    # forked process, and the state (locks, loaded models) reaches it by the fork instead.
    decode = zerogpu.gpu_call(_bind(on_decode, state), heartbeat=ordered({}),  # every output as it is
                              duration=state.gpu_lease())
    run_event = c["run"].click(
        _bind(on_run_form, state, decode), [c[name] for name in FORM], outputs, api_name="run",
        concurrency_limit=run_handlers, concurrency_id="run", show_progress="hidden", trigger_mode="once",
    )
    run_event.then(_bind(after_run, state), [c["model"], c["exit_layer"], c["num_stages"], c["exit_head"]],
                   [c["model_status"], c["exit_layer"], c["num_stages"], c["layers"]], **QUIET)
    run_event.then(_bind(max_tokens_update, state), [c["prompt"], c["model"], c["chat"], c["max_new_tokens"]],
                   c["max_new_tokens"], **QUIET)
    c["load"].click(_bind(on_load, state), c["model"],
                    [c["model_status"], c["exit_layer"], c["num_stages"], c["layers"], c["load"]],
                    api_name="load", concurrency_limit=2, concurrency_id="load", show_progress="hidden")
    return run_handlers, run_event


def _wire_settings(state: AppState, c: dict[str, Any]) -> None:
    """The settings' own rules: the max-tokens bound, slider ranges and pairs, the K warning."""
    for name in ("prompt", "chat"):
        c[name].change(_bind(max_tokens_update, state), [c["prompt"], c["model"], c["chat"], c["max_new_tokens"]],
                       c["max_new_tokens"], trigger_mode="always_last", **QUIET)
    c["num_stages"].input(on_stages, [c["num_stages"], c["layers"], c["model"]], [c["exit_layer"], c["num_stages"]], **QUIET)
    c["exit_layer"].input(on_exit, [c["exit_layer"], c["num_stages"], c["layers"]], c["num_stages"], **QUIET)
    for name in ("num_stages", "workers", "pipeline"):  # as the slider moves, before any Run
        c[name].change(on_stages_warning, [c["num_stages"], c["workers"], c["pipeline"]], c["stages_warning"], **QUIET)


def launch_kwargs() -> dict[str, Any]:
    """What Gradio 6 takes at launch rather than in Blocks: theme and CSS; `show_error`, so
    input Gradio itself refuses (a value past a slider's maximum) reaches an API client in words;
    and the limits on what a request may send (`app.server.guard`): a file's size (Gradio's own check),
    the middleware that bounds every body and upload before Gradio reads it, and no static file
    workers, which would take uploads past it."""
    return {"theme": theme(), "css_paths": [CSS], "show_error": True, "max_file_size": MAX_UPLOAD_BYTES,
            "app_kwargs": {"middleware": [Middleware(RequestLimits)]}, "num_workers": 0}


def theme() -> gr.themes.Base:
    """Soft in emerald, sized and coloured for a room: text from 14 px (its "lg" sizes), and AA
    contrast where Soft has none (emerald-500 labels, white on emerald-500 buttons and grey-400
    hints read 2.2-2.5:1 on white; the pointer left on Run after a click, emerald-600, 3.8:1)."""
    return gr.themes.Soft(primary_hue="emerald", secondary_hue="blue", text_size="lg").set(
        block_label_text_color="*primary_800", block_title_text_color="*primary_800",
        button_primary_background_fill="*primary_700", button_primary_background_fill_hover="*primary_800",
        checkbox_label_background_fill_selected="*primary_700",
        body_text_color_subdued="*neutral_600", block_info_text_color="*neutral_600")
