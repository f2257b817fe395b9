"""`tuner report` and `tuner diff` over two replay runs of SYNTHETIC landscapes, one of
which is made slower at some batch sizes."""


import re

import pytest
from synthetic import scaled_landscape, write_synthetic_landscape

from tuner.cli import main
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space

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


def test_report_says_its_times_are_synthetic(two_runs, capsys):
    old, _ = two_runs
    assert main(["report", str(old)]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].startswith("*** SYNTHETIC") and lines[0].endswith("***")                # loud, on top
    assert "Geometric-mean speedup" in printed and "(SYNTHETIC: not a measurement)" in printed
    assert not re.search(r"\d\.\d{4,}", printed)                                          # no 6 decimals
    md = (old / "report" / "report.md").read_text()
    assert "SYNTHETIC" in md.split("## ")[0]


def test_a_recorded_landscape_is_named_with_its_device(two_runs, tmp_path, capsys):
    """A landscape not marked synthetic (as one recorded on a GPU): the report says where and
    when it was recorded, and a diff against a synthetic run warns the sources differ."""
    old, _ = two_runs
    land = tmp_path / "recorded.jsonl"
    scaled_landscape(old.parent / "a.jsonl", land, KERNEL, 1.0, synthetic=False, driver="570.86",
                     torch="2.11.0", recorded="2026-11-20T09:00:00+00:00")
    run(land, tmp_path / "rec")
    capsys.readouterr()
    assert main(["report", str(tmp_path / "rec")]) == 0
    printed = capsys.readouterr().out
    assert "SYNTHETIC" not in printed
    assert printed.splitlines()[0] == "times: landscape recorded on NVIDIA H200 (2026-11-20), replayed"
    assert main(["diff", str(old), str(tmp_path / "rec"), "--out", str(tmp_path / "d")]) == 0
    printed = capsys.readouterr().out
    assert "warning: the two runs' times come from different sources" in printed
    assert "old: *** SYNTHETIC" in printed and "new: times: landscape recorded on NVIDIA H200" in printed


def test_diff_refuses_unrelated_runs_and_another_pairs_report(two_runs, tmp_path, capsys):
    old, new = two_runs
    other_land = tmp_path / "other.jsonl"
    write_synthetic_landscape(other_land, KERNEL, load_space(KERNEL), get_gpu("H200"),
                              [{"N": 4096, "K": 512, "block_shape": [128, 128]}], MS)
    run(other_land, tmp_path / "other")
    capsys.readouterr()
    rc = main(["diff", str(old), str(tmp_path / "other")])
    err = capsys.readouterr().err
    assert rc == 2 and "no (problem, M) in common" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "other" / "diff").exists()
    assert main(["diff", str(old), str(tmp_path / "other"), "--force"]) == 0

    out = tmp_path / "shared-diff"
    assert main(["diff", str(old), str(new), "--out", str(out)]) == 0
    before = (out / "diff.md").read_text()
    assert main(["diff", str(old), str(new), "--out", str(out)]) == 0          # the same pair again: fine
    capsys.readouterr()
    rc = main(["diff", str(new), str(old), "--out", str(out)])                  # another pair: refused
    err = capsys.readouterr().err
    assert rc == 2 and "holds another comparison" in err and "--force" in err
    assert (out / "diff.md").read_text() == before
    assert main(["diff", str(new), str(old), "--out", str(out), "--force"]) == 0
    assert (out / "diff.md").read_text() != before


def test_terminal_tables_name_engine_file_and_config_keys_within_120_columns(two_runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")        # a 120-column terminal (piped, lines go whole)
    old, new = two_runs
    for argv in (["report", str(old)], ["diff", str(old), str(new), "--out", str(new / "w")]):
        assert main(argv) == 0
        printed = capsys.readouterr().out.splitlines()
        assert max(map(len, printed)) <= 120
        # our kernel timed one table for both engines: both files, each as its engine names it
        assert "vllm: N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json" in printed
        assert "sglang: N=7168,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json" in printed
        assert "  config = BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K GROUP_SIZE_M num_warps num_stages" in printed
    md = (new / "w" / "diff.md").read_text()
    assert "## vllm: N=7168,K=2048" in md and "; sglang: N=7168" in md and "config = BLOCK_SIZE_M" in md


def test_every_plot_says_where_its_times_came_from_and_diff_bars_follow_the_verdict(two_runs, tmp_path,
                                                                                     monkeypatch):
    import tuner.jobs.report as report
    old, new = two_runs
    plots = []
    monkeypatch.setattr(report, "_plot", lambda path, title, series, ratio, source, colours=None, root=None, kind=None:
                        plots.append((title, source, colours, ratio)))
    report.write_report(old, tmp_path / "r.md")
    report.write_diff(old, new, tmp_path / "d")
    assert plots and all("SYNTHETIC" in source for _, source, _, _ in plots)
    diffs = [p for p in plots if p[2] is not None]
    assert diffs and all(src.startswith("old: ") and "\nnew: " in src for _, src, _, _ in diffs)
    df = report.diff_frame(old, new)
    slower = df[df["verdict"] == "slower"]
    for title, _, colours, (_, ms, _) in diffs:
        for m, colour in zip(ms, colours):
            verdict = df[(df["M"] == m) & df["problem"].apply(lambda p: p in title)]["verdict"].iloc[0]
            assert colour == report.VERDICT_COLOURS[verdict]
    assert set(slower["M"]) == {128} and "tab:red" in {c for _, _, cs, _ in diffs for c in cs}


def test_a_manifest_time_of_1e300_prints_no_300_digits(two_runs, tmp_path, capsys):
    """A hand-edited manifest entry (time and speedup 1e300): report and diff printed it with 300
    digits (in the terminal and the Markdown) and overflowed the plots; now it is no number ('-')
    (issue 51, item 11)."""
    import json
    import shutil
    import warnings
    old, new = two_runs
    edited = tmp_path / "edited"
    shutil.copytree(new, edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    entry = next(iter(manifest["tables"][0]["entries"].values()))
    entry.update(time_us=1e300, speedup=1e300, default_time_us=1e-300)
    (edited / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # matplotlib's overflow in exp, before
        assert main(["report", str(edited), "--out", str(tmp_path / "r" / "r.md")]) == 0
        assert main(["diff", str(old), str(edited), "--out", str(tmp_path / "d")]) == 0
    out, err = capsys.readouterr()
    texts = [out, err, (tmp_path / "r" / "r.md").read_text(), (tmp_path / "d" / "diff.md").read_text()]
    assert not any(re.search(r"[0-9]{14}", text) for text in texts), [t[:300] for t in texts]


def test_a_default_that_failed_is_its_reason_not_nan(two_runs, tmp_path, capsys):
    """A run whose default config failed (a synthetic failure, as a --synthetic run has): report
    printed NaN for its default time and speedup, where the run's own closing table says
    '- (synthetic failure)' (docs/nightly.md: missing times are never NaN)."""
    import json
    import shutil
    old, _ = two_runs
    edited = tmp_path / "edited"
    shutil.copytree(old, edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    entry = next(iter(manifest["tables"][0]["entries"].values()))
    entry.update(default_time_us=None, speedup=None, default_error="synthetic failure")
    (edited / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["report", str(edited), "--out", str(tmp_path / "r" / "r.md")]) == 0
    out = capsys.readouterr().out
    md = (tmp_path / "r" / "r.md").read_text()
    assert "NaN" not in out and "NaN" not in md
    assert re.search(rf"^ +{entry['M']} .* - \(synthetic failure\) +- ", out, re.M), out
    assert "| - (synthetic failure) | - |" in md
