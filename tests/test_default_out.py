"""Where a tuning run writes without --out (issue 41, item 1): runs/COMMAND-MODEL-GPU-tpN is the
GPU run's folder; a run whose times no GPU took (--synthetic, a replay of a SYNTHETIC landscape,
the CPU device or a replay of its landscape) says so in its folder's name and leaves the GPU
run's alone. tests/test_readme.py checks that no README or docs command run here writes a
folder of the GPU run's name."""

import gzip
import json
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.pipeline.planning import out_dir
from tuner.pipeline.request import TuneRequest

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "landscapes" / "NVIDIA_H200" / "fp8_gemm.vllm-deepseek-v3-tp8.jsonl.gz"


def _landscape(path: Path, **header) -> Path:
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"format": "tuner-landscape/1", **header}) + "\n")
    return path


def _out(tmp_path, **kw) -> str:
    return str(out_dir(TuneRequest(command="moe", model="deepseek-v3", gpu="H200", tp=8, **kw), "deepseek-v3", "H200"))


def test_only_a_gpus_times_go_to_the_gpu_runs_folder(tmp_path):
    synthetic = _landscape(tmp_path / "s.jsonl.gz", synthetic=True, device="NVIDIA H200")
    cpu = _landscape(tmp_path / "c.jsonl.gz", device="cpu", device_kind="cpu")
    assert _out(tmp_path) == "runs/moe-deepseek-v3-H200-tp8"
    assert _out(tmp_path, replay=str(RECORDED)) == "runs/moe-deepseek-v3-H200-tp8"      # an H200's times
    assert _out(tmp_path, synthetic=True) == "runs/moe-deepseek-v3-H200-tp8-synthetic"
    assert _out(tmp_path, replay=str(synthetic)) == "runs/moe-deepseek-v3-H200-tp8-synthetic"
    assert _out(tmp_path, device="cpu") == "runs/moe-deepseek-v3-H200-tp8-cpu-device"
    assert _out(tmp_path, replay=str(cpu)) == "runs/moe-deepseek-v3-H200-tp8-cpu-device"
    assert _out(tmp_path, device="cpu", out="mine") == "mine"                              # --out wins
    assert _out(tmp_path, replay=str(tmp_path / "missing.jsonl.gz")) == "runs/moe-deepseek-v3-H200-tp8"


def test_the_replay_of_a_synthetic_landscape_leaves_the_gpu_runs_folder_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    assert main(["landscape", "synth", "--kernel", "moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                 "--batch-sizes", "1", "--out", "s.jsonl.gz"]) == 0
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", "s.jsonl.gz",
                 "--trials", "2", "--engines", "vllm", "--quiet"]) == 0
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["moe-deepseek-v3-H200-tp8-synthetic"]
    assert (tmp_path / "runs" / "moe-deepseek-v3-H200-tp8-synthetic" / "manifest.json").is_file()


@pytest.mark.parametrize("extra", [["--device", "cpu", "--kernel-source", "ours"], ["--synthetic"]])
def test_the_dry_run_names_the_folder_the_run_writes(extra, capsys):
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dry-run", *extra]) == 0
    out = capsys.readouterr().out
    suffix = "-cpu-device" if "cpu" in extra else "-synthetic"
    assert f"runs/moe-deepseek-v3-H200-tp8{suffix}/" in out
