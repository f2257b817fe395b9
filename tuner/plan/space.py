"""Search spaces: the launch-config values to try, and the rules that prune them.

A space is read from configs/spaces/<kernel>.yaml. Pruning happens per (problem, M)
before anything compiles; each rule is a small function registered by name below.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.errors import TunerError
from tuner.paths import SPACES_DIR
from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import Config, KernelSpec, Params, config_from_entry


@dataclass
class RuleContext:
    kernel: KernelSpec
    params: Params
    M: int
    gpu: GpuSpec
    choices: dict[str, list[int]]
    memo: dict = field(default_factory=dict)     # what a rule works out once per (problem, M), not per config


# A rule gets the context, its YAML options and a config; it returns True to keep it.
Rule = Callable[[RuleContext, dict, Config], bool]
RULES: dict[str, Rule] = {}
# The rules that never read the batch size (ctx.M): the configs that pass them are worked out
# once per problem, not once per M (a plan counts the pruned configs of 18 batch sizes). A rule
# registered without saying so is taken to read M.
M_FREE: set[str] = set()
KEPT_MEMO = 1024            # (problem, M) answers a space keeps (each a list of the configs it holds already)


def rule(name: str, reads_m: bool = True):
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        if not reads_m:
            M_FREE.add(name)
        return fn
    return register


@rule("block_k_divides_group", reads_m=False)
def _block_k_divides_group(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    block_shape = ctx.params.get("block_shape")
    return not block_shape or block_shape[1] % cfg["BLOCK_SIZE_K"] == 0


@rule("block_k_is_group", reads_m=False)
def _block_k_is_group(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    # One K step per scale group: on the H200 (landscapes/NVIDIA_H200/, vLLM's GEMM at M = 1 and
    # 16) every config with BLOCK_SIZE_K 64 in 128-wide groups took 1.2x the best or more: the
    # loop pays its latency per step, and a half-group step pays it twice for the same scales.
    block_shape = ctx.params.get("block_shape")
    return not block_shape or cfg["BLOCK_SIZE_K"] == block_shape[1]


@rule("block_k_clamped", reads_m=False)
def _block_k_clamped(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    # An engine that clamps K tiles to the weight block runs a wider one as the block-wide
    # one: keep that form only (seeds are folded onto it, see CANONICALIZERS).
    block_shape = ctx.params.get("block_shape")
    return not block_shape or cfg["BLOCK_SIZE_K"] <= min(block_shape)


@rule("tiny_block_m_fp8_only", reads_m=False)
def _tiny_block_m_fp8_only(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    # Tiles under 16 rows: Triton takes them in FP8 dots (vLLM ships BLOCK_SIZE_M 8 for its
    # small-batch path), not in 16-bit ones.
    return cfg["BLOCK_SIZE_M"] >= 16 or ctx.params.get("dtype") == "fp8_w8a8"


@rule("tma_needs_block_fp8", reads_m=False)
def _tma_needs_block_fp8(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    return not cfg.get("USE_TMA") or (ctx.params.get("dtype") == "fp8_w8a8" and bool(ctx.params.get("block_shape")))


@rule("split_k_within_k_steps", reads_m=False)
def _split_k_within_k_steps(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    return cfg.get("SPLIT_K", 1) <= math.ceil(ctx.params["K"] / cfg["BLOCK_SIZE_K"])


@rule("block_k_divides_k", reads_m=False)
def _block_k_divides_k(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    # The group-wise MoE kernels (fused_moe_kernel_gptq_awq) load weight tiles unmasked along
    # K: a K tile that does not divide a GEMM's K reads past the weights (vLLM's tuning script
    # for it keeps only K tiles that divide the hidden and the intermediate size).
    part = ctx.params.get("part", "op")
    ks = [ctx.params[k] for k in (("K",) if part == "up" else ("N",) if part == "down" else ("K", "N")) if k in ctx.params]
    return all(k % cfg["BLOCK_SIZE_K"] == 0 for k in ks)


@rule("shared_memory", reads_m=False)
def _shared_memory(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    limit = opts.get("limit_bytes", ctx.gpu.max_smem_per_block)
    return ctx.kernel.shared_memory(ctx.params, cfg) <= limit


def _dim(cfg: Config, value) -> int:
    """A rule option naming a config key, or a plain number."""
    return cfg[value] if isinstance(value, str) else int(value)


@rule("accumulator_registers", reads_m=False)
def _accumulator_registers(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    # fp32 accumulator tile (rows x cols) spread over the program's threads
    tile = _dim(cfg, opts.get("rows", "BLOCK_SIZE_M")) * _dim(cfg, opts.get("cols", "BLOCK_SIZE_N"))
    return tile / (32 * cfg["num_warps"]) <= opts.get("max_per_thread", 128)


def _useful_block_m(ctx: RuleContext, opts: dict) -> int:
    key = ("useful_block_m", opts.get("min", 16))
    if key not in ctx.memo:
        rows = ctx.kernel.rows(ctx.params, ctx.M)
        ctx.memo[key] = max(opts.get("min", 16), 1 << max(0, math.ceil(math.log2(max(rows, 1)))))
    return ctx.memo[key]


@rule("block_m_within_rows")
def _block_m_within_rows(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    # A tile taller than the next power of two of the rows only adds masked work.
    return cfg[opts.get("key", "BLOCK_SIZE_M")] <= _useful_block_m(ctx, opts)


def _canonical_group_m(ctx: RuleContext, cfg: Config) -> int:
    """The GROUP_SIZE_M that behaves the same as cfg's: every value at or above the
    number of M tiles walks the tiles identically, so the smallest such choice stands
    for all of them."""
    m_tiles = (ctx.kernel.m_tiles(ctx.params, ctx.M, cfg) if ctx.kernel.m_tiles is not None
               else math.ceil(ctx.kernel.rows(ctx.params, ctx.M) / cfg["BLOCK_SIZE_M"]))
    g = cfg["GROUP_SIZE_M"]
    if g < m_tiles:
        return g
    at_or_above = [v for v in ctx.choices.get("GROUP_SIZE_M", [g]) if v >= m_tiles]
    return min(at_or_above) if at_or_above else g


@rule("group_m_equivalence")
def _group_m_equivalence(ctx: RuleContext, opts: dict, cfg: Config) -> bool:
    return _canonical_group_m(ctx, cfg) == cfg["GROUP_SIZE_M"]


def _clamped_block_k(ctx: RuleContext, cfg: Config) -> Config:
    block_shape = ctx.params.get("block_shape")
    return cfg | {"BLOCK_SIZE_K": min(cfg["BLOCK_SIZE_K"], min(block_shape))} if block_shape else cfg


CANONICALIZERS = {"group_m_equivalence": lambda ctx, cfg: cfg | {"GROUP_SIZE_M": _canonical_group_m(ctx, cfg)},
                  "block_k_clamped": _clamped_block_k}


@dataclass
class SearchSpace:
    kernel: KernelSpec
    choices: dict[str, list[int]]
    constraints: dict[str, dict]
    source: str = ""
    # kinds the space file declares (tuner/plan/key_kinds.py); not in `version`: they steer
    # the search's model, not what a config measures
    kinds: dict[str, str] = field(default_factory=dict)
    # (problem, GPU) -> the configs that pass the rules that do not read M (see M_FREE)
    _m_free: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # (problem, GPU, M) -> the configs kept: a plan's text, its budget and the run each ask for the
    # same (problem, M) (a dry run of 18 batch sizes asked 3 times each); at most KEPT_MEMO kept
    _kept: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.choices.values())

    @property
    def version(self) -> str:
        """A hash of what the space holds (values and rules with their options, not where
        it was read from): a worker that rebuilds the space from a stored plan gets the
        same, an edited space file another. Studies and landscapes record it."""
        text = json.dumps({"choices": self.choices, "constraints": self.constraints}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def key_kinds(self) -> dict[str, str]:
        """Every key's kind: declared in the space file, else implied by its values."""
        from tuner.plan.key_kinds import resolved_kinds
        return resolved_kinds(self.choices, self.kinds)

    def _ctx(self, params: Params, M: int, gpu: GpuSpec) -> RuleContext:
        return RuleContext(self.kernel, params, M, gpu, self.choices)

    def all_configs(self):
        keys = self.kernel.config_keys
        for values in itertools.product(*(self.choices[k] for k in keys)):
            yield dict(zip(keys, values))

    def _first_rule_against(self, ctx: RuleContext, cfg: Config) -> str | None:
        for name, opts in self.constraints.items():
            if not RULES[name](ctx, opts, cfg):
                return name
        return None

    def rejected_by(self, params: Params, M: int, gpu: GpuSpec, cfg: Config) -> str | None:
        """The first rule that drops cfg, or None when cfg is kept."""
        return self._first_rule_against(self._ctx(params, M, gpu), cfg)

    def configs(self, params: Params, M: int, gpu: GpuSpec) -> list[Config]:
        """Every config that survives pruning for this problem and batch size (in the space's
        order): those that pass the rules that do not read M, worked out once per problem,
        then the rules that do."""
        ctx = self._ctx(params, M, gpu)
        key = (json.dumps(params, sort_keys=True, default=str), gpu.key)
        memo = key + (M,)
        if memo in self._kept:
            return list(self._kept[memo])
        if key not in self._m_free:
            free = [(n, o) for n, o in self.constraints.items() if n in M_FREE]
            self._m_free[key] = [c for c in self.all_configs() if all(RULES[n](ctx, o, c) for n, o in free)]
        per_m = [(n, o) for n, o in self.constraints.items() if n not in M_FREE]
        kept = [c for c in self._m_free[key] if all(RULES[n](ctx, o, c) for n, o in per_m)]
        if len(self._kept) >= KEPT_MEMO:
            self._kept.clear()
        self._kept[memo] = kept
        return list(kept)

    def canonical(self, params: Params, M: int, gpu: GpuSpec, cfg: Config) -> Config:
        """An equivalent config in the space's canonical form (e.g. GROUP_SIZE_M folded),
        so a seed from a table lands on the point the search measures."""
        ctx = self._ctx(params, M, gpu)
        cfg = config_from_entry(self.kernel, cfg)
        for name in self.constraints:
            if name in CANONICALIZERS:
                cfg = CANONICALIZERS[name](ctx, cfg)
        return cfg


def space_file(kernel: KernelSpec, variant: str = "") -> Path:
    """configs/spaces/<kernel>.<source>.yaml for an engine's kernel with keys or limits of
    its own, else configs/spaces/<kernel>.yaml; for a problem of another of the kernel's jit
    kernels (KernelSpec.space_variant), configs/spaces/<kernel>.<source>.<variant>.yaml."""
    if variant:
        return SPACES_DIR / f"{kernel.name}.{kernel.source}.{variant}.yaml"
    own = SPACES_DIR / f"{kernel.name}.{kernel.source}.yaml"
    return own if own.is_file() else SPACES_DIR / f"{kernel.name}.yaml"


def space_variant(kernel: KernelSpec, problems: list) -> str:
    """The one space variant `problems` (Problem objects or params) take: a run's problems share
    one space, so problems of several are refused."""
    variants = {kernel.space_variant(p.params if hasattr(p, "params") else p) for p in problems}
    if len(variants) > 1:
        raise TunerError(f"these {kernel.name} problems take different search spaces ({', '.join(sorted(variants))}): "
                         "tune them in separate runs")
    return next(iter(variants), "")


def load_space(kernel: KernelSpec, path: str | Path | None = None, problems: list | None = None) -> SearchSpace:
    """The search space: --space's file, else the kernel's (for `problems`' variant)."""
    path = Path(path) if path else space_file(kernel, space_variant(kernel, problems or []))
    from tuner.reading import read_yaml_file
    data = read_yaml_file(path, "search space ")
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise TunerError(f"search space {path} needs a 'params' mapping")
    if data.get("kernel", kernel.name) != kernel.name:
        raise TunerError(f"search space {path} is for kernel {data.get('kernel')!r}, not {kernel.name!r}")
    if data.get("source", kernel.source) != kernel.source:
        raise TunerError(f"search space {path} is for {data.get('source')}'s {kernel.name}, "
                         f"not {kernel.source_label}'s")
    params = data["params"]
    missing = [k for k in kernel.config_keys if k not in params]
    extra = [k for k in params if k not in kernel.config_keys]
    if missing or extra:
        raise TunerError(f"search space {path}: params must be exactly {', '.join(kernel.config_keys)}"
                         + (f" (missing {', '.join(missing)})" if missing else "")
                         + (f" (unknown {', '.join(extra)})" if extra else ""))
    choices = {}
    for k in kernel.config_keys:
        vals = params[k]
        least = 0 if k in kernel.optional_keys else 1      # switches (USE_TMA...) take 0 for off
        if (not isinstance(vals, list) or not vals
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= least for v in vals)):
            raise TunerError(f"search space {path}: {k} must be a list of "
                             f"{'non-negative' if least == 0 else 'positive'} integers")
        choices[k] = sorted(set(vals))
    constraints = data.get("constraints") or {}
    if not isinstance(constraints, dict):
        raise TunerError(f"search space {path}: 'constraints' must map rule names to options")
    unknown = [c for c in constraints if c not in RULES]
    if unknown:
        raise TunerError(f"search space {path}: unknown constraint {unknown[0]!r}; known: {', '.join(RULES)}")
    from tuner.plan.key_kinds import checked_kinds
    kinds = checked_kinds(data.get("kinds"), choices, f"search space {path}")
    return SearchSpace(kernel, choices, {k: dict(v or {}) for k, v in constraints.items()}, str(path), kinds)


