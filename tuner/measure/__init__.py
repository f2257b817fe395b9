"""Where timings come from.

In: a kernel, a problem, an M and configs. Out: timings and numerics verdicts, from a GPU,
the CPU device (Triton's interpreter), or a recorded landscape (replay); the isolated
measuring child, its compile workers and process groups; landscapes on disk.
"""

from pathlib import Path as _Path


def __getattr__(name: str) -> object:
    """The names of the old module tuner.measure (before 0.2; the measurer interface and the
    replay measurer, now tuner.measure.measurers) still import from here: `from tuner.measure
    import ...` in old scripts keeps working."""
    if name.startswith("_") or (_Path(__file__).parent / f"{name}.py").exists():
        raise AttributeError(f"module 'tuner.measure' has no attribute {name!r}")
    from tuner.measure import measurers
    try:
        return getattr(measurers, name)
    except AttributeError:
        raise AttributeError(f"module 'tuner.measure' has no attribute {name!r}") from None
