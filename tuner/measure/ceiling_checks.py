"""A ceiling measured at working clocks, checked against the datasheet (`tuner ceilings`).

The first H200 run's `tuner ceilings` copied 1 GiB at 2.72 TB/s with the SM clock at 345 MHz
(the GPU idle, the environment step just before); a plain `y.copy_(x)` minutes later did
4.27 TB/s, and every MoE floor was 1.57x too high. So a ceiling is taken here as the best of
several sizes and methods, after WARMUP_S of work on the device, with the clocks sampled while
it is timed; a figure under SUSPECT_BELOW of the datasheet is measured again after a longer
warm-up and, still low, is marked suspect in the file: `load` (tuner/measure/ceilings.py)
then uses the datasheet's figure in its place and says so, never the suspect one silently.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable

SUSPECT_BELOW = 0.70      # of the datasheet: slower than this is the clocks or the method, not the memory
WARMUP_S = 1.0            # of back-to-back work before the first timing (a GPU ramps its clocks in ~0.1 s)
RETRY_WARMUP_S = 3.0      # before the second try of a suspect figure
CLOCK_SAMPLE_S = 0.01     # how often the clocks are read while a ceiling is timed


class ClockSamples:
    """The device's clocks read every CLOCK_SAMPLE_S while the block runs (on a thread: the
    timed work waits on the device, the GIL is free), plus once at its end; nothing on a device
    without NVML (the CPU device)."""

    def __init__(self, dev):
        self.dev, self.samples = dev, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            c = self.dev.clocks()
            if c:
                self.samples.append(c)
            self._stop.wait(CLOCK_SAMPLE_S)

    def __enter__(self) -> "ClockSamples":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        end = self.dev.clocks()
        if end:
            self.samples.append(end)

    def summary(self) -> dict:
        """Per clock (MHz): min, median and max of what was read during the timing."""
        out: dict = {"clock_samples": len(self.samples)}
        for key in sorted({k for s in self.samples for k in s}):
            vals = sorted(s[key] for s in self.samples if key in s)
            out[key] = {"min": vals[0], "median": vals[len(vals) // 2], "max": vals[-1]}
        return out


def copy_methods(torch, on: str, nbytes: int) -> dict[str, tuple[list, bool]]:
    """Ways to copy `nbytes` device to device: (the runs, timed as CUDA graph replays?). The runs
    are partials over the tensors they touch (two sources in rotation, one destination)."""
    n = nbytes // 4
    src = [torch.randn(n, device=on) for _ in range(2)]
    dst = torch.empty(n, device=on)
    copies = [functools.partial(torch.Tensor.copy_, dst, s) for s in src]
    return {"copy_, CUDA graph": (copies, True),
            "copy_, launched": (copies, False),
            "elementwise kernel (neg, out=)": ([functools.partial(torch.neg, s, out=dst) for s in src], True)}


def best_copy(dev, torch, sizes: list[int], reps: int) -> dict:
    """The copy bandwidth (TB/s, bytes read plus written): the best median over `sizes` x the
    methods, each trial kept with the clocks read while it ran."""
    from tuner.measure.timing import summarize
    trials = []
    for nbytes in sizes:
        for method, (runs, graph) in copy_methods(torch, dev.tensor_device, nbytes).items():
            with ClockSamples(dev) as clocks:
                t = summarize(dev.time_runs(runs, None, reps, graph=graph))
            trials.append({"bytes": nbytes, "method": method, "median_us": t.median_us, "spread": t.spread,
                           "tb_s": 2 * nbytes / (t.median_us * 1e6), **clocks.summary()})
        dev.empty_cache()
    best = max(trials, key=lambda tr: tr["tb_s"])
    return {"value": best["tb_s"], "best": best, "trials": trials}


def checked(name: str, measure: Callable[[], dict], datasheet: float | None, dev, unit: str) -> dict:
    """`measure()` ({"value": figure, ...}) taken after WARMUP_S of work; under
    SUSPECT_BELOW of `datasheet` it is taken again after RETRY_WARMUP_S and the better kept;
    still under, the result says why it is suspect. datasheet None (the CPU device): no check."""
    dev.warm_up(WARMUP_S)
    first = measure()
    result = {**first, "tries": 1, "datasheet": datasheet}
    low = lambda r: datasheet is not None and r["value"] < SUSPECT_BELOW * datasheet  # noqa: E731
    if low(first):
        dev.warm_up(RETRY_WARMUP_S)
        again = measure()
        result = {**max(first, again, key=lambda r: r["value"]), "tries": 2, "datasheet": datasheet,
                  "first_try": first["value"]}
        if low(result):
            result["suspect"] = (f"{name} {result['value']:.3g} {unit} is {result['value'] / datasheet:.0%} of the "
                                 f"datasheet's {datasheet:g} {unit} (under {SUSPECT_BELOW:.0%}), measured twice "
                                 f"after warming the clocks: the clocks or the method, not the hardware's limit")
    return result
