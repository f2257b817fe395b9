"""Triton kernels, one per file, each exposing a `KERNEL` (tuner.kernel_api.KernelSpec)."""

from __future__ import annotations

import importlib

KERNEL_MODULES = ("fp8_gemm", "fused_moe", "mla_decode")


def get_kernel(name: str):
    if name not in KERNEL_MODULES:
        from tuner.errors import TunerError
        raise TunerError(f"unknown kernel {name!r}; known: {', '.join(KERNEL_MODULES)}")
    return importlib.import_module(f"kernels.{name}").KERNEL
