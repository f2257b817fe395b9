"""What this GPU really does, measured once, for rooflines (`tuner ceilings` measures it).

A kernel's floor is the larger of (fewest bytes it must move / copy bandwidth) and (its
FLOPs / matmul rate). Datasheet rates overstate both, so bench, drift and the plan use
figures measured on the device when a ceilings file exists for it:
  copy_tb_s     device-to-device copy, bytes read plus written: the best of 256 MiB, 1 GiB and
                2 GiB x copy_ (graph-replayed, launched) and an elementwise kernel, after the
                clocks are warmed (tuner/measure/ceiling_checks.py: a figure under 70% of the
                datasheet is measured again, then marked suspect, and `load` uses the datasheet's)
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
    datasheet_copy_tb_s: float | None = None      # what no kernel can beat (tuner/measure/roofline.py)
    datasheet_fp8_tflops: float | None = None

    def floor_us(self, bytes_moved: float, flops: float) -> float:
        """The roofline floor of a kernel in microseconds."""
        return max(bytes_moved / (self.copy_tb_s * 1e6), flops / (self.fp8_tflops * 1e6))


def datasheet(gpu: GpuSpec) -> Ceilings:
    return Ceilings(gpu.hbm_tb_s, gpu.fp8_tflops, None, f"datasheet figures for the {gpu.key}",
                    gpu.hbm_tb_s, gpu.fp8_tflops)


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
    suspect = suspect_figures(data, gpu)
    copy = float(data["copy_tb_s"])
    fp8 = float(data.get("fp8_tflops") or gpu.fp8_tflops)
    if data.get("fp8_tflops") is None:
        source += " (FP8 rate: datasheet)"
    if "copy_tb_s" in suspect:
        source += f" (copy: the datasheet's {gpu.hbm_tb_s:g} TB/s, the measured {copy:.3g} is suspect)"
        copy = gpu.hbm_tb_s
    if "fp8_tflops" in suspect:
        source += f" (FP8 rate: the datasheet's {gpu.fp8_tflops:g} TFLOP/s, the measured {fp8:.3g} is suspect)"
        fp8 = gpu.fp8_tflops
    return Ceilings(copy, fp8, data.get("bf16_tflops"), source, gpu.hbm_tb_s, gpu.fp8_tflops)


def suspect_figures(data: dict, gpu: GpuSpec) -> dict[str, str]:
    """The figures of a ceilings file not to be used: those it marks suspect, and on a GPU
    (not the CPU device) a copy under 70% of the datasheet, whether or not the file was checked
    when measured (files from before the check: the first H200 run's 2.72 TB/s copy)."""
    from tuner.measure.ceiling_checks import SUSPECT_BELOW
    out = {k: str(v) for k, v in (data.get("suspect") or {}).items()} if isinstance(data.get("suspect"), dict) else {}
    if data.get("device_kind", "cuda") != "cuda":
        return out
    for key, sheet, unit in (("copy_tb_s", gpu.hbm_tb_s, "TB/s"),):  # FP8: 65-75% of the datasheet is normal
        v = data.get(key)
        if key not in out and isinstance(v, (int, float)) and v < SUSPECT_BELOW * sheet:
            out[key] = (f"{v:.3g} {unit} is {v / sheet:.0%} of the datasheet's {sheet:g} {unit} "
                        f"(under {SUSPECT_BELOW:.0%})")
    return out


def measure(gpu: GpuSpec, size: int | None = None, copy_bytes: list[int] | None = None, reps: int | None = None,
            device: str = "cuda") -> dict:
    """Measure the ceilings on the present GPU (which must be `gpu`), or on the CPU device
    (small sizes, wall clock: a rehearsal of this code, not a GPU's figures): each after the
    clocks are warmed, the copy as the best of several sizes and methods, the clocks read while
    timed, a figure under 70% of the datasheet measured again and then marked suspect
    (tuner/measure/ceiling_checks.py)."""
    import torch

    from tuner.measure.ceiling_checks import best_copy, checked
    from tuner.measure.device import make_device, require
    from tuner.measure.timing import summarize
    require(device, gpu, "measuring the ceilings", "")
    dev = make_device(device, gpu)
    sizes: dict = dev.ceiling_sizes
    size = int(size or sizes["size"])
    reps = int(reps or sizes["reps"])
    copy_bytes = list(copy_bytes or sizes["copy_bytes"])
    props = dev.properties()
    how = ("CUDA events (CUDA graph replays unless said)" if dev.kind == "cuda"
           else "CPU DEVICE: calls on a CPU timed with the wall clock (not a GPU's figures)")
    compare = dev.compares_with_datasheet
    out = {"format": FORMAT, "device": dev.name, "device_kind": dev.kind, "measured": now_iso(),
           **software_versions(), **dev.nvml_snapshot(),
           "sm_count": props["sm_count"], "l2_bytes": props["l2_bytes"],
           "method": f"{how}, after warming the clocks; median of {reps}; random data; the copy: the best of "
                     f"{len(copy_bytes)} sizes x 3 methods", "figures": {}, "suspect": {}}
    on = dev.tensor_device

    def timed(runs) -> dict:
        t = summarize(dev.time_runs(runs, None, reps))
        return {"median_us": t.median_us, "spread": t.spread}

    # Copy: up to 2 GiB on a GPU, far larger than the L2, so no flush is needed.
    copy = checked("copy", lambda: best_copy(dev, torch, copy_bytes, reps), gpu.hbm_tb_s if compare else None,
                   dev, "TB/s")
    out["copy_tb_s"] = copy["value"]
    out["figures"]["copy"] = copy
    if copy.get("suspect"):
        out["suspect"]["copy_tb_s"] = copy["suspect"]
    dev.empty_cache()

    flops = 2.0 * size ** 3
    a = torch.randn(size, size, device=on, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=on, dtype=torch.bfloat16)
    t = timed([lambda: torch.matmul(a, b)])
    out["bf16_tflops"] = flops / (t["median_us"] * 1e6)
    out["figures"]["bf16_matmul"] = {**t, "shape": [size, size, size]}

    fp8 = torch.float8_e4m3fn
    a8, b8 = a.to(fp8), b.to(fp8).t()                     # _scaled_mm wants B column-major
    one = torch.ones((), device=on)

    def fp8_rate() -> dict:
        t = timed([lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)])
        return {"value": flops / (t["median_us"] * 1e6), **t}
    try:
        # not checked against the datasheet: a dense FP8 matmul reaches 65-75% of it on a healthy GPU
        f = checked("FP8 matmul", fp8_rate, None, dev, "TFLOP/s")
        out["fp8_tflops"] = f["value"]
        out["figures"]["fp8_matmul"] = {**f, "shape": [size, size, size], "how": "torch._scaled_mm, per-tensor scales"}
    except Exception as e:  # noqa: BLE001 - an older torch without FP8 matmul: say so
        out["fp8_tflops"] = None
        out["figures"]["fp8_matmul"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return out


def write(data: dict, path: Path) -> Path:
    from tuner.file_kinds import CEILINGS
    atomic_write_json(path, data, indent=2, kind=CEILINGS)      # only a ceilings file is replaced
    return path


def summary_lines(data: dict) -> list[str]:
    fp8 = f"{data['fp8_tflops']:.3g} TFLOP/s" if data.get("fp8_tflops") else \
        f"not measured ({data['figures']['fp8_matmul'].get('error')})"
    where = "CPU DEVICE: wall clock on a CPU, not a GPU's figures" if data.get("device_kind") == "cpu" \
        else "measured on the GPU"
    lines = [f"device {data['device']} (driver {data.get('driver')}, torch {data.get('torch')}, "
             f"triton {data.get('triton')}), {data.get('sm_count')} SMs, L2 {data.get('l2_bytes')} bytes",
             f"copy {data['copy_tb_s']:.3g} TB/s (read + written), BF16 matmul {data['bf16_tflops']:.3g} TFLOP/s, "
             f"FP8 matmul {fp8}  [{where}]"]
    best = (data.get("figures", {}).get("copy") or {}).get("best")
    if isinstance(best, dict):
        clocks = best.get("sm_clock_mhz")
        lines.append(f"copy: best of {len(data['figures']['copy'].get('trials', []))} trials: {best.get('method')}, "
                     f"{best.get('bytes', 0) / 2**20:.0f} MiB"
                     + (f", SM clock {clocks['min']}-{clocks['max']} MHz while timed" if isinstance(clocks, dict) else ""))
    for key, why in (data.get("suspect") or {}).items():
        lines.append(f"SUSPECT {key}: {why}; bench, drift and the plan use the datasheet's figure instead")
    return lines
