"""A FAKE measurer that misbehaves on purpose, for the fault-isolation tests.

Timings are synthetic (tests/synthetic.py). Chosen configs crash the process (SIGSEGV),
hang, fail to compile, run out of resources, or poison the 'CUDA context' the way an
illegal memory access does. Every start appends the process id to a log file.
"""

import os
import signal
import time

from synthetic import fake_time_us

from tuner.measure.measurers import Measurement, NumericsCheck
from tuner.plan.kernel_registry import get_kernel


def fault(cfg):
    """The fault a config triggers, or None."""
    bn, bk, w, s = cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"], cfg["num_warps"], cfg["num_stages"]
    return {(32, 128, 4, 5): "segfault", (64, 128, 8, 5): "hang", (128, 64, 8, 4): "compile",
            (128, 128, 8, 5): "resources", (64, 64, 4, 3): "illegal"}.get((bn, bk, w, s))


class FaultyMeasurer:
    label = "faulty"

    def __init__(self, log_path: str):
        self.kernel = get_kernel("fp8_gemm")
        self.poisoned = False
        with open(log_path, "a") as f:
            f.write(f"{os.getpid()}\n")

    def environment(self):
        return {"device": "NVIDIA H200", "triton": "3.6.0", "fake": True}

    def measure_iter(self, problem, M, configs):
        for cfg in configs:
            kind = fault(cfg)
            if kind == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            if kind == "hang":
                time.sleep(3600)
            if kind == "compile":
                yield Measurement(None, None, "CompilationError: at 12:8: invalid layout")
            elif kind == "resources":
                yield Measurement(None, None, "OutOfResources: shared memory, Required: 262144, Hardware limit: 232448")
            elif kind == "illegal":
                self.poisoned = True
                yield Measurement(None, None, "RuntimeError: CUDA error: an illegal memory access was encountered")
                return
            else:
                yield Measurement(fake_time_us(problem.params, M, cfg) or 50.0, 0.01, None)

    def check_numerics(self, problem, M, config):
        return NumericsCheck("passed", 0.002, "fake")

    def close(self):
        pass
