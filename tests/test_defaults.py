"""One default config per table, taken by tuning and by drift alike (tuner/defaults.py):
SGLang's `_down` MoE table is compared with the default that has the up table's
BLOCK_SIZE_M; a default that failed is shown with its reason, never as NaN. Timings from
SYNTHETIC landscapes (tuner/synthetic.py)."""

import json
import re

import pytest

from kernels import get_kernel
from synthetic import scaled_landscape, write_synthetic_landscape
from tuner.cli import main
from tuner.defaults import table_default
from tuner.gpus import get_gpu
from tuner.landscape import LandscapeWriter, Point, read_landscape
from tuner.models import load_model, moe_problems
from tuner.space import load_space

KERNEL = get_kernel("fused_moe")
GPU = get_gpu("H200")
MS = [1, 64]
FOLDER = "sglang/fused_moe/triton_3_6_0"


@pytest.fixture(scope="module")
def problems():
    return [p.params for p in moe_problems(load_model("deepseek-v3"), 8, 1, "fp8_w8a8", "uniform", ["sglang"])]


@pytest.fixture(scope="module")
def landscape(tmp_path_factory, problems):
    """Up configs with another BLOCK_SIZE_M than the engine default's made 3x faster, so
    that the up table ties the `_down` table to a BLOCK_SIZE_M the default does not have."""
    d = tmp_path_factory.mktemp("defaults")
    write_synthetic_landscape(d / "raw.jsonl", KERNEL, load_space(KERNEL), GPU, problems, MS)
    return scaled_landscape(d / "raw.jsonl", d / "sglang-moe.jsonl", KERNEL, 1 / 3, only=lambda params, M, c: (
        params["part"] == "up" and c["BLOCK_SIZE_M"] != KERNEL.default_config(params, M)["BLOCK_SIZE_M"]))


def tune(land, out, capsys):
    capsys.readouterr()
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--engines", "sglang",
                 "--replay", str(land), "--trials", "12", "--batch-sizes", *map(str, MS), "--out", str(out)]) == 0
    return capsys.readouterr().out


def drift(land, out, capsys):
    capsys.readouterr()
    rows = out / "drift.json"
    assert main(["drift", str(out / FOLDER), "--gpu", "H200", "--model", "deepseek-v3", "--replay", str(land),
                 "--out", str(rows)]) == 0
    return capsys.readouterr().out, json.loads(rows.read_text())


def test_drift_times_the_default_tuning_compared_with(landscape, tmp_path, capsys):
    out = tmp_path / "run"
    tune(landscape, out, capsys)
    manifest = json.loads((out / "manifest.json").read_text())
    tuned = {(t["problem"]["part"], int(m)): e for t in manifest["tables"] for m, e in t["entries"].items()}
    _, rows = drift(landscape, out, capsys)
    timed = {("down" if "part=down" in r["problem"] else "up", r["M"]): r for r in rows}
    assert set(timed) == set(tuned)
    for key, e in tuned.items():
        assert timed[key]["default_us"] == pytest.approx(e["default_time_us"]), key
    # the tie mattered: at some M the up table's BLOCK_SIZE_M is not the engine default's, so
    # timing the untied default there (as drift did before) would give another number
    down = next(t["problem"] for t in manifest["tables"] if t["problem"]["part"] == "down")
    for M in MS:
        assert tuned["down", M]["default_config"]["BLOCK_SIZE_M"] == tuned["up", M]["config"]["BLOCK_SIZE_M"]
    assert any(tuned["down", M]["default_config"]["BLOCK_SIZE_M"] != KERNEL.default_config(down, M)["BLOCK_SIZE_M"]
               for M in MS)              # at M=1 only BLOCK_SIZE_M 16 is in the space


def test_a_failed_default_shows_its_reason(landscape, problems, tmp_path, capsys):
    """The `_down` default fails at M=64 whatever BLOCK_SIZE_M the up table picks: the
    closing table, the manifest, the report and drift all give the reason, none a NaN."""
    space = load_space(KERNEL)
    down = next(p for p in problems if p["part"] == "down")
    broken = {tuple(sorted(table_default(KERNEL, space, GPU, down, 64, {"BLOCK_SIZE_M": bm}).items()))
              for bm in space.choices["BLOCK_SIZE_M"]}
    land = read_landscape(landscape, KERNEL)
    failing = tmp_path / "failing.jsonl"
    w = LandscapeWriter(failing, KERNEL, land.header)
    for (key, M), pts in land.points.items():
        for cfg_t, p in pts.items():
            cfg = dict(zip(KERNEL.config_keys, cfg_t))
            params = land.problems[key]
            if params["part"] == "down" and M == 64 and tuple(sorted(cfg.items())) in broken:
                p = Point(None, "OutOfResources: shared memory")
            w.write(params, M, cfg, p)
    w.close()

    out = tmp_path / "run"
    closing = tune(failing, out, capsys)
    down_rows = [ln for ln in closing.splitlines() if re.search(r"part=down,routing=uniform +64 ", ln)]
    assert len(down_rows) == 1 and "failed: OutOfResources: shared memory" in down_rows[0]
    assert "NaN" not in closing and "nan" not in closing
    manifest = json.loads((out / "manifest.json").read_text())
    entry = next(t for t in manifest["tables"] if t["problem"]["part"] == "down")["entries"]["64"]
    assert entry["default_time_us"] is None and entry["default_error"] == "OutOfResources: shared memory"
    assert entry["config"] is not None and entry["speedup"] is None

    assert main(["report", str(out)]) == 0
    report = capsys.readouterr().out
    assert "failed: OutOfResources: shared memory" in report and "NaN" not in report

    printed, rows = drift(failing, out, capsys)
    row = next(r for r in rows if "part=down" in r["problem"] and r["M"] == 64)
    assert row["default_us"] is None and row["default_error"] == "OutOfResources: shared memory"
    assert "failed: OutOfResources: shared memory" in printed and "NaN" not in printed
