"""A command meant to be pasted is never wrapped without ` \\` continuation marks (issue 50,
item 7): a window's `continue with` command and install's `export` line, printed on terminals of
40 to 120 columns and piped, paste into bash as the command they stand for (bash itself reads
them back here)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def bash_words(lines: list[str]) -> list[str]:
    """The words bash reads from `lines` pasted as they are (its first word replaced by a printer)."""
    text = "\n".join(lines).lstrip()
    script = "say() { for a in \"$@\"; do printf '%s\\0' \"$a\"; done; }\nsay " + text.split(" ", 1)[1] + "\n"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [text.split(" ", 1)[0], *r.stdout.split("\0")[:-1]]


ARGV = ["tuner", "moe", "--model", "deepseek-v3", "--gpu", "H200", "--dtype", "fp8_w8a8", "--synthetic",
        "--minutes", "0.3", "--out", "/tmp/a folder with spaces/and a very long name that goes on and on/w1"]


@pytest.mark.parametrize("columns", [40, 57, 80, 120])
def test_a_command_to_paste_keeps_its_marks_at_any_width(columns):
    from tuner.textwidth import command_lines
    lines = command_lines("  " + shlex.join(ARGV), columns)
    assert all(len(line) <= columns for line in lines), lines
    assert all(line.endswith("\\") for line in lines[:-1])
    assert bash_words(lines) == ARGV
    # a word longer than a line: cut with a `\` and joined again by the shell
    export = ["export", "VLLM_TUNED_CONFIG_FOLDER=/srv/" + "x" * 150]
    lines = command_lines(" ".join(export), columns)
    assert all(len(line) <= columns for line in lines) and bash_words(lines) == export


@pytest.mark.parametrize("columns", [40, 80])
def test_the_terminal_stream_never_wraps_a_command_as_prose(columns, monkeypatch):
    """A command line wider than the terminal that reaches the fitting stream (printed at 120
    columns) is wrapped there with its marks too, its continuation lines as well."""
    import io

    from tuner.textwidth import Fitting, command_lines
    monkeypatch.setenv("COLUMNS", str(columns))
    raw = io.StringIO()
    out = Fitting(raw)
    wide = command_lines("  " + shlex.join(ARGV), 120)
    out.write("continue with:\n" + "\n".join(wide) + "\nafter it, prose again\n")
    out.flush()
    lines = raw.getvalue().splitlines()
    assert all(len(line) <= columns for line in lines), lines
    command = lines[1:lines.index("after it, prose again")]
    assert all(line.endswith("\\") for line in command[:-1]) and bash_words(command) == ARGV


def _window_output(tmp_path: Path, columns: str | None) -> str:
    """`continue with` as a window prints it, through the command line (a child process: its
    stdout a pipe, $COLUMNS as a terminal's shell sets it, or none)."""
    out = tmp_path / "a folder with spaces" / ("w" * 60)
    code = ("import sys\nfrom tuner.pipeline import studies\nfrom tuner.search.window import WindowClosed\n"
            "real = studies._study\n"
            "def cut(opts, storage, measurer, runner, progress, installed, problem, M, *rest):\n"
            "    if M != 1: raise WindowClosed()\n"
            "    return real(opts, storage, measurer, runner, progress, installed, problem, M, *rest)\n"
            "studies._study = cut\nfrom tuner.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update({"PYTHONPATH": str(REPO), **({"COLUMNS": columns} if columns else {})})
    argv = ["gemm", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--synthetic", "--only",
            "N=7168,K=2048", "--engines", "vllm", "--batch-sizes", "1", "16", "--trials", "3", "--minutes", "5",
            "--out", str(out)]
    r = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, ["tuner", *argv]


@pytest.mark.parametrize("columns", ["60", "80", None])
def test_a_windows_continue_with_pastes_at_80_columns_and_piped(tmp_path, columns):
    said, argv = _window_output(tmp_path, columns)
    lines = said.splitlines()
    after = next(i for i, line in enumerate(lines) if line.startswith("continue with"))
    command = lines[next(i for i in range(after, len(lines)) if lines[i].startswith("  tuner ")):]
    end = next(i for i, line in enumerate(command) if not line.endswith("\\")) + 1
    command = command[:end]
    assert all(len(line) <= int(columns or 120) for line in command), command
    assert bash_words(command) == argv
