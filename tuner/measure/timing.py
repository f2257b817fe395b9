"""Median and spread of timed runs, one way for everything we time (configs, references,
ceilings).

The runs themselves are timed by the device (tuner/measure/device.py: CUDA graphs replayed in
rotation and timed with CUDA events, the L2 flushed before each, on a GPU; the wall clock on
the CPU device). Of the per-run times the median is kept, and the p20-p80 spread over the
median.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass
class Timing:
    median_us: float
    spread: float | None        # (p80 - p20) / median
    samples: int


def summarize(times_us: list[float]) -> Timing:
    """Median and p20-p80 spread of per-run times (microseconds)."""
    if not times_us:
        raise ValueError("no timed runs")
    times = sorted(times_us)
    med = statistics.median(times)
    p20 = times[int(0.2 * (len(times) - 1))]
    p80 = times[int(math.ceil(0.8 * (len(times) - 1)))]
    return Timing(med, (p80 - p20) / med if med > 0 else None, len(times))
