"""The tuning API (tuner/api.py) that the command line and `tuner nightly` both call: no
module imports the command line, and a request's options are checked where they enter."""

import ast
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from tuner import api
from tuner.cli import build_parser, main
from tuner.errors import TunerError
from tuner.jobs.nightly import job_request

TUNER = Path(__file__).resolve().parents[1] / "tuner"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_only_the_entry_point_imports_the_command_line():
    importers = sorted(str(p.relative_to(TUNER)) for p in TUNER.rglob("*.py") if "tuner.cli" in imported_modules(p))
    assert importers == ["__main__.py"]


def test_the_help_loads_no_heavy_library():
    # every command module's parser is built for `tuner --help`: their heavy imports wait for a run
    code = ("import sys; from tuner.cli import build_parser; build_parser().format_help(); "
            "print(' '.join(m for m in ('torch', 'triton', 'optuna', 'pandas', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []


HEAVY = ("torch", "triton", "optuna", "pandas")


@pytest.mark.parametrize("argv", [
    ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8"],         # the mission's command
    ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--kernel-source", "ours"],
    ["mla", "--model", "deepseek-v3", "--gpu", "H200"],
    ["moe", "--model", "deepseek-v3", "--gpu", "H200", "--synthetic"],
], ids=["moe", "gemm-ours", "mla", "moe-synthetic"])
def test_a_dry_run_loads_no_heavy_library(argv, tmp_path):
    """A plan reads the kernels' specs, not their code: no torch, Triton, Optuna or pandas is
    imported (with the engines' wheels at hand, where .ci/run sets them, their code is read and
    hashed, still without importing Triton). What made the mission's dry run take 7.9 s."""
    code = ("import sys, io, contextlib; from tuner.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    rc = main({[*argv, '--dry-run']!r})\n"
            "assert rc == 0 and 'plan: ' in out.getvalue(), out.getvalue()\n"
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**__import__("os").environ, "PYTHONPATH": str(TUNER.parent)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [], f"a dry run imported {r.stdout.strip()}"


def test_a_replay_loads_no_torch(tmp_path):
    """A run that times from a landscape never touches a device: counting the GPUs (which
    imports torch, 1.4 s of every replayed or synthetic run) is left to runs that measure."""
    code = ("import sys, io, contextlib; from tuner.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    rc = main(['moe', '--model', 'deepseek-v3', '--gpu', 'H200', '--tp', '8', '--synthetic',\n"
            "               '--batch-sizes', '1', '--trials', '3', '--out', 'run', '--quiet'])\n"
            "assert rc == 0, rc\n"
            "print('torch' in sys.modules, 'optuna' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**__import__("os").environ, "PYTHONPATH": str(TUNER.parent)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"], r.stdout      # it ran (Optuna), without torch
    assert (tmp_path / "run" / "manifest.json").is_file()


def test_a_request_from_the_command_line_has_every_option():
    args = build_parser().parse_args(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--trials", "9",
                                      "--batch-sizes", "1", "16", "--routing", "zipf", "--engines", "sglang"])
    req = api.TuneRequest.from_args(args)
    assert (req.command, req.model, req.gpu, req.tp, req.trials, req.batch_sizes, req.routing, req.engines) == \
        ("moe", "deepseek-v3", "H200", 8, 9, [1, 16], "zipf", ["sglang"])
    # every option of the tuning commands is a field of the request (none silently dropped)
    options = {a.dest for a in build_parser()._subparsers._group_actions[0].choices["mla"]._actions} - {"help"}
    assert options <= {f.name for f in fields(api.TuneRequest)}


def test_a_nightly_job_becomes_the_same_request(tmp_path):
    job = {"name": "a", "kernel": "gemm", "model": "m.yaml", "gpu": "H200", "tp": 2, "trials": "10",
           "batch_sizes": [1, 16], "replay": tmp_path / "l.jsonl", "kernel_source": "ours", "install": {}}
    req = job_request(job, tmp_path / "out", tmp_path / "prev")
    assert (req.command, req.model, req.tp, req.batch_sizes, req.replay, req.kernel_source, req.quiet) == \
        ("gemm", "m.yaml", 2, [1, 16], str(tmp_path / "l.jsonl"), "ours", True)
    assert req.out == str(tmp_path / "out") and req.baseline == str(tmp_path / "prev")
    assert req.trials == 10                                            # "10" from YAML is fine


@pytest.mark.parametrize("change,needle", [
    ({"trials": "lots"}, "--trials must be an integer, not 'lots'"),
    ({"tp": 0}, "--tp must be at least 1, not 0"),
    ({"batch_sizes": []}, "--batch-sizes takes a list of integers"),
    ({"batch_sizes": [1, -4]}, "--batch-sizes must be at least 1, not -4"),
    ({"compile_workers": True}, "--compile-workers must be an integer"),
    ({"sampler": "grid"}, "--sampler 'grid' is not one of gp, tpe, random"),
    ({"sampler": "cmaes"}, "--sampler cmaes was removed: Optuna's CMA-ES leaves categorical parameters"),
    ({"min_gain": 1.5}, "--min-gain must be at least 0 and below 1"),
    ({"timing": "fast"}, "--timing 'fast' is not one of graph, eager"),
    ({"l2": "hot"}, "--l2 'hot' is not one of cold, warm"),
    ({"kernel_source": "trtllm"}, "--kernel-source 'trtllm' is not one of engine, ours, vllm, sglang"),
    ({"kernel_source": "vllm", "engines": ["sglang"]}, "--kernel-source vllm times vllm's tables only"),
    ({"device": "tpu"}, "--device 'tpu' is not one of cuda, cpu"),
    ({"engines": ["trtllm"]}, "--engines takes some of vllm, sglang"),
    ({"command": "conv"}, "unknown tuning command 'conv'"),
    # what only Python or a YAML can give: one TunerError, never a TypeError deep in the plan
    ({"model": None}, "--model takes a model's name or the path of its config.json, not None"),
    ({"gpu": 7}, "--gpu takes a GPU's name (H100, H200, ...), not 7"),
    ({"out": 5}, "--out takes a text (a name, a path or a URL), not 5"),
    ({"gpus": 3}, "--gpus takes a text"),
    ({"only": "N=7168"}, "--only takes a list of texts, not 'N=7168'"),        # not its letters, one by one
    ({"quiet": "no"}, "--quiet is a switch (true or false), not 'no'"),
    ({"dry_run": "yes"}, "--dry-run is a switch"),
    ({"sampler": {"x": 1}}, "--sampler {'x': 1} is not one of gp, tpe, random"),
    ({"dtype": "bf16"}, "--dtype bf16 is not supported by `tuner gemm`"),
    # the command line's bounds (tuner/commands/options.py), every way a request is made
    ({"batch_sizes": [1 << 21]}, "--batch-sizes must be at most 1048576, not 2097152"),
    ({"trials": 10 ** 12}, "--trials must be at most 1048576"),
    ({"tp": 2048}, "--tp must be at most 1024, not 2048"),
    ({"page_size": 48}, "--page-size must be a power of two, not 48"),
])
def test_bad_options_are_refused_naming_the_option(change, needle):
    with pytest.raises(TunerError) as e:         # checked as the request is made, before it is run
        api.tune(api.TuneRequest(**{"command": "gemm", "model": "deepseek-v3", "gpu": "H200", **change}))
    assert needle in str(e.value)


def test_an_engine_named_twice_is_planned_once():
    req = api.TuneRequest(command="moe", model="deepseek-v3", gpu="H200", engines=["vllm", "vllm"])
    assert req.engines == ["vllm"]


def test_paths_may_be_path_objects(tmp_path):
    req = api.TuneRequest(command="gemm", model="deepseek-v3", gpu="H200", out=tmp_path, only=["N=7168"])
    assert req.out == str(tmp_path) and req.only == ["N=7168"]


def test_a_nightly_job_with_a_bad_option_refuses_the_night_before_it_writes(tmp_path, capsys):
    """A job's options are checked with the config, before the night writes anything (issue
    33: a night refused after writing its folder, state and report left them behind): one
    line naming the first bad job, exit 2, no night folder."""
    jobs = [{"name": "bad", "kernel": "gemm", "model": "deepseek-v3", "gpu": "H200", "trials": "lots"},
            {"name": "also", "kernel": "mla", "model": "deepseek-v3", "gpu": "H200", "page_size": 64, "tp": -1}]
    cfg = tmp_path / "n.yaml"
    cfg.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "runs"), "jobs": jobs}))
    assert main(["nightly", str(cfg), "--night", "n1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.strip().endswith("job 'bad': --trials must be an integer, not 'lots' (nothing was run)")
    jobs[0]["trials"] = 4
    cfg.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "runs"), "jobs": jobs}))
    assert main(["nightly", str(cfg), "--night", "n1"]) == 2
    assert "job 'also': --tp must be at least 1, not -1" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "n1" / "bad").exists()


# The jobs' commands and their requests (issue 53): each command's options are fields of its request.
JOB_REQUESTS = {"proof": "ProofRequest", "nightly": "NightlyRequest", "drift": "DriftRequest", "bench": "BenchRequest",
                "report": "ReportRequest", "diff": "DiffRequest"}


@pytest.mark.parametrize("command", sorted(JOB_REQUESTS))
def test_a_jobs_request_has_every_option_of_its_command(command):
    request = getattr(api, JOB_REQUESTS[command])
    options = {a.dest for a in build_parser()._subparsers._group_actions[0].choices[command]._actions} - {"help"}
    assert options and options <= {f.name for f in fields(request)}, options - {f.name for f in fields(request)}


def test_a_job_runs_from_python_as_from_the_command_line(capsys):
    """tuner.api.proof(ProofRequest(...)) prints what `tuner proof` prints and returns its status
    (here --plan: the steps' time boxes, no GPU needed)."""
    assert main(["proof", "--plan", "--device", "cpu", "--minutes", "9"]) == 0
    printed = capsys.readouterr().out
    assert api.proof(api.ProofRequest(plan=True, device="cpu", minutes=9)) == 0
    assert capsys.readouterr().out == printed and "window" in printed
    with pytest.raises(TunerError, match="--minutes must be more than 0"):
        api.proof(api.ProofRequest(plan=True, device="cpu", minutes=0))
