"""The command line contract: documented JSON fields, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ppsd.cli import main


def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's own errors (a bad type) exit from the parser
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_every_documented_field(saved_model, capsys):
    code, out, _ = cli(capsys, "generate", "--model", saved_model, "--prompt", "def fibonacci(n):",
                       "--max-new-tokens", "12", "--json")
    assert code == 0
    data = json.loads(out)
    assert {"text", "token_ids", "tokens", "drafts", "metrics", "trace", "config"} <= set(data)
    assert len(data["token_ids"]) == len(data["tokens"]) == 12
    assert {"id", "text", "status", "draft"} <= set(data["tokens"][0])
    assert {t["status"] for t in data["tokens"]} <= {"verified", "accepted", "corrected"}
    assert all({"position", "id", "text", "fate"} <= set(d) for d in data["drafts"])
    assert {d["fate"] for d in data["drafts"]} <= {"accepted", "rejected", "flushed"}
    assert {"acceptance_rate", "accepted", "rejected", "flushed", "tokens_per_second", "wall_seconds",
            "stage_utilization", "ideal_speedup", "clock"} <= set(data["metrics"])
    assert data["metrics"]["clock"] == "projected"  # in-process PPSD: overlap can only be projected
    assert {"stage", "position", "kind", "start", "end", "token_id"} <= set(data["trace"]["events"][0])
    config = data["config"]
    assert (config["model"], config["exit_layer"], config["stages"], config["device"], config["dtype"]) == \
        (saved_model, 4, 2, "cpu", "float32")
    assert {"draft_len", "seed"} <= set(config)


def test_methods_agree_and_text_mode_prints_a_summary(saved_model, capsys):
    texts = set()
    for method in ("ar", "eesd", "ppsd"):
        code, out, _ = cli(capsys, "generate", "--model", saved_model, "--prompt", "The quick",
                           "--method", method, "--max-new-tokens", "10")
        assert code == 0
        text, summary = out.rstrip("\n").rsplit("\n", 1)
        assert summary.startswith(f"[{method}] 10 tokens")
        # both clocks for every method, so AR's line and PPSD's compare like with like
        assert "tok/s measured (stages in turn, one process)" in summary and "tok/s projected" in summary
        texts.add(text)
    assert len(texts) == 1


BAD_INPUTS = [
    (["--exit-layer", "0"], "exit layer E=0 is out of range: 1 <= E < 8"),
    (["--exit-layer", "8"], "exit layer E=8 is out of range: 1 <= E < 8"),
    (["--stages", "1"], "stages K=1 is out of range: 2 <= K <= 8"),
    (["--stages", "9"], "stages K=9 is out of range"),
    (["--stages", "4", "--exit-layer", "6"], "stages K=4 do not fit"),
    (["--method", "eesd", "--draft-len", "0"], "draft length G=0 is out of range: 1 <= G <= 64"),
    (["--method", "eesd", "--draft-len", "1000000"], "draft length G=1000000 is out of range: 1 <= G <= 64"),
    (["--seed", str(10**23)], "seed=100000000000000000000000 is out of range: 0 <= seed <= 2^63 - 1"),
    (["--seed", "-1"], "seed=-1 is out of range"),
    (["--threads", "-1"], "argument --threads: -1 is out of range: 1 <= threads <= "),
    (["--threads", "0"], "argument --threads: 0 is out of range: 1 <= threads <= "),
    (["--threads", "100000"], f"argument --threads: 100000 is out of range: 1 <= threads <= {os.cpu_count()} "
                              "(this machine's cores)"),
    (["--chrome-trace", "/no/such/folder/t.json"], "--chrome-trace '/no/such/folder/t.json': folder '/no/such/folder' does not exist"),
    (["--chrome-trace", "/tmp"], "--chrome-trace '/tmp' is a directory: give a file name"),
    (["--max-new-tokens", "0"], "max_new_tokens=0 is out of range: 1 <= N <= 1024"),
    (["--max-new-tokens", "5000"], "max_new_tokens=5000 is out of range: 1 <= N <= 1024"),
    (["--temperature", "-1"], "temperature=-1.0 is out of range: 0 <= T < inf"),
    (["--temperature", "inf"], "temperature=inf is out of range: 0 <= T < inf"),
    (["--temperature", "nan"], "temperature=nan is out of range: 0 <= T < inf"),
    (["--top-p", "0"], "top_p=0.0 is out of range: 0 < P <= 1"),
    (["--top-p", "nan"], "top_p=nan is out of range: 0 < P <= 1"),
    (["--top-p", "1.5"], "top_p=1.5 is out of range: 0 < P <= 1"),
    (["--method", "beam"], "method 'beam' is unknown; choose one of: ar, eesd, ppsd"),
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "fox " * 400], "is too long"),
    (["--prompt", "abc\ud800def"], "prompt is not valid Unicode text: character 3 is a lone surrogate (U+D800)"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS, ids=[m.split(" ")[0] + str(i) for i, (_, m) in enumerate(BAD_INPUTS)])
def test_bad_input_exits_2_with_one_line(saved_model, capsys, args, message):
    base = ["generate", "--model", saved_model, "--prompt", "hello"]
    code, out, err = cli(capsys, *base, *args)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert out == ""


@pytest.mark.parametrize("sampling", [["--temperature", "1e-308"], ["--temperature", "1", "--top-p", "1e-300"]],
                         ids=["tiny-temperature", "tiny-top-p"])
def test_tiny_sampling_values_decode_as_greedy(saved_model, capsys, sampling):
    base = ["generate", "--model", saved_model, "--prompt", "The quick", "--max-new-tokens", "8", "--json"]
    code, out, _ = cli(capsys, *base)
    assert code == 0
    greedy = json.loads(out)["token_ids"]
    code, out, err = cli(capsys, *base, *sampling)
    assert code == 0, err
    assert json.loads(out)["token_ids"] == greedy


def test_models_that_cannot_be_loaded(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    cases = {"no/such-model-anywhere": "cannot load model 'no/such-model-anywhere'",
             str(tmp_path / "missing"): "model directory .* does not exist",
             str(tmp_path): "unsupported architecture 'gpt2'"}
    for name, message in cases.items():
        code, _, err = cli(capsys, "generate", "--model", name, "--prompt", "hi")
        assert code == 2 and re.search(message, err) and err.count("\n") == 1


def test_real_process_exit_status_and_no_traceback(saved_model):
    done = subprocess.run([sys.executable, "-m", "ppsd", "generate", "--model", saved_model, "--prompt", "hi",
                           "--stages", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: stages K=1 is out of range: 2 <= K <= 8 (layers)"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("executor", ["processes", "threads", "distributed"])  # distributed: the earlier name
def test_concurrent_executors_give_the_same_tokens_on_the_measured_clock(saved_model, capsys, executor):
    base = ["generate", "--model", saved_model, "--prompt", "def fibonacci(n):", "--max-new-tokens", "12", "--json"]
    _, local, _ = cli(capsys, *base)
    code, concurrent, err = cli(capsys, *base, "--executor", executor)
    assert code == 0, err
    local, concurrent = json.loads(local), json.loads(concurrent)
    assert concurrent["token_ids"] == local["token_ids"]
    assert concurrent["metrics"]["clock"] == "measured"  # stages really ran at the same time
    assert concurrent["trace"]["events"] and local["metrics"]["clock"] == "projected"


def test_the_summary_line_names_the_executor_the_stages_ran_on(saved_model, capsys):
    code, out, err = cli(capsys, "generate", "--model", saved_model, "--prompt", "def f(x):", "--max-new-tokens", "4",
                         "--executor", "threads")
    assert code == 0, err
    assert "tok/s measured (K threads in one process at once)" in out


SHARED_BAD_INPUTS = [  # values both entry points take: one validation, one message
    (["--exit-layer", "0"], "exit layer E=0 is out of range"),
    (["--stages", "1"], "stages K=1 is out of range"),
    (["--max-new-tokens", "0"], "max_new_tokens=0 is out of range"),
    (["--prompt", "  "], "prompt is empty"),
]


@pytest.mark.parametrize("args,message", SHARED_BAD_INPUTS, ids=[a[0] for a, _ in SHARED_BAD_INPUTS])
def test_bad_values_give_the_same_line_from_generate_and_the_torchrun_entry_point(saved_model, capsys, args,
                                                                                   message):
    from ppsd.cli import main

    base = ["--model", saved_model, "--prompt", "hello"]
    code, _, generate_err = cli(capsys, "generate", *base, *args)
    assert code == 2 and message in generate_err
    assert main(["pipeline", *base, *args]) == 2
    captured = capsys.readouterr()
    assert captured.err == generate_err and captured.out == ""


def test_torchrun_entry_point_exits_2_without_a_traceback(saved_model):
    done = subprocess.run([sys.executable, "-m", "ppsd", "pipeline", "--model", saved_model, "--prompt", "hi",
                           "--stages", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["error: stages K=1 is out of range: 2 <= K <= 8 (layers)"]


def test_an_unreachable_hub_is_one_line_at_once(capsys, monkeypatch):
    from ppsd import model_source

    def refuse(address, timeout):
        raise OSError("network is unreachable")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(model_source, "_hub_probe", None)
    monkeypatch.setattr(model_source.socket, "create_connection", refuse)
    code, out, err = cli(capsys, "generate", "--model", "someone/no-such-model", "--prompt", "hi")
    assert code == 2 and out == ""
    assert err == ("error: cannot load model 'someone/no-such-model': cannot reach the model hub; "
                   "give a local directory, or connect\n")


LONG_NAME = "/tmp/" + "x" * 300  # past the file system's 255-byte name limit: OSError, not ValueError


@pytest.mark.parametrize("args,message", [
    (["--model", LONG_NAME], "is not a usable path: File name too long"),
    (["--model", "/etc/passwd"], "'/etc/passwd' is not a model directory"),
    (["--model", "/dev/zero"], "'/dev/zero' is not a model directory"),
    (["--exit-head", LONG_NAME], "is not a usable path: File name too long"),
    (["--chrome-trace", LONG_NAME], "cannot be written: File name too long"),
    (["--chrome-trace", "/dev/full"], "--chrome-trace '/dev/full' is not a regular file"),
], ids=["long-model", "file-model", "device-model", "long-head", "long-trace", "device-trace"])
def test_names_the_file_system_refuses_exit_2_with_one_line(saved_model, capsys, args, message):
    base = ["generate", "--model", saved_model, "--prompt", "hello", "--max-new-tokens", "2"]
    code, _, err = cli(capsys, *base, *args)
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and "x" * 100 not in err  # the name is cut in the message


def test_a_head_config_with_wrong_field_types_exits_2_with_one_line(saved_model, capsys, tmp_path):
    (tmp_path / "head_config.json").write_text(json.dumps(
        {"head_type": "lowrank", "exit_layer": 4, "base_model": "m", "base_fingerprint": "abc"}))
    code, out, err = cli(capsys, "generate", "--model", saved_model, "--prompt", "hi", "--exit-head", str(tmp_path))
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and err.count("\n") == 1 and "is not a valid head config" in err, err


@pytest.mark.parametrize("timeout,message", [("0", "0 is out of range"), ("-1", "-1 is out of range"),
                                             ("nan", "nan is out of range"), ("soon", "'soon' is not a number"),
                                             ("0.001", "0.001 is out of range: 1 <= seconds <= 604800"),
                                             ("1e-300", "1e-300 is out of range: 1 <= seconds <= 604800"),
                                             ("1e10", "1e10 is out of range: 1 <= seconds <= 604800 (a week)"),
                                             ("1e308", "1e308 is out of range")])
def test_pipeline_timeout_is_checked_like_every_flag(saved_model, capsys, timeout, message):
    code, _, err = cli(capsys, "pipeline", "--model", saved_model, "--prompt", "hi", "--timeout", timeout)
    assert code == 2 and f"argument --timeout: {message}" in err


def test_a_pipeline_that_fails_is_one_line_and_status_1(saved_model, capsys, monkeypatch):
    from ppsd.cli import pipeline
    from ppsd.executors.distributed.wire import PipelineError

    def hung(*args, **kwargs):
        raise PipelineError("a pipeline worker did not answer within 1 s")

    monkeypatch.setattr(pipeline, "shared_pipeline", hung)
    code, out, err = cli(capsys, "pipeline", "--model", saved_model, "--prompt", "hi", "--timeout", "1")
    assert (code, out) == (1, "")
    assert err.endswith("\n") and err.splitlines()[-1] == \
        "error: the pipeline failed: a pipeline worker did not answer within 1 s"  # after any loading bar
    assert "Traceback" not in err


def test_train_head_refuses_an_out_file_and_binary_data_before_training(saved_model, tmp_path, capsys):
    taken = tmp_path / "head"
    taken.write_text("not a directory")
    code, _, err = cli(capsys, "train-head", "--model", saved_model, "--exit-layer", "4", "--steps", "1",
                       "--out", str(taken))
    assert code == 2 and "is a file, not a folder" in err and taken.read_text() == "not a directory"
    noise = tmp_path / "noise.txt"
    noise.write_bytes(bytes(range(256)) * 64)
    code, _, err = cli(capsys, "train-head", "--model", saved_model, "--exit-layer", "4", "--steps", "1",
                       "--data", str(noise), "--out", str(tmp_path / "out"))
    assert code == 2 and f"data file {str(noise)!r} is not UTF-8 text" in err
    assert not (tmp_path / "out" / "head_config.json").exists()


@pytest.mark.parametrize("name,message", [("noise.jsonl", "is not UTF-8 text"),
                                          ("noise.jsonl.gz", "is not a whole gzip file")])
def test_train_head_names_binary_chat_data_exit_2(saved_model, tmp_path, capsys, name, message):
    noise = tmp_path / name
    noise.write_bytes(bytes(range(256)) * 64)
    code, out, err = cli(capsys, "train-head", "--model", saved_model, "--exit-layer", "4", "--steps", "1",
                         "--data", str(noise), "--out", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert err.endswith("\n") and err.splitlines()[-1].startswith(f"error: data {str(noise)!r} {message}"), err
    assert "Traceback" not in err and not (tmp_path / "out" / "head_config.json").exists()


def test_help_names_the_program_ppsd():
    """`ppsd` is the installed command (pyproject's [project.scripts]); `python -m ppsd` runs the same."""
    for argv in ([sys.executable, "-m", "ppsd", "--help"], [sys.executable, "-m", "ppsd", "generate", "--help"]):
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        assert out.startswith("usage: ppsd "), out.splitlines()[0]
