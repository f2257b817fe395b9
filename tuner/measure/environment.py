"""What a measurement was taken on: device, driver, versions, clocks (for manifests)."""

from __future__ import annotations

import datetime as _dt
import platform


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def installed_version(dist: str) -> str:
    """A distribution's version as installed, without importing it ("" when it is not)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


def software_versions() -> dict:
    import optuna
    import torch
    import triton
    return {"torch": torch.__version__, "triton": triton.__version__, "optuna": optuna.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version()}


def _uuid_key(text) -> str:
    text = text.decode() if isinstance(text, bytes) else str(text)
    return text.lower().replace("-", "").removeprefix("gpu")


def nvml_index(torch_device: int = 0) -> int:
    """NVML numbers GPUs physically, torch after CUDA_VISIBLE_DEVICES: match them by UUID
    (falls back to the torch index)."""
    try:
        import pynvml
        import torch
        want = _uuid_key(torch.cuda.get_device_properties(torch_device).uuid)
        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                if _uuid_key(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) == want:
                    return i
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass
    return torch_device


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
