"""`tuner landscape synth` and `tuner landscape info`: a SYNTHETIC landscape from the command
line, labelled as such, and what a landscape covers."""

import gzip
import json

from kernels import get_kernel
from tuner.cli import main
from tuner.landscape import read_landscape, summary


def synth(tmp_path, capsys, *extra, name="s.jsonl.gz"):
    out = tmp_path / name
    rc = main(["landscape", "synth", "--kernel", "gemm", "--model", "deepseek-v3", "--gpu", "H100", "--tp", "8",
               "--batch-sizes", "1", "16", "--out", str(out), *extra])
    return rc, out, capsys.readouterr()


def test_synth_writes_a_labelled_landscape_and_info_shows_it(tmp_path, capsys):
    rc, out, printed = synth(tmp_path, capsys)
    assert rc == 0 and "SYNTHETIC TIMES" in printed.out
    with gzip.open(out, "rt") as f:
        header = json.loads(f.readline())
    assert header["synthetic"] is True and header["device"] == "NVIDIA H100 80GB HBM3"
    land = read_landscape(out, get_kernel("fp8_gemm"))
    s = summary(land)
    assert len(s["problems"]) == 8 and all(p["batch_sizes"] == [1, 16] for p in s["problems"].values())
    assert 0 < s["failures"] < s["points"]
    assert f"{s['points']} points ({s['failures']} made-up failures)" in printed.out
    assert "replay it: tuner gemm --model deepseek-v3 --gpu H100 --tp 8 --replay" in printed.out

    assert main(["landscape", "info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "SYNTHETIC TIMES" in info and "fp8_gemm (our kernel)" in info and "NVIDIA H100 80GB HBM3" in info
    assert f"8 problems, {s['points']} points, {s['failures']} failed" in info
    key = "N=7168,K=2048,block_shape=[128,128]"
    p = s["problems"][key]
    assert f"  problem {key}\n    M 1 16: {p['points']} points, {p['failures']} failed" in info


def test_synth_refuses_to_overwrite(tmp_path, capsys):
    target = tmp_path / "s.jsonl.gz"
    target.write_text("recorded on a GPU, say")
    rc, _, printed = synth(tmp_path, capsys)
    assert rc == 2 and len(printed.err.strip().splitlines()) == 1 and "exists" in printed.err
    assert target.read_text() == "recorded on a GPU, say"


def test_synth_for_an_engine_kernel_replays_its_tables_only(tmp_path, capsys):
    """Labelled for vLLM's kernel (its keys and defaults; no engine code needed): the replay
    times vLLM's tables on it and writes no SGLang table."""
    out = tmp_path / "vllm.jsonl"
    assert main(["landscape", "synth", "--kernel", "moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                 "--batch-sizes", "1", "--kernel-source", "vllm", "--out", str(out)]) == 0
    header = json.loads(out.read_text().splitlines()[0])
    assert header["kernel_source"] == "vllm" and header["synthetic"] is True
    capsys.readouterr()
    run = tmp_path / "run"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(out),
                 "--trials", "8", "--out", str(run), "--quiet"]) == 0
    files = sorted(p.relative_to(run).parts[0] for p in run.rglob("*.json") if p.name != "manifest.json")
    assert files == ["vllm"]


def test_info_of_something_else_is_one_line(tmp_path, capsys):
    f = tmp_path / "x.jsonl"
    f.write_text('{"format": "other"}\n')
    assert main(["landscape", "info", str(f)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "must be a header" in err
    assert main(["landscape", "info", str(tmp_path / "none.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err
