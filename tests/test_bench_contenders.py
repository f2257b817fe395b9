"""Every bench row a user reads has the tuned contender (issue 39, item 6; tuner/commands/
bench.py): one `tuner bench` run shows, per problem and M, the default, the row each engine
reads today (resolved as a tuning run's incumbent is), our tuned table's row (or a row saying
there is none) and the references. Over a SYNTHETIC landscape (labelled so) and a faithful
constructed vLLM site-packages folder holding one shipped GEMM table."""

import json

import pytest
from engine_loaders import wheel_dir

from tuner.cli import main
from tuner.measure.landscape import read_landscape
from tuner.plan.engines import table_family
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_dict, table_entry
from tuner.plan.kernel_registry import get_kernel

MODEL = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"]
COMMON = [*MODEL, "--engines", "vllm", "--only", "N=7168,K=2048"]
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}


def vllm_site(tmp_path, table: dict):
    family = table_family("vllm", "fp8_gemm")
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm-0.33.0.dist-info").mkdir()
    (root / "triton-3.6.0.dist-info").mkdir()
    folder = root / family.folder
    folder.mkdir(parents=True)
    (folder / family.lookup_name(get_gpu("H200").cuda_name, **P)).write_text(json.dumps(table))
    return root


def rows_of(out):
    data = json.loads(next(out.glob("bench-*.json")).read_text())
    by: dict = {}
    for r in data["rows"]:
        by.setdefault(r["M"], {})[r["contender"]] = r
    return by


# vLLM's GEMM kernel (its config names, its table's form) comes from its wheel
@pytest.mark.ci_variables
@pytest.mark.skipif(wheel_dir() is None, reason="TUNER_ENGINE_WHEELS is not set (.ci/run sets it)")
def test_one_bench_run_shows_default_shipped_as_read_tuned_and_references(gemm_landscape, tmp_path, capsys):
    kernel = get_kernel("fp8_gemm", "vllm")
    land = read_landscape(gemm_landscape, kernel)
    # the shipped row at 64: the landscape's slowest timed point, so that it is told from the others
    points = land.lookup(P, 64)
    slowest = max((p.time_us, cfg) for cfg, p in points.items() if p.time_us)
    shipped_cfg = config_dict(kernel, slowest[1])
    site = vllm_site(tmp_path, {"64": table_entry(kernel, shipped_cfg)})
    run = tmp_path / "run"
    assert main(["gemm", *COMMON, "--batch-sizes", "1", "64", "--replay", str(gemm_landscape), "--trials", "6",
                 "--out", str(run), "--quiet", "--no-warm-start", "--engine-source", str(site)]) == 0
    out = tmp_path / "bench"
    capsys.readouterr()
    assert main(["bench", *COMMON, "--kernel", "gemm", "--batch-sizes", "1", "64", "--replay", str(gemm_landscape),
                 "--engine-source", str(site), "--tuned", str(run), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    by = rows_of(out)
    for M in (1, 64):
        row = by[M]
        assert {"default", "shipped (vllm 0.33.0 reads)", "tuned", "reference"} <= set(row), row.keys()
        assert row["tuned"]["time_us"] and row["default"]["time_us"]
    # the shipped row is the table's (nearest key for M = 1 too), timed from the landscape
    assert by[64]["shipped (vllm 0.33.0 reads)"]["time_us"] == pytest.approx(slowest[0])
    assert by[1]["shipped (vllm 0.33.0 reads)"]["config"] == by[64]["shipped (vllm 0.33.0 reads)"]["config"]
    # the tuned row is our run's, where the run put the row the engine read to the race
    manifest = json.loads((run / "manifest.json").read_text())
    entry = manifest["tables"][0]["entries"]["64"]
    assert entry["choice"]["incumbent"] == "installed" and "configs/N=7168,K=2048" in entry["choice"]["incumbent_table"]
    assert by[64]["tuned"]["time_us"] == pytest.approx(entry["time_us"])
    table = [line for line in printed.splitlines() if " M " in line or "vllm" in line]
    assert any("shipped (vllm 0.33.0 reads)" in line for line in table) and max(map(len, table)) <= 120
    # without --tuned, the tuned row says so instead of going missing
    out2 = tmp_path / "bench2"
    assert main(["bench", *COMMON, "--kernel", "gemm", "--batch-sizes", "64", "--replay", str(gemm_landscape),
                 "--engine-source", str(site), "--out", str(out2), "--quiet"]) == 0
    tuned = rows_of(out2)[64]["tuned"]
    assert tuned["time_us"] is None and tuned["error"] == "no tuned table: give --tuned RUN_DIR"
