"""One kernel's run as planned: the request (tuner/pipeline/request.py) resolved into the
kernel, its search space, the GPU, the problems and batch sizes, the search settings and the
output folder. A request that several kernels time (each engine's own) becomes one plan per
kernel; a worker rebuilds the plan from the storage (tuner/pipeline/stored_plans.py). The
options as given stay the request's: a plan holds the request, never a copy of its options.
Light on purpose (no Optuna, torch or Triton): a dry run builds plans."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.pipeline.request import TuneRequest
from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import KernelSpec
from tuner.plan.problems import Problem
from tuner.plan.space import SearchSpace
from tuner.search.settings import JOURNAL, SearchSettings

if TYPE_CHECKING:
    from tuner.plan.traffic import TrafficProfile
    from tuner.search.warm_start import WarmPool


@dataclass
class RunPlan:
    request: TuneRequest             # the options as given (storage, engines, replay, workers, device...)
    kernel: KernelSpec
    space: SearchSpace
    gpu: GpuSpec
    problems: list[Problem]
    batch_sizes: list[int]
    settings: SearchSettings
    out_dir: Path
    record: str | None = None        # the request's --record, named for this kernel where several record
    run_info: dict = field(default_factory=dict)   # model, tp, ep, dtype: for the manifest
    gpus: list[int] = field(default_factory=list)  # more than one: a worker process per GPU
    plan_ms: dict | None = None      # batch sizes per problem key, where they differ (replay)
    traffic: TrafficProfile | None = None   # keys, budgets and kept defaults by traffic
    times: str | None = None         # where the times come from (tuner/search/identity.py), once known
    notes: list[str] = field(default_factory=list)   # lines the run says once it starts (its default --tp)
    started: float | None = None     # time.monotonic() when the command began: its "done in" counts from it
    warm: WarmPool | None = None     # known configs to seed studies from (tuner/search/warm_start.py)
    incumbents: dict | None = None   # the tables the engines read today, once resolved (studies.incumbent_tables)
    made: list[Path] = field(default_factory=list)   # what planning created (undo_planning removes it)

    # The request's options a run reads, by the names the pipeline uses.
    @property
    def storage(self) -> str | None:
        return self.request.storage

    @property
    def engines(self) -> list[str]:
        return self.request.engines

    @property
    def replay(self) -> str | None:
        return self.request.replay

    @property
    def baseline(self) -> str | None:
        return self.request.baseline

    @property
    def compile_workers(self) -> int:
        return self.request.compile_workers

    @property
    def measure_timeout(self) -> float:
        return self.request.measure_timeout     # seconds one config may take before its worker is replaced

    @property
    def recycle_after(self) -> int:
        return self.request.recycle_after       # configs a measuring worker serves before a fresh one

    @property
    def quiet(self) -> bool:
        return self.request.quiet

    @property
    def prefix(self) -> str:
        return self.request.study_prefix        # several runs can share one storage

    @property
    def device(self) -> str:
        return self.request.device              # a CUDA GPU, or the CPU device (tuner/measure/device.py)

    @property
    def policy(self) -> dict:
        """The measurement policy (tuner/measure/policy.py), as run_info carries it to plans and manifests."""
        return dict(self.run_info.get("measurement") or {})

    @property
    def device_name(self) -> str:
        """The device as studies, landscapes and manifests name it."""
        from tuner.measure.device import device_name
        return device_name(self.device, self.gpu)

    def ms_for(self, problem: Problem) -> list[int]:
        if self.plan_ms is not None:
            return list(self.plan_ms.get(problem.key, []))
        return list(self.batch_sizes)


def default_storage(out_dir: Path) -> str:
    """A run's storage when --storage is not given: the journal file OUT/studies.journal
    (tuner/search/storage.py); a folder an older tuner left with OUT/studies.db (SQLite) and
    no journal keeps its database, so its run resumes where it stopped."""
    older = out_dir / "studies.db"
    journal = out_dir / "studies.journal"
    if older.is_file() and not journal.exists():
        return f"sqlite:///{older.resolve()}"
    return f"{JOURNAL}{journal.resolve()}"


def run_storage(plan: RunPlan) -> str:
    """The storage URL of a run: --storage, else the default beside its tables."""
    return plan.storage or default_storage(plan.out_dir)
