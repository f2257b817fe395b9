"""Output that fits a terminal (issue 41, item 2): every line a command prints fits 120 columns,
or the terminal's width ($COLUMNS) where it is narrower. tests/test_readme.py runs the README's
and the manual's commands that run here as written (and checks their lines); this runs the
others as a machine without a GPU, an engine or its wheels can: a [GPU] tuning run as its
--dry-run, the rest as written (most are refused in one line here), at 80 and 120 columns.
The progress line, redrawn in place, fits an 80-column terminal."""

import re

import pytest
from test_readme import ALL, _scratch

from tuner.cli import main

TUNING = ("moe", "gemm", "mla")
NOT_RUN_THERE = [c for c in ALL if not c.runs_here() and c.argv[0] == "tuner"]


def as_here(command) -> list[str]:
    argv = command.argv[1:]
    if argv[0] in TUNING and "--dry-run" not in argv:
        argv = [*argv, "--dry-run"]
    return argv


@pytest.mark.parametrize("columns", [80, 120])
def test_the_commands_that_need_a_gpu_or_an_engine_print_within_the_width(columns, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(_scratch(tmp_path))
    monkeypatch.setenv("COLUMNS", str(columns))
    assert len(NOT_RUN_THERE) >= 20
    over, plans = [], 0
    for command in NOT_RUN_THERE:
        argv = as_here(command)
        capsys.readouterr()
        rc = main(argv)
        out, err = capsys.readouterr()
        assert "Traceback" not in err and "internal error" not in err, (command.where, err)
        lines = (out + err).splitlines()
        over += [f"{command.where} ({len(ln)} > {columns}): {ln}" for ln in lines if len(ln) > columns]
        plans += rc == 0 and "--dry-run" in argv
    assert plans >= 8                         # the dry runs did print their plans
    assert not over, "\n".join(over[:30])


def test_the_progress_line_fits_an_80_column_terminal(monkeypatch):
    from test_wait_progress import Terminal

    from tuner.progress import Progress
    monkeypatch.setenv("COLUMNS", "80")
    term = Terminal(tty=True)
    p = Progress(54, stream=term, unit="us (SYNTHETIC)")
    p.start_study("sglang fused_moe E=257,N=256,block_shape=[128,128] _down M=4096 (a long study label)")
    for done in range(1, 33):
        p.trial(done, 32, 123.456)
    p.end_study("best 123.46 us (SYNTHETIC) after 32 trials, 2.31x the default config's 285.20 us; numerics not checked")
    drawn = [seg for seg in re.split(r"[\r\n]", term.text) if seg.strip()]
    assert len(drawn) > 32 and max(map(len, drawn)) < 80, max(drawn, key=len)
    assert any("32/32" in seg and "123.46" in seg for seg in drawn)      # what it must show is not cut away


@pytest.mark.parametrize("columns", [None, "40", "80"])
def test_machine_readable_output_is_never_fitted_or_cut(columns, monkeypatch):
    """JSON (or CSV) a command prints goes through whole on a terminal of any width, after and
    before fitted prose: a line break added inside a JSON string made `tuner coverage --json`
    invalid on an 80-column terminal."""
    import io
    import json

    from tuner.textwidth import Fitting, print_whole
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    doc = {"command": "tuner moe --model deepseek-v3 --gpu H200 --dtype fp8_w8a8 " * 4,
           "rows": [{"file": "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
                     "note": "a \x1b[2J control and a \u202e override, escaped by json.dumps"}]}
    raw = io.StringIO()
    out = Fitting(raw)
    print("a partial line, ", end="", file=out)
    print_whole(json.dumps(doc, indent=1), file=out)
    print("prose after it " * 20, file=out)
    out.flush()
    text = raw.getvalue()
    assert text.startswith("a partial line, {")              # what was written before it comes first
    document, prose = text.removeprefix("a partial line, ").split("\n}\n", 1)
    assert json.loads(document + "\n}") == doc
    assert max(map(len, document.splitlines())) > 80
    if columns:                                   # the prose after it is fitted again
        assert max(map(len, prose.splitlines())) <= int(columns) and len(prose.splitlines()) > 1
