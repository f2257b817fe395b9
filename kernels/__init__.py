"""Triton kernels, one per file, each exposing a `KERNEL` (tuner.kernel_api.KernelSpec).

These are our own kernels, and they stay the neutral reference: they take the engines'
config semantics (tiles, GROUP_SIZE_M, warps, stages; BLOCK_SIZE_K dividing the scale
group) but none of an engine's launch decisions: no swap-AB on sm_90, no TMA loads, no
small-batch path, no BLOCK_SIZE_M 8. Copying those would make them one more engine
version to keep in step; instead the engines' own kernels are timed for the engines'
tables (kernels/engines/, code read from the user's engine or wheel at run time), and ours
serve where no engine is at hand (--kernel-source ours), for MLA decode (which no engine
reads tables for), and as the plain baseline an engine's kernel is compared with.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import re
from pathlib import Path

KERNEL_MODULES = ("fp8_gemm", "fused_moe", "mla_decode")
KERNEL_SOURCES = ("ours", "vllm", "sglang")
_HERE = Path(__file__).resolve().parent


def _own_files(module: str) -> list[Path]:
    """A kernel module's file and every kernels/ module it imports, recursively."""
    seen: list[Path] = []
    todo = [module]
    while todo:
        path = _HERE / f"{todo.pop()}.py"
        if path in seen:
            continue
        seen.append(path)
        todo += re.findall(r"^from kernels\.(\w+) import", path.read_text(), flags=re.M)
    return sorted(seen)


@functools.lru_cache(maxsize=None)
def _ours(name: str):
    from tuner import __version__
    spec = importlib.import_module(f"kernels.{name}").KERNEL
    digest = hashlib.sha256()
    for path in _own_files(name):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return dataclasses.replace(spec, source="ours", source_version=__version__, origin=str(_HERE),
                               code_version=digest.hexdigest()[:16])


def get_kernel(name: str, source: str = "ours", origin: str | None = None, load_code: bool = True,
               module: str | None = None):
    """The KernelSpec of kernel `name` from `source`: our file in kernels/ ("ours"), or an
    engine's own kernel ("vllm", "sglang"), read from the installed engine or from
    `origin` (its wheel, or a folder of files extracted from it). load_code=False: an
    engine's kernel without its code (keys, space, defaults), to replay or plan. `module`:
    a kernel defined outside kernels/ (a test's), the module whose KERNEL it is."""
    from tuner.errors import TunerError
    if module:
        from tuner.kernel_api import KernelSpec
        spec = getattr(importlib.import_module(module), "KERNEL", None)
        if not isinstance(spec, KernelSpec) or spec.name != name:
            raise TunerError(f"module {module} defines no KERNEL named {name!r}")
        return spec
    if name not in KERNEL_MODULES:
        raise TunerError(f"unknown kernel {name!r}; known: {', '.join(KERNEL_MODULES)}")
    if source == "ours":
        return _ours(name)
    if source not in KERNEL_SOURCES:
        raise TunerError(f"unknown kernel source {source!r}; known: {', '.join(KERNEL_SOURCES)}")
    from tuner.kernel_sources import engine_kernel
    return engine_kernel(name, source, origin or None, load_code)
