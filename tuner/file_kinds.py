"""Every kind of file the tool writes at a path the user names (an --out FILE, or a file it puts
in a folder given as --out), and how each is told by its content: the guarded writer
(tuner/paths.py `replaceable`) replaces a file there only when it is of the kind being written,
so a user's notes, another program's file or a device named by mistake is refused in one line,
never replaced. Each test reads a bounded part of the file (tuner/reading.py) and never raises:
anything it cannot read is not ours."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Callable

from tuner.errors import TunerError
from tuner.paths import Kind

HEAD_BYTES = 64 << 10             # what is read of a file to tell its kind (its first line, a PNG's chunks)
PLOT_SOFTWARE = "tuner"           # the PNG text chunk our plots carry (matplotlib's savefig metadata)
PLOT_METADATA = {"Software": PLOT_SOFTWARE}


def _safely(test: Callable[[Path], bool]) -> Callable[[Path], bool]:
    def ours(path: Path) -> bool:
        try:
            return bool(test(path))
        except (TunerError, OSError, ValueError, KeyError, TypeError, EOFError, zlib.error, RecursionError):
            return False
    return ours


def _json(path: Path):
    from tuner.reading import read_json_file
    return read_json_file(path)


def json_format(what: str, tag: str) -> Kind:
    """A JSON object whose "format" is `tag` (a ceilings file, a bench file, an audit)."""
    return Kind(f"{what} (\"format\": \"{tag}\")",
                _safely(lambda p: isinstance(d := _json(p), dict) and d.get("format") == tag))


def json_rows(what: str, keys: tuple[str, ...]) -> Kind:
    """A JSON list whose every item is an object holding `keys` (drift's rows, a night's summary)."""
    return Kind(what, _safely(lambda p: isinstance(d := _json(p), list)
                              and all(isinstance(r, dict) and set(keys) <= set(r) for r in d)))


def first_line(what: str, prefix: str, also: str = "") -> Kind:
    """A text file whose first line starts with `prefix` (and holds `also`): a Markdown report
    by its heading, a step's log by its command line."""
    from tuner.reading import first_line as line_1

    def test(p: Path) -> bool:
        line = line_1(p, "", HEAD_BYTES)
        return line.startswith(prefix) and also in line
    return Kind(what, _safely(test))


def _png_software(path: Path) -> str | None:
    """The "Software" text of a PNG (its chunks before the image data), None when none or no PNG."""
    from tuner.reading import read_head
    data = read_head(path, HEAD_BYTES)
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    at = 8
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind in (b"IDAT", b"IEND"):
            return None
        if kind == b"tEXt":
            key, _, text = data[at + 8:at + 8 + size].partition(b"\0")
            if key == b"Software":
                return text.decode("latin-1")
        at += 12 + size
    return None


def _tarball_under(path: Path, prefix: str) -> bool:
    """A gzipped tar whose first member lies under `prefix`."""
    from tuner.reading import first_tar_member
    return (first_tar_member(path, HEAD_BYTES) or "").startswith(prefix)


def landscape_file(path: Path) -> bool:
    from tuner.reading import landscape_header
    return landscape_header(path).get("format") == "tuner-landscape/1"


CEILINGS = json_format("a ceilings file", "tuner-ceilings/1")
BENCH_JSON = json_format("a bench file", "tuner-bench/1")
AUDIT_JSON = json_format("an audit", "tuner-audit/1")
BENCH_MD = first_line("a bench's Markdown (first line '# Bench: ...')", "# Bench: ")
REPORT_MD = first_line("a report (first line '# Tuning report: ...')", "# Tuning report: ")
DIFF_MD = first_line("a diff (first line '# NEW against OLD')", "# ", " against ")
AUDIT_MD = first_line("an audit's Markdown (first line '# tuner audit ...')", "# tuner audit")
NIGHT_MD = first_line("a night's report (first line '# Nightly retune ...')", "# Nightly retune ")
PROOF_MD = first_line("a proof's summary (first line '# GPU proof')", "# GPU proof")
LOG = first_line("a step's log (first line '$ COMMAND')", "$ ")
DRIFT_JSON = json_rows("drift's rows (a JSON list of rows with table, M and verdict)", ("table", "M", "verdict"))
NIGHT_JSON = json_rows("a night's summary (a JSON list of jobs with job and status)", ("job", "status"))
PROOF_STEPS = Kind("a proof's steps.json", _safely(lambda p: isinstance(d := _json(p), dict)
                                                   and isinstance(d.get("steps"), list) and "minutes" in d))
PROOF_ENV = Kind("a proof's environment.json", _safely(lambda p: isinstance(d := _json(p), dict)
                                                       and {"written", "device", "gpu"} <= set(d)))
PLOT = Kind(f"a plot tuner drew (a PNG whose Software is '{PLOT_SOFTWARE}')",
            _safely(lambda p: _png_software(p) == PLOT_SOFTWARE))
LANDSCAPE = Kind("a landscape (\"format\": \"tuner-landscape/1\" on line 1)", _safely(landscape_file))
PROOF_BUNDLE = Kind("a proof's tarball (top folder bench/results/)",
                    _safely(lambda p: _tarball_under(p, "bench/results/")))
