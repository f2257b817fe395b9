"""A bench file read back (`tuner report BENCH.json`): tuner bench's JSON (bench_output.py writes
it), every field the verdict uses checked on read. A file that is damaged, edited or made to
attack is one clear line naming the row and the field, never an internal error; and nothing of
it reaches the terminal unchecked: a text printed (the banner, a problem, a contender) is one
line of printable characters, so escapes cannot clear the screen or forge a verdict line, and a
banner is a line, not megabytes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.batch_keys import MAX_BATCH, batch_key

FORMAT = "tuner-bench/1"
MAX_TEXT = 1000            # a problem's key is ~150 characters, a banner ~200 (a long device name)
# A kernel time in microseconds: a nanosecond is below anything a GPU launches, 1000 s beyond any
# kernel timed; a denormal, zero or negative time is no time (and divides by zero in a verdict).
MIN_TIME_US, MAX_TIME_US = 1e-3, 1e9
ROW_TEXTS = ("kernel_source", "problem", "contender")


@dataclass(frozen=True)
class BenchFile:
    banner: str                # where the times came from (printed above the verdict)
    kernel: str                # the table kind the verdict's flags are looked up by
    rows: list[dict]           # each with kernel_source, problem, M, contender, time_us checked


def shown(value, n: int = 40) -> str:
    """A value as a message names it: its repr (escapes made visible), cut to `n` characters."""
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _text(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TunerError(f"{where} must be a non-empty text, not {shown(value)}")
    if len(value) > MAX_TEXT:
        raise TunerError(f"{where} is {len(value):,} characters long (at most {MAX_TEXT}): not tuner bench's")
    if not value.isprintable():
        raise TunerError(f"{where} holds control characters (terminal escapes, line breaks): {shown(value)}")
    return value


def _time(value, where: str) -> float | None:
    if value is None:
        return None          # a contender that failed or was not timed (its error says why)
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not MIN_TIME_US <= value <= MAX_TIME_US):
        raise TunerError(f"{where} must be a time in microseconds from {MIN_TIME_US:g} to {MAX_TIME_US:g}, "
                         f"or null, not {shown(value)}")
    return float(value)


def read_bench(path: Path) -> BenchFile:
    """The bench file at `path`, checked; one clear line on anything wrong."""
    from tuner.reading import read_json_file
    data = read_json_file(path, "bench file ")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("rows"), list):
        raise TunerError(f"{path} is not a bench file (\"format\": \"{FORMAT}\", written by tuner bench)")
    where = f"bench file {path}"
    banner = _text(data["banner"], f"{where}: its banner") if "banner" in data else "times: unknown source"
    kernel = _text(data.get("kernel"), f"{where}: its kernel")
    rows = []
    for i, r in enumerate(data["rows"], 1):
        at = f"{where}: row {i}"
        if not isinstance(r, dict):
            raise TunerError(f"{at} is not an object")
        missing = [k for k in (*ROW_TEXTS, "M") if k not in r]
        if missing:
            raise TunerError(f"{at} has no {', '.join(missing)}")
        checked = {k: _text(r[k], f"{at}: {k}") for k in ROW_TEXTS}
        m = batch_key(r["M"]) if isinstance(r["M"], int) else None
        if m is None:
            raise TunerError(f"{at}: M must be a batch size from 1 to {MAX_BATCH}, not {shown(r['M'])}")
        rows.append({**r, **checked, "M": m, "time_us": _time(r.get("time_us"), f"{at}: time_us")})
    return BenchFile(banner, kernel, rows)
