"""The GPU proof's flow on a CPU (tuner proof --fake): every step runs, writes its results
before the next, says SYNTHETIC, keeps within its time box; the shell wrapper bundles it."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.gpus import get_gpu
from tuner.proof import Proof
from tuner.proof_summary import engine_vs_ours

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def proof_dir(tmp_path_factory, request):
    out = tmp_path_factory.mktemp("proof") / "p"
    shared = REPO.parent / "shared" / "baselines"
    args = ["proof", "--fake", "--gpu", "H200", "--minutes", "6", "--out", str(out)]
    if shared.is_dir():
        args += ["--baselines", str(shared)]
    assert main(args) == 0
    return out


def test_fake_proof_runs_every_step(proof_dir):
    steps = json.loads((proof_dir / "steps.json").read_text())
    status = {s["name"]: s["status"] for s in steps["steps"]}
    assert status == {"environment": "skipped", "validate": "ok" if (REPO.parent / "shared").is_dir() else "skipped",
                      "landscapes": "ok", "tune": "ok", "bench": "ok", "sampler": "ok"}
    summary = (proof_dir / "summary.md").read_text()
    assert summary.startswith("# GPU proof\n\n*** FAKE RUN")
    assert "SYNTHETIC" in summary and "## Bench moe" in summary and "## Sampler study: gemm" in summary
    for land in ("gemm", "moe"):
        with gzip.open(proof_dir / "landscapes" / f"{land}.jsonl.gz", "rt") as f:
            assert json.loads(f.readline())["synthetic"] is True
    assert (proof_dir / "tuned" / "moe-deepseek-v3-tp8" / "manifest.json").is_file()
    bench = json.loads(next((proof_dir / "bench" / "moe").glob("bench-*.json")).read_text())
    assert bench["synthetic"] is True and bench["rows"]


def test_fake_proof_checks_a_shipped_table_on_the_engine_kernel(proof_dir):
    if not (REPO.parent / "shared" / "baselines").is_dir() or not os.environ.get("TUNER_ENGINE_WHEELS"):
        pytest.skip("needs ../shared/baselines and TUNER_ENGINE_WHEELS (.ci/run provides both)")
    [check] = (proof_dir / "validate").glob("check-vllm-*.txt")
    text = check.read_text()
    assert "kernel: vLLM's fused MoE" in text and text.rstrip().endswith("1 passed, 0 failed")


def test_steps_out_of_time_say_so_and_the_rest_still_report(tmp_path):
    proof = Proof(tmp_path / "p", get_gpu("H200"), minutes=0.02, fake=True)   # 1.2 s for everything
    assert proof.execute(log=lambda line: None) == 0
    steps = {s["name"]: s for s in json.loads((tmp_path / "p" / "steps.json").read_text())["steps"]}
    assert steps["landscapes"]["status"] == "out of time"
    assert any("out of time" in d for d in steps["landscapes"]["detail"])
    assert (tmp_path / "p" / "summary.md").is_file()


def test_a_proof_split_over_calls_keeps_earlier_steps(proof_dir, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(proof_dir, copy)
    proof = Proof(copy, get_gpu("H200"), minutes=2, fake=True)
    assert proof.execute(log=lambda line: None, only=["sampler"]) == 0
    names = [s["name"] for s in json.loads((copy / "steps.json").read_text())["steps"]]
    assert sorted(names) == sorted(["environment", "validate", "landscapes", "tune", "bench", "sampler"])


def test_a_partial_landscape_is_kept_gzipped(tmp_path):
    proof = Proof(tmp_path, get_gpu("H200"), minutes=1, fake=True)
    land = tmp_path / "landscapes"
    land.mkdir()
    (land / "gemm.jsonl.gz.partial").write_text('{"format": "tuner-landscape/1"}\n{"M": 1}\n')
    assert proof.keep_partial_landscapes() == ["gemm.partial.jsonl.gz"]
    with gzip.open(land / "gemm.partial.jsonl.gz", "rt") as f:
        assert f.read().count("\n") == 2
    assert not (land / "gemm.jsonl.gz.partial").exists()


def test_engine_vs_ours_ratio():
    rows = [{"problem": "p", "M": 1, "contender": "shipped vllm-0.33.0", "kernel_source": "vllm 0.33.0", "time_us": 10.0},
            {"problem": "p", "M": 1, "contender": "shipped vllm-0.33.0", "kernel_source": "ours", "time_us": 15.0},
            {"problem": "p", "M": 1, "contender": "landscape best", "kernel_source": "ours", "time_us": 1.0},
            {"problem": "p", "M": 16, "contender": "default", "kernel_source": "ours", "time_us": None}]
    [r] = engine_vs_ours(rows)
    assert r["ours / engine"] == pytest.approx(1.5) and r["engine kernel"] == "vllm 0.33.0"


def test_the_shell_wrapper_bundles_results_for_the_device_tool(tmp_path):
    out_dir = tmp_path / "OUT"
    out_dir.mkdir()
    env = {**os.environ, "OUT": str(out_dir), "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    r = subprocess.run(["bash", "scripts/gpu_proof.sh", "--fake", "--gpu", "H200", "--minutes", "0.05",
                        "--out", str(tmp_path / "res" / "p"), "--steps", "environment"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    [tarball] = out_dir.glob("proof-H200-*.tar.gz")
    assert (out_dir / "summary.md").read_text().startswith("# GPU proof")
    listing = subprocess.run(["tar", "tzf", str(tarball)], capture_output=True, text=True).stdout.split()
    assert "p/summary.md" in listing and "p/steps.json" in listing
