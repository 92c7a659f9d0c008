"""Issue 48, item 1, "Recorded runs": a finished run saved as one file (`ppsd.recording`), opened
again with no model loaded (`app.replay`), and shown by the same panels as the live run; every
kind of bad recording refused in one sentence (`BadRecording`), and the page's Open answering
with that one message.

A tiny-model comparison (assets/models/ppsd-tiny, stages in turn) is recorded once per module;
the bad recordings are that file, tampered with.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import tomllib
from pathlib import Path

import pytest

import ppsd
from app import replay, view
from app.handlers import ordered
from app.models import ModelCache
from app.panels import race, recording as panel, timeline
from app.request import FORM, RunRequest
from app.reading import RunView
from app.runner import run_comparison
from ppsd import recording
from ppsd.recording import MAX_BYTES, MAX_DEPTH, BadRecording

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "assets" / "models" / "ppsd-tiny"
pytestmark = pytest.mark.skipif(not (TINY / "model.safetensors").exists(), reason="assets/models/ppsd-tiny is absent")


def said(out: tuple) -> str:
    """The panel's message among an open's outputs: the form's values come after it (issue 58)."""
    return out[-1 - len(FORM)]


@pytest.fixture(scope="module")
def live():
    """A finished live comparison of two rounds on the tiny model: its last snapshot."""
    request = RunRequest(prompt="The sea is", model=str(TINY), max_new_tokens=12, repeats=2, workers=False,
                         chat=False)
    cache = ModelCache()
    last = None
    for snap in run_comparison(request, cache, throttle=0.0):
        last = snap
    assert last is not None and last.done
    yield last
    cache.clear()


@pytest.fixture(scope="module")
def saved(live) -> bytes:
    return recording.dumps(replay.record(live))


def tampered(saved: bytes, change) -> bytes:
    raw = json.loads(saved)
    change(raw)
    return json.dumps(raw).encode()


# --------------------------------------------------------------------------- save, then open


def unlabelled(value, label: str):
    """A rendered value with the replay's label taken out (it leads `shown` and the status)."""
    if not isinstance(value, str):
        return value
    for text in (f"{label} · ", label):
        value = value.replace(html.escape(text), "").replace(text, "")
    return value.replace('<div class="headline-status"></div>', "")  # the status a finished live run leaves empty


def test_save_then_open_shows_the_same_headline_cards_race_order_and_timeline(live, saved):
    replayed = replay.open_bytes(saved)
    assert replayed.state.stats() == live.state.stats()  # the one statistic, every round's walls on both clocks
    assert replayed.state.shown_index() == live.state.shown_index()
    before, after = view.snapshot(live), view.snapshot(replayed)
    label = replayed.recorded
    for key in ("headline", "stats_ar", "stream_ar", "stats_ppsd", "stream_ppsd", "stats_eesd", "stream_eesd",
                "metrics"):
        assert unlabelled(after[key], label) == before[key], key
    assert label in after["headline"] and label not in before["headline"]
    lanes = lambda values: [(lane.method, lane.tokens, lane.times, lane.total) for lane in values["race"]["lanes"]]  # noqa: E731
    assert lanes(after) == lanes(before)
    assert race.race_verdict(after["race"]["lanes"]) == race.race_verdict(before["race"]["lanes"])
    assert after["race"]["pieces"] == before["race"]["pieces"]
    assert after["timeline"].to_plotly_json()["data"] == before["timeline"].to_plotly_json()["data"]
    summary_before, summary_after = before["summary"], after["summary"]
    assert {k: v for k, v in summary_after.items() if k != "note"} == {k: v for k, v in summary_before.items()
                                                                        if k != "note"}


def test_every_panel_of_a_replay_says_where_and_when_it_was_recorded(live, saved):
    replayed = replay.open_bytes(saved)
    label = replayed.recorded
    assert re.fullmatch(r"Recorded on CPU .+, \d{4}-\d\d-\d\d \d\d:\d\d UTC; not run now", label), label
    run_view = RunView.of(replayed)
    assert run_view.recorded == label and run_view.round_label.startswith(label) and run_view.status.startswith(label)
    values = view.snapshot(replayed)
    for name in ("headline", "stats_ppsd", "stats_ar", "metrics", "message"):
        assert html.escape(label) in values[name], name
    assert label in timeline.unwrapped(values["timeline"].layout.title.text)
    assert values["race"]["round_label"].startswith(label)  # the race's note and the step-through read it
    assert label in values["summary"]["note"]
    assert values["recording"] is None  # a replay is not offered for saving again
    assert RunView.of(live).recorded == "" and label not in view.snapshot(live)["headline"]


LINK = '<a href="https://example.invalid/">x</a>'  # a recorded device string that is markup


def _every(raw, key: str, value) -> None:
    """Set `key` to `value` wherever it is in the JSON `raw`."""
    if isinstance(raw, dict):
        for name in raw:
            if name == key:
                raw[name] = value
            else:
                _every(raw[name], key, value)
    elif isinstance(raw, list):
        for item in raw:
            _every(item, key, value)


def test_a_recorded_device_that_is_markup_is_drawn_as_text_in_every_panel_and_plot(saved):
    """Issue 57: the timeline's title (Plotly draws a subset of HTML: links, styles) put a
    recording's device string in raw, so a file could show a live link there."""
    replayed = replay.open_bytes(tampered(saved, lambda raw: _every(raw, "device", LINK)))
    values = view.snapshot(replayed)
    title = values["timeline"].layout.title.text.replace("<br>", " ")  # the title wraps at spaces
    assert html.escape(LINK, quote=False) in title or html.escape(LINK) in title, title
    for name, value in values.items():  # HTML and plots (a dict is a JSON view or a script's data: text)
        drawn = json.dumps(value.to_plotly_json(), default=str) if hasattr(value, "to_plotly_json") else value
        if isinstance(drawn, str):
            assert "<a href" not in drawn, name


def test_opening_a_recording_loads_no_model(saved, monkeypatch, tmp_path):
    def no_model(*args, **kwargs):
        raise AssertionError("a replay loaded a model")

    monkeypatch.setattr(ppsd, "load_model", no_model)
    monkeypatch.setattr(ppsd.model, "load_model", no_model)
    path = tmp_path / "upload.json"
    path.write_bytes(saved)
    page = panel.Shows(lambda snap: ordered(view.snapshot(snap)), lambda: ordered(view.idle()))
    out = panel.on_upload(str(path), page)
    assert "recording-ok" in said(out) and "not run now" in said(out)
    assert str(path) not in repr(out)  # the upload's path is never handed to an output


def test_the_save_offers_a_file_named_by_device_and_date(live):
    values = view.snapshot(live)
    name, data = values["recording"]
    assert re.fullmatch(r"ppsd-cpu-in-process-\d{4}-\d\d-\d\dT\d{4}Z\.json", name), name
    update, said = panel.on_recorded((name, data))
    target = Path(update["value"])
    assert update["visible"] and target.name == name and target.read_bytes() == data and said == ""
    assert recording.loads(target.read_bytes()).state.stats() == live.state.stats()
    assert panel.on_recorded(None)[0]["visible"] is False


def test_a_recording_names_model_head_device_date_library_and_settings(live, saved):
    rec = recording.loads(saved)
    assert rec.library == ppsd.__version__
    assert re.fullmatch(r"[0-9a-f]{64}", rec.model.sha256) and re.fullmatch(r"[0-9a-f]{64}", rec.model.head_sha256)
    assert rec.model.head == live.head and rec.model.name == live.loaded.model.info.name
    assert rec.machine.device == "cpu" and len(rec.machine.load_average) == 3
    assert rec.settings["max_new_tokens"] == 12 and rec.settings["prompt"] == "The sea is"
    assert len(rec.state.rounds) == 2 and all(run.result.trace.events for r in rec.state.rounds for run in r.values())


def test_the_library_version_is_the_packages():
    assert ppsd.__version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_every_shipped_recording_opens_labelled_and_quickly():
    shipped = replay.shipped()
    assert shipped, "assets/runs/ holds no recording"
    for name, path in shipped.items():
        assert path.stat().st_size < MAX_BYTES / 10, name  # far below the cap
        snap = replay.open_bytes(path.read_bytes())
        assert snap.done and snap.recorded.endswith("; not run now")
        assert re.fullmatch(r"ppsd-(cpu|cuda\d*)-[a-z-]+-\d{4}-\d\d-\d\dT\d{4}Z\.json", name), name


# --------------------------------------------------------------------------- bad recordings, one message each


def refused(data: bytes, *words: str) -> str:
    with pytest.raises(BadRecording) as caught:
        replay.open_bytes(data)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 300, message
    for word in words:
        assert word in message, message
    return message


def test_a_setting_the_page_gained_later_takes_its_default_and_the_prompt_is_still_required(saved):
    """A recording made before the page had the what-if control opens as an ordinary run; one
    without the prompt, which has no default, is refused in words."""
    older = replay.open_bytes(tampered(saved, lambda r: r["settings"].pop("forced_acceptance")))
    assert older.request.forced is None
    refused(tampered(saved, lambda r: r["settings"].pop("prompt")), "settings lacks prompt")


def test_a_round_that_was_not_clean_replays_as_not_clean(live):
    """What kept a round from being clean is recorded with it: a saved run whose round compiled,
    or ran beside other programs, replays with the live page's "Not a clean result" (before, the
    replay dropped both and headlined the number as clean). A file without the two fields (written
    before them) opens with nothing known; values out of range are refused."""
    for change in ({"compiled": (1,)}, {"others": (0.0, 1.6)}):
        unclean = dataclasses.replace(live, state=dataclasses.replace(live.state, **change))
        replayed = replay.open_bytes(recording.dumps(replay.record(unclean)))
        assert (replayed.state.compiled, replayed.state.others) == (unclean.state.compiled, unclean.state.others)
        headline = view.snapshot(replayed)["headline"]
        assert "Not a clean result" in headline and "Not a clean result" in view.snapshot(unclean)["headline"]
        assert unlabelled(headline, replayed.recorded) == view.snapshot(unclean)["headline"]
    saved = recording.dumps(replay.record(live))
    older = replay.open_bytes(tampered(saved, lambda r: [r["comparison"].pop(k) for k in ("compiled", "others")]))
    assert (older.state.compiled, older.state.others) == ((), ())
    refused(tampered(saved, lambda r: r["comparison"].update(compiled=[2])), "comparison.compiled[] = 2",
            "out of range")
    refused(tampered(saved, lambda r: r["comparison"].update(others=[-1.0])), "comparison.others[] = -1.0")
    refused(tampered(saved, lambda r: r["comparison"].update(others=[0.1] * 3)), "comparison.others has 3 items")


def test_a_wrong_version_is_refused(saved):
    refused(tampered(saved, lambda r: r.update(version=2)), "version 2", "reads version 1")
    refused(tampered(saved, lambda r: r.update(format="something")), "not a PPSD recording")


def test_a_tampered_trace_is_refused(saved):
    def overlap(raw):  # stage work moved to start before its input was ready
        events = raw["rounds"][0]["ppsd"]["events"]
        later = next(e for e in events if e[0] == 2 and e[2] != "prefill")
        later[3] = 0.0

    refused(tampered(saved, overlap), "round 1, PPSD", "trace", "invariant")


def test_a_tampered_wall_is_refused_by_the_statistic(saved):
    def faster(raw):
        raw["rounds"][0]["ppsd"]["wall"] = raw["rounds"][0]["ppsd"]["wall"] + 5

    refused(tampered(saved, faster), "statistic", "changed after it was recorded")


def test_a_file_over_the_size_cap_is_refused_before_parsing(saved):
    refused(saved + b" " * (MAX_BYTES + 1 - len(saved)), "over the", "MB")


def test_deep_nesting_is_refused_before_parsing():
    refused(b"[" * 100_000 + b"]" * 100_000, f"deeper than {MAX_DEPTH}")
    refused(b'{"format": "ppsd-recording", "x": ' + b"[" * 50 + b"]" * 50 + b"}", "deeper")


def test_non_utf8_bytes_are_refused(saved):
    refused(saved[:50] + b"\xff\xfe" + saved[50:], "not UTF-8", "byte 50")


def test_numbers_out_of_range_are_refused(saved):
    def negative_time(raw):
        raw["rounds"][0]["ar"]["events"][0][3] = -1.0

    def token_past_vocab(raw):
        raw["rounds"][0]["ar"]["tokens"][0][1] = raw["model"]["vocab_size"]

    refused(tampered(saved, negative_time), "start = -1.0", "out of range")
    refused(tampered(saved, token_past_vocab), "tokens[0].id", "out of range")
    refused(saved.replace(b'"wall":', b'"wall":NaN,"x":', 1), "NaN")


def test_wrong_types_are_refused(saved):
    refused(tampered(saved, lambda r: r["rounds"][0]["ar"]["tokens"][0].__setitem__(1, "7")), "must be a whole number")
    refused(tampered(saved, lambda r: r["machine"].update(name=7)), "machine.name must be text")
    refused(tampered(saved, lambda r: r.update(rounds={})), "rounds must be a list")
    refused(tampered(saved, lambda r: r.update(extra=1)), "does not know: 'extra'")
    refused(tampered(saved, lambda r: r["settings"].update(repeats=3)), "rounds recorded")
    refused(tampered(saved, lambda r: r["settings"].update(repeats=99)), "repeats=99 is out of range")
    refused(tampered(saved, lambda r: r["settings"].update(max_new_tokens=64)), "settings.max_new_tokens = 64",
            "runs' 12")


def test_not_json_and_not_an_object_are_refused():
    refused(b"hello", "not JSON")
    refused(b"[1, 2]", "not a PPSD recording")


def test_a_bad_upload_gets_one_message_on_the_page(tmp_path, saved):
    page = panel.Shows(lambda snap: ordered(view.snapshot(snap)), lambda: ordered(view.idle()))
    for data in (b"\xff" * 10, tampered(saved, lambda r: r.update(version=9)), b"[" * 10_000):
        path = tmp_path / "bad.json"
        path.write_bytes(data)
        out = panel.on_upload(str(path), page)
        assert said(out).count("cannot be opened") == 1 and "recording-bad" in said(out)
        assert out[:-1 - len(FORM)] == ordered(view.idle())  # nothing of another run stays up beside the message
    assert "cannot be opened" in said(panel.on_shipped("../../etc/passwd", page))


def test_an_upload_is_deleted_once_read_and_nothing_outside_the_upload_folder_is(tmp_path, saved, monkeypatch):
    """An opened upload leaves Gradio's folder, so its link serves nobody else; a path outside that
    folder is read (and refused or opened) but never deleted."""
    import gradio.utils

    uploads = tmp_path / "uploads"
    (uploads / "abc").mkdir(parents=True)
    monkeypatch.setattr(gradio.utils, "get_upload_folder", lambda: str(uploads))
    page = panel.Shows(lambda snap: ordered(view.snapshot(snap)), lambda: ordered(view.idle()))
    arrived = uploads / "abc" / "run.json"
    arrived.write_bytes(saved)
    assert "recording-ok" in said(panel.on_upload(str(arrived), page))
    assert not arrived.exists()
    outside = tmp_path / "mine.json"
    outside.write_bytes(saved)
    panel.on_upload(str(outside), page)
    assert outside.exists()


def test_generate_record_writes_a_recording_the_page_refuses_in_words(tmp_path, capsys):
    from ppsd.cli import main

    target = tmp_path / "one.json"
    assert main(["generate", "--model", str(TINY), "--prompt", "The sea is", "--max-new-tokens", "6", "--no-chat",
                 "--record", str(target)]) == 0
    rec = recording.loads(target.read_bytes())
    assert rec.state.methods == ("ppsd",) and len(rec.state.rounds[0]["ppsd"].result.tokens) <= 6
    refused(target.read_bytes(), "PPSD alone", "replays comparisons")


def test_record_command_writes_a_recording_the_page_opens(tmp_path):
    from app.record import main

    target = tmp_path / "run.json"
    assert main([ "--model", str(TINY), "--pipeline", "in-process", "--max-new-tokens", "6",
                 "--repeats", "1", "--out", str(target)]) == 0
    snap = replay.open_bytes(target.read_bytes())
    assert snap.request.repeats == 1 and snap.pipeline == "in-process" and snap.recorded
