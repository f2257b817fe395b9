"""Bad input: one clear line on stderr, a non-zero exit, no traceback, no files."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]


def run_main(capsys, tmp_path, *argv):
    out = tmp_path / "out"
    rc = main([*argv, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    return rc, err, out


@pytest.mark.parametrize("argv,needle", [
    (["gemm", "--model", "nope", "--gpu", "H200"], "unknown model 'nope'"),
    (["gemm", "--model", "deepseek-v33", "--gpu", "H200"], "unknown model 'deepseek-v33'; did you mean deepseek-v3? known:"),
    (["gemm", "--model", "DeepSeek_V3", "--gpu", "H200"], "did you mean deepseek-v3?"),
    (["moe", "--model", "qwen3-30b", "--gpu", "H200"], "did you mean qwen3-30b-a3b-gptq-int4?"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--storage", ""], "--storage is empty"),
    # explicit, it is not overridden in silence: --synthetic times one kernel's configs (found by a new-user pass)
    (["moe", "--model", "deepseek-v3", "--gpu", "H200", "--synthetic", "--kernel-source", "engine"],
     "--synthetic times one kernel's configs: ours (kernels/, the default) or one engine's"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "B200"], "unknown GPU 'B200'"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "3"], "--tp 3 does not divide"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "0"], "--tp: must be from 1 to 1024"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--ep", "3"], "--ep 3 does not divide"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "bf16"], "--dtype bf16 is not supported"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--replay", "missing.jsonl"], "landscape missing.jsonl not found"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--batch-sizes", "0"], "--batch-sizes: must be from 1 to 1048576"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--sampler", "grid"], "invalid choice: 'grid'"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--baseline", "nowhere"], "--baseline nowhere is not a folder"),
    (["gemm", "--model", "models/none.json", "--gpu", "H200"], "model file models/none.json not found"),
    (["gemm", "--gpu", "H200"], "--model"),
    # no GPU here (our kernel, so that the engines' code is not looked for first)
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--kernel-source", "ours"], "no CUDA GPU is visible"),
])
def test_bad_input_one_line_exit_2(capsys, tmp_path, argv, needle):
    rc, err, out = run_main(capsys, tmp_path, *argv)
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("tuner: error: ") and needle in err
    assert not out.exists()


@pytest.mark.parametrize("content,needle", [
    ("{broken", "is not valid JSON"),
    ('{"hidden_size": 7168}', "lacks the field 'num_attention_heads'"),
    ('{"hidden_size": "big", "num_attention_heads": 8}', "must be a non-negative integer"),
    ('[1, 2]', "does not hold a mapping"),
])
def test_malformed_model_files(capsys, tmp_path, content, needle):
    f = tmp_path / "config.json"
    f.write_text(content)
    rc, err, out = run_main(capsys, tmp_path, "gemm", "--model", str(f), "--gpu", "H200", "--dry-run")
    assert rc == 2 and needle in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("content,needle", [
    ("", "is empty"),
    ('{"format": "other"}\n', "must be a header"),
    ('{"format": "tuner-landscape/1", "kernel": "fused_moe", "device": "NVIDIA H200"}\n', "holds kernel 'fused_moe'"),
    ('{"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200"}\n{"M": 1}\n', "line 2 is malformed"),
])
def test_malformed_landscapes(capsys, tmp_path, content, needle):
    f = tmp_path / "land.jsonl"
    f.write_text(content)
    rc, err, out = run_main(capsys, tmp_path, "gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                            "--replay", str(f))
    assert rc == 2 and needle in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_dry_run_writes_nothing_and_names_files(capsys, tmp_path):
    rc = main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--dry-run",
               "--out", str(tmp_path / "out"), "--batch-sizes", "1", "64"])
    text = capsys.readouterr().out
    assert rc == 0 and not (tmp_path / "out").exists()
    assert "2880 configs before pruning" in text
    assert "configs after pruning, per M: 1:32 64:160" in text      # BLOCK_SIZE_K 64 pruned (block_k_is_group)
    assert "vllm/fp8_gemm/N=4096,K=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json" in text
    assert "sglang/fp8_gemm/N=4096,K=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json" in text
    # SGLang fuses the shared expert: no SGLang file for its GEMMs
    assert "sglang/fp8_gemm/N=512,K=7168" not in text and "vllm/fp8_gemm/N=512,K=7168" in text


@pytest.mark.parametrize("tp,shape", [(1, "N=36864,K=7168"), (4, "N=9216,K=7168"), (8, "N=4608,K=7168")])
def test_dry_run_plan_per_tp(capsys, tp, shape):
    # no TP of one H100 node holds DeepSeek-V3: these are one rank's shapes on purpose
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H100", "--tp", str(tp), "--per-rank", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"vllm/fp8_gemm/{shape},device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json" in text
    assert "8 problems x 18 batch sizes = 144 studies" in text


def test_no_traceback_from_the_real_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "tuner", "gemm", "--model", "deepseek-v3", "--gpu", "H200",
                        "--tp", "8", "--kernel-source", "ours", "--out", str(tmp_path / "o")],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "--dry-run" in r.stderr and "--synthetic" in r.stderr      # what works without a GPU (issue 41)


@pytest.mark.parametrize("argv,hint", [
    (["drift", "t.json", "--gpu", "H200", "--bogus"], "tuner drift --help"),
    (["gemm", "--model", "deepseek-v3", "--gpu", "H200", "extra"], "tuner gemm --help"),
    (["landscape", "info", "x.jsonl", "--bogus"], "tuner landscape info --help"),
    (["--bogus"], "tuner --help"),
])
def test_argument_errors_point_at_the_subcommands_help(capsys, argv, hint):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unrecognized arguments" in err and f"(see `{hint}`)" in err


def test_drift_without_a_gpu_says_what_it_can_do(capsys, tmp_path):
    table = tmp_path / "N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    table.write_text('{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, '
                     '"num_warps": 4, "num_stages": 3}}')
    assert main(["drift", str(table), "--gpu", "H200", "--kernel-source", "ours"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA GPU is visible" in err
    assert "--replay FILE" in err and "--dry-run" not in err          # drift has no --dry-run


def test_drift_help_explains_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["drift", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--noise NOISE a difference smaller than this fraction" in text
    assert "--routing {uniform,zipf} fused MoE: how tokens are routed" in text


def _files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("argv,needle", [
    (["--synthetic", "--batch-sizes", "1", "--trials", "4"],
     "holds tables measured on a GPU ({manifest}); this run's would be of SYNTHETIC times"),
    (["--synthetic", "--batch-sizes", "1", "--trials", "4", "--dry-run"], "this run's would be of SYNTHETIC times"),
    (["--device", "cpu", "--dry-run"], "this run's would be timed on the CPU device"),
    (["--gpu", "H100", "--tp", "16", "--dry-run"], "holds tables for H200 ({manifest}); this run is for H100"),
    (["--model", "mixtral-8x7b", "--dtype", "bf16", "--dry-run"],
     "holds tables for deepseek-v3 ({manifest}); this run is for mixtral-8x7b"),
])
def test_a_run_never_writes_into_a_folder_of_other_times(capsys, tmp_path, argv, needle):
    """--out holding a GPU run's tables (a copy of tuned/NVIDIA_H200) takes no SYNTHETIC or CPU-device tables and
    no other GPU's, and no other model's (its manifest names one model for all its tables, which install and audit
    read; another model's run there headed it with its own model and replaced the first's landscape): one line, the
    folder unchanged. Before, --synthetic into it replaced the measured rows of
    vLLM's table with SYNTHETIC ones, deleted SGLang's _down table and listed each file twice in the manifest,
    whose report then said nothing of SYNTHETIC (found by a new-user pass)."""
    import shutil
    out = tmp_path / "gpu-run"
    shutil.copytree(REPO / "tuned" / "NVIDIA_H200", out)
    before = _files(out)
    base = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8"]
    for option in ("--gpu", "--model", "--dtype"):
        given = argv.index(option) if option in argv else None
        if given is not None:
            base[base.index(option) + 1] = argv[given + 1]
            argv = argv[:given] + argv[given + 2:]
    assert main([*base, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"tuner: error: --out {out} " + err.split(f"--out {out} ", 1)[1]], err
    assert needle.format(manifest=out / "manifest.json") in err, err
    assert _files(out) == before


def test_a_synthetic_run_goes_on_in_its_own_folder(capsys, tmp_path):
    """The same check lets a run continue its own folder: a --synthetic run twice into one --out."""
    argv = ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic", "--batch-sizes",
            "1", "--trials", "4", "--quiet", "--out", str(tmp_path / "syn")]
    assert main(argv) == 0
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize("where", ["loading the commands", "building the parser", "SIGTERM loading the commands"])
def test_a_ctrl_c_before_the_command_begins_is_one_line(tmp_path, where):
    """A Ctrl-C in the first fraction of a second (the commands loading, the parser built: before main's own
    handler) is one line and exit 130, as later. Before, a new user's `timeout -s INT 0.2 tuner moe ...` got a
    KeyboardInterrupt traceback in several of 24 tries. The interrupt is raised where it lands, deterministically."""
    if where == "SIGTERM loading the commands":      # it died silently, 143 by the signal (an attacker's pass)
        land = ("import builtins, os, signal, time\nreal = builtins.__import__\n"
                "def imp(name, *a, **k):\n"
                "    if name == 'tuner.commands' or name.startswith('tuner.commands.'):\n"
                "        os.kill(os.getpid(), signal.SIGTERM)\n"
                "        time.sleep(5)\n"
                "    return real(name, *a, **k)\n"
                "builtins.__import__ = imp\n")
    elif where == "loading the commands":
        land = ("import builtins\nreal = builtins.__import__\n"
                "def imp(name, *a, **k):\n"
                "    if name == 'tuner.commands' or name.startswith('tuner.commands.'):\n"
                "        raise KeyboardInterrupt\n"
                "    return real(name, *a, **k)\n"
                "builtins.__import__ = imp\n")
    else:
        land = ("import tuner.cli\n"
                "def interrupted():\n    raise KeyboardInterrupt\n"
                "tuner.cli.build_parser = interrupted\n")
    code = land + "import sys\nsys.argv = ['tuner', 'moe', '--model', 'deepseek-v3', '--gpu', 'H200', '--dry-run']\n" \
                  "from tuner.__main__ import run\nraise SystemExit(run())\n"
    got = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    what, code = ("terminated", 143) if where.startswith("SIGTERM") else ("interrupted", 130)
    assert got.returncode == code, got.stderr
    assert got.stderr.strip() == f"tuner: {what} before the command began; nothing was done", got.stderr


def test_the_tuner_command_is_that_entry():
    """pyproject.toml's `tuner` script is the entry that handles an early Ctrl-C (python -m tuner's too)."""
    text = (REPO / "pyproject.toml").read_text()
    assert 'tuner = "tuner.__main__:run"' in text


def test_the_documented_postgresql_url_finds_the_driver_the_extra_installs(capsys, tmp_path):
    """docs/several-gpus.md's `--storage postgresql://user@db/tuner` with the driver `pip install -e ".[postgres]"`
    installs (the test extra holds the same): SQLAlchemy 2.1 reads a bare postgresql:// with psycopg 3, and the
    extra installed psycopg2, so the documented command said 'No module named psycopg' (found by a new-user pass;
    CI's worker test spelled postgresql+psycopg2://). A dry run loads the driver and connects nowhere."""
    extras = (REPO / "pyproject.toml").read_text()
    assert extras.count('"psycopg[binary]>=3.1"') == 2          # the postgres extra and the test extra
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--storage", "postgresql://user@db/tuner",
                 "--dry-run"]) == 0, capsys.readouterr().err


def test_a_ctrl_c_that_an_extensions_import_turns_into_its_own_error_is_an_interruption(monkeypatch, capsys):
    """A Ctrl-C landing while Triton's compiled module is imported came out as 'tuner: internal error:
    ImportError: initialization failed', exit 1 (pybind11 turns the KeyboardInterrupt raised in the
    module's initialisation into that ImportError; a new user saw it once in 140 tries). The signal
    is noted before it is raised, so it is one line and 130 (143 for SIGTERM) wherever it lands; the
    same error with no signal is still an internal error."""
    import os
    import signal
    import time

    from tuner import cli

    def as_pybind11_does(sig):
        def command(args):
            try:
                os.kill(os.getpid(), sig)
                time.sleep(5)            # the handler runs here
            except KeyboardInterrupt:
                raise ImportError("initialization failed") from None
            return 0
        return command
    # as at a terminal: a background job of a non-interactive shell (.ci/run's plain clone) starts with SIGINT
    # ignored, and tuner leaves an ignored SIGINT ignored
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for sig, code, said in ((signal.SIGINT, 130, "tuner: interrupted;"),
                                (signal.SIGTERM, 143, "tuner: terminated;")):
            monkeypatch.setitem(cli.COMMANDS, "report", as_pybind11_does(sig))
            assert cli.main(["report", "somewhere"]) == code
            err = capsys.readouterr().err
            assert said in err and "internal error" not in err
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler         # put back
    finally:
        signal.signal(signal.SIGINT, before)

    def broken(args):
        raise ImportError("initialization failed")
    monkeypatch.setitem(cli.COMMANDS, "report", broken)
    assert cli.main(["report", "somewhere"]) == 1
    assert "internal error: ImportError" in capsys.readouterr().err


def test_another_models_run_is_refused_where_another_deployment_of_the_model_is_taken(capsys, tmp_path):
    """A new user's `tuner moe --model mixtral-8x7b --synthetic ... --out` a DeepSeek-V3 run's folder ran: the
    manifest then named mixtral-8x7b for the DeepSeek tables too (install and audit read the folder's model
    from it) and DeepSeek's synthetic landscape was replaced. Now refused in one line, nothing touched; the
    model's other deployments (TP16 one rank's shapes, as the GPU run's window tunes into one folder) still go in."""
    out = tmp_path / "run"
    small = ["--synthetic", "--batch-sizes", "1", "--trials", "4", "--out", str(out), "--quiet"]
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", *small]) == 0
    capsys.readouterr()
    before = _files(out)
    assert main(["moe", "--model", "mixtral-8x7b", "--gpu", "H200", "--dtype", "bf16", *small]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds tables for deepseek-v3" in err and "for mixtral-8x7b" in err, err
    assert _files(out) == before
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--tp", "16", "--per-rank",
                 *small]) == 0
    # the same model named as its Hugging Face repository is (case aside): taken, not refused
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "model": "DeepSeek-V3"}))
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", *small]) == 0


@pytest.mark.parametrize("argv,said", [
    (["moe", "--modle", "deepseek-v3", "--gpu", "H200"],
     "the following arguments are required: --model; not an option here: --modle (did you mean --model?)"),
    (["audit", "--engine", "vllm", "--gpu", "H200", "--modle", "x"],
     "unrecognized arguments: --modle x (did you mean --model?)"),
    (["moe", "--mod", "deepseek-v3", "--dtype", "fp8_w8a8"],            # a prefix argparse takes is no misspelling
     "the following arguments are required: --gpu (see"),
])
def test_a_misspelt_option_is_named(argv, said, capsys):
    """`tuner moe --modle deepseek-v3 --gpu H200` said only 'the following arguments are required: --model' (argparse
    says what is missing before what it did not know), never naming --modle (a new user's finding)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err
