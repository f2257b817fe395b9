"""What each step of the GPU proof timed, read back from what it wrote: how many of its cases
were timed, how many failed, and the first failure's text (one line). A step that timed
nothing says so with that text (tuner/jobs/proof.py), in steps.json and summary.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from tuner.errors import TunerError
from tuner.measure.failures import one_line
from tuner.reading import read_json_file, text_lines


@dataclass
class Outcome:
    timed: int
    failed: int
    first_failure: str | None

    def line(self) -> str | None:
        """The step's detail line about its timings, None when nothing failed."""
        if not self.failed:
            return None
        first = f"; first failure: {self.first_failure}" if self.first_failure else ""
        if not self.timed:
            return f"timed nothing ({self.failed} failed){first}"
        return f"timed {self.timed} of {self.timed + self.failed}{first}"


def _json(path: Path):
    try:
        return read_json_file(path)
    except TunerError:                # missing, too big, not JSON: the step wrote no outcome
        return None


def _manifest(path: Path, engine: str | None = None) -> Outcome | None:
    data = _json(path)
    if not isinstance(data, dict):
        return None
    tables = [t for t in data.get("tables", []) if engine is None or engine in (t.get("files") or {})
              or (t.get("kernel_source") or {}).get("source") == engine]
    entries = [e for t in tables for e in (t.get("entries") or {}).values()]
    if not entries:
        return None
    timed = sum(1 for e in entries if e.get("time_us"))
    first = next((e["first_failure"] for e in entries if e.get("first_failure") and not e.get("time_us")),
                 next((e["first_failure"] for e in entries if e.get("first_failure")), None))
    return Outcome(timed, len(entries) - timed, first)


def _rows(rows: Iterable, skip=lambda row: False) -> Outcome | None:
    """Counted as they pass (a landscape's records stream through here, none kept)."""
    timed = failed = 0
    first = None
    for r in rows:
        if not isinstance(r, dict) or skip(r):
            continue
        if r.get("time_us"):
            timed += 1
        else:
            failed += 1
            if first is None and r.get("error"):
                first = one_line(r["error"])
    return Outcome(timed, failed, first) if timed or failed else None


def _landscape_records(folder: Path) -> Iterator:
    """The records of the landscapes in `folder`, streamed (bounded reads: tuner/reading.py);
    a file that cannot be read is left at what it gave."""
    for path in sorted(folder.glob("*.jsonl.gz")) if folder.is_dir() else []:
        try:
            for n, line in text_lines(path):
                if n > 1:                                   # line 1: the header
                    yield json.loads(line)
        except (TunerError, ValueError):
            continue


def step_outcome(out: Path, step: str) -> Outcome | None:
    """What `step` timed in the proof folder `out` (None: it times nothing, or wrote nothing)."""
    if step == "smoke":
        return _manifest(out / "runs" / "smoke" / "manifest.json")
    if step == "window":          # the state folder's tables (every window's so far)
        return next((_manifest(m) for m in sorted(out.glob("tuned/*/manifest.json"))), None)
    if step == "validate":
        cases = [c for f in validation_files(out) if isinstance(d := _json(f), dict)
                 for c in d.get("cases", [])]
        # a case recorded as passed before (bench/validated.json) was not run: neither timed nor failed
        return _rows(cases, skip=lambda r: bool(r.get("recorded"))) if cases else None
    if step == "landscapes":
        return _rows(_landscape_records(out / "landscapes"))
    return None


def validation_files(out: Path) -> list[Path]:
    """The validate step's results: the engines' kernels (kernels.json), then ours (ours.json)."""
    return [p for p in (out / "validate" / "kernels.json", out / "validate" / "ours.json") if p.is_file()]
