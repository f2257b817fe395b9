"""A kernel known only from a recorded landscape: another project's kernel, timed on its GPU.

Landscapes that other autotuning projects brute-forced and published (kernel_tuner's GEMM
cache files, ...) have launch parameters of their own (MWG, NWG, MDIMC, ...). To judge our
search on them, their header names those parameters, and `landscape_kernel` builds a
`KernelSpec` whose config keys are exactly those: the search (StudyRunner: encoding,
sampler, claims, stopping) then drives them through the same code as our own kernels,
with nothing special-cased. Such a kernel has no code: it can be replayed, never run.

Header fields, besides the landscape format's ("format", "kernel", "device", ...):
  "config_keys": ["MWG", "NWG", ...]      the launch parameters, in order
  "problem_keys": ["M", "N", "K"]         the problem's keys
  "params": {"MWG": [16, 32, ...], ...}   every value each parameter takes
  "default_config": {"MWG": 64, ...}      the project's default (the study's seed), optional
  "kinds": {"use_method": "category"}     keys' kinds as a space file declares them, optional
  "origin": {"repository": ..., "path": ..., "commit": ..., "license": ...}
"""

from __future__ import annotations

import hashlib
import json

from tuner.errors import TunerError
from tuner.plan.gpus import GPUS, GpuSpec
from tuner.plan.kernel_api import Config, KernelSpec
from tuner.plan.space import SearchSpace

HEADER_KEYS = ("config_keys", "problem_keys", "params")


def is_landscape_kernel(header: dict) -> bool:
    return all(k in header for k in HEADER_KEYS)


def _no_code(*args, **kwargs):
    raise TunerError("a kernel known only from its landscape has no code: it can be replayed, not run")


def landscape_kernel(header: dict) -> KernelSpec:
    """The KernelSpec of a landscape whose header names its parameters (see above)."""
    missing = [k for k in ("kernel", *HEADER_KEYS) if k not in header]
    if missing:
        raise TunerError(f"landscape header lacks {', '.join(missing)}: not a landscape of another project's kernel")
    keys = tuple(header["config_keys"])
    params = header["params"]
    if not keys or any(k not in params or not params[k] for k in keys):
        raise TunerError("landscape header: 'params' must list the values of every config key")
    first = {k: sorted(params[k])[0] for k in keys}
    default = {k: int(v) for k, v in (header.get("default_config") or first).items() if k in keys}
    if set(default) != set(keys):
        raise TunerError("landscape header: 'default_config' must give every config key")

    def default_config(problem: dict, M: int) -> Config:
        return dict(default)

    code = hashlib.sha256(json.dumps({k: header.get(k) for k in ("kernel", *HEADER_KEYS)},
                                     sort_keys=True).encode()).hexdigest()[:16]
    return KernelSpec(
        name=header["kernel"], table_kind=header["kernel"], problem_keys=tuple(header["problem_keys"]),
        config_keys=keys, make_inputs=_no_code, run=_no_code, reference=_no_code, tolerance=0.0,
        flops=lambda p, M: 1.0, bytes_moved=lambda p, M: 1.0, default_config=default_config,
        shared_memory=lambda p, c: 0, description=f"{header['kernel']} (known from a landscape only)",
        source="ours", code_version=code)


def landscape_space(kernel: KernelSpec, header: dict) -> SearchSpace:
    """Every value of every parameter, no pruning rules: the landscape's points are the
    configs that exist (a replay searches only those)."""
    from tuner.plan.key_kinds import checked_kinds
    choices = {k: sorted(int(v) for v in header["params"][k]) for k in kernel.config_keys}
    return SearchSpace(kernel, choices, {}, source=f"landscape {header['kernel']}",
                       kinds=checked_kinds(header.get("kinds"), choices, "landscape header"))


def landscape_gpu(header: dict) -> GpuSpec:
    """A GpuSpec named as the landscape's device (limits unused: no rule reads them)."""
    base = GPUS["H100"]
    return GpuSpec(header["device"], header["device"], base.sm_count, base.max_smem_per_block, base.l2_bytes,
                   base.hbm_tb_s, base.fp8_tflops)
