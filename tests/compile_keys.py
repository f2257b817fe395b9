"""Runs in a compile worker of the CPU device (tuner.measure.device.init_compile_worker("cpu"): kernels
compiled, not interpreted, for sm_90): the Triton cache keys of a config's compile_only launch
and of its real run, taken by Triton's own jit cache hook, which then skips the compile (and
the launch): nothing is built, nothing runs, so any kernel and shape costs milliseconds.

Triton looks a launch up by this key (its specialization on dtypes, integer arguments and
16-byte alignment, and its options), so a compile worker's build is used by the timed run
exactly when the keys match."""

import os


def launch_keys(kernel_ref: dict, params: dict, M: int, config: dict) -> tuple[list, list]:
    from triton import knobs

    from tuner.plan.kernel_registry import get_kernel
    assert os.environ.get("TRITON_INTERPRET") is None       # compiled kernels, as on a GPU
    kernel = get_kernel(**kernel_ref)
    seen: list = []

    def hook(**kw) -> bool:
        seen.append((kw["fn"].name, str(kw["key"])))
        return True                                          # skip compiling (and launching)

    knobs.runtime.jit_cache_hook = hook
    try:
        kernel.compile_only(params, M, config)
        compiled = sorted(set(seen))
        seen.clear()
        kernel.run(kernel.make_inputs(params, M, "cpu", 0), config)   # the timed run's launches
        ran = sorted(set(seen))
    finally:
        knobs.runtime.jit_cache_hook = None
    return compiled, ran
