"""An analytic estimate of a launch config's time on a Hopper GPU, with no GPU time.

A kernel describes what a config makes the GPU do (`KernelSpec.work`: one `Launch` per kernel
launch, in the spirit of DeepGEMM's heuristics: programs, K steps, bytes and MMA work per step,
pipeline stages, warps, shared memory), and this module turns that into microseconds from the
GPU's datasheet figures alone. Nothing here knows which kernel it is looking at.

Per launch:
  occupancy   programs one SM holds at once: shared memory (per-SM pool over the program's
              buffers), warps (64 a SM) and registers (the fp32 accumulator and the scaled
              step's product per thread plus a fixed overhead, 64K a SM), at most 32
  waves       programs over (SMs x occupancy)
  the K loop  each wave waits one load latency to start and one per stages-1 steps after
              (Little's law), plus the bytes all programs load over the bandwidth their SMs
              can pull, plus the MMA work at the share of the FP8 rate a block-scaled Triton
              loop reaches; these add (at decode sizes a step's rescaling needs both loads)
  the launch  that, times 1.1 for tiles too thin for their warps and 1.5 for spilled
              accumulators, never under the launch's bytes over the copy ceiling or its FLOPs
              over the FP8 rate, plus a fixed launch cost
Split-K is two launches (partials written, then reduced); a MoE is the grouped GEMMs with
their padded blocks per expert (the kernel's `work` counts them).

What it is for: ordering a study's candidates (tuner/search/prior.py), where only the ranks
matter. Its constants are round figures for Hopper's HBM3(e), set by eye (not fitted) while
looking at the first H200 run's data, so the agreement scripts/cost_model_check.py reports on
that data (bench/results/cost-model.md) is in-sample: the next GPU run is its first real test.
"""

from __future__ import annotations

import math

from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import Launch

LOAD_LATENCY_US = 0.55        # a global load's round trip under load on HBM3(e), with its dequantization
COPY_SHARE = 0.89             # a plain copy reaches this share of the datasheet bandwidth (H200: 4.27 of 4.8)
SM_BANDWIDTH_SHARE = 2.0      # one SM can pull this many times its even share of the copy ceiling
LAUNCH_US = 3.0               # a launch's fixed cost in a CUDA graph, with its prologue and epilogue
SMEM_PER_SM = 233472          # 228 KiB of shared memory on an sm_90 SM
WARPS_PER_SM = 64
REGISTERS_PER_SM = 65536
MAX_PROGRAMS_PER_SM = 32
BASE_REGISTERS = 40           # registers a thread holds besides its accumulator
WGMMA_M = 64                  # a warpgroup MMA's M: a narrower tile still pays for 64 rows
# The share of the datasheet FP8 rate a Triton K loop with block scales reaches (each step
# rescales the accumulator on the CUDA cores); set by eye from the H200 MoE studies, where
# BLOCK_SIZE_M 128 took twice the time of 64 at M = 1024 (twice the padded rows)
MMA_SHARE = 0.15
SPILL = 1.5                   # a program whose accumulators do not fit 255 registers a thread spills


def registers(launch: Launch) -> int:
    """Registers a thread wants: the fp32 accumulator and the scaled step's product (both a tile
    over the threads), plus addresses and loop state."""
    return BASE_REGISTERS + 2 * math.ceil(launch.tile_m * launch.tile_n / (launch.warps * 32))


def occupancy(launch: Launch) -> int:
    """Programs of this launch one SM runs at once (0: it does not fit)."""
    by_smem = SMEM_PER_SM // max(launch.smem, 1)
    by_warps = WARPS_PER_SM // launch.warps
    regs = min(255, registers(launch))
    by_regs = REGISTERS_PER_SM // (regs * launch.warps * 32)
    return max(0, min(by_smem, by_warps, by_regs, MAX_PROGRAMS_PER_SM))


def launch_us(launch: Launch, gpu: GpuSpec) -> float:
    """The estimated time of one launch (microseconds); inf where a program cannot fit an SM."""
    per_sm = occupancy(launch)
    if per_sm == 0:
        return math.inf
    copy = gpu.hbm_tb_s * COPY_SHARE * 1e6                          # bytes per microsecond
    waves = math.ceil(launch.programs / (gpu.sm_count * per_sm))
    active_sms = min(gpu.sm_count, launch.programs)
    bandwidth = min(copy, active_sms * SM_BANDWIDTH_SHARE * copy / gpu.sm_count)
    loaded = float(launch.programs) * launch.k_steps * launch.step_bytes
    mma_rows = max(launch.tile_m, WGMMA_M)
    mma = (2.0 * launch.programs * mma_rows * launch.tile_n * launch.tile_k * launch.k_steps
           / (MMA_SHARE * gpu.fp8_tflops * 1e6))
    # each wave's K loop waits one load latency to start, then one per stages-1 steps (no more
    # loads are in flight than steps remain); at decode sizes the wait and the transfer hardly
    # overlap (a step's dequantization needs both of its loads), so they add
    in_flight = max(1, min(launch.stages - 1, launch.k_steps - 1))
    chain = waves * LOAD_LATENCY_US * (1 + (launch.k_steps - 1) / in_flight)
    # a warp needs a few accumulator values to keep its MMA busy: thin tiles over many warps issue idle
    thin = 1.1 if launch.tile_m * launch.tile_n / (launch.warps * 32) < 8 else 1.0
    thin *= SPILL if registers(launch) > 255 else 1.0
    flops = launch.flops or 2.0 * launch.programs * launch.tile_m * launch.tile_n * launch.tile_k * launch.k_steps
    floor = max(launch.hbm_bytes / copy, flops / (gpu.fp8_tflops * 1e6))
    return LAUNCH_US + max(floor, (chain + loaded / bandwidth + mma) * thin)


def estimate_us(work: list[Launch] | tuple[Launch, ...], gpu: GpuSpec) -> float:
    """The estimated time of a config's launches, run one after another."""
    return sum(launch_us(launch, gpu) for launch in work)
