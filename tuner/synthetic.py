"""SYNTHETIC landscapes: timings from a made-up cost model, not from a GPU.

`tuner landscape synth` writes one so that replay, report, diff and drift can be tried
on a machine without a GPU, and the tests use them to exercise the search. The header
carries "synthetic": true, and every command that shows times read from such a file says
so (tuner/provenance.py). The model has the features a search must cope with (wave
quantization, tile waste at small M, pipelining depth, about 3 % of configs failing), so
that search, resume and emission can be tried on a CPU; its numbers mean nothing.
"""

from __future__ import annotations

import hashlib
import math

from tuner.environment import now_iso
from tuner.landscape import FORMAT, LandscapeWriter, Point

FAILURE = "synthetic failure"


def fake_time_us(params: dict, M: int, cfg: dict, sm_count: int = 132) -> float | None:
    """Made-up time of a GEMM, a fused MoE or an MLA decode; None marks a config that
    'fails' (~3 %)."""
    h = int(hashlib.sha256(repr((sorted(params.items()), M, sorted(cfg.items()))).encode()).hexdigest(), 16)
    if h % 97 < 3:
        return None
    if "E" in params:
        return _fake_moe_time_us(params, M, cfg, h)
    if "heads" in params:
        return _fake_mla_time_us(params, M, cfg, h)
    N, K = params["N"], params["K"]
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    waves = math.ceil(tiles / sm_count)
    work_per_tile = bm * bn * K                      # MACs incl. padding waste
    tile_rate = 2e3 * (1.0 + 0.15 * (cfg["num_warps"] == 8) * (bm * bn >= 128 * 128))
    pipeline = 1.0 + 0.6 / cfg["num_stages"] + (0.1 if bk == 64 else 0.0)
    compute = waves * work_per_tile / tile_rate * pipeline / 1e3
    memory = (M * K + N * K * math.ceil(M / bm) ** 0.25 + 2 * M * N) / 4.0e6
    group = 1.0 + 0.02 * abs(math.log2(cfg["GROUP_SIZE_M"]) - 3)
    noise = 1.0 + ((h >> 8) % 1000) / 1000 * 0.04
    return (max(compute, memory) + 2.0) * group * noise


def _fake_moe_time_us(params: dict, M: int, cfg: dict, h: int) -> float:
    E, N, K, topk = params["E"], params["N"], params["K"], params["topk"]
    mats = {"op": 3, "up": 2, "down": 1}[params.get("part", "op")]
    bm, bn = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"]
    touched = E * (1 - (1 - topk / E) ** M)
    rows = M * topk / max(touched, 1)                      # tokens per touched expert
    padded = touched * math.ceil(rows / bm) * bm           # rows computed, padding included
    compute = padded * mats * N * K / 2.5e8 * (1 + 0.5 / cfg["num_stages"]) * (1.1 if bn == 32 else 1.0)
    memory = touched * mats * N * K / 4.0e6 * (1.0 + 0.1 * abs(math.log2(bn / 128)))
    warps = 1.0 + 0.05 * (cfg["num_warps"] == 8) * (bm * bn < 64 * 128)
    noise = 1.0 + ((h >> 8) % 1000) / 1000 * 0.04
    return (max(compute, memory) + 4.0) * warps * noise


def _fake_mla_time_us(params: dict, M: int, cfg: dict, h: int) -> float:
    heads, ctx = params["heads"], params["context"]
    programs = M * math.ceil(heads / cfg["BLOCK_H"]) * cfg["num_kv_splits"]
    occupancy = min(1.0, programs / (2 * 132))              # too few programs: bandwidth idles
    stream = M * ctx * 576 * 2 / 4.0e6 / max(occupancy, 0.05)
    stream *= 1.0 + 0.3 / cfg["num_stages"] + (0.2 if cfg["BLOCK_N"] == 16 else 0.0)
    merge = M * heads * cfg["num_kv_splits"] * 512 * 4 / 4.0e6 * (1.2 if cfg["merge_warps"] == 1 else 1.0)
    noise = 1.0 + ((h >> 8) % 1000) / 1000 * 0.04
    return (stream + merge + 3.0) * (1.1 if cfg["num_warps"] == 2 else 1.0) * noise


def synthetic_header(kernel, device: str, triton: str = "3.6.0", recorded: str | None = None) -> dict:
    """A landscape header that says it is synthetic. `triton` only names the folder SGLang's
    MoE tables replayed from it are written to (triton_<X_Y_Z>); nothing ran under it."""
    from tuner.tune import landscape_source
    return {"format": FORMAT, "kernel": kernel.name, **landscape_source(kernel), "device": device,
            "triton": triton, "torch": "synthetic", "cuda": "synthetic", "driver": "synthetic",
            "recorded": recorded or "2026-11-22T00:00:00+00:00", "synthetic": True,
            "cost_model": "tuner.synthetic.fake_time_us"}


def write_synthetic_landscape(path, kernel, space, gpu, problems: list[dict], batch_sizes: list[int],
                              device: str = "NVIDIA H200", triton: str = "3.6.0",
                              recorded: str | None = None) -> dict:
    """Every config of the pruned grid (and the engines' defaults and seeds) of each problem
    and M, with made-up times; returns counts {"points", "failures"}."""
    w = LandscapeWriter(path, kernel, synthetic_header(kernel, device, triton, recorded))
    points = failures = 0
    try:
        for params in problems:
            for M in batch_sizes:
                seeds = [kernel.default_config(params, M), *kernel.extra_seeds(params, M)]
                grid = space.configs(params, M, gpu) + [space.canonical(params, M, gpu, c) for c in seeds]
                unique = {tuple(sorted(c.items())): c for c in grid}      # a seed may be in the grid
                for cfg in unique.values():
                    t = fake_time_us(params, M, cfg)
                    w.write(params, M, cfg, Point(t, None if t else FAILURE, 0.01 if t else None))
                    points += 1
                    failures += t is None
    finally:
        w.close()
    return {"points": points, "failures": failures}


def synthesize(path, kernel, space, gpu, problems: list[dict], batch_sizes: list[int]) -> dict:
    """`tuner landscape synth`: a synthetic landscape for this GPU, dated now, named for the
    Triton installed here (the folder SGLang's replayed MoE tables go to)."""
    from tuner.environment import software_versions
    return write_synthetic_landscape(path, kernel, space, gpu, problems, batch_sizes, device=gpu.cuda_name,
                                     triton=software_versions()["triton"], recorded=now_iso())
