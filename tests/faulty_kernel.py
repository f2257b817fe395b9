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


HANGING_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
                  "num_stages": 4}


def hanging_plan(folder, model: str, measure_timeout: float, budget: int, quiet: bool = False):
    """A RunPlan (CPU device, one compile worker) of one study of `model`'s N=256 GEMM at M=1
    whose every config hangs, the default too: a space of HANGING_CONFIG alone (written into
    `folder`), results into `folder`/out. What the tests of a child stuck in a config run."""
    from pathlib import Path

    from tuner.pipeline.request import TuneRequest
    from tuner.pipeline.run_plan import RunPlan
    from tuner.plan.gpus import get_gpu
    from tuner.plan.models import gemm_problems, load_model
    from tuner.plan.space import load_space
    from tuner.search.runner import SearchSettings
    space = Path(folder) / "space.yaml"
    space.write_text("kernel: fp8_gemm\nparams:\n" + "".join(f"  {k}: [{v}]\n" for k, v in HANGING_CONFIG.items()))
    kernel = dataclasses.replace(KERNEL, default_config=lambda params, M: dict(HANGING_CONFIG),
                                 extra_seeds=lambda params, M: [])
    [problem] = [p for p in gemm_problems(load_model(model), 1) if p.params["N"] == 256]
    request = TuneRequest("gemm", model, "H100", engines=["vllm"], compile_workers=1, measure_timeout=measure_timeout,
                          device="cpu", quiet=quiet)
    return RunPlan(request=request, kernel=kernel, space=load_space(kernel, space), gpu=get_gpu("H100"),
                   problems=[problem], batch_sizes=[1],
                   settings=SearchSettings(budget=budget, patience=100, batch=budget, seed=0),
                   out_dir=Path(folder) / "out")
