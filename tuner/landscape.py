"""Landscapes: every config of a pruned grid timed on a real GPU, saved as JSON Lines.

Line 1 is a header:
  {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200",
   "triton": "3.6.0", "torch": "...", "cuda": "...", "driver": "...", "recorded": ISO time}
Every other line is one measurement:
  {"problem": {"N": 7168, "K": 2048, "block_shape": [128, 128]}, "M": 16,
   "config": {...the kernel's config keys...}, "time_us": 12.3}
or the same with "error": "..." instead of "time_us". Files may be gzipped (.jsonl.gz).
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError
from tuner.kernel_api import KernelSpec, config_tuple
from tuner.problems import Problem

FORMAT = "tuner-landscape/1"


def problem_key(kernel: KernelSpec, params: dict) -> str:
    """The landscape's identity for a problem: its params in the kernel's key order."""
    ordered = {k: params[k] for k in kernel.problem_keys if k in params}
    return Problem(kernel.name, ordered).key


@dataclass
class Point:
    time_us: float | None
    error: str | None = None
    spread: float | None = None


@dataclass
class Landscape:
    header: dict
    kernel: KernelSpec
    path: str = ""
    # (problem key, M) -> {config tuple: Point}
    points: dict[tuple[str, int], dict[tuple, Point]] = field(default_factory=dict)
    problems: dict[str, dict] = field(default_factory=dict)   # problem key -> params

    def add(self, params: dict, M: int, config: dict, point: Point) -> None:
        key = problem_key(self.kernel, params)
        self.problems.setdefault(key, dict(params))
        self.points.setdefault((key, M), {})[config_tuple(self.kernel, config)] = point

    def lookup(self, params: dict, M: int) -> dict[tuple, Point] | None:
        return self.points.get((problem_key(self.kernel, params), M))

    def batch_sizes(self, params: dict) -> list[int]:
        key = problem_key(self.kernel, params)
        return sorted(m for (k, m) in self.points if k == key)

    def best(self, params: dict, M: int) -> tuple[tuple, float] | None:
        pts = self.lookup(params, M) or {}
        timed = [(c, p.time_us) for c, p in pts.items() if p.time_us is not None]
        return min(timed, key=lambda cp: cp[1]) if timed else None


def _open(path: Path, mode: str):
    return gzip.open(path, mode + "t") if path.name.endswith(".gz") else open(path, mode)


def read_header(path: str | Path) -> dict:
    """Line 1 of a landscape, e.g. to learn its kernel before reading the rest."""
    try:
        with _open(Path(path), "r") as f:
            return json.loads(f.readline())
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TunerError(f"cannot read the header of landscape {path}: {e}") from None


def read_landscape(path: str | Path, kernel: KernelSpec) -> Landscape:
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"landscape {path} not found")
    try:
        with _open(path, "r") as f:
            lines = f.readlines()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TunerError(f"cannot read landscape {path}: {e}") from None
    if not lines:
        raise TunerError(f"landscape {path} is empty")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        raise TunerError(f"landscape {path}: line 1 is not a JSON header") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TunerError(f"landscape {path}: line 1 must be a header with \"format\": \"{FORMAT}\"")
    for key in ("kernel", "device"):
        if not header.get(key):
            raise TunerError(f"landscape {path}: header lacks {key!r}")
    if header["kernel"] != kernel.name:
        raise TunerError(f"landscape {path} holds kernel {header['kernel']!r}, not {kernel.name!r}")
    land = Landscape(header, kernel, str(path))
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            params, M, cfg = rec["problem"], int(rec["M"]), rec["config"]
            if "time_us" in rec and rec["time_us"] is not None:
                point = Point(float(rec["time_us"]), None, rec.get("spread"))
            elif rec.get("error"):
                point = Point(None, str(rec["error"]))
            else:
                raise KeyError("time_us or error")
            land.add(params, M, cfg, point)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise TunerError(f"landscape {path}: line {n} is malformed ({type(e).__name__}: {e})") from None
    return land


class LandscapeWriter:
    """Streams records to FILE.partial and renames it to FILE when closed, so a file at
    FILE is always whole. A .partial left by a killed run is read back and continued."""

    def __init__(self, path: str | Path, kernel: KernelSpec, header: dict):
        self.path = Path(path)
        self.kernel = kernel
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.done: set[tuple[str, int, tuple]] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.partial.exists():
            self._resume(header)
        else:
            with open(self.partial, "w") as f:
                f.write(json.dumps(header) + "\n")
        self._f = open(self.partial, "a")

    def _resume(self, header: dict) -> None:
        with open(self.partial) as f:
            lines = f.readlines()
        old = json.loads(lines[0]) if lines else {}
        if old.get("kernel") != header["kernel"] or old.get("device") != header["device"]:
            raise TunerError(f"{self.partial} was recorded for {old.get('kernel')} on {old.get('device')}; "
                             "remove it or record to another file")
        good = [lines[0]]
        for line in lines[1:]:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break   # a line cut off by a kill: drop it and what follows
            self.done.add((problem_key(self.kernel, rec["problem"]), rec["M"],
                           config_tuple(self.kernel, rec["config"])))
            good.append(line)
        with open(self.partial, "w") as f:
            f.writelines(good)

    def has(self, params: dict, M: int, config: dict) -> bool:
        return (problem_key(self.kernel, params), M, config_tuple(self.kernel, config)) in self.done

    def write(self, params: dict, M: int, config: dict, point: Point) -> None:
        rec = {"problem": params, "M": M, "config": config}
        if point.time_us is not None:
            rec["time_us"] = round(point.time_us, 4)
            if point.spread is not None:
                rec["spread"] = round(point.spread, 4)
        else:
            rec["error"] = point.error or "failed"
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()
        self.done.add((problem_key(self.kernel, params), M, config_tuple(self.kernel, config)))

    def close(self) -> None:
        self._f.close()
        if self.path.name.endswith(".gz"):
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(self.partial, "rb") as src, gzip.open(tmp, "wb") as dst:
                dst.write(src.read())
            os.replace(tmp, self.path)
            os.unlink(self.partial)
        else:
            os.replace(self.partial, self.path)


def landscape_kernel(path: str | Path):
    """The KernelSpec a landscape's timings belong to (its header's kernel and source),
    without an engine's code: enough to read it."""
    from kernels import get_kernel
    header = read_header(path)
    if not isinstance(header, dict) or header.get("format") != FORMAT or not header.get("kernel"):
        raise TunerError(f"landscape {path}: line 1 must be a header with \"format\": \"{FORMAT}\" and a kernel")
    source = header.get("kernel_source", "ours")
    if source == "ours":
        return get_kernel(header["kernel"])
    return get_kernel(header["kernel"], source, load_code=False)


def summary(land: Landscape) -> dict:
    """What a landscape covers: per problem its batch sizes, points and failures, and the
    most common failure reasons."""
    from collections import Counter
    problems: dict[str, dict] = {}
    reasons: Counter = Counter()
    for (key, M), pts in sorted(land.points.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        p = problems.setdefault(key, {"batch_sizes": [], "points": 0, "failures": 0})
        p["batch_sizes"].append(M)
        p["points"] += len(pts)
        failed = [pt.error or "failed" for pt in pts.values() if pt.time_us is None]
        p["failures"] += len(failed)
        reasons.update(failed)
    return {"problems": problems, "points": sum(p["points"] for p in problems.values()),
            "failures": sum(p["failures"] for p in problems.values()), "reasons": reasons.most_common(3)}


def info_lines(land: Landscape) -> list[str]:
    """`tuner landscape info FILE`, in words."""
    from tuner.provenance import from_header
    h = land.header
    s = summary(land)
    source = h.get("kernel_source", "ours")
    version = h.get("kernel_source_version") or ""
    lines = [f"landscape {land.path}", *from_header(h, land.path).banner(),
             f"  kernel     {h['kernel']} ("
             + ("our kernel" if source == "ours" else f"{source}{' ' + version if version else ''}'s kernel") + ")",
             f"  device     {h['device']}",
             "  software   " + ", ".join(f"{k} {h.get(k) or '?'}" for k in ("triton", "torch", "cuda", "driver")),
             f"  {'written ' if h.get('synthetic') else 'recorded'}   {h.get('recorded') or '?'}",
             f"  {len(s['problems'])} problems, {s['points']} points, {s['failures']} failed"
             + (" (" + "; ".join(f"{n}x {r}" for r, n in s["reasons"]) + ")" if s["reasons"] else "")]
    for key, p in s["problems"].items():
        lines.append(f"  problem {key}")
        lines.append(f"    M {' '.join(map(str, p['batch_sizes']))}: {p['points']} points, {p['failures']} failed")
    return lines
