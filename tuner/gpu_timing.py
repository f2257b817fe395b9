"""Timing on a GPU, one way for everything we time (configs, references, ceilings).

Each callable runs once outside timing (warm-up: binary loaded, data touched), is captured
into a CUDA graph, and the graphs are replayed in rotation (several input sets, so the L2
cannot serve a repeat of the last run), each replay timed with CUDA events with the L2
flushed just before it. The median is kept, and the p20-p80 spread over the median.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence


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


def l2_flush_buffer(torch, l2_bytes: int):
    """Writing twice the L2's size evicts whatever the last run left in it."""
    return torch.empty(2 * l2_bytes, dtype=torch.int8, device="cuda")


def graph_times(torch, runs: Sequence[Callable[[], object]], flush, reps: int = 40) -> list[float]:
    """Per-replay times (us) of `runs` (one callable per input set), captured as CUDA graphs
    and replayed in rotation, `flush` zeroed (outside the timed region) before each replay;
    with flush=None nothing is flushed (for work far larger than the L2)."""
    for run in runs:                          # warm-up: load the binary, touch the data
        run()
    torch.cuda.synchronize()
    graphs = []
    for run in runs:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        graphs.append(g)
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for r in range(reps):
        if flush is not None:
            flush.zero_()                     # queued ahead of the timed replay, so it does not count
        starts[r].record()
        graphs[r % len(graphs)].replay()
        ends[r].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]
