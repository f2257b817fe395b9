"""tuner bench, tuner ceilings and tuner landscape synth/info, on CPU: benches over SYNTHETIC
landscapes (labelled so), the ceilings file's checks and fallbacks, the timing statistics."""

import gzip
import json

import pytest

from tuner.cli import main
from tuner.errors import TunerError
from tuner.measure import ceilings
from tuner.measure.timing import summarize
from tuner.plan.gpus import get_gpu

COMMON = ["--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"]


def test_landscape_synth_and_info(gemm_landscape, tmp_path, capsys):
    assert main(["landscape", "info", str(gemm_landscape)]) == 0
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and "kernel fp8_gemm" in out and "device NVIDIA H200" in out
    assert "problem N=7168,K=2048,block_shape=[128,128]: M=1,64" in out
    # run again as written: its own earlier file is replaced (here with other batch sizes)...
    mine = tmp_path / "mine.jsonl.gz"
    mine.write_bytes(gemm_landscape.read_bytes())
    assert main(["landscape", "synth", "--kernel", "gemm", *COMMON, "--batch-sizes", "16", "--out", str(mine)]) == 0
    assert f"replaced {mine} (an earlier SYNTHETIC landscape)" in capsys.readouterr().out
    assert main(["landscape", "info", str(mine)]) == 0
    assert "block_shape=[128,128]: M=16;" in capsys.readouterr().out
    # ...never a landscape recorded on a GPU, nor any other file
    recorded = tmp_path / "recorded.jsonl"
    lines = gzip.decompress(gemm_landscape.read_bytes()).decode().splitlines(keepends=True)
    recorded.write_text(json.dumps({k: v for k, v in json.loads(lines[0]).items() if k != "synthetic"}) + "\n"
                        + "".join(lines[1:]))
    for path, kind in ((recorded, "a landscape recorded on a GPU"), (tmp_path, "a folder")):
        before = recorded.read_text()
        assert main(["landscape", "synth", "--kernel", "gemm", *COMMON, "--out", str(path)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f" is {kind}" in err and recorded.read_text() == before


def test_bench_over_a_landscape(gemm_landscape, tmp_path, capsys, shared_dir, monkeypatch):
    monkeypatch.setattr(ceilings, "CEILINGS_DIR", tmp_path / "no-ceilings")     # the datasheet's figures
    out = tmp_path / "bench"
    assert main(["bench", *COMMON, "--kernel", "gemm", "--batch-sizes", "1", "64", "--replay", str(gemm_landscape),
                 "--baseline", str(shared_dir / "baselines" / "vllm-0.33.0"), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("*** SYNTHETIC")
    [result] = out.glob("bench-NVIDIA_H200-*.json")
    data = json.loads(result.read_text())
    assert data["synthetic"] is True and "SYNTHETIC" in data["time_source"]
    assert data["ceilings"] == "datasheet figures for the H200"
    rows = data["rows"]
    by = {}
    for r in rows:
        by.setdefault((r["problem"], r["M"]), {})[r["contender"]] = r
    assert len(by) == 8 * 2
    for (problem, M), row in by.items():
        assert {"default", "landscape best", "reference"} <= set(row)
        assert row["reference"]["time_us"] is None and "needs a GPU" in row["reference"]["error"]
        timed = [r["time_us"] for r in row.values() if r["time_us"]]
        assert row["landscape best"]["time_us"] == min(timed)
        for r in row.values():
            if r["time_us"]:
                assert r["roofline_fraction"] == pytest.approx(r["floor_us"] / r["time_us"])
                assert 0 < r["roofline_fraction"] < 1
    # vLLM's shipped tables hold this shape (o_proj) and M=64's entry is timed from the landscape
    assert by[("N=7168,K=2048,block_shape=[128,128]", 64)]["shipped vllm-0.33.0"]["config"]
    md = result.with_suffix(".md").read_text()
    assert "SYNTHETIC" in md and md.count("![") == 8
    assert len(list(out.glob("*.png"))) == 8


def test_bench_times_our_tuned_table(gemm_landscape, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["gemm", *COMMON, "--batch-sizes", "1", "64", "--replay", str(gemm_landscape), "--trials", "8",
                 "--out", str(run), "--quiet"]) == 0
    out = tmp_path / "bench"
    assert main(["bench", *COMMON, "--kernel", "gemm", "--batch-sizes", "1", "64", "--replay", str(gemm_landscape),
                 "--tuned", str(run), "--out", str(out), "--quiet"]) == 0
    assert "replacing" not in capsys.readouterr().out
    # a second bench the same day into the same folder replaces the first's files: it says so (it was silent)
    assert main(["bench", *COMMON, "--kernel", "gemm", "--batch-sizes", "1", "64", "--replay", str(gemm_landscape),
                 "--tuned", str(run), "--out", str(out), "--quiet"]) == 0
    assert "(replacing today's earlier bench there, and its plots)" in capsys.readouterr().out
    rows = json.loads(next(out.glob("*.json")).read_text())["rows"]
    manifest = json.loads((run / "manifest.json").read_text())
    tuned = {(r["problem"], r["M"]): r for r in rows if r["contender"] == "tuned"}
    assert len(tuned) == 16
    from tuner.plan.problems import Problem
    for t in manifest["tables"]:
        key = Problem(t["kernel"], t["problem"]).key
        for m, e in t["entries"].items():
            assert tuned[(key, int(m))]["time_us"] == pytest.approx(e["time_us"])   # the same landscape point


def test_bench_over_a_landscape_that_lacks_every_asked_point_refuses_and_writes_nothing(gemm_landscape, tmp_path,
                                                                                         capsys):
    # the landscape holds M=1 and 64 only: M=7 (or a problem it does not hold) used to be an internal
    # error (KeyError 'kernel_source' making the Markdown) after a bench JSON with 0 rows was written
    from pathlib import Path
    recorded = Path(__file__).resolve().parents[1] / "landscapes/NVIDIA_H200/fp8_gemm.vllm-deepseek-v3-tp8.jsonl.gz"
    for landscape, extra in ((gemm_landscape, ["--batch-sizes", "7"]), (recorded, ["--only", "N=2112"])):
        out = tmp_path / "b" / "bench"
        assert main(["bench", *COMMON, "--kernel", "gemm", "--replay", str(landscape), *extra,
                     "--out", str(out)]) == 2
        said, err = capsys.readouterr()
        assert err.splitlines() == [f"tuner: error: landscape {landscape} covers none of the planned problems "
                                    "and batch sizes"], err
        assert "internal error" not in said + err and not (tmp_path / "b").exists()


def test_bench_table_says_what_problems_share_and_long_notes_whole():
    long_note = "needs a GPU (torch._scaled_mm with 1x128 and 128x128 block scales): not timed from a landscape"
    rows = [{"kernel_source": "ours", "problem": f"E={e},N=256,K=7168,routing=uniform", "M": 8, "contender": c,
             "time_us": 9.0 if c == "default" else None, "roofline_fraction": 0.5 if c == "default" else None,
             "error": None if c == "default" else long_note} for e in (256, 257) for c in ("default", "reference")]
    from tuner.jobs.bench_output import bench_table
    lines = bench_table(rows)
    assert lines[0] == "all problems: N=256,K=7168,routing=uniform"        # not a dangling `... and`
    assert not any(line.endswith(" and") for line in lines)
    assert [line for line in lines if line.endswith("  reference        -            -  note 1")], lines
    assert lines.count(f"note 1: {long_note}") == 1 and all(len(line) <= 120 for line in lines[:-1])
    # one problem: the same
    one = bench_table(rows[:2])
    assert one[0] == "problem: E=256,N=256,K=7168,routing=uniform" and one[-1] == f"note 1: {long_note}"


def test_bench_refuses_without_gpu_or_landscape(tmp_path, capsys):
    assert main(["bench", *COMMON, "--kernel", "gemm", "--kernel-source", "ours", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "GPU" in err
    assert not (tmp_path / "b").exists()


def test_ceilings_file_checks_and_fallback(tmp_path, monkeypatch):
    gpu = get_gpu("H200")
    assert ceilings.load(gpu, None).source.startswith("measured on NVIDIA H200")     # bench/ceilings/H200.json
    monkeypatch.setattr(ceilings, "CEILINGS_DIR", tmp_path)
    assert ceilings.load(gpu, None).source.startswith("datasheet")
    good = {"format": ceilings.FORMAT, "device": "NVIDIA H200", "measured": "2026-11-22T10:00:00+00:00",
            "copy_tb_s": 4.3, "fp8_tflops": 1300.0, "bf16_tflops": 790.0}
    f = tmp_path / "c.json"
    f.write_text(json.dumps(good))
    c = ceilings.load(gpu, f)
    assert c.copy_tb_s == 4.3 and "measured on NVIDIA H200 2026-11-22" in c.source
    # a 4.3 TB/s copy: 4.3 MB take 1 us; 1.3 PFLOP/s: 1.3 GFLOP take 1 us
    assert c.floor_us(4.3e6, 1.0) == pytest.approx(1.0)
    assert c.floor_us(1.0, 2.6e9) == pytest.approx(2.0)
    for bad in ({**good, "copy_tb_s": -1}, {**good, "copy_tb_s": float("nan")}, {**good, "format": "x"},
                {**good, "fp8_tflops": "fast"}):
        f.write_text(json.dumps(bad))
        with pytest.raises(TunerError):
            ceilings.load(gpu, f)
    f.write_text(json.dumps({**good, "device": "NVIDIA H100 80GB HBM3"}))
    with pytest.raises(TunerError, match="measured on 'NVIDIA H100"):
        ceilings.load(gpu, f)
    f.write_text(json.dumps({**good, "fp8_tflops": None}))       # a torch without FP8 matmul
    assert ceilings.load(gpu, f).fp8_tflops == gpu.fp8_tflops and "datasheet" in ceilings.load(gpu, f).source


def test_ceilings_needs_a_gpu(tmp_path, capsys):
    assert main(["ceilings", "--gpu", "H200", "--out", str(tmp_path / "c.json")]) == 2
    assert "GPU" in capsys.readouterr().err and not (tmp_path / "c.json").exists()


def test_timing_statistics():
    t = summarize([5.0, 1.0, 2.0, 4.0, 3.0, 100.0])
    assert t.median_us == 3.5 and t.samples == 6
    # p20 = 2.0 (index 1 of the sorted six), p80 = 5.0 (index 4): (5 - 2) / 3.5
    assert t.spread == pytest.approx(3.0 / 3.5)
    with pytest.raises(ValueError):
        summarize([])
