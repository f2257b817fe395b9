"""Compile ahead: the configs a study is likely to ask for next, handed to the compile workers
while a batch is timed (tuner/measure/device_measurer.py: compile_ahead).

On the H200 a study waited for compile workers half of its seconds (scripts/study_seconds.py:
bench/results/study-seconds.md): a batch's configs are built when it is asked, and the workers a
batch leaves idle (16 on the H200, 8 configs a batch) build nothing. With compile-ahead they
build, in this order: the study's own seeds not measured yet (queued: asked first) and the rows
its close times against its winner (the engine's rows today: the H200 smoke's close waited for
one's build), what the
next studies of the run will surely time (their seeds: defaults, the cost model's first, the rows
the engines read today; set by the pipeline as `upcoming`), then the configs the cost model ranks
fastest among those nobody measured or holds (tuner/search/prior.py). Only workers the batch
leaves idle take them; a job never asked for costs a worker's time only, and one still queued
when the next batch is asked is dropped.
"""

from __future__ import annotations

from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import Config, KernelSpec, config_dict, config_tuple
from tuner.plan.problems import Problem
from tuner.search.prior import estimates


class CompileAhead:
    """The jobs to build ahead of each batch of a run's studies."""

    def __init__(self, kernel: KernelSpec, gpu: GpuSpec):
        self.kernel, self.gpu = kernel, gpu
        self.upcoming: list[tuple[Problem, int, Config]] = []     # the run's next studies' sure configs
        self.closing: list[Config] = []                            # this study's: the rows its choice times
        self._order: dict[tuple, list[tuple]] = {}                 # (problem, M): candidates, fastest first

    @classmethod
    def of(cls, kernel: KernelSpec, gpu: GpuSpec, measurer) -> "CompileAhead | None":
        """One for a measurer that builds ahead (compile workers), else None."""
        return cls(kernel, gpu) if callable(getattr(measurer, "compile_ahead", None)) else None

    def hand_out(self, measurer, target, measured: dict, running: dict, batch: list[Config], n: int) -> None:
        """Tell the measurer what to build while `batch` (of the study `target`) is timed."""
        measurer.compile_ahead(self.jobs(target.problem, target.M, target.allowed, target.seeds, measured, running,
                                         batch, n))

    def _ranked(self, problem: Problem, M: int, allowed: set[tuple]) -> list[tuple]:
        key = (problem.key, M)
        if key not in self._order:
            est = estimates(self.kernel, self.gpu, problem.params, M, sorted(allowed))
            self._order = {key: sorted(est, key=lambda t: (est[t], t))}      # one study at a time
        return self._order[key]

    def jobs(self, problem: Problem, M: int, allowed: set[tuple], seeds: list[tuple[str, Config]],
             measured: dict, running: dict, batch: list[Config], n: int) -> list[tuple[Problem, int, Config]]:
        """In the order the workers should take them (the measurer hands out as many as it has
        idle workers, skipping those handed out before): this study's seeds not measured yet,
        the next studies' sure configs (a next study's first batch is its seeds: built ahead
        whole, it waits for no compile), then up to `n` of this study's candidates the cost
        model ranks fastest (a search batch rarely falls wholly among them, and a batch waits for
        its slowest compile: on the recorded H200 GEMM landscape none of 6 did, though 19 of its
        40 new configs were among the 8 ranked first)."""
        taken = {config_tuple(self.kernel, c) for c in batch} | set(measured) | set(running)
        own = [t for t in dict.fromkeys([*(config_tuple(self.kernel, c) for _, c in seeds),
                                         *(config_tuple(self.kernel, c) for c in self.closing)]) if t not in taken]
        ranked = [t for t in self._ranked(problem, M, allowed) if t not in taken and t not in own][:n]
        later = [(p, m, c) for p, m, c in self.upcoming if (p.key, m) != (problem.key, M)]
        return ([(problem, M, config_dict(self.kernel, t)) for t in own] + later
                + [(problem, M, config_dict(self.kernel, t)) for t in ranked])

    def studied(self, problem: Problem, M: int, closing: list[Config] | None = None) -> None:
        """A study began: its own configs leave the upcoming list; `closing`: the rows its choice
        will time against its winner (the engine's rows today), built with its seeds."""
        self.upcoming = [(p, m, c) for p, m, c in self.upcoming if (p.key, m) != (problem.key, M)]
        self.closing = list(closing or [])
