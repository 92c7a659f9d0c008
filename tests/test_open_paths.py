"""Issue 57, item 6: an open of a path that is not the visitor's upload (outside Gradio's upload
folder) logs one line, not Gradio's traceback, and answers in words; an open leaves no stray
file of Gradio's behind. On a real launched server over the raw API, as any script can call it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import httpx

from app import replay
from app.state import AppState
from conftest import served


def _upload_event(config: dict) -> int:
    component = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "open-recording")
    return next(i for i, d in enumerate(config["dependencies"]) if [component, "upload"] in
                [list(t) for t in d["targets"]])


def _call(base: str, fn_index: int, data: list) -> dict:
    """Join event `fn_index` in a fresh session and read its stream: the completion message."""
    session = uuid.uuid4().hex
    payload = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None, "trigger_id": None}
    httpx.post(f"{base}/gradio_api/queue/join", content=json.dumps(payload), timeout=30,
               headers={"content-type": "application/json"}).raise_for_status()
    with httpx.stream("GET", f"{base}/gradio_api/queue/data", params={"session_hash": session}, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                return json.loads(line[5:])
    raise AssertionError("the stream closed without an answer")


def test_an_open_of_a_path_outside_the_upload_folder_logs_one_line_not_a_traceback(capfd, tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    with served(AppState()) as url:
        base = url.rstrip("/")
        config = httpx.get(f"{base}/config", timeout=30).json()
        capfd.readouterr()
        done = _call(base, _upload_event(config), [{"path": str(outside), "orig_name": "run.json",
                                                    "meta": {"_type": "gradio.FileData"}}])
        logged = capfd.readouterr().err
    assert not done.get("success"), done
    assert "Traceback" not in logged, logged[-3000:]
    refused = [line for line in logged.splitlines() if "refused" in line]
    assert len(refused) == 1 and "not an upload" in refused[0], logged[-3000:]
    assert str(outside) not in json.dumps(done), done  # the caller is not told what the server's paths are


def _files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


def test_an_open_leaves_no_file_behind():
    """Gradio's UploadButton made an empty temporary file in its cache at every open, never deleted."""
    from gradio.utils import get_upload_folder

    root = Path(get_upload_folder())
    recorded = next(iter(replay.shipped().values())).read_bytes()
    with served(AppState()) as url:
        base = url.rstrip("/")
        config = httpx.get(f"{base}/config", timeout=30).json()
        for _ in range(3):
            before = _files(root)
            stored = httpx.post(f"{base}/gradio_api/upload", timeout=30,
                                files={"files": ("run.json", recorded, "application/json")}).json()[0]
            done = _call(base, _upload_event(config), [{"path": stored, "orig_name": "run.json",
                                                        "meta": {"_type": "gradio.FileData"}}])
            assert done.get("success"), done
            left = _files(root) - before
            assert not left, f"the open left {sorted(left)}"


def test_saved_runs_are_pruned_on_a_timer_with_no_later_save(monkeypatch, tmp_path):
    """A saved run's file stayed until someone saved again, however long that took."""
    from app import create_demo
    from app.panels import recording

    monkeypatch.setattr(recording, "SAVES", tmp_path)
    monkeypatch.setattr(recording, "SAVE_SECONDS", 30.0)
    monkeypatch.setattr(recording, "PRUNE_SECONDS", 0.2, raising=False)
    old, fresh = tmp_path / "old", tmp_path / "fresh"
    for folder in (old, fresh):
        folder.mkdir()
        (folder / "ppsd-cpu-run.json").write_text("{}")
    os.utime(old, (time.time() - 60, time.time() - 60))
    create_demo(AppState())  # the page: nobody saves
    deadline = time.monotonic() + 10.0
    while old.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not old.exists(), "a saved run past its time was left"
    assert fresh.exists()
