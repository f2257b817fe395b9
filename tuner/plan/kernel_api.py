"""The contract every kernel module in kernels/ meets.

The engine only ever talks to a kernel through a `KernelSpec`, so adding a kernel
means writing one file in kernels/ that builds one of these; nothing in tuner/
branches on a kernel's name.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

Config = dict[str, int]
# The launch-config keys of the engines' Triton matmul kernels (GEMM and fused MoE), in
# the order their tables list them.
MATMUL_CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
Params = dict[str, Any]   # a problem's shape/dtype keys, e.g. {"N": 7168, "K": 2048, "block_shape": [128, 128]}
# What `compile_only` builds its launch on: tensors of the real shapes, strides and dtypes
# that own no memory. Triton specializes a launch on dtypes, integer arguments and 16-byte
# alignment (a meta tensor's address, 0, is aligned like any allocation), so the build lands
# under the key the timed run looks up, while a compile worker allocates nothing: an MLA
# decode at 128 x 32K would otherwise take 6 GB in every worker.
COMPILE_DEVICE = "meta"


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a config, as the cost model (tuner/plan/cost_model.py) needs it."""
    programs: int             # programs in the grid
    k_steps: int              # iterations of each program's K loop
    tile_m: int               # the MMA tile of one step (rows x cols x depth), padding included
    tile_n: int
    tile_k: int
    step_bytes: int           # bytes a program loads from global memory per K step (tiles and scales)
    stages: int               # pipeline stages (loads in flight: stages - 1)
    warps: int
    smem: int                 # shared memory one program needs (bytes)
    hbm_bytes: float          # the fewest bytes the launch must move through HBM
    flops: float = 0.0        # the launch's useful FLOPs (0: from the tiles)

    def __post_init__(self) -> None:
        for name in ("programs", "k_steps", "tile_m", "tile_n", "tile_k", "stages", "warps"):
            if getattr(self, name) < 1:
                raise ValueError(f"Launch.{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class KernelSpec:
    """One kernel as the tuner sees it (ours in kernels/, or an engine's own).

    Call order, per problem (params) and batch size M:
      1. `default_config(params, M)` and `extra_seeds(params, M)`: configs every study
         measures first; `shared_memory(params, config)` and `rows(params, M)` feed the
         space's pruning rules (tuner/plan/space.py) before anything compiles.
      2. `compile_only(params, M, config)` (when not None), in a compile worker process:
         builds the config into Triton's cache (`kernel.warmup(...)`), launching nothing,
         on tensors of COMPILE_DEVICE; its launch has the Triton cache key of `run`'s.
      3. `make_inputs(params, M, device, seed)` -> inputs, then `run(inputs, config)` any
         number of times (timing, CUDA-graph capture), and for the numerics check:
         `inputs["out"]` poisoned with NaN, `run`, then `reference(inputs)`.
      4. `emit_table(...)` / `read_table(...)` (own-format kernels only) when writing
         and re-reading tables; `engine_hints(...)` for the closing lines.

    Invariants (tests/test_kernel_contract.py checks them for every registered kernel):
      - `run` writes `inputs["out"]` in place and returns that tensor; it depends on the
        config only through `config_keys`, and never on anything but `inputs`.
      - `make_inputs` is a function of (params, M, device, seed): the same seed gives the
        same inputs, another seed other ones; their reference is not all zeros.
      - `reference(inputs)` is the exact answer in float32/float64, and `run` agrees with it
        within `tolerance` (relative error, tuner/measure/numerics.py) at the default config and
        every seed config.
      - the default config's values (in the space's canonical form) are among the
        search space's values; `flops` and `bytes_moved` are positive and grow with M.
      - `config_keys` are ints in every config (booleans of `bool_keys` as 0/1); an
        engine table's entry read back (`config_from_entry(table_entry(c))`) is `c`.
      - `code_version` hashes every piece of code that decides a timing, so resumable
        state keyed on it is never reused for other code ("" only for an engine kernel
        built without its code, for a replay: then the landscape's header decides).
      - nothing in tuner/ looks at `name` to decide anything: a kernel's specifics live here.
    """

    name: str                                   # "fp8_gemm"; also the landscape's "kernel"
    table_kind: str                             # which engine table family: "fp8_gemm", "fused_moe"
    problem_keys: tuple[str, ...]               # the keys of Params, in a fixed order
    config_keys: tuple[str, ...]                # the launch config's keys, in table order
    # Inputs for one problem at batch size M, on `device`, drawn from `seed`.
    # Must hold an "out" tensor the kernel writes, so a checker can poison it.
    make_inputs: Callable[[Params, int, str, int], dict]
    run: Callable[[dict, Config], Any]          # run with a config, writing inputs["out"]
    reference: Callable[[dict], Any]            # the exact answer in float32/float64
    tolerance: float                            # max relative error ||out-ref||/||ref||
    flops: Callable[[Params, int], float]
    bytes_moved: Callable[[Params, int], float]  # fewest bytes a run must move through HBM
    default_config: Callable[[Params, int], Config]  # what vLLM uses with no table
    shared_memory: Callable[[Params, Config], int]   # bytes one program needs, estimated
    # Rows of the M dimension one launch covers (bounds BLOCK_SIZE_M usefully).
    rows: Callable[[Params, int], int] = lambda params, M: M
    # Programs along M of a launch with this config, where that is known exactly (None:
    # ceil(rows / BLOCK_SIZE_M)); GROUP_SIZE_M values at or above it walk the programs
    # identically (tuner/plan/space.py group_m_equivalence). A launcher that cannot say returns
    # a number past every GROUP_SIZE_M, which folds nothing.
    m_tiles: Callable[[Params, int, Config], int] | None = None
    # What a config makes the GPU do, launch by launch (tuner/plan/cost_model.py: programs, K
    # steps, bytes per step, stages, warps): the cost model's input, which orders a study's
    # candidates before anything is measured (tuner/search/prior.py). None: no estimate.
    work: Callable[[Params, int, Config], list[Launch]] | None = None
    # Further configs worth seeding every study with (e.g. another engine's default).
    extra_seeds: Callable[[Params, int], list[Config]] = lambda params, M: []
    # Compile a config without running it (for parallel compile workers); may be None.
    compile_only: Callable[[Params, int, Config], None] | None = None
    # False when no constexpr or specialized integer argument of the launch depends on M (the
    # batch size changes only the grid): one build of a config then serves every M of a problem,
    # and the compile workers skip the rebuilds (a cache hit still costs a worker's lookup).
    compile_per_m: bool = True
    # Problem keys along which a study is seeded with the best configs of the nearest problem
    # this run already tuned (the same batch size first): MLA decode's context, whose best configs
    # move little from one context bucket to the next (tuner/search/warm_start.py). (): none.
    warm_across: tuple[str, ...] = ()
    # The batch sizes its tables cover when none are given: the tuning command's grid, and the
    # grid a table is whole at (tuner/pipeline/mark_partial.py). (): the engines' grid.
    batch_sizes: tuple[int, ...] = ()
    # Kernels no engine reads tables for write their own format: given [(problem, results)]
    # and the CUDA device name, return ({relative path: JSON object}, {problem key: path}).
    # None: the engines' tables.
    emit_table: Callable[[list, str], dict] | None = None
    # The reverse, for re-timing such tables (tuner drift, nightly): a JSON object ->
    # [(problem params, {M: config})], [] when the object is not this kernel's table.
    read_table: Callable[[dict], list] | None = None
    # How many times one forward pass of a model runs a table of this kernel for `params`
    # (model, params, tp or None) -> int, or None when the model runs no such problem: the
    # weight a table's time has in a pass (tuner drift). None: not known for this kernel.
    layers_per_pass: Callable[[Any, Params, int | None], int | None] | None = None
    # Lines telling the user what the engines can take from the results, printed at the end.
    engine_hints: Callable[[list], list[str]] | None = None
    # How a problem's timing was taken, in words, for the manifest.
    measurement_note: Callable[[Params], str] = lambda params: ""
    description: str = ""
    notes: dict = field(default_factory=dict)
    # Whose code this is: "ours" (kernels/), or an engine's own kernel ("vllm", "sglang")
    # loaded at run time from the user's engine or its wheel (tuner/plan/kernel_sources.py).
    source: str = "ours"
    source_version: str = ""        # the engine's version ("0.33.0"); ours: the tuner's
    origin: str = ""                # where the code was read from (package, wheel, folder)
    # A hash of every piece of code that decides a timing (the Triton kernel and the
    # launcher; for an engine, its kernel and the wrapper our launcher mirrors). Resumable
    # state (studies, landscapes, manifests) records it, so that timings of other code are
    # never silently reused.
    code_version: str = ""
    # Config keys an engine reads with a default when a table lacks them (SGLang's
    # USE_TMA, SWAP_AB, SPLIT_K): filled in when a table is read, and written to a table
    # only where they differ from the default. Keys in bool_keys are JSON true/false there.
    optional_keys: dict = field(default_factory=dict)
    bool_keys: tuple[str, ...] = ()
    # Optional keys a problem's table holds even at their default, because the engine's launch
    # passes the row to its kernel as it is (vLLM's group-wise MoE: SPLIT_K, which its kernel
    # takes as an argument and a row without it fails to launch): (params) -> keys.
    kept_keys: Callable[[Params], tuple[str, ...]] = lambda params: ()
    # Which of the kernel's search spaces a problem takes (configs/spaces/<name>.<source>.<variant>.yaml,
    # tuner/plan/space.py): "" for the default one; an engine kernel that launches another jit
    # kernel for some problems (the group-wise MoE's) has a space of its own for them.
    space_variant: Callable[[Params], str] = lambda params: ""
    # Why this kernel cannot run a problem (a precision it has no launch for), in one line;
    # None: it can. A plan refuses such a problem before anything is timed.
    refuses: Callable[[Params], str | None] = lambda params: None
    # For a problem tied to another (SGLang's _down table to its up table): the params of a
    # problem that times a config of it together with `up_config` of the table it is tied
    # to, as the engine runs the two (run(inputs, config) then times both); None: the two
    # tables' own times are added instead.
    tied_params: Callable[[Params, Config], Params] | None = None
    # A kernel defined outside kernels/ (a test's kernel): the importable module whose KERNEL
    # it is, so that a measuring child or compile worker builds the same one. "": kernels/.
    module: str = ""
    # An engine launcher's variant (kernels/engines/<engine>_<variant>_spec.py) for the problems
    # its `handles` takes (the integer MoE precisions): a code version of its own, so that the
    # tables of the engine's main launcher keep theirs. "": the main launcher.
    variant: str = ""

    @property
    def source_label(self) -> str:
        """'ours', or 'vllm 0.33.0'."""
        return self.source if self.source == "ours" else f"{self.source} {self.source_version}".strip()

    @property
    def ref(self) -> dict:
        """What another process needs to build this same spec (tuner.plan.kernel_registry.get_kernel(**ref))."""
        ref = {"name": self.name, "source": self.source, "origin": self.origin}
        ref = {**ref, "variant": self.variant} if self.variant else ref
        return {**ref, "module": self.module} if self.module else ref


def from_code(module: str, name: str) -> Callable:
    """A callable that imports `module` on its first call and calls its function `name`: a
    spec's code (Triton, torch) is loaded only when something runs it, so that planning, which
    reads a spec's facts (keys, defaults, cost model), imports neither."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


def from_factory(module: str, factory: str, *args) -> Callable:
    """A callable that, on its first call, imports `module`, calls its `factory(*args)` (a
    launcher's `moe_run(code, launch)`, say) once and from then on calls what it returned."""
    made: list[Callable] = []

    def call(*a, **kw):
        if not made:
            made.append(getattr(importlib.import_module(module), factory)(*args))
        return made[0](*a, **kw)
    call.__name__ = call.__qualname__ = factory
    return call


def config_from_entry(spec: KernelSpec, entry: dict) -> Config:
    """A table entry (or any config-like dict) as this kernel's config: optional keys
    filled with their defaults, booleans as 0/1, keys the kernel does not take dropped."""
    merged = {**spec.optional_keys, **entry}
    return {k: int(merged[k]) for k in spec.config_keys}


# Recorded routing (tuner/plan/routing.py): a MoE problem's "routing" param names the ids as
# "recorded:<stem>@<hash>"; the ids are in <$TUNER_ROUTING_DIR>/<hash>.npy, int32 [layers, tokens, topk].
ROUTING_PREFIX = "recorded:"
ROUTING_DIR_ENV = "TUNER_ROUTING_DIR"


def recorded_routing_ids(routing: str):
    """The recorded top-k ids a routing name stands for (a numpy array), for a kernel's inputs."""
    return _load_routing(os.environ.get(ROUTING_DIR_ENV, ""), routing.rsplit("@", 1)[-1])


def _load_routing_uncached(folder: str, digest: str):
    import numpy as np

    from tuner.errors import TunerError
    path = os.path.join(folder, f"{digest}.npy") if folder else ""
    if not folder or not os.path.isfile(path):
        raise TunerError(f"the recorded routing {digest} is not in {folder or '$' + ROUTING_DIR_ENV + ' (not set)'}: "
                         "give --routing FILE again")
    return np.load(path, allow_pickle=False)


_load_routing = functools.lru_cache(maxsize=4)(_load_routing_uncached)


MAX_TABLE_M = 1 << 20            # a table's batch size, as the command line's --batch-sizes
MAX_CONFIG_VALUE = 1 << 12       # no launch-config value reaches it (tiles 256, warps 32, stages 8)


def table_batch_size(key, where: str) -> int:
    """A table's key as a batch size: a whole number from 1 to MAX_TABLE_M, else one line."""
    from tuner.errors import TunerError
    from tuner.plan.batch_keys import batch_key
    m = batch_key(key.strip() if isinstance(key, str) else key, MAX_TABLE_M)
    if m is None:
        raise TunerError(f"{where}: key {str(key)[:40]!r} is not a batch size (a whole number from 1 to {MAX_TABLE_M})")
    return m


def checked_config(spec: KernelSpec, entry, where: str) -> Config:
    """A table entry as this kernel's config, strictly: every key the kernel takes present
    (optional keys default) as a JSON integer (a switch may be a boolean) from 0 to
    MAX_CONFIG_VALUE; a string, a float or an absurd value is one line, never run."""
    from tuner.errors import TunerError
    if not isinstance(entry, dict):
        raise TunerError(f"{where} is not a config object: {str(entry)[:60]}")
    merged = {**spec.optional_keys, **entry}
    missing = [k for k in spec.config_keys if k not in merged]
    if missing:
        raise TunerError(f"{where} is not a config of {spec.name}: it lacks {', '.join(missing)} (a config "
                         f"takes {', '.join(spec.config_keys)})")
    out = {}
    for k in spec.config_keys:
        v = merged[k]
        if isinstance(v, bool) and k in spec.bool_keys:
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_CONFIG_VALUE:
            raise TunerError(f"{where}: {k}={str(v)[:40]!r} is not a launch-config value (a whole number from 0 "
                             f"to {MAX_CONFIG_VALUE})")
        out[k] = v
    return out


def table_entry(spec: KernelSpec, config: Config, params: Params | None = None) -> dict:
    """A config as an engine's table holds it: keys in table order, optional keys only
    where they differ from the engine's default (or the launch needs them in the row for the
    problem `params`: spec.kept_keys), booleans as JSON booleans."""
    out = {}
    kept = spec.kept_keys(params) if params is not None else ()
    for k in spec.config_keys:
        v = int(config[k])
        if k in spec.optional_keys and v == spec.optional_keys[k] and k not in kept:
            continue
        out[k] = bool(v) if k in spec.bool_keys else v
    return out


def config_tuple(spec: KernelSpec, config: Config) -> tuple:
    return tuple(int(config[k]) for k in spec.config_keys)


def config_dict(spec: KernelSpec, values) -> Config:
    return {k: int(v) for k, v in zip(spec.config_keys, values)}


def read_table_file(path) -> dict | list:
    """A kernel's own table file (JSON), read within the bounds of tuner/reading.py (a FIFO,
    a device or a huge file is one clear line, never a read without end): the one reader
    kernels/ uses, so that it imports nothing of tuner/ but this contract."""
    from tuner.reading import read_json_file
    return read_json_file(path, "table ")
