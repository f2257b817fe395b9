"""What this GPU really does, measured once, for rooflines (`tuner ceilings` measures it).

A kernel's floor is the larger of (fewest bytes it must move / copy bandwidth) and (its
FLOPs / matmul rate). Datasheet rates overstate both, so bench, drift and the plan use
figures measured on the device when a ceilings file exists for it:
  copy_tb_s     device-to-device copy of a 1 GiB tensor, bytes read plus written
  fp8_tflops    torch._scaled_mm on 8192 x 8192 x 8192 FP8 e4m3 (per-tensor scales), bf16 out
  bf16_tflops   torch.matmul on 8192 x 8192 x 8192 bf16
  l2_bytes, sm_count from the device's properties.
Files live in bench/ceilings/<gpu key>.json (or where --ceilings points). On the CPU device
(tuner/measure/device.py) the same code measures small sizes with the wall clock, for CI; such a file
names the CPU device, goes elsewhere by default, and is never taken for a GPU's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.measure.environment import now_iso, software_versions
from tuner.paths import REPO_ROOT, atomic_write_json, read_json
from tuner.plan.gpus import GpuSpec

CEILINGS_DIR = REPO_ROOT / "bench" / "ceilings"
FORMAT = "tuner-ceilings/1"


@dataclass(frozen=True)
class Ceilings:
    copy_tb_s: float
    fp8_tflops: float
    bf16_tflops: float | None
    source: str                  # "measured on <device> <date>" or "datasheet"

    def floor_us(self, bytes_moved: float, flops: float) -> float:
        """The roofline floor of a kernel in microseconds."""
        return max(bytes_moved / (self.copy_tb_s * 1e6), flops / (self.fp8_tflops * 1e6))


def datasheet(gpu: GpuSpec) -> Ceilings:
    return Ceilings(gpu.hbm_tb_s, gpu.fp8_tflops, None, f"datasheet figures for the {gpu.key}")


def default_path(gpu: GpuSpec, device: str = "cuda") -> Path:
    if device == "cpu":                          # never where a GPU's ceilings are looked for
        return REPO_ROOT / "runs" / f"ceilings-{gpu.key}-cpu-device.json"
    return CEILINGS_DIR / f"{gpu.key}.json"


def read(path: Path) -> dict:
    data = read_json(path, "ceilings file ")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TunerError(f"{path} is not a ceilings file (\"format\": \"{FORMAT}\")")
    for key in ("copy_tb_s", "fp8_tflops", "bf16_tflops"):
        v = data.get(key)
        if v is None and key != "copy_tb_s":
            continue                   # not measurable with that torch: the datasheet's stands in
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or v == float("inf"):
            raise TunerError(f"ceilings file {path}: {key} must be a positive number, got {v!r}")
    return data


def load(gpu: GpuSpec, path: str | Path | None = None, device_name: str | None = None) -> Ceilings:
    """Measured ceilings for this GPU (from `path`, else bench/ceilings/<gpu>.json), else
    the datasheet's, labelled as such. A file measured on another device (the CPU device
    included) than `device_name` (default: the GPU's CUDA name) is refused."""
    file = Path(path) if path else default_path(gpu)
    if not file.is_file():
        if path:
            raise TunerError(f"ceilings file {path} not found")
        return datasheet(gpu)
    data = read(file)
    expected = device_name or gpu.cuda_name
    if data.get("device") and data["device"] != expected:
        raise TunerError(f"ceilings file {file} was measured on {data['device']!r}, not {expected!r}")
    source = f"measured on {data.get('device')} {str(data.get('measured', ''))[:10]}"
    if data.get("fp8_tflops") is None:
        source += " (FP8 rate: datasheet)"
    return Ceilings(float(data["copy_tb_s"]), float(data.get("fp8_tflops") or gpu.fp8_tflops),
                    data.get("bf16_tflops"), source)


def measure(gpu: GpuSpec, size: int | None = None, copy_bytes: int | None = None, reps: int | None = None,
            device: str = "cuda") -> dict:
    """Measure the ceilings on the present GPU (which must be `gpu`), or on the CPU device
    (small sizes, wall clock: a rehearsal of this code, not a GPU's figures)."""
    import torch

    from tuner.measure.device import make_device, require
    from tuner.measure.timing import summarize
    require(device, gpu, "measuring the ceilings", "")
    dev = make_device(device, gpu)
    sizes = dev.ceiling_sizes
    size, copy_bytes, reps = size or sizes["size"], copy_bytes or sizes["copy_bytes"], reps or sizes["reps"]
    props = dev.properties()
    how = ("CUDA graph replays timed with CUDA events" if dev.kind == "cuda"
           else "CPU DEVICE: calls on a CPU timed with the wall clock (not a GPU's figures)")
    out = {"format": FORMAT, "device": dev.name, "device_kind": dev.kind, "measured": now_iso(),
           **software_versions(), **dev.nvml_snapshot(),
           "sm_count": props["sm_count"], "l2_bytes": props["l2_bytes"],
           "method": f"{how} after a warm-up; median of {reps}; random data", "figures": {}}
    on = dev.tensor_device

    def timed(runs) -> dict:
        t = summarize(dev.time_runs(runs, None, reps))
        return {"median_us": t.median_us, "spread": t.spread}

    # Copy: 1 GiB on a GPU, far larger than the L2, so no flush is needed.
    n = copy_bytes // 4
    src = [torch.randn(n, device=on) for _ in range(2)]
    dst = torch.empty(n, device=on)
    t = timed([lambda s=s, d=dst: d.copy_(s) for s in src])
    out["copy_tb_s"] = 2 * copy_bytes / (t["median_us"] * 1e6)
    out["figures"]["copy"] = {**t, "bytes_read_plus_written": 2 * copy_bytes}
    del src, dst              # free 1.5 GiB before the matmuls (the closures are done)

    flops = 2.0 * size ** 3
    a = torch.randn(size, size, device=on, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=on, dtype=torch.bfloat16)
    t = timed([lambda: torch.matmul(a, b)])
    out["bf16_tflops"] = flops / (t["median_us"] * 1e6)
    out["figures"]["bf16_matmul"] = {**t, "shape": [size, size, size]}

    fp8 = torch.float8_e4m3fn
    a8, b8 = a.to(fp8), b.to(fp8).t()                     # _scaled_mm wants B column-major
    one = torch.ones((), device=on)
    try:
        t = timed([lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)])
        out["fp8_tflops"] = flops / (t["median_us"] * 1e6)
        out["figures"]["fp8_matmul"] = {**t, "shape": [size, size, size], "how": "torch._scaled_mm, per-tensor scales"}
    except Exception as e:  # noqa: BLE001 - an older torch without FP8 matmul: say so
        out["fp8_tflops"] = None
        out["figures"]["fp8_matmul"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return out


def write(data: dict, path: Path) -> Path:
    atomic_write_json(path, data, indent=2)
    return path


def summary_lines(data: dict) -> list[str]:
    fp8 = f"{data['fp8_tflops']:.3g} TFLOP/s" if data.get("fp8_tflops") else \
        f"not measured ({data['figures']['fp8_matmul'].get('error')})"
    where = "CPU DEVICE: wall clock on a CPU, not a GPU's figures" if data.get("device_kind") == "cpu" \
        else "measured on the GPU"
    return [f"device {data['device']} (driver {data.get('driver')}, torch {data.get('torch')}, "
            f"triton {data.get('triton')}), {data.get('sm_count')} SMs, L2 {data.get('l2_bytes')} bytes",
            f"copy {data['copy_tb_s']:.3g} TB/s (read + written), BF16 matmul {data['bf16_tflops']:.3g} TFLOP/s, "
            f"FP8 matmul {fp8}  [{where}]"]
