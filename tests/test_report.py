"""`tuner report` and `tuner diff` over two replay runs of SYNTHETIC landscapes, one of
which is made slower at some batch sizes."""


import pytest

from kernels import get_kernel
from synthetic import scaled_landscape, write_synthetic_landscape
from tuner.cli import main
from tuner.gpus import get_gpu
from tuner.space import load_space

KERNEL = get_kernel("fp8_gemm")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
MS = [1, 16, 128]


def run(land, out):
    assert main(["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--replay", str(land),
                 "--out", str(out), "--trials", "16", "--batch-sizes", *map(str, MS), "--quiet"]) == 0


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    land = d / "a.jsonl"
    write_synthetic_landscape(land, KERNEL, load_space(KERNEL), get_gpu("H200"), [P], MS)
    # the same landscape with every time at M=128 made 30 % slower
    slow = scaled_landscape(land, d / "b.jsonl", KERNEL, 1.3, only_m={128})
    run(land, d / "old")
    run(slow, d / "new")
    return d / "old", d / "new"


def test_report_writes_markdown_and_plots(two_runs, capsys):
    old, _ = two_runs
    assert main(["report", str(old)]) == 0
    printed = capsys.readouterr().out
    assert "speedup" in printed and "report:" in printed
    md = (old / "report" / "report.md").read_text()
    assert "Geometric-mean speedup" in md and "![" in md
    png = old / "report" / "plot-0.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_diff_finds_the_slower_batch_size(two_runs, capsys):
    old, new = two_runs
    assert main(["diff", str(old), str(new), "--out", str(new / "d")]) == 0
    printed = capsys.readouterr().out
    md = (new / "d" / "diff.md").read_text()
    assert "1 slower" in printed and "**0 faster, 1 slower**" in md
    assert "M=128" in md and "+30.0%" in md
    assert (new / "d" / "diff-0.png").read_bytes()[:4] == b"\x89PNG"


def test_report_of_a_non_results_folder(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
