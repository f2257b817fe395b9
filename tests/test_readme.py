"""The README's commands, as written. Those without a tag run on a CPU, in README order, from
a scratch folder that has the repository's configs/ and scripts/ (so `runs/` and the
landscapes they write stay out of the checkout): each must exit 0 without a traceback, and
every one that shows times from the synthetic landscapes the README makes must say
`SYNTHETIC TIMES`. Tagged ones cannot run here: `[GPU]` needs a Hopper GPU, `[engine]`
writes into an installed vLLM or SGLang, `[wheels]` needs the engines' wheels (run when
TUNER_ENGINE_WHEELS is set); their arguments are still checked against the parser. The
set-up commands (pip install, pytest) are `.ci/run`'s to run."""

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tuner.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TAGS = ("GPU", "engine", "wheels")
WHEELS = bool(os.environ.get("TUNER_ENGINE_WHEELS"))


@dataclass
class Command:
    text: str
    argv: list
    tags: set
    line: int

    def runs_here(self) -> bool:
        return not self.tags or self.tags == {"wheels"} and WHEELS


def _split_comment(text: str) -> tuple[str, str]:
    """(command, comment): the comment starts at the first '#' outside quotes that follows
    whitespace."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i], text[i + 1:]
    return text, ""


def readme_commands() -> list[Command]:
    commands, in_block, pending, start = [], False, "", 0
    for n, line in enumerate(README.read_text().splitlines(), start=1):
        if line.startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if not in_block:
            continue
        if not pending:
            start = n
        pending += line.strip()
        if pending.endswith("\\"):                # continued on the next line
            pending = pending[:-1] + " "
            continue
        text, pending = pending, ""
        if not re.match(r"(tuner |python -m tuner |scripts/\S)", text):
            continue                             # JSON, tables and other examples
        command, comment = _split_comment(text)
        tags = set(re.findall(r"\[(" + "|".join(TAGS) + r")\]", comment))
        argv = [os.path.expanduser(os.path.expandvars(a)) for a in shlex.split(command)]
        commands.append(Command(text, argv, tags, start))
    return commands


COMMANDS = readme_commands()


def test_the_readme_has_commands_and_tags():
    """The extraction itself: the tour and the tags are found (an edit that breaks the
    README's code blocks must not leave this test running nothing)."""
    assert sum(c.runs_here() for c in COMMANDS) >= 15
    assert any(c.argv[:3] == ["tuner", "landscape", "synth"] for c in COMMANDS)
    assert {t for c in COMMANDS for t in c.tags} == set(TAGS)
    gpu_runs = [c for c in COMMANDS if c.argv[0] == "tuner" and c.argv[1] in ("gemm", "moe", "mla")
                and "--dry-run" not in c.argv and "--replay" not in c.argv and "cpu" not in c.argv
                and "--synthetic" not in c.argv]
    assert gpu_runs and all("GPU" in c.tags for c in gpu_runs)        # a tuning run without a landscape


def _scratch(tmp_path: Path) -> Path:
    for name in ("configs", "scripts"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def _run(command: Command, capsys) -> tuple[int, str, str]:
    if command.argv[0] == "tuner":
        capsys.readouterr()
        rc = main(command.argv[1:])
        out, err = capsys.readouterr()
        return rc, out, err
    if command.argv[:3] == ["python", "-m", "tuner"]:
        argv = [sys.executable, *command.argv[1:]]
    else:
        argv = ["bash", *command.argv]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def test_readme_commands_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(_scratch(tmp_path))
    ran = 0
    for command in COMMANDS:
        if not command.runs_here():
            continue
        rc, out, err = _run(command, capsys)
        where = f"README.md:{command.line}: {command.text}\n{err[-2000:]}"
        assert rc == 0, where
        assert "Traceback" not in err and "internal error" not in err, where
        shows_times = ("--replay" in command.argv or "--synthetic" in command.argv
                       or command.argv[1:2] in (["report"], ["diff"], ["landscape"]))
        if shows_times:               # every landscape in the README is synthetic, and says so
            assert "SYNTHETIC" in out, where
        if "--device" in command.argv:   # the CPU device's times say so
            assert "*** CPU DEVICE" in out, where
        ran += 1
    assert ran >= 15
    assert (tmp_path / "runs" / "moe-deepseek-v3-H200-tp8" / "report" / "report.md").is_file()
    assert (tmp_path / "runs" / "moe-random" / "diff" / "diff.md").is_file()
    # the tour runs again as written, in the same folder (its landscapes replaced, its runs resumed)
    tour = [c for c in COMMANDS if c.runs_here() and tour_lines()[0] < c.line < tour_lines()[1]]
    assert len(tour) >= 8
    for command in tour:
        rc, out, err = _run(command, capsys)
        assert rc == 0 and "Traceback" not in err, f"again: README.md:{command.line}: {command.text}\n{err[-2000:]}"


def tour_lines() -> tuple[int, int]:
    """The README lines of the tour: from "## Try it without a GPU" to the next heading."""
    lines = README.read_text().splitlines()
    start = lines.index("## Try it without a GPU")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("#"))
    return start + 1, end + 1


@pytest.mark.parametrize("command", [c for c in COMMANDS if not c.runs_here() and c.argv[0] != "scripts"],
                         ids=lambda c: f"line{c.line}")
def test_readme_commands_not_run_here_parse(command):
    """What cannot run here still names real subcommands, options and choices."""
    argv = command.argv[3:] if command.argv[:3] == ["python", "-m", "tuner"] else command.argv[1:]
    build_parser().parse_args(argv)            # a bad option raises TunerError with the option's name


@pytest.mark.parametrize("tag", [t for t in TAGS if t != "wheels" or not WHEELS])
def test_readme_commands_not_run_here(tag):
    reasons = {"GPU": "they need a Hopper GPU (and run minutes to hours)",
               "engine": "they write into an installed vLLM or SGLang",
               "wheels": "they need the engines' wheels: TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"}
    lines = [c.line for c in COMMANDS if tag in c.tags]
    pytest.skip(f"README commands tagged [{tag}] (lines {', '.join(map(str, lines))}) are not run: {reasons[tag]}; "
                "their arguments are checked")


def layout_tree() -> dict[str, str]:
    """{path: what it is for} of the modules the README's layout shows, by their folders
    (indentation nests a file in the folder above it)."""
    block = README.read_text().split("## Layout", 1)[1].split("```", 2)[1]
    folders: list[tuple[int, str]] = []
    shown = {}
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        token, _, what = line.strip().partition(" ")
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if token.endswith("/"):
            folders.append((indent, (folders[-1][1] if folders else "") + token))
        elif token.endswith(".py"):
            shown[(folders[-1][1] if folders else "") + token] = what.strip()
    return shown


def test_the_layout_shows_every_module_in_its_folder():
    """The README's layout shows every module of tuner/ and kernels/ in the folder it is in,
    each with what it is for, and nothing that is not there (a module moved or added must be
    placed, and said what it is for, there)."""
    shown = layout_tree()
    modules = {str(p.relative_to(REPO)) for d in ("tuner", "kernels") for p in (REPO / d).rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")}
    assert len(modules) > 40
    assert not modules - set(shown), f"README layout does not show {sorted(modules - set(shown))}"
    assert not set(shown) - modules, f"README layout shows modules that do not exist: {sorted(set(shown) - modules)}"
    assert all(shown.values()), [p for p, what in shown.items() if not what]

