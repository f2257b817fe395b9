"""The engines' own kernels, launched as each engine's wrapper launches them.

One module per engine (vllm.py, sglang.py) says which files of that engine's package the
kernels come from, which wrapper functions our launcher mirrors (with their hashes at the
version it was written against, so a changed wrapper is noticed), the engine's default
configs and extra config keys, and builds a KernelSpec per kernel. The Triton code itself
is read from the user's engine or wheel at run time (tuner/plan/kernel_sources.py); problems,
inputs and float64 references are shared with our kernels, so one numerics check serves all.
"""
