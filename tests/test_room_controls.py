"""Issue 58, the controls a room uses, in Debian's Chromium: Pause holds under load (a tick that
started before it moves the slot once at most, and no tick restarts the play); every symbol the page
writes on a button or a label is drawn by the fonts installed here, none as an empty box; the first
screen at 1920x1080 holds the headline and both answers; a recording is uploaded from inside Present.

One server and one browser for the module (`test_room_page.room`); no model is loaded, the shipped
recordings drive the page.
"""

from __future__ import annotations

import io
import time
import tokenize
import unicodedata
from pathlib import Path

import pytest

from app import replay
from app.panels import steps
from test_room_page import ROOT, fits_a_room, open_shipped, page_at, present, room  # noqa: F401 - the fixture

SLOT = "#step-slot input[type=number]"


def slot_of(page) -> int:
    return int(page.locator(SLOT).first.input_value())


def test_pause_holds_under_load_a_tick_in_flight_moves_the_slot_once_at_most(room):
    """Load stands in as a slow slot (1 s a tick, at a pace of 0.3 s): Pause lands while a tick is
    being computed. That tick used to turn the timer back on when it ended, and play went on."""
    page = page_at(room, 1920, 1080)
    shown = steps.step
    try:
        open_shipped(page, next(iter(replay.shipped())))
        pace = page.locator("#step-pace input[type=number]").first
        pace.fill("0.3")
        pace.press("Enter")
        page.wait_for_timeout(500)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(steps, "step", lambda race, index: time.sleep(1.0) or shown(race, index))
            page.locator("#step-play").click()
            page.wait_for_function(f"() => +document.querySelector('{SLOT}').value >= 3", timeout=30_000)
            page.wait_for_timeout(400)  # the next tick has begun, and takes its second
            held = slot_of(page)
            page.locator("#step-pause").click()
            page.wait_for_timeout(4500)  # four more slots' worth of ticks, were it playing
            after = slot_of(page)
        assert after <= held + 1, f"Pause at slot {held}, then slot {after}"
        count = int(page.locator(SLOT).first.get_attribute("max"))
        assert held + 5 < count, (held, count)  # there were slots left to move to
        page.locator("#step-next").click()  # and the step-through still answers
        page.wait_for_function(f"() => +document.querySelector('{SLOT}').value === {after + 1}", timeout=10_000)
    finally:
        page.close()


# --------------------------------------------------------------------------- glyphs


def page_symbols() -> str:
    """Every non-ASCII character other than a letter or a digit in the app's string literals and
    its style sheet: the symbols the page can put on a button, a label or a note."""
    found = set()
    for path in (ROOT / "app").rglob("*.py"):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.STRING:
                found.update(token.string)
    found.update((ROOT / "assets" / "styles" / "app.css").read_text())
    return "".join(sorted(c for c in found if ord(c) > 127 and unicodedata.category(c)[0] not in "LNZC"))


# Each character drawn on a canvas in a font of the page, its pixels against those of U+10FFFD (a
# private-use code point no font here has): the same pixels are the missing-glyph box.
TOFU_JS = """([chars, selectors]) => {
    const canvas = document.createElement('canvas');
    canvas.width = 64; canvas.height = 64;
    const ctx = canvas.getContext('2d', {willReadFrequently: true});
    const draw = (c, font) => {
        ctx.clearRect(0, 0, 64, 64); ctx.font = font; ctx.fillStyle = '#000'; ctx.textBaseline = 'middle';
        ctx.fillText(c, 8, 32);
        return ctx.getImageData(0, 0, 64, 64).data.join(',');
    };
    const out = {};
    for (const selector of selectors) {
        const s = getComputedStyle(document.querySelector(selector));
        const font = `${s.fontWeight} 40px ${s.fontFamily}`;
        const missing = draw('\\u{10FFFD}', font);
        out[selector] = {font, sane: [draw('\\u{F0000}', font) === missing, draw('A', font) !== missing],
                         tofu: [...chars].filter((c) => draw(c, font) === missing || draw(c, font) === draw(' ', font))};
    }
    return out;
}"""


def test_every_symbol_on_the_page_is_drawn_by_the_fonts_installed_here(room):
    symbols = page_symbols()
    assert {"▶", "◀", "✓", "✗", "⚠"} <= set(symbols), symbols  # the collector finds the page's symbols
    page = page_at(room, 1920, 1080)
    try:
        open_shipped(page, next(iter(replay.shipped())))
        # a button's font, the page's, and the answers' monospace (where ∅ and ↵ stand)
        got = page.evaluate(TOFU_JS, [symbols, ["#step-pause", "#headline", "#stream-ppsd .ppsd-stream"]])
    finally:
        page.close()
    for selector, found in got.items():
        assert found["sane"] == [True, True], (selector, found)  # the box is one box, and a letter is not it
        assert found["tofu"] == [], f"drawn as an empty box in {found['font']}: {found['tofu']}"


# --------------------------------------------------------------------------- Open a file, in Present


def test_a_recording_is_uploaded_from_inside_present_and_a_bad_file_is_said_there(room, tmp_path):
    names = list(replay.shipped())
    page = page_at(room, 1366, 768)
    try:
        open_shipped(page, names[0])
        present(page)
        other = replay.shipped()[names[-1]]
        button = page.locator("#open-recording")
        box = button.bounding_box()
        assert button.is_visible() and box and box["y"] >= 0 and box["y"] + box["height"] <= 768, box
        with page.expect_file_chooser() as chooser:
            button.click()
        chooser.value.set_files(str(other))
        recorded = replay.open_bytes(other.read_bytes()).recorded
        page.locator("#headline", has_text="not run now").wait_for(timeout=30_000)
        page.wait_for_function("(p) => document.querySelector('#prompt textarea').value === p",
                               arg=replay.open_bytes(other.read_bytes()).request.prompt, timeout=30_000)
        page.locator("#timeline g.trace.bars").first.wait_for(timeout=30_000)
        page.wait_for_timeout(1200)
        page.evaluate("() => window.scrollTo(0, 0)")
        assert recorded.split(";")[0] in page.locator("#headline").inner_text()
        fits_a_room(page, f"{other.name}, uploaded in Present")  # and the room's screen still holds
        bad = tmp_path / "not-a-recording.json"
        bad.write_text('{"format": "something else"}')
        with page.expect_file_chooser() as chooser:
            button.click()
        chooser.value.set_files(str(bad))
        said = page.locator("#recording-said .recording-bad")
        said.wait_for(timeout=30_000)
        assert said.is_visible() and "cannot be opened" in said.inner_text()
    finally:
        page.close()


# --------------------------------------------------------------------------- the first screen at 1920x1080

FIRST_SCREEN_JS = """() => {
    const r = (s) => document.querySelector(s).getBoundingClientRect();
    const streams = ['#stream-ar .ppsd-stream', '#stream-ppsd .ppsd-stream'].map((s) => document.querySelector(s));
    return {H: innerHeight, scrollY, headline: r('#headline').bottom,
            tops: streams.map((s) => s.getBoundingClientRect().top),
            bottoms: streams.map((s) => s.getBoundingClientRect().bottom),
            hidden: streams.map((s) => s.scrollHeight - s.clientHeight)};
}"""


def first_screen_holds_the_answers(page, what: str) -> None:
    page.evaluate("() => window.scrollTo(0, 0)")
    got = page.evaluate(FIRST_SCREEN_JS)
    assert got["scrollY"] == 0 and got["headline"] <= got["H"], (what, got)
    assert all(0 < top and bottom <= got["H"] for top, bottom in zip(got["tops"], got["bottoms"])), (what, got)
    assert all(hidden <= 1 for hidden in got["hidden"]), (what, got)  # each whole, no scroll inside its box


def test_the_first_screen_at_1920x1080_holds_the_headline_and_both_answers(room):
    from conftest import quiet
    from test_room_page import tiny_run

    page = page_at(room, 1920, 1080)
    try:
        for name in replay.shipped():
            open_shipped(page, name)
            first_screen_holds_the_answers(page, name)
        with quiet():
            tiny_run(page)
        first_screen_holds_the_answers(page, "after a Run")
    finally:
        page.close()
