"""Landscapes: every config of a pruned grid timed on a real GPU, saved as JSON Lines.

Line 1 is a header:
  {"format": "tuner-landscape/1", "kernel": "fp8_gemm", "device": "NVIDIA H200",
   "triton": "3.6.0", "torch": "...", "cuda": "...", "driver": "...", "recorded": ISO time,
   "code_version": hash of the kernel's code, "space": hash of the search space}
(an engine's kernel adds "kernel_source" and "kernel_source_version"; older landscapes lack
"code_version" and "space", and are read with a note).
Every other line is one measurement:
  {"problem": {"N": 7168, "K": 2048, "block_shape": [128, 128]}, "M": 16,
   "config": {...the kernel's config keys...}, "time_us": 12.3}
or the same with "error": "..." (and "failure": its kind, tuner/measure/failures.py) instead of
"time_us". Files may be gzipped (.jsonl.gz).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import TunerError
from tuner.measure.failures import RUNTIME, kind_of
from tuner.plan.kernel_api import MAX_CONFIG_VALUE, KernelSpec, config_from_entry, config_tuple
from tuner.plan.problems import Problem

FORMAT = "tuner-landscape/1"
MAX_M = 1 << 20                  # as the command line's batch sizes
MAX_DIM = 1 << 24                # a problem's sizes (hidden size, experts x N, contexts): beyond any model
# Header keys besides kernel and device that a recording continues only when they match.
RESUME_KEYS = ("kernel_source", "kernel_source_version", "code_version", "triton", "space")


def problem_key(kernel: KernelSpec, params: dict) -> str:
    """The landscape's identity for a problem: its params in the kernel's key order."""
    ordered = {k: params[k] for k in kernel.problem_keys if k in params}
    return Problem(kernel.name, ordered).key


@dataclass
class Point:
    time_us: float | None
    error: str | None = None
    spread: float | None = None
    kind: str | None = None        # a failure's kind (tuner/measure/failures.py); from `error` when not given

    def __post_init__(self) -> None:
        if self.time_us is None and self.kind is None:
            self.kind = kind_of(self.error) or RUNTIME


@dataclass
class Landscape:
    header: dict
    kernel: KernelSpec
    path: str = ""
    # (problem key, M) -> {config tuple: Point}
    points: dict[tuple[str, int], dict[tuple, Point]] = field(default_factory=dict)
    problems: dict[str, dict] = field(default_factory=dict)   # problem key -> params
    digest: str = ""              # sha256 of the lines read (decompressed): which landscape, for identities

    def add(self, params: dict, M: int, config: dict, point: Point) -> None:
        key = problem_key(self.kernel, params)
        self.problems.setdefault(key, dict(params))
        self.points.setdefault((key, M), {})[config_tuple(self.kernel, config_from_entry(self.kernel, config))] = point

    def lookup(self, params: dict, M: int) -> dict[tuple, Point] | None:
        return self.points.get((problem_key(self.kernel, params), M))

    def batch_sizes(self, params: dict) -> list[int]:
        key = problem_key(self.kernel, params)
        return sorted(m for (k, m) in self.points if k == key)

    def best(self, params: dict, M: int) -> tuple[tuple, float] | None:
        pts = self.lookup(params, M) or {}
        timed = [(c, p.time_us) for c, p in pts.items() if p.time_us is not None]
        return min(timed, key=lambda cp: cp[1]) if timed else None


def read_header(path: str | Path) -> dict:
    """Line 1 of a landscape, e.g. to learn its kernel before reading the rest (read
    within bounds: tuner/reading.py landscape_header, where the plan stage reads it too)."""
    from tuner.reading import landscape_header
    return landscape_header(path)


def landscape_source(kernel: KernelSpec) -> dict:
    """What a landscape's header says of the code it timed: a hash of that code, and for an
    engine's kernel whose it is (none for ours, so that older landscapes read the same)."""
    out = {"code_version": kernel.code_version} if kernel.code_version else {}
    if kernel.source == "ours":
        return out
    variant = {"kernel_variant": kernel.variant} if kernel.variant else {}      # the launcher's variant
    return {"kernel_source": kernel.source, "kernel_source_version": kernel.source_version, **variant, **out}


def _header(path: Path, line: str) -> dict:
    try:
        header = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        raise TunerError(f"landscape {path}: line 1 is not a JSON header") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TunerError(f"landscape {path}: line 1 must be a header with \"format\": \"{FORMAT}\"")
    for key in ("kernel", "device"):
        if not header.get(key) or not isinstance(header[key], str):
            raise TunerError(f"landscape {path}: header lacks {key!r}")
    return header


def replay_times(path: str | Path) -> str | None:
    """Where a replay of this landscape takes its times (tuner/measure/provenance.py), known
    before it is read: its header, and the hash of its lines as read_landscape takes it; None
    for a landscape that cannot be read (refused where it is read)."""
    from tuner.measure.provenance import landscape_times
    from tuner.reading import text_lines
    try:
        header = read_header(path)
        if not isinstance(header, dict):
            return None
        if header.get("synthetic"):
            return landscape_times(header, "")
        digest = hashlib.sha256()
        for _, line in text_lines(Path(path), "landscape "):
            digest.update(line.encode() + b"\n")
    except TunerError:
        return None
    return landscape_times(header, digest.hexdigest())


def read_landscape(path: str | Path, kernel: KernelSpec) -> Landscape:
    """A landscape, every line checked (its number named when one is not a measurement),
    streamed within the bounds of tuner/reading.py (line length, decompressed size)."""
    from tuner.reading import text_lines
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"landscape {path} not found")
    land: Landscape | None = None
    digest = hashlib.sha256()
    for n, line in text_lines(path, "landscape "):
        digest.update(line.encode() + b"\n")
        if land is None:
            header = _header(path, line)
            if header["kernel"] != kernel.name:
                raise TunerError(f"landscape {path} holds kernel {header['kernel']!r}, not {kernel.name!r}")
            land = Landscape(header, kernel, str(path))
            continue
        if not line.strip():
            continue
        try:
            params, M, cfg, point = parse_record(json.loads(line), kernel)
            land.add(params, M, cfg, point)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError) as e:
            raise TunerError(f"landscape {path}: line {n} is malformed ({type(e).__name__}: {e})") from None
    if land is None:
        raise TunerError(f"landscape {path} is empty")
    land.digest = digest.hexdigest()
    return land


def _number(value, what: str, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (value <= 0 if positive else value < 0):
        raise ValueError(f"{what} must be a {'positive' if positive else 'non-negative'} finite number, "
                         f"not {value!r}")
    return float(value)


def parse_record(rec, kernel: KernelSpec) -> tuple[dict, int, dict, Point]:
    """One measurement line, checked: a problem object, a positive integer M, a config with
    the kernel's integer keys, and either a positive finite time (spread optional) or an error."""
    if not isinstance(rec, dict):
        raise TypeError("not a JSON object")
    params, M, cfg = rec["problem"], rec["M"], rec["config"]
    if not isinstance(params, dict):
        raise TypeError("'problem' is not an object")
    if isinstance(M, bool) or not isinstance(M, int) or not 1 <= M <= MAX_M:
        raise ValueError(f"'M' must be a whole number from 1 to {MAX_M}, not {M!r}")
    for k, v in params.items():
        if isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= MAX_DIM:
            raise ValueError(f"problem key {k}={v} is beyond any model (at most {MAX_DIM})")
    if not isinstance(cfg, dict):
        raise TypeError("'config' is not an object")
    for k in kernel.config_keys:
        v = cfg[k] if k not in kernel.optional_keys else cfg.get(k, kernel.optional_keys[k])
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_CONFIG_VALUE:
            raise ValueError(f"config key {k} must be a whole number from 0 to {MAX_CONFIG_VALUE}, not {v!r}")
    if rec.get("time_us") is not None:
        spread = rec.get("spread")
        return params, M, cfg, Point(_number(rec["time_us"], "time_us", True), None,
                                     None if spread is None else _number(spread, "spread", False))
    if isinstance(rec.get("error"), str) and rec["error"]:
        kind = rec.get("failure")
        if kind is not None and not isinstance(kind, str):
            raise TypeError(f"'failure' must be a kind's name, not {kind!r}")
        return params, M, cfg, Point(None, rec["error"], None, kind)
    raise KeyError("time_us or error")


class LandscapeWriter:
    """Streams records to a partial file and renames it to FILE when closed, so a file at
    FILE is always whole. A recording (resume=True) streams to FILE.partial, which a run
    killed part-way leaves behind and the next recording reads back and continues (when it
    was recorded on the same kernel, device, code, Triton and space). A landscape written in
    one go (resume=False: `landscape synth`) streams to a temporary file of its own
    (`.FILE.<random>.tmp`), so a killed run leaves nothing a rerun would continue or merge,
    and never touches a FILE.partial another run left. Every file is written inside FILE's
    folder, through no symbolic link (tuner/paths.py)."""

    def __init__(self, path: str | Path, kernel: KernelSpec, header: dict, resume: bool = True):
        from tuner.paths import confined
        self.path = confined(Path(path))
        self.kernel = kernel
        self.resume = resume
        self.done: set[tuple[str, int, tuple]] = set()
        if resume:
            self.partial = self.path.with_name(self.path.name + ".partial")
            if os.path.lexists(self.partial) and (os.path.islink(self.partial) or not self.partial.is_file()):
                raise TunerError(f"{self.partial} is not a file of ours (a link, or a folder); remove it")
            self._f = self._held_partial()
            try:
                if os.fstat(self._f.fileno()).st_size:
                    if self._resume(header):
                        self._f = self._held_partial(replacing=self._f)
                else:                              # new (or killed before its first byte)
                    self._f.write(json.dumps(header) + "\n")
                    self._f.flush()
            except BaseException:
                self._f.close()
                raise
        else:
            from tuner.paths import new_temporary
            fd, tmp = new_temporary(self.path)      # locked while this writer lives (tuner/paths.py)
            self.partial = Path(tmp)
            self._f = os.fdopen(fd, "w")
            self._f.write(json.dumps(header) + "\n")

    def _held_partial(self, replacing=None):
        """FILE.partial opened to append to, under an exclusive lock (flock) held while this
        writer lives: two recordings into one FILE would interleave their lines and the first to
        finish would take the file from the other, so the second is refused. The kernel drops
        the lock when its holder dies (kill -9 included), so a killed run's .partial is continued.
        `replacing`: our locked handle on the file as it was before _resume rewrote it (a new
        inode), held until the new one is locked so no run slips in between."""
        import fcntl

        from tuner.paths import open_for_append
        for _ in range(100):
            f = open_for_append(self.partial)
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                if replacing is not None:
                    replacing.close()
                raise TunerError(f"{self.path} is being recorded by another run ({self.partial} is held); "
                                 "wait for it to finish, or record to another file") from None
            except BaseException:
                f.close()
                raise
            try:
                same = os.path.samestat(os.fstat(f.fileno()), os.stat(self.partial, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if same:
                if replacing is not None:
                    replacing.close()
                return f
            f.close()       # locked a file another run has since renamed or removed: open it again
        raise TunerError(f"{self.partial} keeps being replaced by another run; record to another file")

    def _resume(self, header: dict) -> bool:
        """Reads back FILE.partial (ours, locked) and keeps what can be continued; True when
        it had to be rewritten (a line cut off, a record twice)."""
        from tuner.paths import atomic_write_text
        from tuner.reading import text_lines
        read = [line for _, line in text_lines(self.partial, "partial landscape ")]
        lines = read
        if not lines or not lines[0].endswith("\n"):       # killed before its header was whole
            lines = [json.dumps(header) + "\n"]
        try:
            old = json.loads(lines[0]) if lines else {}
        except (json.JSONDecodeError, RecursionError):
            old = None
        if not isinstance(old, dict) or old.get("format") != FORMAT:
            raise TunerError(f"{self.partial} is not a partial landscape (its first line is no landscape header); "
                             "remove it or record to another file")
        if old.get("kernel") != header["kernel"] or old.get("device") != header["device"]:
            raise TunerError(f"{self.partial} was recorded for {old.get('kernel')} on {old.get('device')}; "
                             "remove it or record to another file")
        # Timings of other code, another Triton or another space must not be continued
        # (a key an older file lacks is no difference).
        differs = [f"{k} {old[k]} (now {header[k]})" for k in RESUME_KEYS
                   if old.get(k) and header.get(k) and old[k] != header[k]]
        if differs:
            raise TunerError(f"{self.partial} was recorded with another {', '.join(differs)}; "
                             "remove it or record to another file")
        good = lines[:1]
        for line in lines[1:]:
            try:
                params, M, cfg, _ = parse_record(json.loads(line), self.kernel)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError):
                break   # a line cut off by a kill: drop it and what follows
            if not line.endswith("\n"):
                break   # the last line, cut before its end: measured again
            key = (problem_key(self.kernel, params), M, config_tuple(self.kernel, cfg))
            if key in self.done:
                continue          # written twice (a run killed between two writers): keep one
            self.done.add(key)
            good.append(line)
        if good == read:                  # as the file holds it: nothing to rewrite
            return False
        atomic_write_text(self.partial, "".join(good))
        return True

    def has(self, params: dict, M: int, config: dict) -> bool:
        return (problem_key(self.kernel, params), M, config_tuple(self.kernel, config)) in self.done

    def write(self, params: dict, M: int, config: dict, point: Point) -> Point:
        """Append one measurement; returns it as the file holds it (times rounded), so a
        recording run searches the very numbers a replay of the file will read."""
        rec = {"problem": params, "M": M, "config": config}
        if point.time_us is not None:
            point = Point(round(point.time_us, 4), point.error,
                          None if point.spread is None else round(point.spread, 4), point.kind)
            rec["time_us"] = point.time_us
            if point.spread is not None:
                rec["spread"] = point.spread
        else:
            rec["error"] = point.error or "failed"
            rec["failure"] = point.kind
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()
        self.done.add((problem_key(self.kernel, params), M, config_tuple(self.kernel, config)))
        return point

    def abandon(self) -> None:
        """A landscape written in one go that did not finish: its temporary file goes (a
        recording keeps its .partial, to be continued). Closing flushes, which fails again on a
        full disk: the temporary goes all the same."""
        try:
            self._f.close()
        finally:
            if not self.resume:
                try:
                    os.unlink(self.partial)
                except FileNotFoundError:
                    pass

    def close(self) -> None:
        from tuner.file_kinds import LANDSCAPE
        from tuner.paths import atomic_write_file, replaceable
        # The file stays open (a temporary's lock with it) until it is in place: a rerun
        # beside us never takes it for a killed writer's.
        self._f.flush()
        try:
            if self.path.name.endswith(".gz"):
                def fill(tmp: Path) -> None:
                    with open(self.partial, "rb") as src, gzip.open(tmp, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                try:
                    atomic_write_file(self.path, fill, kind=LANDSCAPE)    # only a landscape is replaced
                except BaseException:
                    if not self.resume:
                        os.unlink(self.partial)
                    raise
                os.unlink(self.partial)
            else:
                try:
                    replaceable(self.path, LANDSCAPE)     # only a landscape is replaced (a recording's .partial stays)
                except TunerError:
                    if not self.resume:
                        os.unlink(self.partial)
                    raise
                if not self.resume:                       # mkstemp's file is private: as open() would
                    from tuner.paths import new_file_mode
                    os.chmod(self.partial, new_file_mode())
                os.replace(self.partial, self.path)
        finally:
            self._f.close()


def describe(land: Landscape) -> list[str]:
    """What a landscape covers, in lines: source, device and versions, then per problem its
    batch sizes, points and failures."""
    h = land.header
    source = h.get("kernel_source", "ours")
    lines = [f"landscape {land.path}",
             f"  kernel {h['kernel']} ({source}'s" + (f" {h['kernel_source_version']}" if h.get("kernel_source_version")
                                                    else "") + " code)",
             f"  device {h['device']}; triton {h.get('triton')}, torch {h.get('torch')}, cuda {h.get('cuda')}, "
             f"driver {h.get('driver')}; recorded {h.get('recorded')}"]
    if h.get("synthetic"):
        lines.append("  *** SYNTHETIC: made by a cost model, not measured on any GPU ***")
    from tuner.measure.provenance import is_cpu_device
    if is_cpu_device(h):
        lines.append("  *** CPU DEVICE: recorded on a CPU in Triton's interpreter, not on any GPU ***")
    total = failed = 0
    for key, params in sorted(land.problems.items()):
        ms = land.batch_sizes(params)
        pts = [p for m in ms for p in (land.lookup(params, m) or {}).values()]
        bad = sum(p.time_us is None for p in pts)
        total, failed = total + len(pts), failed + bad
        lines.append(f"  problem {key}: M={','.join(map(str, ms))}; {len(pts)} points, {bad} failed")
    lines.append(f"  {len(land.problems)} problems, {total} points, {failed} failed")
    return lines
