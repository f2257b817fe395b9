"""What each step of the GPU proof timed, read back from what it wrote: how many of its cases
were timed, how many failed, and the first failure's text (one line). A step that timed
nothing says so with that text (tuner/commands/proof.py), in steps.json and summary.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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


def _rows(rows: list, skip=lambda row: False) -> Outcome | None:
    rows = [r for r in rows if isinstance(r, dict) and not skip(r)]
    if not rows:
        return None
    timed = [r for r in rows if r.get("time_us")]
    failed = [r for r in rows if not r.get("time_us")]
    first = next((one_line(r.get("error")) for r in failed if r.get("error")), None)
    return Outcome(len(timed), len(failed), first)


def _landscape(folder: Path) -> Outcome | None:
    """Counted as the records stream past (bounded reads: tuner/reading.py), none kept."""
    timed = failed = 0
    first = None
    for path in sorted(folder.glob("*.jsonl.gz")) if folder.is_dir() else []:
        try:
            for n, line in text_lines(path):
                rec = json.loads(line) if n > 1 else None          # line 1: the header
                if not isinstance(rec, dict):
                    continue
                if rec.get("time_us"):
                    timed += 1
                else:
                    failed += 1
                    first = first or (one_line(rec["error"]) if rec.get("error") else None)
        except (TunerError, ValueError):
            continue
    return Outcome(timed, failed, first) if timed or failed else None


def step_outcome(out: Path, step: str) -> Outcome | None:
    """What `step` timed in the proof folder `out` (None: it times nothing, or wrote nothing)."""
    if step == "smoke":
        return _manifest(out / "runs" / "smoke" / "manifest.json")
    if step in ("tune-vllm", "tune-sglang"):
        return _manifest(out / "tuned" / "moe" / "manifest.json", step.split("-", 1)[1])
    if step == "validate":
        data = _json(out / "validate" / "kernels.json")
        return _rows(data.get("cases", [])) if isinstance(data, dict) else None
    if step in ("bench-moe", "bench-gemm"):
        folder = out / "bench" / step.split("-", 1)[1]
        data = _json(max(folder.glob("bench-*.json"), default=folder / "none"))
        # references outside Triton that cannot run here say so; they are not the step's timings
        return _rows(data.get("rows", []), skip=lambda r: r.get("contender") not in (None, "") and
                     not str(r.get("contender")).startswith(("default", "shipped", "tuned"))) \
            if isinstance(data, dict) else None
    if step == "landscapes":
        return _landscape(out / "landscapes")
    return None
