"""The Hopper GPUs we tune for: the names users type, the names CUDA reports, limits.

Rates here are datasheet figures, used only to print rough floors in a plan; reported
rooflines use ceilings measured on the device (bench/). The L2 size here sizes the L2 flush
only where the device cannot be asked (the CPU device); on a GPU the real one is read off it.
"""

from __future__ import annotations

import re
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


# Names people type for a GPU whose key or CUDA name says it otherwise (compared as _plain() is).
_TYPED = {"h100sxm": "H100", "h100sxm5": "H100", "h10080gb": "H100", "h100hbm3": "H100", "h200sxm": "H200",
          "h800sxm": "H800"}


def _plain(name: str) -> str:
    """A GPU's name as compared: lower case, without "NVIDIA" and without spaces, dashes or dots."""
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", ""))


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by the user's key or its CUDA name, or a name people type for it ("H100 SXM",
    "h200 nvl"): case, spaces, dashes and "NVIDIA" aside; an unknown one gets a did-you-mean."""
    plain = _plain(str(name))
    for spec in GPUS.values():
        if plain in (_plain(spec.key), _plain(spec.cuda_name)) or _TYPED.get(plain) == spec.key:
            return spec
    import difflib
    names = {_plain(g.key): g.key for g in GPUS.values()} | {typed: key for typed, key in _TYPED.items()}
    # the same family letter (a B200 is no misspelt H200)
    close = [c for c in difflib.get_close_matches(plain, list(names), n=3, cutoff=0.7) if c[:1] == plain[:1]][:1]
    hint = f"did you mean {names[close[0]]}? " if close else ""
    raise TunerError(f"unknown GPU {name!r}; {hint}supported: {', '.join(GPUS)}")


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
