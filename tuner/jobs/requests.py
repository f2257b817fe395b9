"""The jobs' requests as typed objects: what `tuner proof`, `nightly`, `drift`, `bench`,
`report` and `diff` ask for, made by the command line from its options (`request_of`) or by a
Python caller (tuner.api), with the command line's defaults. The jobs check them as they run:
bad values end in one TunerError line, whoever made the request."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from tuner.plan.engines import ENGINE_NAMES

R = TypeVar("R")


def request_of(kind: type[R], args: Any) -> R:
    """The request of type `kind` a parsed command line asks for (each field from the option
    of its name; a field with no option keeps its default)."""
    names = [f.name for f in fields(kind)]  # type: ignore[arg-type]
    return kind(**{name: getattr(args, name) for name in names if hasattr(args, name)})


@dataclass
class ProofRequest:
    """`tuner proof`: the GPU run's steps (or --plan's time boxes) within `minutes`."""
    gpu: str = "H100"
    minutes: float = 9.0
    out: str | None = None
    engine_source: list[str] | None = None
    trust_engine_source: bool = False
    baselines: str | None = None
    call: str | None = None
    steps: list[str] | None = None
    plan: bool = False
    bundle: str | None = None
    device: str = "cuda"


@dataclass
class NightlyRequest:
    """`tuner nightly`: one night of the retune loop over a jobs YAML."""
    config: str
    night: str | None = None
    dry_run: bool = False
    synthetic: bool = False
    minutes: float | None = None
    started: float | None = None        # when a --minutes window began (default: when the night starts)


@dataclass
class DriftRequest:
    """`tuner drift`: do these tables still beat the default config here?"""
    tables: list[str]
    gpu: str
    model: str | None = None
    routing: str = "uniform"
    replay: str | None = None
    timing: str = "graph"
    l2: str = "cold"
    noise: float = 0.02
    kernel_source: str | None = None
    engine_source: list[str] | None = None
    trust_engine_source: bool = False
    out: str | None = None
    tp: int | None = None
    traffic: str | None = None
    device: str = "cuda"


@dataclass
class BenchRequest:
    """`tuner bench`: every contender per (problem, M), against the roofline."""
    model: str
    gpu: str
    kernel: str
    out: str
    tp: int | None = None
    ep: int = 1
    per_rank: bool = False
    dtype: str | None = None
    routing: str = "uniform"
    batch_sizes: list[int] | None = None
    contexts: list[int] | None = None
    page_size: int = 64
    engines: list[str] = field(default_factory=lambda: list(ENGINE_NAMES))
    only: list[str] | None = None
    tuned: str | None = None
    baseline: list[str] | None = None
    replay: str | None = None
    kernel_source: list[str] = field(default_factory=lambda: ["engine"])
    engine_source: list[str] | None = None
    trust_engine_source: bool = False
    ceilings: str | None = None
    compile_workers: int = field(default_factory=lambda: min(16, os.cpu_count() or 1))
    measure_timeout: float = 120
    device: str = "cuda"
    traffic: str | None = None
    quiet: bool = False
    dry_run: bool = False               # what the kernels' planning reads: a bench is never a dry run


@dataclass
class ReportRequest:
    """`tuner report`: a results folder's tables and plots, or a bench file's verdict."""
    run: str
    out: str | None = None
    traffic: str | None = None
    model: str | None = None


@dataclass
class DiffRequest:
    """`tuner diff`: two results folders compared."""
    old: str
    new: str
    out: str | None = None
    noise: float = 0.02
    force: bool = False
    traffic: str | None = None
    model: str | None = None
