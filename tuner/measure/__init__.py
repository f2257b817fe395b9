"""Where timings come from.

In: a kernel, a problem, an M and configs. Out: timings and numerics verdicts, from a GPU,
the CPU device (Triton's interpreter), or a recorded landscape (replay); the isolated
measuring child, its compile workers and process groups; landscapes on disk.
"""

from tuner.moved import forward_old_names

# the names of the old module tuner.measure (before 0.2), now in tuner.measure.measurers, still import from here
__getattr__ = forward_old_names(__name__, "tuner.measure.measurers", __file__)
