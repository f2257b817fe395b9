"""Measurers: where timings come from. The search talks only to this interface.

- ReplayMeasurer answers from a recorded landscape (CPU; tests, offline studies).
- tuner.measure_gpu.GpuMeasurer times on a real GPU.
- RecordingMeasurer times the full pruned grid on the GPU into a landscape, then
  answers the search from what it recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tuner.errors import TunerError
from tuner.kernel_api import Config, KernelSpec, config_tuple
from tuner.landscape import Landscape, LandscapeWriter, Point
from tuner.problems import Problem


@dataclass
class Measurement:
    time_us: float | None          # median time; None when the config failed
    spread: float | None = None    # (p80 - p20) / median over the timed runs
    error: str | None = None       # why it failed


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

    def __init__(self, landscape: Landscape, validator=None):
        self.landscape = landscape
        self.kernel = landscape.kernel
        self.label = f"replay:{landscape.path}" if landscape.path else "replay"
        self.validator = validator   # a GPU measurer that can still check numerics

    @classmethod
    def from_file(cls, path: str, kernel: KernelSpec, cuda_name: str) -> "ReplayMeasurer":
        """Replay a landscape file, refusing one recorded on another device."""
        from tuner.landscape import read_landscape
        land = read_landscape(path, kernel)
        recorded = land.header.get("kernel_source", "ours")
        if recorded != kernel.source:
            raise TunerError(f"landscape {path} was recorded on {recorded}'s {kernel.name} kernel, "
                             f"not {kernel.source_label}'s")
        if land.header["device"] != cuda_name:
            raise TunerError(f"landscape {path} was recorded on {land.header['device']!r}, "
                             f"but --gpu is {cuda_name!r}")
        return cls(land)

    def environment(self) -> dict:
        h = self.landscape.header
        env = {k: h.get(k) for k in ("device", "driver", "cuda", "torch", "triton", "recorded")}
        if h.get("synthetic"):
            env["synthetic"] = True
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
                out.append(Measurement(None, None, "not in the landscape"))
            else:
                out.append(Measurement(p.time_us, p.spread, p.error))
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

    def __init__(self, gpu_measurer, writer: LandscapeWriter, landscape: Landscape, grid_fn, progress=None):
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

    def _ensure_recorded(self, problem: Problem, M: int) -> None:
        if (problem.key, M) in self._recorded:
            return
        todo = [c for c in self.grid_fn(problem, M) if not self.writer.has(problem.params, M, c)]
        chunk = 16
        for i in range(0, len(todo), chunk):
            part = todo[i:i + chunk]
            for cfg, m in zip(part, self.gpu.measure(problem, M, part)):
                point = Point(m.time_us, m.error, m.spread)
                self.writer.write(problem.params, M, cfg, point)
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
        known = self.replay.candidates(problem, M)
        missing = [c for c in configs if config_tuple(self.kernel, c) not in known]
        for cfg, m in zip(missing, self.gpu.measure(problem, M, missing) if missing else []):
            point = Point(m.time_us, m.error, m.spread)
            self.writer.write(problem.params, M, cfg, point)
            self.replay.landscape.add(problem.params, M, cfg, point)
        return self.replay.measure(problem, M, configs)

    def check_numerics(self, problem: Problem, M: int, config: Config) -> NumericsCheck:
        return self.gpu.check_numerics(problem, M, config)

    def close(self) -> None:
        self.writer.close()
        self.gpu.close()


TUNING_WITHOUT_GPU = ("a tuning run needs one; use --dry-run to see the plan, or --replay FILE to tune over a "
                      "recorded landscape")


def require_gpu(expected_cuda_name: str, without: str = TUNING_WITHOUT_GPU) -> None:
    """Stop with one clear line when no (or another) GPU is present; `without` says what
    needs the GPU and what the command can do without one."""
    import torch
    if not torch.cuda.is_available():
        raise TunerError(f"no CUDA GPU is visible, and {without}")
    name = torch.cuda.get_device_name()
    if name != expected_cuda_name:
        raise TunerError(f"--gpu asks for {expected_cuda_name!r} but this machine has {name!r}; "
                         "tables are specific to the GPU they were measured on")
