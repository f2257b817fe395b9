"""A time's fraction of its roofline floor, or why there is none: a kernel faster than its floor
(beyond the timing's spread) means a figure is wrong, not that the kernel beat physics.

The floor is the larger of (fewest bytes / copy ceiling) and (FLOPs / FP8 rate). Which figure is
wrong follows from the rate the kernel would have reached on the binding term: above the
datasheet's (what the hardware cannot exceed) the kernel's byte or FLOP count is too large;
within it, the measured ceiling is too low (the first H200 run: a 2.72 TB/s copy ceiling taken at
a 345 MHz SM clock gave MoE fractions of 1.12 to 1.48). Every command that prints a fraction
(`tuner bench`'s table, Markdown and JSON; the proof's summary) takes it from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Judged:
    fraction: float | None       # floor / time, at most 1.0; None: no time, or a figure is wrong
    error: str | None = None     # which figure is wrong, when the time beat the floor
    wrong: str | None = None     # that figure, in a word or two ("copy ceiling", "byte count", ...)


def judge(time_us: float | None, spread: float | None, bytes_moved: float, flops: float, copy_tb_s: float,
          fp8_tflops: float, datasheet_copy_tb_s: float | None = None,
          datasheet_fp8_tflops: float | None = None) -> Judged:
    """The fraction of the roofline `time_us` reaches. Above 1 within the timing's spread it is
    1.0 (at the floor, as far as the timing can tell); beyond it, no fraction and which figure
    is wrong."""
    if not time_us or time_us <= 0:
        return Judged(None)
    copy_us = bytes_moved / (copy_tb_s * 1e6)
    flop_us = flops / (fp8_tflops * 1e6)
    fraction = max(copy_us, flop_us) / time_us
    if fraction <= 1.0 + (spread or 0.0):
        return Judged(min(fraction, 1.0))
    if copy_us >= flop_us:
        rate, ceiling, sheet = bytes_moved / (time_us * 1e6), copy_tb_s, datasheet_copy_tb_s
        what, unit, short, count = "copy ceiling", "TB/s", "byte count", f"byte count ({bytes_moved / 1e6:.4g} MB)"
    else:
        rate, ceiling, sheet = flops / (time_us * 1e6), fp8_tflops, datasheet_fp8_tflops
        what, unit, short, count = "FP8 rate", "TFLOP/s", "FLOP count", f"FLOP count ({flops / 1e9:.4g} GFLOP)"
    took = f"{fraction:.2f}x its floor: the kernel would run at {rate:.3g} {unit} against a {what} of {ceiling:.3g}"
    if sheet is None:
        return Judged(None, f"{took}: the {what} or the kernel's {count} is wrong (no datasheet to tell which)",
                      f"{what} or {short}")
    if rate > sheet * (1.0 + (spread or 0.0)):
        return Judged(None, f"{took}, above the datasheet's {sheet:g}: the kernel's {count} is wrong", short)
    return Judged(None, f"{took}, within the datasheet's {sheet:g}: the {what} ({ceiling:.3g} {unit}) is wrong", what)


def judge_row(row: dict) -> Judged:
    """A bench row as written (JSON): its own verdict where it has one, else its stored fraction
    held to the same rule (files from before the rule: which figure cannot be told)."""
    if row.get("roofline_error"):
        return Judged(None, str(row["roofline_error"]), str(row.get("roofline_wrong") or "a figure"))
    floor, time_us, spread = row.get("floor_us"), row.get("time_us"), row.get("spread")
    if not isinstance(floor, (int, float)) or not isinstance(time_us, (int, float)) or time_us != time_us \
            or time_us <= 0:
        return Judged(None)
    fraction = floor / time_us
    if fraction <= 1.0 + (spread if isinstance(spread, (int, float)) and spread == spread else 0.0):
        return Judged(min(fraction, 1.0))
    return Judged(None, f"{fraction:.2f}x its floor: the ceiling or the kernel's byte/FLOP count is wrong",
                  "ceiling or byte/FLOP count")
