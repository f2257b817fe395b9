"""What to tune.

In: a model (a name, a file or a Hugging Face folder), the GPU, the engine and its
version, the parallelism, a traffic profile. Out: problems (kernel shapes), the batch sizes M
to tune, the search space of launch configs, and the engines' naming and loader rules;
the kernel contract (`KernelSpec`) and the one registry that resolves a kernel.
"""
