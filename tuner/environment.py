"""What a measurement was taken on: device, driver, versions, clocks (for manifests)."""

from __future__ import annotations

import datetime as _dt
import platform


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def software_versions() -> dict:
    import torch
    import triton
    import optuna
    return {"torch": torch.__version__, "triton": triton.__version__, "optuna": optuna.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version()}


def nvml_snapshot(index: int = 0) -> dict:
    """Driver, clocks, temperature and power of one GPU through NVML; {} without one."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        snap = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        }
        try:
            snap["throttle_reasons"] = int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
        except Exception:
            pass
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in snap.items()}
    except Exception:
        return {}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
