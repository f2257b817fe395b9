"""How printed tables write times, speedups and configs that have no time: numbers with
two decimals, speedups as `1.23x`, and a missing time as the reason it is missing (the
default config failed, or was never timed), never as NaN."""

from __future__ import annotations

import math


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def time_cell(time_us, error: str | None = None) -> str:
    if not _missing(time_us):
        return f"{time_us:.2f}"
    if not error:
        return "-"
    error = str(error)
    return error if error.startswith("not ") else f"failed: {error}"


def speedup_cell(speedup) -> str:
    return "-" if _missing(speedup) or not speedup else f"{speedup:.2f}x"
