"""Every command-line value is checked before any work (a load, a benchmark, a training), each
with one `error: ...` line and exit status 2, and each message names the real problem: not a
regular file, not a folder, not readable, out of range."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ppsd.cli import main
from ppsd.model_source import default_available


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
    from ppsd.cli import train_head

    def started(*args, **kwargs):
        raise AssertionError("the work started before the values were checked")

    monkeypatch.setattr(sweep, "_plan", started)
    monkeypatch.setattr(pipeline, "_model_and_prompts", started)
    monkeypatch.setattr(train_head, "load_model", started)


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


# --------------------------------------------------------------------------- before any weights load

WEIGHT_FILE_BYTES = 20_000_000  # more than any config or tokenizer file; less than any model's weights


@pytest.fixture
def no_weights(monkeypatch):
    """Fails the test loudly if any weights load, any random model is built, or any file the size
    of a model's weights is hashed (the default model's check hashed its 540 MB first)."""
    from ppsd import cache_files, model
    from ppsd.bench import pipeline

    def opened(*args, **kwargs):
        raise AssertionError("the weights were opened before the values were checked")

    hash_small = cache_files._sha256

    def hashed(path: str, size: int, mtime_ns: int) -> str:
        if size > WEIGHT_FILE_BYTES:
            raise AssertionError(f"{path} ({size:,} bytes) was hashed before the values were checked")
        return hash_small(path, size, mtime_ns)

    monkeypatch.setattr(model, "_weights", opened)
    monkeypatch.setattr(pipeline, "_random_model", opened)
    monkeypatch.setattr(cache_files, "_sha256", hashed)


@pytest.fixture
def two_cores(monkeypatch):
    from ppsd.executors import host

    monkeypatch.setattr(host, "usable_cores", lambda: 2)


def refused_at_once(capsys, args: list[str], message: str, *, within: float = 15.0) -> None:
    started = time.monotonic()
    code, out, err = cli(capsys, *args)
    one_line(code, err, message)
    assert out == "" and time.monotonic() - started < within


def _places(tmp_path) -> dict[str, str]:
    """FIFO: a named pipe (reading it would wait for ever); HEAD-FIFO: a head folder whose config is one."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "head").mkdir()
    os.mkfifo(tmp_path / "head" / "head_config.json")
    return {"FIFO": str(tmp_path / "pipe"), "HEAD-FIFO": str(tmp_path / "head"), "OUT": str(tmp_path / "out")}


BEFORE_THE_LOAD = [
    (["bench", "--temperatures", "nan"], "temperature=nan is out of range: 0 <= T < inf"),
    (["bench", "--temperatures", "-1"], "temperature=-1.0 is out of range: 0 <= T < inf"),
    (["bench", "--exit-layers", "99"], "exit layer E=99 is out of range: 1 <= E < 8 (layers)"),
    (["bench", "--exit-layers", "4", "99"], "exit layer E=99 is out of range: 1 <= E < 8 (layers)"),
    (["bench", "--stages", "40"], "stages K=40 is out of range: 2 <= K <= 8 (layers)"),
    (["bench", "--draft-lens", "9999"], "draft length G=9999 is out of range: 1 <= G <= 64"),
    (["bench", "--max-new-tokens", "999999"], "max_new_tokens=999999 is out of range: 1 <= N <= 1024"),
    (["bench", "--prompts", "FIFO"], "is not a regular file (it is a FIFO)"),
    (["bench", "--prompts", "/dev/full"], "prompts file '/dev/full' is not a regular file (it is a character device)"),
    (["bench", "--prompts", "/etc"], "prompts file '/etc' is not a regular file (it is a folder)"),
    (["bench", "--device", "tpu"], "device 'tpu' is not one of: cpu, cuda, auto"),
    (["bench-pipeline", "--new-tokens", "99999"], "max_new_tokens=99999 is out of range: 1 <= N <= 1024"),
    (["bench-pipeline", "--exit-layer", "0"], "exit layer E=0 is out of range: 1 <= E < 8 (layers)"),
    (["bench-pipeline", "--stages", "9"], "stages K=9 is out of range: 2 <= K <= 8 (layers)"),
    (["bench-pipeline", "--stages", "3"], "K = 3 worker processes need 3 CPU cores, one each; this machine gives 2"),
    (["bench-pipeline", "--draft-len", "9999"], "draft length G=9999 is out of range: 1 <= G <= 64"),
    (["bench-pipeline", "--prompts", "FIFO"], "is not a regular file (it is a FIFO)"),
    (["bench-pipeline", "--random-hidden", "8", "--stages", "9"], "stages K=9 is out of range: 2 <= K <= 8 (layers)"),
    (["train-head", "--max-chars", "0"], "argument --max-chars: 0 is out of range: 1 <= value"),
    (["train-head", "--decode-tokens", "5000"], "max_new_tokens=5000 is out of range: 1 <= N <= 1024"),
    (["train-head", "--prompts", "/etc"], "--prompts '/etc' is not a regular file (it is a folder)"),
    (["train-head", "--prompts", "FIFO"], "is not a regular file (it is a FIFO)"),
    (["generate", "--executor", "processes", "--stages", "3"],
     "K = 3 worker processes need 3 CPU cores, one each; this machine gives 2"),
    (["generate", "--exit-head", "/etc"], "/etc is not a saved exit head: head_config.json does not exist"),
    (["generate", "--exit-head", "FIFO"], "is not a folder (it is a FIFO)"),
    (["generate", "--exit-head", "HEAD-FIFO"], "head_config.json is not a regular file (it is a FIFO)"),
    (["generate", "--prompt", "fox " * 400], "tokens is too long: with max_new_tokens=64 the model's context of 256"),
    (["pipeline", "--stages", "3"], "K = 3 worker processes need 3 CPU cores, one each; this machine gives 2"),
    (["pipeline", "--exit-head", "/etc"], "/etc is not a saved exit head"),
    (["pipeline", "--prompt", "fox " * 400], "tokens is too long"),
]
if not torch.cuda.is_available():
    BEFORE_THE_LOAD += [(["generate", "--device", "cuda"], "device 'cuda' requested but no CUDA GPU is available"),
                        (["bench-pipeline", "--device", "cuda"], "device 'cuda' requested but no CUDA GPU")]


@pytest.mark.parametrize("args,message", BEFORE_THE_LOAD, ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_every_value_is_refused_before_any_weights_load(saved_model, capsys, tmp_path, no_weights, two_cores,
                                                        args, message):
    places = _places(tmp_path)
    command, *flags = [places.get(a, a) for a in args]
    needs = {"generate": ["--prompt", "hi"], "pipeline": ["--prompt", "hi"], "bench": ["--out", places["OUT"]],
             "train-head": ["--out", places["OUT"]], "bench-pipeline": []}[command]
    if "--prompt" in flags:
        needs = []
    refused_at_once(capsys, [command, "--model", saved_model, *needs, *flags], message)


DEFAULT_MODEL_REFUSALS = [
    (["generate", "--prompt", "hi", "--stages", "40"], "stages K=40 is out of range: 2 <= K <= 30 (layers)"),
    (["generate", "--prompt", "hi", "--exit-head", "/etc"], "/etc is not a saved exit head"),
    (["generate", "--prompt", "hi", "--executor", "processes", "--stages", "3"], "K = 3 worker processes need 3"),
    (["generate", "--prompt", "fox " * 9000], "tokens is too long: with max_new_tokens=64 the model's context of 8192"),
    (["pipeline", "--prompt", "hi", "--exit-layer", "30"], "exit layer E=30 is out of range: 1 <= E < 30 (layers)"),
    (["bench", "--out", "OUT", "--exit-layers", "99"], "exit layer E=99 is out of range: 1 <= E < 30 (layers)"),
    (["bench-pipeline", "--new-tokens", "99999"], "max_new_tokens=99999 is out of range"),
    (["train-head", "--out", "OUT", "--max-chars", "0"], "argument --max-chars: 0 is out of range"),
]
if not torch.cuda.is_available():
    DEFAULT_MODEL_REFUSALS.append((["generate", "--prompt", "hi", "--device", "cuda"], "device 'cuda' requested"))


@pytest.mark.skipif(not default_available(), reason="the default model is not installed here")
@pytest.mark.parametrize("args,message", DEFAULT_MODEL_REFUSALS, ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_the_default_models_540_mb_are_neither_hashed_nor_loaded_for_a_refusal(capsys, tmp_path, no_weights,
                                                                               two_cores, args, message):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    refused_at_once(capsys, args, message)


def test_a_trace_that_cannot_be_written_after_decoding_is_one_line_and_leaves_no_file(saved_model, tmp_path):
    """The up-front check passed, then the disk refused the write (here a file-size limit: EFBIG,
    as a full disk gives ENOSPC): one line, a failing status, and no empty or cut file."""
    trace = tmp_path / "trace.json"
    code = ("import resource, signal, sys\n"
            "from ppsd.cli import main\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))\n"
            f"sys.exit(main(['generate', '--model', {saved_model!r}, '--prompt', 'hi', '--max-new-tokens', '4',\n"
            f"                '--chrome-trace', {str(trace)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == f"error: --chrome-trace {str(trace)!r} could not be written: File too large"
    assert done.stdout.strip().splitlines()[-1].startswith("[ppsd] 4 tokens")  # the answer itself still came
    assert list(tmp_path.iterdir()) == []  # neither the trace nor its partial file


def test_a_result_file_is_replaced_whole_or_left_as_it_was(tmp_path, monkeypatch):
    from ppsd.cli.values import write_result

    target = tmp_path / "bench.json"
    write_result(str(target), '{"run": 1}', "--json")
    assert target.read_text() == '{"run": 1}' and oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(ValueError, match=r"^--json '.*bench.json' could not be written: No space left on device$"):
        write_result(str(target), '{"run": 2}', "--json")
    assert target.read_text() == '{"run": 1}' and [p.name for p in tmp_path.iterdir()] == ["bench.json"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_result_written_through_a_link_replaces_the_file_it_points_to_and_keeps_its_mode(tmp_path):
    """Issue 57: the write put a new 0644 file in the link's place (the link gone, the file it
    pointed to stale), and a 0600 file came out 0644."""
    from ppsd.cli.values import check_output_file, write_result

    real = tmp_path / "kept" / "run.json"
    real.parent.mkdir()
    real.write_text("old")
    real.chmod(0o600)
    link = tmp_path / "run.json"
    link.symlink_to(real)
    check_output_file(str(link), "--record")
    write_result(str(link), '{"run": 1}', "--record")
    assert link.is_symlink() and real.read_text() == '{"run": 1}'
    assert oct(real.stat().st_mode & 0o777) == oct(0o600)
    assert sorted(p.name for p in real.parent.iterdir()) == ["run.json"]  # no partial left beside it


def test_a_dangling_link_is_refused_in_one_sentence_and_nothing_is_made(tmp_path):
    """Checking a link to nowhere used to create an empty file where it pointed (and remove the link)."""
    from ppsd.cli.values import check_output_file

    link = tmp_path / "run.json"
    link.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(ValueError, match=r"^--record '.*run.json' is a link to '.*nowhere.json', which does not "
                                         r"exist: give the file itself, or make the file it points to first$"):
        check_output_file(str(link), "--record")
    assert link.is_symlink() and not (tmp_path / "nowhere.json").exists()


@pytest.mark.parametrize("args,message", [
    (["--pipeline", "evil"], "executor 'evil' is unknown; choose one of: auto, in-process, processes"),
    (["--pipeline", "processes", "--stages", "3"],
     "--pipeline processes cannot run here: K = 3 worker processes need 3 CPU cores, one each; this machine gives 2"),
], ids=["unknown", "K-over-cores"])
def test_app_record_checks_its_values_before_any_weights_load(capsys, monkeypatch, two_cores, tmp_path, args,
                                                             message):
    """Issue 57: `python -m app.record` loaded the weights first, then refused (47-55 s)."""
    from app import record
    from app.models import ModelCache

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the values were checked")

    monkeypatch.setattr(ModelCache, "get", loaded)
    code = record.main([*args, "--out", str(tmp_path / "run.json")])
    one_line(code, capsys.readouterr().err, message)
    assert not (tmp_path / "run.json").exists()
