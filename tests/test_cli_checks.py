"""Every command-line value is checked before any work (a load, a benchmark, a training), each
with one `error: ...` line and exit status 2, and each message names the real problem: not a
regular file, not a folder, not readable, out of range."""

from __future__ import annotations

import os

import pytest

from ppsd.cli import main


def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's own errors exit from the parser
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code: int, err: str, message: str) -> None:
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err


@pytest.fixture
def no_work(monkeypatch):
    """Every long piece of work fails the test if it starts."""
    from ppsd.bench import pipeline, sweep
    from ppsd.heads import train

    def started(*args, **kwargs):
        raise AssertionError("the work started before the values were checked")

    monkeypatch.setattr(sweep, "_plan", started)
    monkeypatch.setattr(pipeline, "_model_and_prompts", started)
    monkeypatch.setattr(train, "load_model", started)


@pytest.mark.parametrize("args,message", [
    (["bench", "--draft-lens", "0"], "argument --draft-lens: 0 is out of range: 1 <= value (g >= 1"),
    (["bench", "--stages", "1"], "argument --stages: 1 is out of range: 2 <= value"),
    (["bench", "--repeats", "0"], "argument --repeats: 0 is out of range: 1 <= value"),
    (["bench", "--warmup", "-1"], "argument --warmup: -1 is out of range: 0 <= value"),
    (["bench-pipeline", "--max-prompts", "0"], "argument --max-prompts: 0 is out of range: 1 <= value"),
    (["bench-pipeline", "--max-prompts", "-1"], "argument --max-prompts: -1 is out of range"),
    (["bench-pipeline", "--repeats", "0"], "argument --repeats: 0 is out of range: 1 <= value"),
    (["bench-pipeline", "--new-tokens", "0"], "argument --new-tokens: 0 is out of range"),
    (["bench-pipeline", "--random-hidden", "-1"], "argument --random-hidden: -1 is out of range: 4 <= value <= 4096"),
    (["bench-pipeline", "--random-hidden", "6"], "argument --random-hidden: 6 is not a multiple of 4"),
    (["bench-pipeline", "--random-hidden", "many"], "argument --random-hidden: 'many' is not a whole number"),
    (["train-head", "--out", "x", "--stages", "1"], "argument --stages: 1 is out of range: 2 <= value"),
    (["pipeline", "--prompt", "hi", "--timeout", "1e308"], "argument --timeout: 1e308 is out of range"),
], ids=lambda value: value if isinstance(value, str) else " ".join(value))
def test_out_of_range_values_are_refused_by_the_parser(capsys, no_work, args, message):
    one_line(*cli(capsys, *args)[::2], message)


def test_bench_out_is_checked_before_benchmarking(capsys, no_work, tmp_path):
    taken = tmp_path / "bench"
    taken.write_text("a file")
    one_line(*cli(capsys, "bench", "--out", str(taken))[::2], f"--out {str(taken)!r} is a file, not a folder")
    one_line(*cli(capsys, "bench", "--out", "/proc/ppsd-bench")[::2], "--out '/proc/ppsd-bench' cannot be made a folder")
    assert taken.read_text() == "a file"


@pytest.mark.parametrize("target,message", [("/no/such/folder/r.json", "folder '/no/such/folder' does not exist"),
                                            ("/proc/ppsd.json", "cannot be written"),
                                            ("/dev/full", "is not a regular file")])
def test_bench_pipeline_json_is_checked_before_the_run(capsys, no_work, target, message):
    one_line(*cli(capsys, "bench-pipeline", "--random-hidden", "8", "--json", target)[::2], message)


def test_train_head_stages_must_fit_the_model_before_it_loads(saved_model, capsys, no_work, tmp_path):
    code, _, err = cli(capsys, "train-head", "--model", saved_model, "--exit-layer", "4", "--stages", "8",
                       "--out", str(tmp_path / "out"))
    one_line(code, err, "stages K=8 do not fit")


@pytest.mark.parametrize("flags,message", [
    (["--data", "/dev/zero"], "--data '/dev/zero' is not a regular file or a folder (it is a character device)"),
    (["--data", "FIFO"], "is not a regular file or a folder (it is a FIFO)"),
    (["--data", "FIFO.jsonl"], "is not a regular file (it is a FIFO): give a JSONL file of chat answers"),
    (["--data", "/no/such/text"], "--data '/no/such/text' does not exist"),
    (["--heldout", "/dev/zero"], "--heldout applies to a text --data only"),
    (["--data", "TEXT", "--heldout", "/dev/zero"], "--heldout '/dev/zero' is not a regular file or a folder"),
    (["--data", "TEXT", "--heldout", "FIFO"], "(it is a FIFO)"),
])
def test_train_head_names_what_is_wrong_with_its_data_before_it_loads(saved_model, capsys, no_work, tmp_path,
                                                                      flags, message):
    (tmp_path / "text.txt").write_text("some text to learn from")
    os.mkfifo(tmp_path / "pipe")
    os.mkfifo(tmp_path / "pipe.jsonl")
    where = {"FIFO": str(tmp_path / "pipe"), "FIFO.jsonl": str(tmp_path / "pipe.jsonl"),
             "TEXT": str(tmp_path / "text.txt")}
    flags = [where.get(f, f) for f in flags]
    code, _, err = cli(capsys, "train-head", "--model", saved_model, "--exit-layer", "4", *flags,
                       "--out", str(tmp_path / "out"))
    one_line(code, err, message)


@pytest.mark.parametrize("head,message", [
    ("/dev/zero", "exit head '/dev/zero' is not a folder (it is a character device)"),
    ("FIFO", "is not a folder (it is a FIFO)"),
    ("CONFIG-FIFO", "is not a saved exit head: head_config.json is not a regular file (it is a FIFO)"),
])
def test_an_exit_head_that_is_no_folder_says_what_it_is(saved_model, capsys, tmp_path, head, message):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "head").mkdir()
    os.mkfifo(tmp_path / "head" / "head_config.json")  # reading it would wait for ever
    head = {"FIFO": str(tmp_path / "pipe"), "CONFIG-FIFO": str(tmp_path / "head")}.get(head, head)
    code, _, err = cli(capsys, "generate", "--model", saved_model, "--prompt", "hi", "--max-new-tokens", "2",
                       "--exit-head", head)
    one_line(code, err, message)


def test_pipeline_and_generate_on_processes_refuse_too_many_stages_alike(saved_model, capsys, monkeypatch):
    from ppsd.executors import host

    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    base = ["--model", saved_model, "--prompt", "hi", "--max-new-tokens", "2", "--stages", "3"]
    code, _, generate_err = cli(capsys, "generate", "--executor", "processes", *base)
    one_line(code, generate_err, "K = 3 worker processes need 3 CPU cores, one each; this machine gives 2")
    code, _, pipeline_err = cli(capsys, "pipeline", *base)
    assert code == 2 and pipeline_err == generate_err
