"""One tuning request, typed and checked once, when it is made.

`TuneRequest` holds the options of `tuner gemm|moe|mla` (same names, docs/tuning.md). The
command line makes one from its parsed options (`from_args`), `tuner.api` callers and
`tuner nightly` from plain values (a job's YAML), and `tuner worker` from a plan stored in a
shared storage (tuner/pipeline/stored_plans.py): every one is checked here, at construction,
with the same words naming the option at fault. The pipeline (tuner/pipeline/) resolves it
into what each kernel's run tunes (tuner/pipeline/run_plan.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from tuner.errors import TunerError
from tuner.plan.engines import ENGINE_NAMES
from tuner.plan.precision import MOE_DTYPES
from tuner.search.samplers import SAMPLERS

COMMANDS = ("gemm", "moe", "mla")
KERNEL_OF = {"gemm": "fp8_gemm", "moe": "fused_moe", "mla": "mla_decode"}
DEFAULT_TRIALS = {"gemm": 48, "moe": 32, "mla": 32}
DTYPES = {"gemm": ("fp8_w8a8",), "moe": MOE_DTYPES, "mla": ("bf16",)}   # first: the default
# The largest values the command line takes (tuner/commands/options.py uses these): a request
# made in Python or from a nightly job's YAML is held to the same bounds.
MAX_COUNT = 1 << 20                 # batch sizes (tokens per step), trials, patience, seconds, launches
MAX_PARALLEL = 1024                 # --tp, --ep
MAX_WORKERS = 256                   # --compile-workers
MAX_PAGE = 1024                     # --page-size
MAX_CONTEXT = 1 << 24               # --contexts
# Options that hold text (a name, a path, a URL), a list of texts, or a switch.
TEXT_OPTIONS = ("dtype", "space", "baseline", "storage", "out", "replay", "record", "gpus", "traffic")
PATH_LIST_OPTIONS = ("engine_source", "only")
SWITCHES = ("per_rank", "dry_run", "quiet", "trust_engine_source", "no_warm_start", "synthetic")


@dataclass
class TuneRequest:
    """One tuning run, as the options of `tuner gemm|moe|mla` (same names, see docs/tuning.md)."""
    command: str                                # "gemm", "moe" or "mla"
    model: str
    gpu: str
    dtype: str | None = None
    tp: int | None = None                       # None: the smallest that serves the model (tuner/plan/deployment.py)
    ep: int = 1
    per_rank: bool = False                      # --tp is one rank's shapes on purpose: no fit check
    batch_sizes: list[int] | None = None
    engines: list[str] = field(default_factory=lambda: list(ENGINE_NAMES))
    trials: int | None = None
    patience: int | None = None
    sampler: str = SAMPLERS[0]
    seed: int = 0
    space: str | None = None
    baseline: str | None = None
    storage: str | None = None
    study_prefix: str = ""
    kernel_source: str | None = None            # "engine" (default), "ours", or one engine's ("vllm")
    engine_source: list[str] | None = None
    out: str | None = None
    replay: str | None = None
    record: str | None = None
    gpus: str | None = None                     # "0,1,2,3"; None: every visible GPU
    compile_workers: int = min(16, os.cpu_count() or 1)
    measure_timeout: int = 120
    device: str = "cuda"                        # "cpu": the CPU device (tuner/measure/device.py), for CI
    recycle_after: int = 256
    dry_run: bool = False
    quiet: bool = False
    only: list[str] | None = None               # problems whose key holds one of these texts
    routing: str = "uniform"                    # moe: uniform, zipf, or a recorded routing file (tuner/plan/routing.py)
    contexts: list[int] | None = None           # mla
    page_size: int = 64                         # mla
    traffic: str | None = None                  # gemm, moe: a traffic profile (tuner/plan/traffic.py)
    trust_engine_source: bool = False           # import engine files that match no known release
    timing: str = "graph"                       # CUDA-graph replay or eager launches (tuner/measure/policy.py)
    l2: str = "cold"                            # L2 flushed before each timed run, or warm
    warm_start: list[str] | None = None         # results folders, tables, folders of tables: seeds
    no_warm_start: bool = False                 # no seeds from the engines' shipped tables
    min_gain: float = 0.02                      # a row changes only for a gain above this (tuner/search/choice.py)
    synthetic: bool = False                     # time on a SYNTHETIC landscape made on the fly (no GPU)
    minutes: float | None = None                # a time-boxed window: what fits, by value (tuner/pipeline/windows.py)
    argv: list[str] | None = None               # the command line that made it (to say the one that continues)
    started: float | None = None                # when the command began, on the window's clock (tuner/search/window.py)

    def __post_init__(self) -> None:
        """Checked once, here: every way a request is made (the command line, `tuner.api`, a
        nightly job, a worker joining a stored run) gets the same checks and the same words."""
        for name, value in self._checked().items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_args(cls, args) -> "TuneRequest":
        """From the CLI's parsed options (those a command lacks keep their defaults)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    def _checked(self) -> dict:
        """The request's values checked, naming the option at fault (the CLI's parser checked
        its own already; a nightly job's come from YAML): {field: its value as a number} to set."""
        if self.command not in COMMANDS:
            raise TunerError(f"unknown tuning command {self.command!r}; choose from {', '.join(COMMANDS)}")

        def whole(name: str, value, least: int = 1, most: int | None = None) -> int:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TunerError(f"--{name.replace('_', '-')} must be an integer, not {value!r}")
            try:
                v = int(value)
            except ValueError:
                raise TunerError(f"--{name.replace('_', '-')} must be an integer, not {value!r}") from None
            if v < least:
                raise TunerError(f"--{name.replace('_', '-')} must be at least {least}, not {v}")
            if most is not None and v > most:
                raise TunerError(f"--{name.replace('_', '-')} must be at most {most}, not {v}")
            return v

        changes: dict = {}
        if isinstance(self.model, os.PathLike):
            changes["model"] = os.fspath(self.model)
        elif not isinstance(self.model, str) or not self.model:
            raise TunerError(f"--model takes a model's name or the path of its config.json, not {self.model!r}")
        if not isinstance(self.gpu, str) or not self.gpu:
            raise TunerError(f"--gpu takes a GPU's name (H100, H200, ...), not {self.gpu!r}")
        for name in TEXT_OPTIONS:
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                changes[name] = value = os.fspath(value)
            if value is not None and not isinstance(value, str):
                raise TunerError(f"--{name.replace('_', '-')} takes a text (a name, a path or a URL), not {value!r}")
            if value is not None and not value.strip():
                # an empty --out was taken as none given: the default folder, in silence (found by a new-user pass)
                raise TunerError(f"--{name.replace('_', '-')} is empty: give a name, a path or a URL, or leave it out")
        if not isinstance(self.study_prefix, str):
            raise TunerError(f"--study-prefix takes a name, not {self.study_prefix!r}")
        for name in PATH_LIST_OPTIONS:
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, os.PathLike)) for v in value):
                    raise TunerError(f"--{name.replace('_', '-')} takes a list of texts, not {value!r}")
                changes[name] = [os.fspath(v) for v in value]
        for name in SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise TunerError(f"--{name.replace('_', '-')} is a switch (true or false), not {getattr(self, name)!r}")
        if self.dtype is not None and self.dtype not in DTYPES[self.command]:
            raise TunerError(f"--dtype {self.dtype} is not supported by `tuner {self.command}`; "
                             f"choose from {', '.join(DTYPES[self.command])}")
        from tuner.search.samplers import REMOVED
        if not isinstance(self.sampler, str):
            raise TunerError(f"--sampler {self.sampler!r} is not one of {', '.join(SAMPLERS)}")
        if self.sampler in REMOVED:
            raise TunerError(REMOVED[self.sampler])
        for name, value, allowed in (("sampler", self.sampler, SAMPLERS),
                                     ("timing", self.timing, ("graph", "eager")),
                                     ("l2", self.l2, ("cold", "warm")),
                                     ("kernel_source", self.kernel_source, (None, "engine", "ours", *ENGINE_NAMES)),
                                     ("device", self.device, ("cuda", "cpu"))):
            if value not in allowed:
                raise TunerError(f"--{name.replace('_', '-')} {value!r} is not one of "
                                 f"{', '.join(str(a) for a in allowed if a)}")
        if not isinstance(self.routing, str) or not self.routing:
            raise TunerError(f"--routing takes uniform, zipf or a routing file, not {self.routing!r}")
        from tuner.plan.routing import is_file_routing
        if is_file_routing(self.routing) and self.command != "moe":       # (a nightly job's too, before its night)
            raise TunerError(f"--routing applies to `tuner moe`, not `tuner {self.command}`")
        if self.traffic and self.command not in ("gemm", "moe"):
            raise TunerError(f"--traffic applies to `tuner gemm` and `tuner moe` (M = tokens per forward pass); "
                             f"`tuner {self.command}` tunes another M")
        if isinstance(self.min_gain, bool) or not isinstance(self.min_gain, (int, float)) or not 0 <= self.min_gain < 1:
            raise TunerError(f"--min-gain must be at least 0 and below 1 (0.02 is 2%), not {self.min_gain!r}")
        if self.minutes is not None:
            changes["minutes"] = checked_minutes(self.minutes)
        if self.started is not None and (isinstance(self.started, bool) or not isinstance(self.started, (int, float))):
            raise TunerError(f"started takes a time, not {self.started!r}")
        if self.argv is not None and (not isinstance(self.argv, (list, tuple))
                                      or not all(isinstance(a, str) for a in self.argv)):
            raise TunerError(f"argv takes a list of texts, not {self.argv!r}")
        if self.warm_start is not None and (not isinstance(self.warm_start, (list, tuple))
                                            or not all(isinstance(p, str) for p in self.warm_start)):
            raise TunerError(f"--warm-start takes paths, not {self.warm_start!r}")
        if self.synthetic:
            clash = [o for o, v in (("--replay", self.replay), ("--record", self.record), ("--gpus", self.gpus),
                                    ("--device cpu", self.device == "cpu")) if v]
            if clash:
                raise TunerError(f"--synthetic makes its own SYNTHETIC landscape and replays it; drop {clash[0]}")
        if (not isinstance(self.engines, (list, tuple)) or not self.engines
                or any(not isinstance(e, str) or e not in ENGINE_NAMES for e in self.engines)):
            raise TunerError(f"--engines takes some of {', '.join(ENGINE_NAMES)}, not {self.engines!r}")
        # each engine once: `--engines vllm vllm` would plan (and tune) the same tables twice
        engines = changes["engines"] = list(dict.fromkeys(self.engines))
        if self.kernel_source in ENGINE_NAMES:
            # one engine's own kernel: it times that engine's tables only
            if engines != list(ENGINE_NAMES) and engines != [self.kernel_source]:
                raise TunerError(f"--kernel-source {self.kernel_source} times {self.kernel_source}'s tables only, "
                                 f"not --engines {' '.join(engines)}")
            changes["engines"] = [self.kernel_source]
        if self.synthetic and self.kernel_source == "engine":
            # said, not overridden in silence (found by a new-user pass): --synthetic makes one landscape
            raise TunerError("--synthetic times one kernel's configs: ours (kernels/, the default) or one engine's "
                             "(--kernel-source vllm or sglang, with its keys); not --kernel-source engine")
        if self.synthetic and self.kernel_source is None:
            changes["kernel_source"] = "ours"          # the cost model's landscape of our kernels' configs
        for name, most in (("ep", MAX_PARALLEL), ("measure_timeout", MAX_COUNT), ("recycle_after", MAX_COUNT),
                           ("page_size", MAX_PAGE)):
            changes[name] = whole(name, getattr(self, name), most=most)
        if changes["page_size"] & (changes["page_size"] - 1):
            raise TunerError(f"--page-size must be a power of two, not {changes['page_size']}")
        if self.tp is not None:
            changes["tp"] = whole("tp", self.tp, most=MAX_PARALLEL)
        changes["compile_workers"] = whole("compile_workers", self.compile_workers, 0, MAX_WORKERS)
        # what every sampler's generator takes (numpy's RandomState: 0 to 2^32-1)
        changes["seed"] = whole("seed", self.seed, 0, (1 << 32) - 1)
        for name in ("trials", "patience"):
            if getattr(self, name) is not None:
                changes[name] = whole(name, getattr(self, name), most=MAX_COUNT)
        for name, most in (("batch_sizes", MAX_COUNT), ("contexts", MAX_CONTEXT)):
            values = getattr(self, name)
            if values is not None:
                if not isinstance(values, (list, tuple)) or not values:
                    raise TunerError(f"--{name.replace('_', '-')} takes a list of integers, not {values!r}")
                changes[name] = [whole(name, v, most=most) for v in values]
        return changes


MAX_MINUTES = 24 * 60


def checked_minutes(value) -> float:
    """--minutes: more than 0, at most a day (NaN and infinity fail too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TunerError(f"--minutes must be a number of minutes, not {value!r}")
    try:
        v = float(value)
    except ValueError:
        raise TunerError(f"--minutes must be a number of minutes, not {value!r}") from None
    if not 0 < v <= MAX_MINUTES:
        raise TunerError(f"--minutes must be more than 0 and at most {MAX_MINUTES} (a day), not {value}")
    return v
