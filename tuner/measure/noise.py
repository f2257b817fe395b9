"""How much the same config's time moves between processes on a device, measured, and what
follows from it: no gain within it replaces a row, and no ratio within it is printed as a speed-up.

The first H200 run timed vLLM's M = 1024 config at 796.7 us in the tuning process and 771.9 us in
the bench minutes later (3.1%; the manifest's paired re-time said 805.6). Within one process the
paired re-time cancels drift; between processes (the tuning, the bench, the engine that reads the
table) it does not. bench/noise/<gpu>.json records the spread of every config timed in two
processes of one GPU run (scripts/measure_noise.py makes it from a run's studies journal and bench
JSON): `spread` is the 90th percentile of |t_b / t_a - 1| over those configs. Only times measured
on that GPU carry it: a synthetic landscape or the CPU device has none.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from tuner.paths import REPO_ROOT

NOISE_DIR = REPO_ROOT / "bench" / "noise"
FORMAT = "tuner-noise/1"


@dataclass(frozen=True)
class Noise:
    spread: float            # a relative change this small between processes is noise
    device: str
    source: str              # where the figure comes from, for the reader

    def describe(self) -> str:
        return f"{self.spread:.1%} between processes on {self.device} ({self.source})"


def for_device(device: str | None, synthetic: bool = False) -> Noise | None:
    """The recorded between-process spread of `device` (its CUDA name), None for times that are
    no GPU's (synthetic, the CPU device) or a device without a record."""
    from tuner.errors import TunerError
    from tuner.measure.device import is_cpu_device_name
    from tuner.reading import read_text
    if not device or synthetic or is_cpu_device_name(device) or not NOISE_DIR.is_dir():
        return None
    for path in sorted(NOISE_DIR.glob("*.json")):
        try:
            data = json.loads(read_text(path, "a noise record "))
        except (OSError, ValueError, TunerError):
            continue
        spread = (data.get("between_process") or {}).get("spread") if isinstance(data, dict) else None
        if (data.get("format") == FORMAT and data.get("device") == device and isinstance(spread, (int, float))
                and not isinstance(spread, bool) and 0 <= spread < 1):
            rel = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
            return Noise(float(spread), device, str(rel))
    return None


def for_environment(env: dict | None) -> Noise | None:
    """The noise of the times a measurer's environment (or a results manifest's) describes."""
    env = env or {}
    return for_device(env.get("device"), bool(env.get("synthetic")) or bool(env.get("cpu_device")))


def gain_threshold(min_gain: float, noise: Noise | None) -> float:
    """The paired gain a new row must clear: --min-gain, or the between-process spread if larger."""
    return max(min_gain, noise.spread) if noise is not None else min_gain


def within(ratio: float | None, noise: Noise | None) -> bool:
    """Is a speed ratio (old time / new time) within the between-process spread?"""
    return ratio is not None and noise is not None and math.isfinite(ratio) and abs(ratio - 1) <= noise.spread


def speedup(ratio: float, noise: Noise | None, compact: bool = False) -> str:
    """`ratio`x, unless it is within the noise: then said so (compact: '~1.02x', for tables)."""
    from tuner.textwidth import factor
    if within(ratio, noise):
        assert noise is not None
        return f"~{factor(ratio)}" if compact else f"{factor(ratio)} (within the {noise.spread:.1%} between-process noise)"
    return factor(ratio)


def spread_of(pairs: list[tuple[float, float]]) -> dict:
    """The between-process statistics of (time in one process, time in another) pairs."""
    diffs = sorted(abs(b / a - 1) for a, b in pairs if a and b)
    if not diffs:
        raise ValueError("no config was timed in two processes")
    at = lambda q: diffs[min(len(diffs) - 1, math.ceil(q * len(diffs)) - 1)]  # noqa: E731
    return {"spread": at(0.9), "statistic": "90th percentile of |t_b / t_a - 1|", "median": at(0.5),
            "max": diffs[-1], "configs": len(diffs)}


class GainThreshold(float):
    """--min-gain raised to the between-process noise where that is larger: the float the paired
    check compares with, remembering both (for the words that explain a kept row)."""
    asked: float
    noise: Noise | None

    def __new__(cls, min_gain: float, noise: Noise | None = None):
        obj = super().__new__(cls, gain_threshold(min_gain, noise))
        obj.asked, obj.noise = float(min_gain), noise
        return obj

    def __reduce__(self):
        return (GainThreshold, (self.asked, self.noise))


def threshold_text(threshold: float) -> str:
    """What a paired gain had to clear, in words: '--min-gain 2%', or the noise that raised it."""
    if isinstance(threshold, GainThreshold) and threshold.noise is not None and threshold > threshold.asked:
        return (f"the between-process noise {float(threshold):.1%} on {threshold.noise.device} "
                f"(above --min-gain {threshold.asked:.0%})")
    return f"--min-gain {float(threshold):.0%}"


def for_request(device_kind: str, cuda_name: str, replay: str | None, synthetic: bool = False) -> Noise | None:
    """The noise of what a tuning run will time: the GPU's own on a GPU, the recording device's for
    a replayed landscape recorded on a GPU, none on the CPU device or a synthetic landscape (a
    --synthetic run makes its landscape after planning, so its flag says so, not the header)."""
    if synthetic:
        return None
    if replay:
        from tuner.measure.landscape import read_header
        try:
            header = read_header(replay)
        except Exception:  # noqa: BLE001 - an unreadable landscape is refused later, with its own words
            return None
        return for_device(header.get("device"), bool(header.get("synthetic")))
    return for_device(cuda_name) if device_kind == "cuda" else None
