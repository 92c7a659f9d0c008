"""The whole page in a real browser (Debian chromium through Playwright): open it, click an
example, Run, and see coloured tokens, the Plotly timeline and the speedup headline.

Then what a room needs (issue 34): a run's status, headline and streams on the first screen at
1920x1080, every text from 14 px with AA contrast (`text_walk.js`), a Present mode, the race at
its recorded pace naming every lane, cut answers marked, and a warning for K past the cores.

Uses the default model (SmolLM2-135M-Instruct) when its wheel is installed, else the tiny random
test model.
Saves a screenshot to docs/screenshot.png when PPSD_SAVE_SCREENSHOT=1, else to tmp_path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import CHROMIUM, open_page, set_slider

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")


def test_page_runs_an_example_and_shows_tokens_timeline_and_headline(page_url, tmp_path):
    from app.page_text import load_examples
    from ppsd.choice import concurrent_by_default
    from ppsd.model import resolve_device

    real = page_url[2]
    shot = ROOT / "docs" / "screenshot.png" if os.environ.get("PPSD_SAVE_SCREENSHOT") == "1" \
        else tmp_path / "screenshot.png"
    with open_page(page_url) as page:
        example = load_examples()[0]
        page.get_by_text(f"{example['category']} · {example['name']}", exact=True).first.click()
        prompt = page.locator("#prompt textarea").first
        page.wait_for_function("(el) => el.value.length > 0", arg=prompt.element_handle(), timeout=10_000)
        assert prompt.input_value() == example["prompt"]
        # Asked before the run: while one runs, stage 1's pinning narrows this process's cores.
        workers = concurrent_by_default(2, resolve_device("auto"))
        page.locator("#run").click()
        # where the visitor pressed Run, something happens at once: the run's state, in words
        # (about 0.3 s here; 1.96 s was seen on a loaded CI machine's first event: speed is not
        # asserted by a test, the wait's own limit bounds it)
        page.locator("#run-message .run-message-status").wait_for(timeout=5_000)
        # The default model's first use converts its GGUF (about 20 s) before the run; the
        # agreement note comes with the last snapshot, after every timed run.
        page.locator(".headline-agreement").wait_for(state="attached", timeout=180_000 if real else 45_000)
        headline = page.locator(".headline-main").inner_text()
        # Issue 48: a number the run's own ideal does not allow, or from a stalled round (a busy
        # machine), is held back, and the headline says why.
        clean = re.match(r"PPSD .* than (plain AR|AR on the same pipeline|AR in one process)$", headline)
        assert clean or (headline == "Not a clean result" and
                         page.locator(".headline-unclean-why").inner_text().startswith("Why: ")), headline
        # With the cores for K = 2 stages the page runs them at once, measured, and says so.
        assert page.locator("#workers input").is_checked() == workers
        clock = "measured clock" if workers else "projected clock"
        assert clock in page.locator(".headline-clock").inner_text()
        # every panel names the timed run it shows, and the headline is their median
        runs = int(page.locator("#repeats input[type=number]").first.input_value())
        assert f"median of {runs} rounds" in page.locator(".headline-clock").inner_text()
        for panel in ("#stats-ar", "#stats-ppsd", "#metrics"):
            assert "the one closest to the medians" in page.locator(f"{panel} .shown-run").inner_text()
        page.locator(".headline-more > summary").click()  # the fold: the ideal, every round, plain AR
        # one ideal: the headline's S_PPSD is the metrics table's "ideal speedup at a" for PPSD
        ideal = page.locator(".headline-ideal").inner_text().split(" = ")[1].split("×")[0]
        row = page.locator("#metrics tr", has_text="ideal speedup at a").inner_text()
        assert f"{ideal}×" in row
        for method in ("ar", "ppsd"):  # special tokens are never shown as text
            assert "<|im_end|>" not in page.locator(f"#stream-{method}").inner_text()
        coloured = page.locator("#stream-ppsd .tok-accepted, #stream-ppsd .tok-corrected")
        assert coloured.count() > 0
        assert page.locator("#stream-ar .tok-verified").count() > 0
        page.locator("#timeline .js-plotly-plot").wait_for(timeout=10_000)
        assert "stage 1" in page.locator("#timeline").inner_text()
        assert page.locator(".ppsd-legend").is_visible()
        page.locator("#step-view .step-caption").wait_for(timeout=10_000)  # the step-through is ready
        assert page.locator("#step-view .step-caption").inner_text().startswith("Slot 1 of")
        page.locator("#step-next").click()
        page.wait_for_function("() => document.querySelector('#step-view .step-caption')"
                               ".innerText.startsWith('Slot 2 of')", timeout=10_000)
        assert page.locator("#stream-ppsd .tok-rejected").first.is_hidden()  # committed text only
        page.locator("#drafts input").check()
        assert page.locator("#stream-ppsd .tok-rejected").first.is_visible()  # the drafts on request
        page.locator("#drafts input").uncheck()
        page.locator(".race-lane").first.wait_for(timeout=10_000)
        page.locator("#race .race-verdict").wait_for(timeout=60_000)  # the replay has ended: the picture
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        assert not (bad := _unreadable(page)), f"{len(bad)} unreadable texts after a run, e.g. {bad[:5]}"
        # Present: one key (P) in, one click (the Present box) out; large numbers, streams and
        # timeline, the intro folded away, one timed run next time and a short headline now
        size = lambda selector: page.evaluate(  # noqa: E731 - the rendered height of a text, zoom included
            f"() => document.querySelector('{selector}').getBoundingClientRect().height")
        tick, theory_tick = size("#timeline svg.main-svg text"), size("#theory svg.main-svg text")
        page.locator("#headline").click()  # the page has the focus, no text box
        page.keyboard.press("p")
        page.wait_for_function("() => document.body.classList.contains('present')", timeout=5_000)
        page.wait_for_function("() => document.querySelector('#repeats input[type=number]').value === '1'",
                               timeout=10_000)
        page.wait_for_timeout(500)  # the plots redraw at their new size
        font = lambda selector: float(page.evaluate(  # noqa: E731
            f"() => getComputedStyle(document.querySelector('{selector}')).fontSize")[:-2])
        assert font(".headline-main") >= 28
        assert font("#stream-ppsd .ppsd-stream") >= 22 and font("#stream-ar .ppsd-stream") >= 22
        # Issue 48: the timeline keeps its own size, so its bars are on the first screen at 1366x768
        # (tests/test_lesson_page.py); the theory's text is the one enlarged.
        assert size("#timeline svg.main-svg text") >= 0.99 * tick and size("#theory svg.main-svg text") >= 1.3 * theory_tick
        assert page.locator("#intro").is_hidden()
        page.evaluate("() => window.scrollTo(0, 0)")
        for selector in ("#headline .headline-main", "#stream-ar", "#stream-ppsd", "#present"):
            _in_view(page, selector)
        for note in page.locator(".headline-note").all():  # Present: the headline's lines alone
            assert not note.is_visible()
        assert not (bad := _unreadable(page)), f"{len(bad)} unreadable texts in Present, e.g. {bad[:5]}"
        page.locator("#present input").uncheck()
        page.wait_for_function("() => !document.body.classList.contains('present')", timeout=5_000)
        assert page.locator("#intro").is_visible() and font(".headline-main") < 40
    assert shot.stat().st_size > 10_000


def test_stop_answers_promptly_and_shows_where_it_stopped(page_url):
    import time

    with open_page(page_url) as page:
        page.locator("#prompt textarea").first.fill("Tell me a long story about a lighthouse keeper.")
        set_slider(page, "max-new-tokens", 1000)
        page.locator("#run").click()
        page.get_by_text("Running AR").first.wait_for(timeout=180_000)
        page.wait_for_timeout(1500)  # well into the run
        clicked = time.monotonic()
        page.locator("#stop").click()
        page.get_by_text("Stopped during").first.wait_for(timeout=5_000)
        answered = time.monotonic() - clicked
        # about 0.3 s on a quiet machine; 1.03 s was seen on 2 cores with a training job beside the
        # browser, server and decoder, so the bound is what a user would still call prompt
        assert answered < 2.0, f"Stop took {answered:.2f} s to show"
        page.wait_for_timeout(1500)
        status = page.locator(".headline-status").inner_text()
        assert status.startswith("Stopped during AR, after") and "Running" not in status  # and it stays
        assert page.locator("#stats-ar").inner_text().startswith("stopped at")


def test_every_slider_position_is_valid_and_errors_go_beside_run(page_url):
    import time

    with open_page(page_url) as page:
        page.wait_for_timeout(1000)  # the page-load handler fits the sliders to the model
        top_k = int(page.locator("#stages input[type=number]").first.get_attribute("max"))
        set_slider(page, "stages", top_k)  # K = L: every stage one layer, so E must fall to 1
        page.wait_for_function("() => document.querySelector('#exit-layer input[type=number]').value === '1'",
                               timeout=10_000)
        top_e = int(page.locator("#exit-layer input[type=number]").first.get_attribute("max"))
        set_slider(page, "exit-layer", top_e)  # E = L - 1: one layer left, so K falls to 2
        page.wait_for_function("() => document.querySelector('#stages input[type=number]').value === '2'",
                               timeout=10_000)
        assert page.locator(".toast-body, .toast-wrap .error").count() == 0  # no Gradio error toast
        page.locator("#model textarea, #model input").first.fill("/etc/passwd")
        page.locator("#prompt textarea").first.fill("hello")
        page.locator("#run").click()
        message = page.locator("#run-message .run-message-error")
        message.wait_for(timeout=30_000)
        assert "'/etc/passwd' is not a loadable model here" in message.inner_text()
        assert page.locator(".headline-main").count() == 0  # no numbers of an earlier run
        assert page.get_by_text("Error", exact=True).count() == 0  # no generic error badges
        page.locator("#model textarea, #model input").first.fill("no-such-org/no-such-model")  # a mistyped hub id
        clicked = time.monotonic()
        page.locator("#run").click()
        page.get_by_text("cannot reach the model hub").first.wait_for(timeout=30_000)
        assert time.monotonic() - clicked < 5  # offline (tests run so): at once, not after the hub's retries


# --------------------------------------------------------------------------- issue 34: a page for a room

VIEW_HEIGHT = 1080  # open_page's viewport: a projector's 1920x1080
WALK_TEXTS = (Path(__file__).with_name("text_walk.js")).read_text()


def _in_view(page, selector: str) -> dict:
    """The first element of `selector`, asserted on the first screen (the page never scrolled):
    its top inside the viewport with room for a line of text under it."""
    box = page.locator(selector).first.bounding_box()
    assert page.evaluate("() => window.scrollY") == 0
    assert box is not None and 0 <= box["y"] <= VIEW_HEIGHT - 40, f"{selector} at {box}"
    return box


def _unreadable(page) -> list[dict]:
    """Every visible text under 14 px or under WCAG AA contrast (4.5:1, or 3:1 for large text),
    against the background it is painted on (`text_walk.js`)."""
    texts = page.evaluate(WALK_TEXTS)
    assert len(texts) > 50  # the walk found the page
    return [t for t in texts if t["size"] < 14 or t["contrast"] < (3 if t["large"] else 4.5)]


def test_run_with_nothing_typed_shows_status_headline_and_streams_on_the_first_screen(page_url):
    with open_page(page_url) as page:
        prompt = page.locator("#prompt textarea").first
        assert prompt.input_value().strip()  # a default prompt: Run works with nothing typed
        page.locator("#run").click()
        _in_view(page, "#run-message .run-message-status")
        page.locator("#stream-ar .tok").first.wait_for(timeout=180_000)
        for selector in ("#headline .headline-status", "#stream-ar", "#stream-ppsd"):
            _in_view(page, selector)
        page.locator("#stop").click()
        page.get_by_text("Stopped").first.wait_for(timeout=10_000)
        _in_view(page, "#run-message")
        _in_view(page, "#headline .headline-status")
        prompt.fill("")
        page.locator("#run").click()
        error = page.locator("#run-message .run-message-error")
        error.wait_for(timeout=30_000)
        _in_view(page, "#run-message .run-message-error")
        # Chat is on: the words ask for a question, not for text to continue
        assert "question" in error.inner_text() and "continue" not in error.inner_text()


def test_every_text_is_at_least_14_px_with_aa_contrast(page_url):
    with open_page(page_url) as page:
        page.wait_for_timeout(1500)  # the page-load handlers fill the sliders' notes
        bad = _unreadable(page)
        assert not bad, f"{len(bad)} unreadable texts, e.g. {bad[:5]}"


def test_a_stages_count_past_the_cores_warns_before_run_and_names_the_controls(page_url):
    from ppsd.executors.host import usable_cores

    with open_page(page_url) as page:
        page.wait_for_timeout(1000)
        warning = page.locator("#stages-warning")
        assert not warning.get_by_text("Stages K").count()
        if not page.locator("#workers input").is_checked():
            page.locator("#workers input").check()
        # The worker processes need a core a stage; "auto" would run more stages than cores on threads.
        page.locator("#pipeline label").filter(has_text="worker processes").click()
        set_slider(page, "stages", usable_cores() + 1)
        warning.get_by_text("Run the K stages at once").first.wait_for(timeout=10_000)
        text = warning.inner_text()
        assert "untick" in text.lower() and f"Stages K to {usable_cores()}" in text
        page.locator("#workers input").uncheck()  # the stages in turn: nothing to warn of
        page.wait_for_function("() => !document.querySelector('#stages-warning').innerText.trim()", timeout=10_000)


def test_a_short_run_marks_cut_answers_and_races_every_lane_at_its_recorded_pace(page_url):
    import re
    import time

    with open_page(page_url) as page:
        legend = page.locator(".ppsd-legend").inner_text()
        assert "∅" in legend and "↵" in legend  # the end marker and the line break, explained
        set_slider(page, "max-new-tokens", 16)
        set_slider(page, "repeats", 1)
        page.locator("#run").click()
        page.locator(".headline-agreement").wait_for(state="attached", timeout=180_000)
        for method in ("ar", "ppsd"):
            assert "cut at 16 tokens" in page.locator(f"#stream-{method}").inner_text()
        page.locator("#race .race-lane").first.wait_for(timeout=10_000)
        started = time.monotonic()
        note = page.locator("#race .race-note").inner_text()
        assert note.startswith("Replay") and "recorded pace" in note
        verdict = page.locator("#race .race-verdict")
        verdict.wait_for(timeout=60_000)
        took = time.monotonic() - started
        names = [n.inner_text() for n in page.locator("#race .race-name").all()]
        for name in names:  # every measured lane, PPSD included, in the finish order (the projected one is no run)
            assert "(projected)" in name or name in verdict.inner_text(), (name, verdict.inner_text())
        slowest = max(float(n) / (1000 if unit == "ms" else 1)
                      for n, unit in re.findall(r"([0-9.]+) (ms|s)\b", verdict.inner_text()))
        assert took >= slowest * 0.9, f"replayed in {took:.2f} s, recorded {slowest:.2f} s: not the recorded pace"
        # the PPSD lane shows committed text only, like AR's, unless the drafts are asked for
        rejected = page.locator("#race .tok-rejected")
        assert rejected.count() > 0  # there are drafts to hide: 16 tokens of the default model see corrections
        assert all(not t.is_visible() for t in page.locator("#race .tok-rejected, #race .tok-pending").all())
        page.locator("#drafts input").check()
        assert rejected.first.is_visible()  # the drafts on request, in the race as in the streams
