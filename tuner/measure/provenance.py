"""Where a time came from, in words every output that shows times carries.

Four sources: a GPU (the device named), a landscape recorded on a GPU (replayed: the
device it was recorded on, and when), the CPU DEVICE (the GPU's code path run on a CPU in
Triton's interpreter, for CI: wall-clock times that mean nothing about a GPU), or a
SYNTHETIC cost model (nothing was measured). The last two are said loudly everywhere.
"""

from __future__ import annotations

from tuner.measure.device import is_cpu_device_name

CPU_DEVICE = "CPU DEVICE"

# Where a study's times came from, as its identity names it (tuner/search/identity.py).
TIMES_GPU = "GPU"
TIMES_CPU_DEVICE = "CPU device"
TIMES_SYNTHETIC = "SYNTHETIC"


def landscape_times(header: dict, digest: str) -> str:
    """Where a replay's times come from: 'SYNTHETIC', or the landscape, by the hash of what it
    holds (a CPU device's landscape says so too)."""
    if header.get("synthetic"):
        return TIMES_SYNTHETIC
    what = "CPU device landscape" if is_cpu_device(header) else "landscape"
    return f"{what} sha256:{digest[:16]}" if digest else what


def measured_times(environment: dict | None) -> str:
    """Where a measurer that times kernels itself takes its times: the GPU or the CPU device."""
    return TIMES_CPU_DEVICE if is_cpu_device(environment) else TIMES_GPU


def times_of(measurer) -> str:
    """The `times` of a measurer: its own `times` where it says, else from its environment (a
    replay without a landscape to hash is 'landscape')."""
    times = getattr(measurer, "times", None)
    if isinstance(times, str) and times:
        return times
    env = measurer.environment() or {}
    if env.get("synthetic"):
        return TIMES_SYNTHETIC
    if str(getattr(measurer, "label", "")).startswith("replay"):
        return landscape_times(env, "")
    return measured_times(env)


def is_cpu_device(environment: dict | None) -> bool:
    """Times taken on the CPU device (tuner/measure/device.py), measured or replayed from its landscape."""
    env = environment or {}
    return env.get("device_kind") == "cpu" or is_cpu_device_name(env.get("device"))


def time_source(environment: dict | None, measured_by: str | None) -> str:
    """One line for a run's (or a measurer's) environment and label."""
    env = environment or {}
    how = measured_by or ""
    if env.get("synthetic"):
        return "SYNTHETIC cost model: nothing was measured; these numbers mean nothing about any GPU"
    device = env.get("device") or "an unknown device"
    if is_cpu_device(env):
        what = (f"{CPU_DEVICE}: the GPU's code path run on a CPU in Triton's interpreter ({device}); "
                "wall-clock times that mean nothing about any GPU")
        return what + (", replayed from its landscape" if how.startswith("replay") else "")
    if how.startswith("replay"):
        when = str(env.get("recorded") or "")[:10]
        return f"landscape recorded on {device}" + (f" ({when})" if when else "") + ", replayed"
    if how:
        return f"measured on the GPU ({device})"
    return "unknown source"


def is_synthetic(environment: dict | None) -> bool:
    return bool((environment or {}).get("synthetic"))


def not_a_gpu(environment: dict | None) -> bool:
    """Times that were not measured on a GPU at all (SYNTHETIC or the CPU device)."""
    return is_synthetic(environment) or is_cpu_device(environment)


def is_loud(source_line: str) -> bool:
    """A time_source() or banner() line of times not measured on a GPU."""
    return "SYNTHETIC" in source_line or CPU_DEVICE in source_line


def short_label(environment: dict | None) -> str:
    """A few words to put beside a single time: 'GPU', 'CPU device', 'SYNTHETIC'."""
    if is_synthetic(environment):
        return "SYNTHETIC"
    return "CPU device" if is_cpu_device(environment) else "GPU"


def banner(environment: dict | None, measured_by: str | None) -> str:
    """A line to put above any table of times; loud when synthetic or from the CPU device."""
    text = time_source(environment, measured_by)
    if not_a_gpu(environment):
        return f"*** {text} ***"
    return f"times: {text}"
