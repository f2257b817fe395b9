"""A --minutes window's closing table shows what its files hold (issue 50, item 5): where the
window ends between SGLang's up study at an M and the `_down` study tied to it, the up row is
not written (tied tables change together; both hold the incumbent there), so the closing table
does not show it as tuned and "not tuned yet" lists it, saying why."""

import json
import re

from tuner.cli import main
from tuner.search.window import WindowClosed


def test_a_row_whose_tied_study_the_window_cut_is_not_shown_tuned(tmp_path, monkeypatch, capsys):
    from tuner.pipeline import studies
    real = studies._study

    def cut_at_the_first_down(opts, storage, measurer, runner, progress, installed, problem, M, *rest):
        if problem.tied_to:          # the window ends as the `_down` study of the first M begins
            raise WindowClosed()
        return real(opts, storage, measurer, runner, progress, installed, problem, M, *rest)

    monkeypatch.setattr(studies, "_study", cut_at_the_first_down)
    out = tmp_path / "w"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
                 "--batch-sizes", "1", "16", "--trials", "4", "--minutes", "5", "--out", str(out)]) == 0
    said, err = capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    # what the files hold: vLLM's table tuned, no SGLang row (its up study finished, the `_down` one did not)
    assert [list(t["files"]) for t in manifest["tables"]] == [["vllm"]] and manifest["tables"][0]["entries"]
    assert not (out / "sglang").exists()
    up_m = [int(m) for m in re.findall(r"part=up[^\n]* M=(\d+): [\d.]+ us", err)]      # the up studies finished
    # the closing table shows vLLM's rows, no SGLang row as tuned
    rows = said[said.index("file  "):said.index("window of")].splitlines()[1:]
    assert rows and all(row.startswith("vllm E=256,N=256 ") for row in rows), said
    # and "not tuned yet" lists both tables at every M, the up one's finished study said
    block = said[said.index("window of"):]
    lines = block.replace("\n    ", " ").splitlines()
    up_line = next(line for line in lines if "part=up" in line and "not tuned yet" in line)
    down_line = next(line for line in lines if "part=down" in line and "not tuned yet" in line)
    assert "M=1,16" in up_line and "M=1,16" in down_line, block
    assert up_m and f"at M={up_m[0]} its study finished" in up_line and "its tied" in up_line, up_line


def test_a_window_that_wrote_no_table_says_so(tmp_path, monkeypatch, capsys):
    """A window that finished no row of any table (here SGLang's up study alone: its `_down` one
    was cut) writes no table and says where its trials are, not `tables and manifest in ...`
    (issue 50, item 10; before: that line, then an error that the folder holds no manifest)."""
    from tuner.pipeline import studies
    real = studies._study

    def cut_at_the_first_down(opts, storage, measurer, runner, progress, installed, problem, M, *rest):
        if problem.tied_to:
            raise WindowClosed()
        return real(opts, storage, measurer, runner, progress, installed, problem, M, *rest)

    monkeypatch.setattr(studies, "_study", cut_at_the_first_down)
    out = tmp_path / "w"
    assert main(["moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
                 "--engines", "sglang", "--batch-sizes", "1", "--trials", "4", "--minutes", "5",
                 "--out", str(out)]) == 0
    said, err = capsys.readouterr()
    assert not (out / "manifest.json").exists() and "tables and manifest in" not in said + err
    assert f"no table written yet (no row tuned yet); the trials measured are kept in journal:///{out}" in err
    assert "continue with" in said
