"""The verdict per batch size (tuner/emit/verdict.py): on the committed H200 benches, which
contender was fastest at each M and which backend flag each engine should run, as `tuner report
BENCH.json` prints it (and `tuner bench` after its table); the flags are the engines' own (read
in their wheels)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tuner.emit.verdict import per_m, verdict_lines
from tuner.plan.engines import ENGINES

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "results" / "H200-2026-11-27"
GEMM_BENCH = RUN / "extra" / "bench-gemm" / "bench-NVIDIA_H200-2026-11-27.json"
MOE_BENCH = RUN / "bench" / "moe" / "bench-NVIDIA_H200-2026-11-27.json"


def report(path, columns: str | None = "120"):
    """`tuner report` as a 120-column terminal shows it (piped without $COLUMNS, lines go whole)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "tuner", "report", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={**env, **({"COLUMNS": columns} if columns else {})})


def test_the_h200_gemm_bench_says_cublaslt_wins_and_to_keep_each_engines_default_backend():
    got = report(GEMM_BENCH)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0].startswith("times: measured on the GPU (NVIDIA H200)")
    assert all(len(line) <= 120 for line in lines)
    text = " ".join(line.strip() for line in lines)
    # N=4608,K=7168: torch._scaled_mm fastest from M=16 on; the shipped Triton config only at M=1
    assert ("vllm 0.33.0 N=4608,K=7168: fastest M=1 shipped sglang-0.5.23, M=16 torch._scaled_mm, "
            "M=128 torch._scaled_mm, M=1024 torch._scaled_mm") in text
    assert text.count("no --linear-backend triton") == 3 and text.count("no --fp8-gemm-backend triton") == 3
    verdicts = {(v["kernel_source"], v["problem"], v["M"]): v for v in per_m(json.loads(GEMM_BENCH.read_text())["rows"])}
    v = verdicts[("vllm 0.33.0", "N=4608,K=7168,block_shape=[128,128]", 1024)]
    assert v["fastest"].startswith("torch._scaled_mm") and v["triton_us"] / v["other_us"] > 1.3


def test_the_h200_moe_bench_says_the_triton_tables_are_read_by_default():
    got = report(MOE_BENCH)
    assert got.returncode == 0, got.stderr
    assert got.stdout.count("runs its Triton kernel by default") == 3
    assert "sglang 0.5.23 E=257,shared_experts=1,part=up: fastest M=1 tuned, M=16 tuned" in got.stdout


def rows(times: dict):
    return [{"kernel_source": "vllm 0.33.0", "problem": "N=8,K=8,block_shape=[128,128]", "M": m, "contender": c,
             "time_us": t} for (m, c), t in times.items()]


def test_where_triton_wins_weighted_by_traffic_the_flag_and_its_gain_are_said():
    times = {(1, "tuned"): 10.0, (1, "torch._scaled_mm"): 20.0, (64, "tuned"): 40.0, (64, "torch._scaled_mm"): 20.0}
    alike = " ".join(verdict_lines(rows(times), "fp8_gemm"))
    assert "keep the default" in alike and "1.25x" in alike          # (10+40)/2 against 20, each M alike
    decode = " ".join(verdict_lines(rows(times), "fp8_gemm", served={1: 0.9, 2: 0.05, 80: 0.05}))
    # M=1 and 2 count at 1, 80 at 64: 0.95*10 + 0.05*40 = 11.5 against 20: Triton 1.74x faster
    assert "run --linear-backend triton: the best Triton config is 1.74x faster" in decode


@pytest.mark.ci_variables
def test_every_backend_flag_is_the_engines_own_in_every_wheel():
    folder = Path(os.environ.get("TUNER_ENGINE_WHEELS", ""))
    wheels = sorted(folder.glob("*.whl")) if str(folder) else []
    if not wheels:
        pytest.skip("no engine wheels in $TUNER_ENGINE_WHEELS")
    checked = 0
    for wheel in wheels:
        engine = ENGINES.get(wheel.name.split("-")[0])
        if engine is None:
            continue
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            for kind, flag in engine.triton_flags.items():
                texts = [z.read(f).decode() for f in flag.source_files if f in names]
                assert any(flag.source_text in t for t in texts), (wheel.name, kind)
                checked += 1
    assert checked >= 4


def test_a_file_that_is_no_bench_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"format": "something else"}))
    got = report(bad, columns=None)             # piped: the error is one line to grep
    assert got.returncode == 2 and len(got.stderr.strip().splitlines()) == 1 and "not a bench file" in got.stderr
