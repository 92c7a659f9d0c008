"""What a request may send, through the real server (`app.server.guard`, `app.server.limits`): uploads bounded
in size, number, per address an hour and on disk, each refusal one sentence and nothing kept;
a body over the cap refused before Gradio parses it, by its length and as it streams; a prompt
over its characters refused in words before any tokenizer; unknown-session polls answered in one
line. No model loads: every refusal here comes before one would."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from app import AppState, create_demo, launch_kwargs
from app.server import guard, limits
from app.request import MAX_PROMPT_CHARS
from conftest import free_port

MB = limits.MB


@contextmanager
def served(state: AppState, folder: Path) -> Iterator[str]:
    """The page on `state`, its uploads in `folder` (Gradio reads GRADIO_TEMP_DIR as it builds its app)."""
    before = os.environ.get("GRADIO_TEMP_DIR")
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    demo = create_demo(state)
    port = free_port()
    try:
        demo.launch(prevent_thread_lock=True, server_port=port, quiet=True, **launch_kwargs())
        yield f"http://127.0.0.1:{port}"
    finally:
        demo.close()
        if before is None:
            os.environ.pop("GRADIO_TEMP_DIR", None)
        else:
            os.environ["GRADIO_TEMP_DIR"] = before


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[str, Path]]:
    folder = tmp_path / "uploads"
    with served(AppState(proxy_hops=1), folder) as url:  # as behind a Space's proxy: X-Forwarded-For names the visitor
        yield url, folder


def stored(folder: Path) -> list[Path]:
    """Every file under the upload folder (Gradio's temporary ones too)."""
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def upload(url: str, files: list[tuple[str, bytes]], address: str = "192.0.2.1") -> httpx.Response:
    return httpx.post(f"{url}/gradio_api/upload", files=[("files", (name, data)) for name, data in files],
                      headers={"X-Forwarded-For": address}, timeout=60)


def test_a_64_mb_upload_is_refused_in_words_and_nothing_of_it_is_kept(server):
    url, folder = server
    answer = upload(url, [("big.bin", b"\0" * (64 * 10**6))])
    assert answer.status_code == 413
    # Its Content-Length alone is past the address's share of the room (32 MB): refused before a byte is read.
    assert answer.text == ("this upload is larger than what is left of your share of the room for uploads (32 MB): "
                           "nothing of it was kept")
    assert stored(folder) == []


def test_a_file_just_over_the_cap_is_refused_and_one_at_the_cap_kept(server):
    url, folder = server
    assert upload(url, [("over.json", b"x" * (limits.MAX_UPLOAD_BYTES + 1))]).status_code == 413
    assert stored(folder) == []
    kept = upload(url, [("recording.json", b"{}" + b" " * (limits.MAX_UPLOAD_BYTES - 2))])
    assert kept.status_code == 200, kept.text
    assert [Path(p).name for p in kept.json()] == ["recording.json"]


def test_one_request_of_200_files_keeps_none_and_one_of_20_keeps_20(server):
    url, folder = server
    answer = upload(url, [(f"f{i}.json", b"{%d}" % i) for i in range(200)])
    assert answer.status_code == 413
    assert answer.text == "an upload may carry at most 20 files: nothing of this one was kept"
    assert stored(folder) == []
    kept = upload(url, [(f"f{i}.json", b"{%d}" % i) for i in range(20)])
    assert kept.status_code == 200 and len(kept.json()) == 20
    assert len(stored(folder)) == 20


def test_an_address_gets_its_hourly_upload_budget_and_another_address_its_own(server, monkeypatch):
    url, folder = server
    monkeypatch.setattr(guard, "UPLOAD_BYTES_PER_HOUR", 3 * MB)
    monkeypatch.setattr(guard, "UPLOAD_FILES_PER_HOUR", 3)
    assert [upload(url, [(f"r{i}.json", bytes([i]) * MB)]).status_code for i in range(2)] == [200, 200]
    over = upload(url, [("big.json", b"x" * 2 * MB)])  # 4 MB in the hour: past the budget as it streams
    assert over.status_code == 413
    assert over.text == ("this upload is larger than what you may still upload this hour (1 MB): nothing of it was "
                         "kept; try again in 60 min")
    assert int(over.headers["retry-after"]) > 3500
    assert upload(url, [("r2.json", b"{}")]).status_code == 200  # a refused upload costs nothing
    spent = upload(url, [("r3.json", b"{}")])  # a fourth file
    assert spent.status_code == 429
    assert spent.text == ("you have uploaded 2 MB in 3 files in the last hour, the most one visitor may (3 MB, "
                          "3 files): try again in 60 min")
    assert int(spent.headers["retry-after"]) > 3500  # the first upload leaves the hour's window in about an hour
    assert upload(url, [("r4.json", b"{}")], address="198.51.100.9").status_code == 200
    assert len(stored(folder)) == 4


def slow_upload(url: str, name: str, size: int, address: str) -> httpx.Response:
    """One file of `size` bytes, sent in 64 kB pieces with pauses, so that uploads overlap."""
    boundary = b"sl0w"

    def pieces() -> Iterator[bytes]:
        yield b"--" + boundary + f'\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n\r\n'.encode()
        for _ in range(size // 65536):
            time.sleep(0.002)
            yield b"x" * 65536
        yield b"\r\n--" + boundary + b"--\r\n"

    return httpx.post(f"{url}/gradio_api/upload", content=pieces(), timeout=60, headers={
        "Content-Type": "multipart/form-data; boundary=sl0w", "X-Forwarded-For": address})


@pytest.mark.parametrize("budget, addresses", [("UPLOAD_BYTES_PER_HOUR", ["192.0.2.7"] * 3),
                                               ("UPLOAD_DISK_BYTES", ["192.0.2.7", "192.0.2.8", "192.0.2.9"])])
def test_uploads_at_once_share_one_budget(server, monkeypatch, budget, addresses):
    """Three uploads of 2 MB at once against a 3 MB budget: each fits alone, and at most one is
    kept (the budget is checked against all of them as their bytes arrive, so all may be refused)."""
    from concurrent.futures import ThreadPoolExecutor

    url, folder = server
    monkeypatch.setattr(guard, budget, 3 * MB)
    monkeypatch.setattr(guard, "UPLOAD_SHARES", 1)  # the room's budget, not an address's share of it
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda a: slow_upload(url, f"{a[0]}.json", 2 * MB, a[1]), enumerate(addresses)))
    kept = [a for a in answers if a.status_code == 200]
    assert len(kept) <= 1 and all(a.status_code == 413 and "nothing of it was kept" in a.text
                                  for a in answers if a not in kept), [a.text for a in answers]
    assert sum(p.stat().st_size for p in stored(folder)) == 2 * MB * len(kept)


def test_uploads_never_hold_more_than_their_room_on_disk(server, monkeypatch):
    url, folder = server
    monkeypatch.setattr(guard, "UPLOAD_DISK_BYTES", 3 * MB)
    monkeypatch.setattr(guard, "UPLOAD_SHARES", 1)
    answers = [upload(url, [(f"r{i}.json", bytes([i]) * MB)], address=f"203.0.113.{i}") for i in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 413, 413]  # 1 MB and its headers past the 1 MB left
    assert answers[-1].text.startswith("this upload is larger than the room uploads have now (1 MB)")
    assert sum(p.stat().st_size for p in stored(folder)) == 2 * MB
    monkeypatch.setattr(guard, "UPLOAD_DISK_BYTES", 2 * MB)  # now full
    full = upload(url, [("r.json", b"{}")])
    assert full.status_code == 429 and full.text.startswith("the demo's room for uploads is full for now")
    assert full.text.endswith("try again in 11 min") and 600 < int(full.headers["retry-after"]) <= 660
    assert sum(p.stat().st_size for p in stored(folder)) == 2 * MB


def test_four_addresses_at_their_hourly_most_leave_room_for_a_fifth(server):
    """Four addresses once filled the whole room in about 2 s with their hourly budgets, and every
    upload was then refused for an hour. Now each address holds at most its share, each refusal
    says when to retry, and a fifth address's recording of 100 KB is kept."""
    url, folder = server
    size = limits.UPLOAD_BYTES_PER_HOUR // 8 - 4096  # eight of these fit an address's hour, headers included
    for a in range(4):
        answers = [upload(url, [(f"r{i}.json", b"x" * size)], address=f"203.0.113.{a}") for i in range(9)]
        refused = [r for r in answers if r.status_code != 200]
        assert refused, f"address {a} was refused nothing"
        assert all(r.status_code in (413, 429) and "try again in" in r.text and int(r.headers["retry-after"]) > 0
                   for r in refused), [r.text for r in refused]
    fifth = upload(url, [("recording.json", b"{}" + b" " * (100 * 1024))], address="198.51.100.20")
    assert fifth.status_code == 200, fifth.text
    assert create_demo(AppState()).delete_cache[1] <= 600  # an unopened upload expires in minutes, not an hour


def test_two_visitors_uploading_the_same_file_each_open_their_own(server):
    """Gradio stores an upload by its content: two visitors sending one file got one path, and the
    first to open it deleted it ("the file could not be read: No such file or directory")."""
    from concurrent.futures import ThreadPoolExecutor

    from app import replay

    url, folder = server
    data = next(iter(replay.shipped().values())).read_bytes()
    first, second = (upload(url, [("run.json", data)], address=a).json()[0] for a in ("192.0.2.1", "192.0.2.2"))
    assert first != second
    for path in (first, second):  # each visitor's open, in turn
        assert replay.open_bytes(replay.read_upload(path)).recorded.startswith("Recorded on")
    with ThreadPoolExecutor(3) as pool:  # one content at once from three addresses
        answers = list(pool.map(lambda a: slow_upload(url, "same.json", MB, f"192.0.2.{a}"), (7, 8, 9)))
    paths = [a.json()[0] for a in answers]
    assert len(set(paths)) == 3, paths
    assert [len(replay.read_upload(p)) for p in paths] == [MB] * 3
    assert stored(folder) == []  # every open deleted its own copy, and the shared name is gone


def test_the_disk_keeps_the_model_cache_room(server, monkeypatch):
    url, folder = server
    import shutil

    free = shutil.disk_usage(folder.parent).free
    monkeypatch.setattr(guard, "DISK_RESERVE_BYTES", free)  # as if the disk had no more room than the reserve
    answer = upload(url, [("r.json", b"{}")])
    assert answer.status_code == 429 and "keeps room for the model cache" in answer.text
    assert stored(folder) == []


def test_a_chunked_upload_past_its_room_is_refused_as_it_streams(server):
    url, folder = server

    def chunks() -> Iterator[bytes]:
        boundary = b"b0undary"
        yield b"--" + boundary + b'\r\nContent-Disposition: form-data; name="files"; filename="a.json"\r\n\r\n'
        for _ in range(80):  # 80 MB with no Content-Length
            yield b"x" * MB
        yield b"\r\n--" + boundary + b"--\r\n"

    answer = httpx.post(f"{url}/gradio_api/upload", content=chunks(), timeout=60,
                        headers={"Content-Type": "multipart/form-data; boundary=b0undary"})
    assert answer.status_code == 413 and "nothing of" in answer.text
    assert stored(folder) == []


def join_body(url: str, prompt: str) -> bytes:
    """The body of a Run as the raw API sends it (`/gradio_api/queue/join`), with `prompt`."""
    import json

    dependencies = httpx.get(f"{url}/config", timeout=30).json()["dependencies"]
    fn_index = next(i for i, d in enumerate(dependencies) if d.get("api_name") == "run")
    return json.dumps({"data": [prompt, "", 4, 2, False, 3, 4, 0.0, 1.0, 0, "", False, True, 1, "processes"],
                       "fn_index": fn_index, "session_hash": "limits-test", "event_data": None}).encode()


def test_a_50_mb_prompt_is_refused_in_words_before_it_is_parsed(server):
    url, _ = server
    body = join_body(url, "x" * 50_000_000)
    started = time.monotonic()
    answer = httpx.post(f"{url}/gradio_api/queue/join", content=body, timeout=60,
                        headers={"Content-Type": "application/json"})
    assert time.monotonic() - started < 10
    assert answer.status_code == 413
    assert answer.text == ("a request may send at most 2 MB (a prompt at most 100,000 characters): this one sent "
                           "more")


def test_a_chunked_body_past_the_cap_is_refused_as_it_streams(server):
    url, _ = server
    body = join_body(url, "x" * 5_000_000)
    answer = httpx.post(f"{url}/gradio_api/queue/join", timeout=60, headers={"Content-Type": "application/json"},
                        content=(body[i:i + MB] for i in range(0, len(body), MB)))  # no Content-Length
    assert answer.status_code == 413 and answer.text.startswith("a request may send at most 2 MB")


def test_a_prompt_past_its_characters_is_refused_in_words_before_any_tokenizer(server):
    from gradio_client import Client

    url, _ = server
    outputs = Client(url, verbose=False).predict("x" * (MAX_PROMPT_CHARS + 1), "no/model-is-loaded", 4, 2, False, 3,
                                                 4, 0.0, 1.0, 0, "", False, True, 1, "processes", api_name="/run")
    assert outputs[-1] == {"error": f"the prompt is {MAX_PROMPT_CHARS + 1:,} characters long; the demo takes at "
                                    f"most {MAX_PROMPT_CHARS:,}"}


def test_polls_of_unknown_sessions_are_answered_in_one_line_and_log_nothing(server, capfd):
    url, _ = server
    capfd.readouterr()
    with httpx.Client(timeout=10) as client:
        answers = [client.get(f"{url}/gradio_api/queue/data", params={"session_hash": f"x{i}"}) for i in range(300)]
        answers += [client.get(f"{url}/gradio_api/call/run/no-such-event-{i}") for i in range(10)]  # the plain API's
    assert {a.status_code for a in answers} == {404}
    assert answers[0].text == "no such session: join an event first"
    out, err = capfd.readouterr()
    assert len(out) + len(err) < 100_000 and "Traceback" not in err


def test_the_upload_ledger_forgets_an_address_an_hour_after_its_last_upload():
    now = [0.0]
    ledger = limits.UploadLedger(window=3600, clock=lambda: now[0])
    first = ledger.start("192.0.2.1")
    first.bytes, first.files = 5 * MB, 1
    assert ledger.used("192.0.2.1") == (5 * MB, 1)
    now[0] = 1800.0
    ledger.start("192.0.2.2").bytes = MB
    assert ledger.free_again_in("192.0.2.1") == 1800.0
    now[0] = 3601.0
    ledger.start("192.0.2.3")
    assert ledger.used("192.0.2.1") == (0, 0) and len(ledger) == 2  # the first address is gone, not kept empty
    refused = ledger.start("192.0.2.2")
    refused.bytes = 9 * MB
    ledger.refund("192.0.2.2", refused)
    assert ledger.used("192.0.2.2") == (MB, 0)


def test_the_gpu_lease_never_tokenizes_a_prompt_past_the_cap():
    """The ZeroGPU lease counts a prompt's tokens before the run is checked: past the character cap
    it counts characters, so no tokenizer reads a prompt the run will refuse."""
    from app import lease
    from app.request import MAX_PROMPT_CHARS, RunRequest

    class Tokenizer:
        chat = False

        def encode(self, text, chat=False):
            raise AssertionError("a prompt past the cap reached the tokenizer")

    count = lease.counter(lambda model: Tokenizer())
    prompt = "x" * (MAX_PROMPT_CHARS + 1)
    assert count(RunRequest(prompt=prompt)) == len(prompt) // lease.PROMPT_CHARS_PER_TOKEN
