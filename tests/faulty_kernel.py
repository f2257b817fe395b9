"""A test kernel, registered through the KernelSpec contract (module "faulty_kernel"), that
misbehaves for chosen configs while the real measuring stack runs it: the isolated child, its
compile workers (which compile our block-FP8 GEMM for sm_90 as usual), the CPU device.

It is our fp8_gemm in every respect but `run`, which for BLOCK_SIZE_N 32 and num_stages:
  4   hangs (sleeps an hour), having first written its pid into the file named by
      $FAULTY_KERNEL_HANG_FILE when that is set (so a test can time the hang from its start),
  5   kills its process with SIGSEGV,
  3   raises the error CUDA gives after an illegal memory access (the context is lost),
and otherwise runs the real kernel.
"""

import dataclasses
import os
import signal
import time

from tuner.plan.kernel_registry import get_kernel

_BASE = get_kernel("fp8_gemm")
HANG_FILE = "FAULTY_KERNEL_HANG_FILE"


def fault(config: dict) -> str | None:
    if config["BLOCK_SIZE_N"] != 32:
        return None
    return {4: "hang", 5: "segfault", 3: "illegal"}.get(config["num_stages"])


def run(inputs: dict, config: dict):
    kind = fault(config)
    if kind == "hang":
        if os.environ.get(HANG_FILE):
            with open(os.environ[HANG_FILE], "w") as f:
                f.write(str(os.getpid()))
        time.sleep(3600)
    elif kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "illegal":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return _BASE.run(inputs, config)


KERNEL = dataclasses.replace(_BASE, run=run, module="faulty_kernel",
                             code_version="faulty-kernel-1", description="fp8_gemm that hangs or crashes on purpose")
