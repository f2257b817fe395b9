"""A refused run changes nothing, and a dry run refuses exactly what the run would (issue 41,
item 5): a --synthetic run refused for a missing --warm-start leaves the landscape an earlier
run made as it was; --out naming a file is refused by the dry run as by the run. SYNTHETIC."""

from pathlib import Path

import pytest

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
SMALL = str(REPO / "configs" / "examples" / "small-moe.json")


def test_a_synthetic_run_refused_late_leaves_the_earlier_landscape(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o"
    args = ["gemm", "--model", SMALL, "--gpu", "H100", "--synthetic", "--trials", "2", "--out", str(out), "--quiet"]
    assert main([*args, "--batch-sizes", "1", "16"]) == 0
    [land] = out.glob("synthetic-*.jsonl.gz")
    before = land.read_bytes()
    capsys.readouterr()
    assert main([*args, "--batch-sizes", "1", "--warm-start", str(tmp_path / "missing.json")]) == 2
    assert "--warm-start" in capsys.readouterr().err
    assert land.read_bytes() == before


@pytest.mark.parametrize("dry", [False, True])
def test_out_naming_a_file_is_refused_by_the_dry_run_as_by_the_run(tmp_path, capsys, dry):
    (tmp_path / "afile").write_text("x")
    argv = ["gemm", "--model", SMALL, "--gpu", "H100", "--synthetic", "--out", str(tmp_path / "afile")]
    assert main(argv + (["--dry-run"] if dry else [])) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert (tmp_path / "afile").read_text() == "x"


def test_a_resume_with_a_larger_budget_says_the_studies_continue(tmp_path, capsys):
    """Messages that mislead (issue 41, item 6): run again with more --trials, the studies that
    stopped at the old budget run on; the resume line says so instead of 'not run again'."""
    args = ["gemm", "--model", SMALL, "--gpu", "H100", "--synthetic", "--batch-sizes", "1", "--only", "N=256,K=256",
            "--out", str(tmp_path / "o")]
    assert main([*args, "--trials", "2"]) == 0
    capsys.readouterr()
    assert main([*args, "--trials", "2"]) == 0
    same = capsys.readouterr().err
    assert "1 shown as stored, not run again" in same and "continued" not in same, same
    assert main([*args, "--trials", "4"]) == 0
    grown = capsys.readouterr().err
    assert "1 continued to the larger budget" in grown and "not run again" not in grown, grown


def test_done_in_counts_the_commands_planning_too(tmp_path, monkeypatch, capsys):
    """'done in 1s' after 10.7 s (issue 41, item 6): the closing line counts from the command's
    start, its planning (here a synthetic landscape made slowly on purpose) included."""
    import re
    import time

    from tuner.measure import synthetic
    real = synthetic.landscape_for_run

    def slow(*args, **kwargs):
        time.sleep(2.5)
        return real(*args, **kwargs)
    monkeypatch.setattr(synthetic, "landscape_for_run", slow)
    t0 = time.monotonic()
    assert main(["gemm", "--model", SMALL, "--gpu", "H100", "--synthetic", "--batch-sizes", "1", "--only",
                 "N=256,K=256", "--trials", "2", "--out", str(tmp_path / "o")]) == 0
    wall = time.monotonic() - t0
    said = int(re.search(r"done in (\d+)s", capsys.readouterr().err).group(1))
    # at least the planning's sleep (before: the run's own seconds alone, 1 here), at most the command's
    assert 2.5 <= said + 0.5 and said <= wall + 0.5, (said, wall)
