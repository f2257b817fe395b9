"""What the engines' launchers share: loading their jit functions once per process, the
check that the wrappers they mirror are the ones they were written against, the code
version of what runs, and the device facts the engines' launch decisions depend on."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

import torch

from kernels.interpreter_fixes import interpreting, patch_interpreter
from tuner.errors import TunerError
from tuner.kernel_api import COMPILE_DEVICE, KernelSpec


def target_capability() -> tuple[int, int]:
    """The compute capability the engine's launch decisions are taken for: the GPU in use,
    or, without one (Triton's interpreter), sm_90, the Hopper GPUs the tables are for."""
    if not interpreting() and torch.cuda.is_available():
        return torch.cuda.get_device_capability()
    return (9, 0)


def on_cuda_device() -> bool:
    """Launching (or compiling) for a CUDA GPU: one is present, or this is a compile worker of
    the CPU device, which compiles for sm_90 without one (tuner/device.py)."""
    from tuner.device import compiling_for_sm90
    return not interpreting() and (torch.cuda.is_available() or compiling_for_sm90())


@functools.lru_cache(maxsize=None)
def _module(code_key: tuple, relpath: str, names: tuple[str, ...]):
    from tuner.kernel_sources import jit_module
    return jit_module(_CODES[code_key], relpath, list(names))


_CODES: dict = {}


def jit_functions(code, relpath: str, names: list[str]):
    """The engine's jit functions `names` from `relpath` (loaded once per process)."""
    if code is None:
        raise TunerError("this kernel was set up without the engine's code (a replay or a plan); "
                         "running it needs the engine: give --engine-source PATH")
    patch_interpreter()          # engine kernels carry no interpreter work-arounds of their own
    key = (code.engine, code.version, code.origin)
    _CODES[key] = code
    try:
        module = _module(key, relpath, tuple(names))
    except KeyError as e:
        raise TunerError(f"{code.engine} {code.version} ({code.where}) has no function {e} in {relpath}: "
                         "its kernels changed; this launcher cannot run them") from None
    return [getattr(module, n) for n in names]


def changed_wrappers(code, mirrored: dict[str, str]) -> list[str]:
    """The mirrored wrapper functions whose source differs from the version the launcher
    was written against ('file:function' names); [] when all match."""
    from tuner.kernel_sources import mirrored_hashes
    by_file: dict[str, list[str]] = {}
    for key in mirrored:
        rel, name = key.rsplit(":", 1)
        by_file.setdefault(rel, []).append(name)
    now = mirrored_hashes(code, by_file)
    return sorted(k for k, h in mirrored.items() if now.get(k) != h)


def code_version(code, kernel_files: dict[str, list[str]], launcher_file: str) -> str:
    """A hash of the engine's kernel functions as read now and of our launcher module."""
    from tuner.kernel_sources import function_source
    digest = hashlib.sha256(Path(launcher_file).read_bytes())
    digest.update(Path(__file__).read_bytes())
    for rel in sorted(kernel_files):
        text = code.read(rel)
        for name in kernel_files[rel]:
            digest.update(function_source(text, name).encode())
    return digest.hexdigest()[:16]


def engine_spec(base: KernelSpec, code, engine: str, kernel_files: dict, mirrored: dict,
                launcher_file: str, written_for: str, **changes) -> KernelSpec:
    """Our kernel's spec (problems, inputs, reference, cost model) with the engine's launch,
    defaults and keys; source and code version filled from the engine's code when given."""
    notes = dict(base.notes)
    notes["launcher_written_for"] = f"{engine} {written_for}"
    changes.update(source_version="", origin="", code_version="")     # known only from the code
    if code is not None:
        changed = changed_wrappers(code, mirrored)
        notes["launcher_matches_engine"] = not changed
        if changed:
            notes["changed_wrappers"] = changed
        changes.update(source_version=code.version, origin=code.origin,
                       code_version=code_version(code, kernel_files, launcher_file))
    return dataclasses.replace(base, source=engine, **changes, notes=notes)


def phantom(shape, dtype, device: str = COMPILE_DEVICE) -> torch.Tensor:
    """A contiguous tensor of `shape` that owns no memory (a meta tensor): for compiling a
    launch, which looks only at dtype, strides and alignment, without the gigabytes a full
    expert weight would take in every compile worker. (A view of a few real bytes would fail
    torch's storage bounds check, on a GPU as here.)"""
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def gemm_phantoms(params, M: int, device: str = COMPILE_DEVICE):
    """(A, B, As, Bs, C) of a block-FP8 GEMM problem for compiling, B a phantom."""
    N, K = params["N"], params["K"]
    bn, bk = params["block_shape"]
    fp8 = torch.float8_e4m3fn
    return (torch.empty((M, K), dtype=fp8, device=device), phantom((N, K), fp8, device),
            torch.empty((M, -(-K // bk)), dtype=torch.float32, device=device),
            torch.empty((-(-N // bn), -(-K // bk)), dtype=torch.float32, device=device),
            torch.empty((M, N), dtype=torch.bfloat16, device=device))
