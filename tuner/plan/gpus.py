"""The Hopper GPUs we tune for: the names users type, the names CUDA reports, limits.

Rates here are datasheet figures, used only to print rough floors in a plan; reported
rooflines use ceilings measured on the device (bench/). The L2 size here sizes the L2 flush
only where the device cannot be asked (the CPU device); on a GPU the real one is read off it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import TunerError


@dataclass(frozen=True)
class GpuSpec:
    key: str                  # what the user types: "H200"
    cuda_name: str            # torch.cuda.get_device_name(): "NVIDIA H200"
    sm_count: int
    max_smem_per_block: int   # bytes a program may ask for (opt-in limit on sm_90)
    l2_bytes: int
    hbm_tb_s: float           # datasheet memory bandwidth
    fp8_tflops: float         # datasheet dense FP8 tensor rate
    memory_gb: float = 80.0   # datasheet HBM capacity (GB): does a model's shard fit?


_HOPPER_SMEM = 232448  # 227 KiB: the sm_90 per-block opt-in shared-memory limit

GPUS: dict[str, GpuSpec] = {
    g.key: g
    for g in [
        GpuSpec("H100", "NVIDIA H100 80GB HBM3", 132, _HOPPER_SMEM, 50 << 20, 3.35, 1979.0),
        GpuSpec("H100-PCIe", "NVIDIA H100 PCIe", 114, _HOPPER_SMEM, 50 << 20, 2.0, 1513.0),
        GpuSpec("H100-NVL", "NVIDIA H100 NVL", 132, _HOPPER_SMEM, 50 << 20, 3.9, 1671.0, memory_gb=94),
        GpuSpec("H200", "NVIDIA H200", 132, _HOPPER_SMEM, 60 << 20, 4.8, 1979.0, memory_gb=141),
        GpuSpec("H200-NVL", "NVIDIA H200 NVL", 132, _HOPPER_SMEM, 60 << 20, 4.8, 1671.0, memory_gb=141),
        GpuSpec("H800", "NVIDIA H800", 132, _HOPPER_SMEM, 50 << 20, 3.35, 1979.0),
        GpuSpec("H20", "NVIDIA H20", 78, _HOPPER_SMEM, 60 << 20, 4.0, 296.0, memory_gb=96),
    ]
}


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by the user's key (case-insensitive) or by its CUDA name."""
    for spec in GPUS.values():
        if name.lower() in (spec.key.lower(), spec.cuda_name.lower()):
            return spec
    raise TunerError(f"unknown GPU {name!r}; supported: {', '.join(GPUS)}")


def resolve_gpu(key: str | None, device: str):
    """The GPU the check runs on: --gpu, else the one present (the CPU device stands in for
    an H100 unless told otherwise)."""
    if key:
        return get_gpu(key)
    if device == "cpu":
        return GPUS["H100"]
    import torch
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    found = next((g for g in GPUS.values() if g.cuda_name == name), None)
    if found is None:
        raise TunerError(f"this machine's GPU {name or '(none)'} is not one of {', '.join(GPUS)}; give --gpu")
    return found
