"""Measurers: where timings come from. The search talks only to this interface.

- ReplayMeasurer answers from a recorded landscape (CPU; tests, offline studies).
- tuner.measure.device_measurer.DeviceMeasurer times on a GPU, or on the CPU device in CI
  (tuner/measure/device.py), inside an isolated child (tuner/measure/isolation.py).
- RecordingMeasurer times the full pruned grid on the GPU into a landscape, then
  answers the search from what it recorded.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Protocol

from tuner.errors import TunerError
from tuner.measure.failures import INVALID, RUNTIME, kind_of
from tuner.measure.landscape import Landscape, LandscapeWriter, Point
from tuner.plan.code_carry import same_code
from tuner.plan.kernel_api import Config, KernelSpec, config_tuple
from tuner.plan.problems import Problem

log = logging.getLogger("tuner")


@dataclass
class Measurement:
    time_us: float | None          # median time; None when the config failed
    spread: float | None = None    # (p80 - p20) / median over the timed runs
    error: str | None = None       # why it failed: the failure's detail
    kind: str | None = None        # the failure's kind (tuner/measure/failures.py KINDS); from `error` when not given

    def __post_init__(self) -> None:
        if self.time_us is None and self.kind is None:
            self.kind = kind_of(self.error) or RUNTIME


def valid(m: Measurement) -> Measurement:
    """Every measurement, from a landscape or a GPU, passes here: a time that is not a
    positive finite number is a failed measurement with the reason (a NaN must never reach
    the search, a table or a manifest); a spread that is not finite is dropped."""
    t = m.time_us
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0):
        return Measurement(None, None, f"invalid time {t!r}: not a positive finite number", INVALID)
    spread = m.spread if isinstance(m.spread, (int, float)) and math.isfinite(m.spread) and m.spread >= 0 else None
    return Measurement(t, spread, m.error) if spread is not m.spread else m


@dataclass
class NumericsCheck:
    status: str                    # "passed", "failed", "not checked"
    rel_error: float | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def as_dict(self) -> dict:
        return {"status": self.status, "rel_error": self.rel_error, "detail": self.detail}


class Measurer(Protocol):
    kernel: KernelSpec
    label: str                     # "gpu" or "replay:<file>", for the manifest

    def environment(self) -> dict: ...
    def candidates(self, problem: Problem, M: int) -> set[tuple] | None:
        """The configs this measurer can time (None: any)."""
    def measure(self, problem: Problem, M: int, configs: list[Config]) -> list[Measurement]: ...
    def check_numerics(self, problem: Problem, M: int, config: Config) -> NumericsCheck: ...
    def close(self) -> None: ...


class ReplayMeasurer:
    """Times configs by looking them up in a landscape recorded on a real GPU."""

    def __init__(self, landscape: Landscape, validator: Measurer | None = None):
        self.landscape = landscape
        self.kernel = landscape.kernel
        self.label = f"replay:{landscape.path}" if landscape.path else "replay"
        self.validator = validator   # a GPU measurer that can still check numerics

    @property
    def times(self) -> str:
        """Where its times come from, for study identities (tuner/search/identity.py)."""
        from tuner.measure.provenance import landscape_times
        return landscape_times(self.landscape.header, self.landscape.digest)

    @classmethod
    def from_file(cls, path: str, kernel: KernelSpec, cuda_name: str) -> "ReplayMeasurer":
        """Replay a landscape file, refusing one recorded on another device."""
        from tuner.measure.landscape import read_landscape
        land = read_landscape(path, kernel)
        recorded = land.header.get("kernel_source", "ours")
        if recorded != kernel.source:
            raise TunerError(f"landscape {path} was recorded on {recorded}'s {kernel.name} kernel, "
                             f"not {kernel.source_label}'s")
        recorded_code = land.header.get("code_version")
        if (recorded_code and kernel.code_version and not same_code(recorded_code, kernel.code_version)
                and not land.header.get("synthetic")):
            raise TunerError(f"landscape {path} was recorded on other code of {kernel.source_label}'s {kernel.name} "
                             f"(code {recorded_code}, this is {kernel.code_version}): its timings are not of this "
                             "kernel; record it again")
        if land.header["device"] != cuda_name:
            raise TunerError(f"landscape {path} was recorded on {land.header['device']!r}, "
                             f"but --gpu is {cuda_name!r}")
        if not recorded_code and not land.header.get("synthetic"):
            log.warning("landscape %s predates code versions: its timings are taken as of %s", path,
                        f"this {kernel.name} code ({kernel.code_version})" if kernel.code_version
                        else f"{kernel.source_label}'s {kernel.name}, code unknown")
        return cls(land)

    def environment(self) -> dict:
        h = self.landscape.header
        env = {k: h.get(k) for k in ("device", "driver", "cuda", "torch", "triton", "recorded", "code_version")}
        if h.get("device_kind"):
            env["device_kind"] = h["device_kind"]
        if h.get("synthetic"):
            env["synthetic"] = True
        if h.get("policy"):
            env["policy"] = h["policy"]          # how it was timed (tuner/measure/policy.py)
        return env

    def candidates(self, problem: Problem, M: int) -> set[tuple] | None:
        pts = self.landscape.lookup(problem.params, M)
        return set(pts) if pts is not None else set()

    def covers(self, problem: Problem, M: int) -> bool:
        return self.landscape.lookup(problem.params, M) is not None

    def measure(self, problem: Problem, M: int, configs: list[Config]) -> list[Measurement]:
        pts = self.landscape.lookup(problem.params, M) or {}
        out = []
        for cfg in configs:
            p = pts.get(config_tuple(self.kernel, cfg))
            if p is None:
                out.append(Measurement(None, None, "not in the landscape", INVALID))
            else:
                out.append(valid(Measurement(p.time_us, p.spread, p.error, p.kind)))
        return out

    def check_numerics(self, problem: Problem, M: int, config: Config) -> NumericsCheck:
        if self.validator is not None:
            return self.validator.check_numerics(problem, M, config)
        return NumericsCheck("not checked", None, "replayed timings; no GPU to run the kernel on")

    def close(self) -> None:
        if self.validator is not None:
            self.validator.close()


class RecordingMeasurer:
    """Measures the whole pruned grid of each (problem, M) on the GPU once, streams it
    to a landscape file, then serves the search from it like a replay."""

    def __init__(self, gpu_measurer: Measurer, writer: LandscapeWriter, landscape: Landscape,
                 grid_fn: Callable[[Problem, int], list[Config]], progress: Callable[[str], None] | None = None):
        self.gpu = gpu_measurer
        self.kernel = gpu_measurer.kernel
        self.writer = writer
        self.replay = ReplayMeasurer(landscape, validator=gpu_measurer)
        self.grid_fn = grid_fn            # (problem, M) -> list of configs to record
        self.label = f"gpu (grid recorded to {writer.path})"
        self.progress = progress
        self._recorded: set[tuple[str, int]] = set()

    def environment(self) -> dict:
        return self.gpu.environment()

    @property
    def times(self) -> str:
        from tuner.measure.provenance import times_of
        return times_of(self.gpu)           # measured, the grid recorded on the way

    def _ensure_recorded(self, problem: Problem, M: int) -> None:
        if (problem.key, M) in self._recorded:
            return
        todo = [c for c in self.grid_fn(problem, M) if not self.writer.has(problem.params, M, c)]
        chunk = 16
        for i in range(0, len(todo), chunk):
            part = todo[i:i + chunk]
            for cfg, m in zip(part, map(valid, self.gpu.measure(problem, M, part))):
                point = self.writer.write(problem.params, M, cfg, Point(m.time_us, m.error, m.spread, m.kind))
                self.replay.landscape.add(problem.params, M, cfg, point)
            if self.progress:
                self.progress(f"recording {problem.key} M={M}: {min(i + chunk, len(todo))}/{len(todo)}")
        self._recorded.add((problem.key, M))

    def candidates(self, problem: Problem, M: int):
        # Record the grid now; anything else (seeds) is timed on the GPU when asked for.
        self._ensure_recorded(problem, M)
        return None

    def measure(self, problem: Problem, M: int, configs: list[Config]) -> list[Measurement]:
        self._ensure_recorded(problem, M)
        # Seeds outside the grid (shipped tables) are timed on the GPU directly.
        known = self.replay.candidates(problem, M) or set()
        missing = [c for c in configs if config_tuple(self.kernel, c) not in known]
        for cfg, m in zip(missing, map(valid, self.gpu.measure(problem, M, missing)) if missing else []):
            point = self.writer.write(problem.params, M, cfg, Point(m.time_us, m.error, m.spread, m.kind))
            self.replay.landscape.add(problem.params, M, cfg, point)
        return self.replay.measure(problem, M, configs)

    def check_numerics(self, problem: Problem, M: int, config: Config) -> NumericsCheck:
        return self.gpu.check_numerics(problem, M, config)

    def close(self) -> None:
        self.writer.close()
        self.gpu.close()
