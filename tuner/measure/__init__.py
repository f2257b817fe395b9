"""Where timings come from.

In: a kernel, a problem, an M and configs. Out: timings and numerics verdicts, from a GPU,
the CPU device (Triton's interpreter), or a recorded landscape (replay); the isolated
measuring child, its compile workers and process groups; landscapes on disk.
"""
