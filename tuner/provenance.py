"""Where a time came from, in words every output that shows times carries.

Three sources: a GPU (the device named), a landscape recorded on a GPU (replayed: the
device it was recorded on, and when), or a SYNTHETIC cost model (nothing was measured).
"""

from __future__ import annotations


def time_source(environment: dict | None, measured_by: str | None) -> str:
    """One line for a run's (or a measurer's) environment and label."""
    env = environment or {}
    how = measured_by or ""
    if env.get("synthetic"):
        return "SYNTHETIC cost model: nothing was measured; these numbers mean nothing about any GPU"
    device = env.get("device") or "an unknown device"
    if how.startswith("replay"):
        when = str(env.get("recorded") or "")[:10]
        return f"landscape recorded on {device}" + (f" ({when})" if when else "") + ", replayed"
    if how:
        return f"measured on the GPU ({device})"
    return "unknown source"


def is_synthetic(environment: dict | None) -> bool:
    return bool((environment or {}).get("synthetic"))


def banner(environment: dict | None, measured_by: str | None) -> str:
    """A line to put above any table of times; loud when synthetic."""
    text = time_source(environment, measured_by)
    if is_synthetic(environment):
        return f"*** {text} ***"
    return f"times: {text}"
