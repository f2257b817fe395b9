"""Triton kernels, one per file, each exposing a `KERNEL` (tuner.plan.kernel_api.KernelSpec).

These are our own kernels, and they stay the neutral reference: they take the engines'
config semantics (tiles, GROUP_SIZE_M, warps, stages; BLOCK_SIZE_K dividing the scale
group) but none of an engine's launch decisions: no swap-AB on sm_90, no TMA loads, no
small-batch path, no BLOCK_SIZE_M 8. Copying those would make them one more engine
version to keep in step; instead the engines' own kernels are timed for the engines'
tables (kernels/engines/, code read from the user's engine or wheel at run time), and ours
serve where no engine is at hand (--kernel-source ours), for MLA decode (which no engine
reads tables for), and as the plain baseline an engine's kernel is compared with.
"""
