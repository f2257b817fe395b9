"""A roofline fraction above 1 (beyond the timing's spread) is a bug, not a result: every command
that prints a fraction (`tuner bench`'s terminal table, Markdown and JSON; the proof's summary)
names the wrong figure instead, fed a wrong ceiling."""

import json

import pytest

from tuner.cli import main
from tuner.jobs.proof_summary import summary_markdown
from tuner.measure import ceilings
from tuner.measure.roofline import judge

COMMON = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"]


def test_judge_names_the_figure_that_is_wrong():
    # 1 GB in 250 us: 4 TB/s, within the H200's 4.8 datasheet, so a 2.72 TB/s ceiling is what is wrong
    j = judge(250.0, 0.01, 1e9, 1e9, 2.72, 1439.0, 4.8, 1979.0)
    assert j.fraction is None and j.wrong == "copy ceiling" and "1.47x its floor" in j.error
    # 1 GB in 150 us: 6.7 TB/s, beyond what the HBM can do: the kernel's byte count is wrong
    j = judge(150.0, 0.01, 1e9, 1e9, 4.27, 1439.0, 4.8, 1979.0)
    assert j.fraction is None and j.wrong == "byte count" and "above the datasheet's 4.8" in j.error
    # compute-bound, 2 TFLOP in 1000 us: 2000 TFLOP/s beyond the datasheet's 1979: the FLOP count
    assert judge(1000.0, 0.0, 1.0, 2e12, 4.27, 1439.0, 4.8, 1979.0).wrong == "FLOP count"
    assert judge(1500.0, 0.0, 1.0, 2e12, 4.27, 1000.0, 4.8, 1979.0).wrong == "FP8 rate"
    # above 1 within the timing's spread: at the floor as far as the timing can tell
    assert judge(230.0, 0.03, 1e9, 1.0, 4.27, 1439.0, 4.8, 1979.0).fraction == 1.0
    assert judge(300.0, 0.03, 1e9, 1.0, 4.27, 1439.0, 4.8, 1979.0).fraction == pytest.approx(1e3 / 4.27 / 300)
    assert judge(None, None, 1e9, 1.0, 4.27, 1439.0).fraction is None


def test_bench_fed_a_wrong_ceiling_prints_no_fraction_above_one(tmp_path, capsys, monkeypatch):
    land = tmp_path / "gemm.jsonl.gz"
    assert main(["landscape", "synth", "--kernel", "gemm", *COMMON, "--batch-sizes", "1", "64", "--out", str(land)]) == 0
    wrong = ceilings.Ceilings(0.01, 1439.0, None, "a wrong ceiling (test)", 4.8, 1979.0)
    monkeypatch.setattr(ceilings, "load", lambda *a, **k: wrong)
    out = tmp_path / "bench"
    capsys.readouterr()
    assert main(["bench", *COMMON, "--kernel", "gemm", "--batch-sizes", "1", "64", "--replay", str(land),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(next(out.glob("*.json")).read_text())["rows"]
    timed = [r for r in rows if r["time_us"]]
    assert timed and all(r["floor_us"] > r["time_us"] for r in timed)        # every time beat the wrong floor
    for r in timed:
        assert r["roofline_fraction"] is None and r["roofline_wrong"] == "copy ceiling"
        assert "the copy ceiling (0.01 TB/s) is wrong" in r["roofline_error"]
    md = next(out.glob("*.md")).read_text()
    assert "## Faster than the roofline floor: a figure is wrong" in md and md.count("copy ceiling (0.01") == len(timed)
    percents = [int(w[:-1]) for line in printed.splitlines() for w in line.split() if w.endswith("%") and w[:-1].isdigit()]
    assert all(p <= 100 for p in percents) and "beat its floor: copy ceiling wrong" in printed


def test_the_proof_summary_prints_no_fraction_above_one(tmp_path):
    """Rows as the first H200 run wrote them (M=64: 436 us against a 451 us floor, spread 2.5%)."""
    bench = tmp_path / "bench" / "moe"
    bench.mkdir(parents=True)
    base = {"kernel_source": "vllm 0.33.0", "problem": "E=256,part=op", "contender": "tuned", "error": None}
    rows = [{**base, "M": 16, "time_us": 246.0, "spread": 0.039, "floor_us": 207.0, "roofline_fraction": 0.842},
            {**base, "M": 64, "time_us": 436.0, "spread": 0.0248, "floor_us": 451.0, "roofline_fraction": 1.034},
            {**base, "M": 256, "time_us": 528.0, "spread": 0.02, "floor_us": 530.0, "roofline_fraction": 1.004}]
    (bench / "bench-NVIDIA_H200-2026-11-27.json").write_text(json.dumps({"rows": rows, "ceilings": "x"}))
    text = summary_markdown(tmp_path, [], "cuda", 0.0)
    table = [line for line in text.splitlines() if line.startswith("| vllm")]
    assert [line.split(" | ")[-1] for line in table] == ["0.841 |", "- |", "1 |"]   # 207 / 246   # 1.004: within its spread
    assert "E=256,part=op M=64 tuned: 1.03x its floor: the ceiling or the kernel's byte/FLOP count is wrong" in text
