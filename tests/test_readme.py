"""The commands of the README and of the manual in docs/, as written. Those without a tag run
on a CPU: each file's in its own order, in a scratch folder of its own that has the
repository's configs/ and scripts/ (so `runs/` and the landscapes they write stay out of the
checkout, and no page depends on another: a page makes what its commands need at its top).
Each must exit 0 without a traceback; every one that shows times from the synthetic
landscapes the pages make must say `SYNTHETIC`, every one on the CPU device `CPU DEVICE`, and
`report` and `diff` must leave their Markdown where they say. Tagged ones cannot run here:
`[GPU]` needs a Hopper GPU, `[engine]` writes into an installed vLLM or SGLang, `[wheels]`
needs the engines' wheels (run when TUNER_ENGINE_WHEELS is set); their arguments are still
checked against the parser. The set-up commands (pip install, pytest, mkdocs) are
`.ci/run`'s to run.

Also: the README stays a front page (at most 400 lines) whose links lead to files that exist,
the site's navigation lists every page of docs/, and the layout in docs/architecture.md shows
every module."""

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tuner.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
FILES = [README, *sorted(DOCS.glob("*.md"))]
ARCHITECTURE = DOCS / "architecture.md"
TAGS = ("GPU", "engine", "wheels")
WHEELS = bool(os.environ.get("TUNER_ENGINE_WHEELS"))
README_MAX_LINES = 400
GPU_RUN_FOLDER = re.compile(r"(gemm|moe|mla)-.+-tp\d+(-ep\d+)?")     # tuner/pipeline/planning.py's out_dir


@dataclass
class Command:
    text: str
    argv: list
    tags: set
    file: str               # relative to the repository
    line: int

    def runs_here(self) -> bool:
        return not self.tags or self.tags == {"wheels"} and WHEELS

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


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


def commands_of(path: Path) -> list[Command]:
    """The commands in a Markdown file's fenced code blocks, in order."""
    commands, in_block, pending, start = [], False, "", 0
    rel = str(path.relative_to(REPO))
    for n, line in enumerate(path.read_text().splitlines(), start=1):
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
            continue                             # set-up commands, JSON, tables and other examples
        command, comment = _split_comment(text)
        tags = set(re.findall(r"\[(" + "|".join(TAGS) + r")\]", comment))
        argv = [os.path.expanduser(os.path.expandvars(a)) for a in shlex.split(command)]
        commands.append(Command(text, argv, tags, rel, start))
    return commands


COMMANDS = {str(path.relative_to(REPO)): commands_of(path) for path in FILES}
ALL = [c for commands in COMMANDS.values() for c in commands]


def test_the_readme_and_the_manual_have_commands_and_tags():
    """The extraction itself: the commands and the tags are found (an edit that breaks the
    code blocks must not leave the tests below running nothing)."""
    assert len(FILES) > 10 and sum(c.runs_here() for c in ALL) >= 30
    readme = COMMANDS["README.md"]
    assert any(c.argv[:3] == ["tuner", "landscape", "synth"] for c in readme)       # the try without a GPU
    assert any(c.argv[:2] == ["tuner", "moe"] and c.tags == {"GPU"} for c in readme)  # the main job
    assert {t for c in ALL for t in c.tags} == set(TAGS)
    gpu_runs = [c for c in ALL if c.argv[0] == "tuner" and c.argv[1] in ("gemm", "moe", "mla")
                and "--dry-run" not in c.argv and "--replay" not in c.argv and "cpu" not in c.argv
                and "--synthetic" not in c.argv]
    assert gpu_runs and all("GPU" in c.tags for c in gpu_runs)        # a tuning run without a landscape


def _scratch(tmp_path: Path) -> Path:
    for name in ("configs", "scripts", "landscapes"):
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


def _markdown_written(command: Command) -> Path | None:
    """Where `tuner report` or `tuner diff` says it writes its Markdown (None for the others)."""
    if command.argv[:1] != ["tuner"] or command.argv[1] not in ("report", "diff"):
        return None
    args = build_parser().parse_args(command.argv[1:])
    if command.argv[1] == "report":
        return Path(args.out) if args.out else Path(args.run) / "report" / "report.md"
    return Path(args.out or Path(args.new) / "diff") / "diff.md"


# a file with [wheels] commands runs them where TUNER_ENGINE_WHEELS is set (.ci/run's ci_variables run)
@pytest.mark.parametrize("file", [
    pytest.param(f, marks=pytest.mark.ci_variables if any("wheels" in c.tags for c in commands) else ())
    for f, commands in COMMANDS.items() if any(c.runs_here() for c in commands)])
def test_commands_run_as_written(file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(_scratch(tmp_path))
    monkeypatch.setenv("COLUMNS", "120")           # a 120-column terminal: every line fits it (issue 41)
    ran = 0
    for command in COMMANDS[file]:
        if not command.runs_here():
            continue
        rc, out, err = _run(command, capsys)
        where = f"{command.where}: {command.text}\n{err[-2000:]}"
        assert rc == 0, where
        assert "Traceback" not in err and "internal error" not in err, where
        # what a person reads fits; --json's output is for programs, printed whole (a JSON string
        # holding a long note is not cut: textwidth.print_whole)
        shown = err if "--json" in command.argv else out + err
        wide = [line for line in shown.splitlines() if len(line) > 120]
        assert not wide, f"{where}\nlines over 120 columns:\n" + "\n".join(wide[:10])
        shows_times = ("--replay" in command.argv or "--synthetic" in command.argv
                       or command.argv[1:2] in (["report"], ["diff"], ["landscape"]))
        recorded = any(a.startswith("landscapes/") for a in command.argv)     # the ones we ship: a GPU's
        if shows_times and recorded:  # a landscape recorded on a GPU says whose times it replays
            assert re.search(r"^times: landscape recorded on NVIDIA H\d+ \(\d{4}-\d\d-\d\d\), replayed$", out, re.M), where
            assert "SYNTHETIC" not in out, where
        elif shows_times:             # every other landscape in the README and docs/ is synthetic, and says so
            assert "SYNTHETIC" in out, where
        if "--device" in command.argv:   # the CPU device's times say so
            assert "*** CPU DEVICE" in out, where
        markdown = _markdown_written(command)
        if markdown is not None:
            assert (tmp_path / markdown).is_file(), where
        ran += 1
    assert ran == sum(c.runs_here() for c in COMMANDS[file])
    # nothing run without a GPU writes into a GPU run's default folder (runs/moe-deepseek-v3-H200-tp8)
    runs = tmp_path / "runs"
    gpu_folders = [p.name for p in runs.iterdir() if GPU_RUN_FOLDER.fullmatch(p.name)] if runs.is_dir() else []
    assert not gpu_folders, f"{file} wrote into a GPU run's default folder: {gpu_folders}"
    if file == "README.md":
        # the try without a GPU runs again as written, in the same folder (its landscape
        # replaced, its run resumed)
        first, last = tour_lines()
        tour = [c for c in COMMANDS[file] if c.runs_here() and first < c.line < last]
        assert tour
        monkeypatch.setenv("COLUMNS", "80")         # again on an 80-column terminal: every line fits it
        for command in tour:
            rc, out, err = _run(command, capsys)
            assert rc == 0 and "Traceback" not in err, f"again: {command.where}: {command.text}\n{err[-2000:]}"
            wide = [line for line in (out + err).splitlines() if len(line) > 80]
            assert not wide, f"again at 80 columns: {command.where}\n" + "\n".join(wide[:10])


def tour_lines() -> tuple[int, int]:
    """The README lines of the try without a GPU: from "## Try it without a GPU" to the next heading."""
    lines = README.read_text().splitlines()
    start = lines.index("## Try it without a GPU")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("#"))
    return start + 1, end + 1


@pytest.mark.parametrize("command", [c for c in ALL if not c.runs_here() and c.argv[0] != "scripts"],
                         ids=lambda c: c.where)
def test_commands_not_run_here_parse(command):
    """What cannot run here still names real subcommands, options and choices."""
    argv = command.argv[3:] if command.argv[:3] == ["python", "-m", "tuner"] else command.argv[1:]
    build_parser().parse_args(argv)            # a bad option raises TunerError with the option's name


@pytest.mark.parametrize("tag", [pytest.param(t, marks=pytest.mark.ci_variables if t == "wheels" else ())
                                 for t in TAGS if t != "wheels" or not WHEELS])
def test_commands_not_run_here(tag):
    reasons = {"GPU": "they need a Hopper GPU (and run minutes to hours)",
               "engine": "they write into an installed vLLM or SGLang",
               "wheels": "they need the engines' wheels: TUNER_ENGINE_WHEELS is not set (.ci/run sets it)"}
    where = [c.where for c in ALL if tag in c.tags]
    pytest.skip(f"commands tagged [{tag}] ({', '.join(where)}) are not run: {reasons[tag]}; "
                "their arguments are checked")


def test_the_readme_is_a_front_page_whose_links_lead_somewhere():
    """At most 400 lines (the rest belongs in docs/), and every relative link names a file of
    the repository (mkdocs checks the links inside docs/; the README is not part of the site)."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md is a front page: move the details into docs/"
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+:", link)]
    assert len(local) >= 10
    assert all((REPO / link).exists() for link in local), [link for link in local if not (REPO / link).exists()]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading when it shows a Markdown file: lower case, every
    character but letters, digits, '_', '-' and spaces dropped, each space a '-' (runs of '-'
    are kept: "windows (`--minutes`)" -> "windows---minutes")."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def markdown_slug(heading: str) -> str:
    """The anchor MkDocs gives it: Python-Markdown's toc extension (pinned in the docs extra)
    where installed; its rule written out otherwise (runs of '-' and spaces become one '-')."""
    try:
        from markdown.extensions.toc import slugify
    except ImportError:
        import unicodedata
        text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
        text = re.sub(r"[^\w\s-]", "", text).strip().lower()
        return re.sub(r"[-\s]+", "-", text)
    return slugify(heading, "-")


def headings(path: Path) -> list[str]:
    """The text of every heading of a Markdown page, its code spans' backticks dropped."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [m.group(1).replace("`", "") for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, flags=re.M)]


def test_every_anchor_link_resolves_on_github_and_in_the_site():
    """A link to a heading (`page.md#anchor`, `#anchor`) in the README or the manual names a
    heading whose anchor is the same under GitHub's rule and MkDocs' (Python-Markdown's toc),
    so neither where it is read nor a release of Markdown can break it: a heading with
    punctuation next to a space ("windows (`--minutes`)") gets two anchors, and a link to one of
    them broke `mkdocs build --strict` with the Markdown pip installed (issue 50, item 1)."""
    pages = [README, *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, anchor = target.split("#", 1)
            linked = (page.parent / file) if file else page
            both = {github_slug(h) for h in headings(linked)} & {markdown_slug(h) for h in headings(linked)}
            if anchor not in both:
                broken.append(f"{page.name}: {target}")
    assert not broken, broken
    # the two rules part where the bug was: what the check above guards against
    assert (github_slug("Windows (--minutes)"), markdown_slug("Windows (--minutes)")) == ("windows---minutes", "windows-minutes")


def test_the_site_lists_every_page():
    """mkdocs.yml's navigation names every page of docs/, once (a page left out is a page
    nobody finds; .ci/run's `mkdocs build --strict` also refuses it)."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    pages = [page for entry in nav for page in entry.values()]
    assert sorted(pages) == sorted(p.name for p in DOCS.glob("*.md")) and len(set(pages)) == len(pages)


def layout_tree() -> dict[str, str]:
    """{path: what it is for} of the modules docs/architecture.md's layout shows, by their
    folders (indentation nests a file in the folder above it)."""
    block = ARCHITECTURE.read_text().split("## Layout", 1)[1].split("```", 2)[1]
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
    """docs/architecture.md's layout shows every module of tuner/ and kernels/ in the folder it
    is in, each with what it is for, and nothing that is not there (a module moved or added
    must be placed, and said what it is for, there)."""
    shown = layout_tree()
    modules = {str(p.relative_to(REPO)) for d in ("tuner", "kernels") for p in (REPO / d).rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")}
    assert len(modules) > 40
    assert not modules - set(shown), f"docs/architecture.md's layout does not show {sorted(modules - set(shown))}"
    assert not set(shown) - modules, \
        f"docs/architecture.md's layout shows modules that do not exist: {sorted(set(shown) - modules)}"
    assert all(shown.values()), [p for p, what in shown.items() if not what]
