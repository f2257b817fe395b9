"""SYNTHETIC landscapes: timings from a made-up cost model, not a GPU.

For trying the tool without a GPU (`tuner landscape synth`) and for tests: search, resume,
emission, install and nightly can run on a CPU over them. Headers carry "synthetic": true
and every output that shows their times says SYNTHETIC. The model has the features a
search must cope with (wave quantization, tile waste at small M, pipelining depth, some
failing configs), and its numbers mean nothing about any GPU.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

from tuner.errors import TunerError
from tuner.measure.landscape import LandscapeWriter, Point, landscape_source


def fake_time_us(params: dict, M: int, cfg: dict, sm_count: int = 132) -> float | None:
    """Made-up time of a GEMM or a fused MoE; None marks a config that 'fails' (~3 %)."""
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
    ep = params.get("ep", 1)                               # routed over E * ep experts, E of them here
    mats = {"op": 3, "pair": 3, "up": 2, "down": 1}[params.get("part", "op")]
    bm, bn = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"]
    touched = E * (1 - (1 - topk / (E * ep)) ** M)
    rows = M * topk / ep / max(touched, 1)                 # tokens per touched expert
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


def write_synthetic_landscape(path, kernel, space, gpu, problems: list[dict], batch_sizes: list[int],
                              device: str | None = None, made_for: str | None = None) -> int:
    """The pruned grid (and the seeds) of every problem and M, timed by the cost model;
    returns the number of points written."""
    device = device or gpu.cuda_name
    import triton

    from tuner.plan.kernel_api import config_tuple
    # the running Triton: a replay refuses (or notes) a landscape of another one, as it would a recording
    header = {"format": "tuner-landscape/1", "kernel": kernel.name, **landscape_source(kernel),
              "device": device, "triton": triton.__version__,
              "torch": "synthetic", "cuda": "synthetic", "driver": "synthetic",
              "recorded": "2026-11-22T00:00:00+00:00", "synthetic": True, **({"made_for": made_for} if made_for else {})}
    # written in one go into a temporary file of its own, renamed at the end: a killed run
    # leaves nothing a rerun would continue or merge (LandscapeWriter, resume=False)
    w = LandscapeWriter(path, kernel, header, resume=False)
    written = 0
    try:
        for params in problems:
            for M in batch_sizes:
                seeds = [kernel.default_config(params, M), *kernel.extra_seeds(params, M)]
                grid = space.configs(params, M, gpu) + [space.canonical(params, M, gpu, c) for c in seeds]
                # a seed that is also a grid point is one point, as `landscape info` counts them
                grid = list({config_tuple(kernel, c): c for c in grid}.values())
                for cfg in grid:
                    t = fake_time_us(params, M, cfg)
                    w.write(params, M, cfg, Point(t, None if t else "synthetic failure", 0.01 if t else None))
                    written += 1
        w.close()               # a full disk fails here too: the temporary goes with abandon
    except BaseException:
        w.abandon()
        raise
    return written


def check_replaceable(path: Path, what: str = "--out") -> bool:
    """Whether a new SYNTHETIC landscape may be written at `path`: True when a SYNTHETIC
    landscape is there (this cost model's, made by an earlier run: replaced, so that a command
    runs again as written), False when nothing is; anything else there (a recorded landscape,
    another file, a folder, a link) is refused in one line, never overwritten."""
    if not os.path.lexists(path):
        return False
    from tuner.measure.landscape import read_header
    header: object = None
    if path.is_file() and not path.is_symlink():
        try:
            header = read_header(path)
        except TunerError:
            header = None
    if isinstance(header, dict) and header.get("format") == "tuner-landscape/1" and header.get("synthetic") is True:
        return True
    kind = ("a landscape recorded on a GPU" if isinstance(header, dict) and header.get("format") == "tuner-landscape/1"
            else "a link" if path.is_symlink() else "a folder" if path.is_dir() else "not a SYNTHETIC landscape")
    if kind == "a folder":      # never advise removing a folder (it may be a whole results folder)
        raise TunerError(f"{what} {path} is a folder: give the path of a file, e.g. {path}/synthetic.jsonl.gz")
    raise TunerError(f"{what} {path} exists and is {kind}: only a SYNTHETIC landscape is replaced; "
                     "remove it or give another path")


SYNTHETIC_RUN_LINE = ("*** SYNTHETIC: times from a cost model (tuner/measure/synthetic.py), not a GPU: "
                      "to try the tool, never to install ***")


def landscape_for_run(out: Path, kernel_name: str, source: str, gpu, problems: list, batch_sizes: list[int],
                      space_path: str | None = None, say=print) -> Path:
    """`tuner gemm|moe|mla --synthetic`: the SYNTHETIC landscape of the run's problems and batch
    sizes, written into its results folder (an earlier run's replaced), to replay."""
    from tuner.paths import make_folder
    from tuner.plan.kernel_registry import engine_variant, get_kernel
    from tuner.plan.space import load_space
    params = [p.params for p in problems if source == "ours" or source in p.engines]
    kernel = (get_kernel(kernel_name, source, load_code=False,
                         variant=engine_variant(kernel_name, source, params[0] if params else None))
              if source != "ours" else get_kernel(kernel_name))
    path = out / f"synthetic-{kernel_name}.jsonl.gz"
    check_replaceable(path, "the run's landscape")
    space = load_space(kernel, space_path, params)
    made_for = made_for_digest(kernel, space, gpu, params, sorted(set(batch_sizes)))
    if os.path.lexists(path) and _header_of(path).get("made_for") == made_for:
        # an earlier run's (a window before this one): the same points, so not made again (a window's start-up)
        say(f"replaying {path}, made by an earlier run for the same problems and batch sizes (SYNTHETIC)")
        return path
    make_folder(out)
    n = write_synthetic_landscape(path, kernel, space, gpu, params, sorted(set(batch_sizes)), made_for=made_for)
    say(f"made {path}: {n} SYNTHETIC points ({len(params)} problems x {len(set(batch_sizes))} batch sizes); "
        "replaying it")
    return path


def made_for_digest(kernel, space, gpu, params: list[dict], batch_sizes: list[int]) -> str:
    """What a run's SYNTHETIC landscape is made of: the kernel and its code, the space, the GPU, the problems
    and batch sizes, and this cost model's own code: a landscape made for the same is the same, point for point."""
    import inspect
    import json
    model = inspect.getsource(fake_time_us) + inspect.getsource(_fake_moe_time_us) + inspect.getsource(_fake_mla_time_us)
    what = {"kernel": kernel.name, **landscape_source(kernel), "space": space.version, "device": gpu.cuda_name,
            "problems": params, "batch_sizes": batch_sizes, "model": hashlib.sha256(model.encode()).hexdigest()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _header_of(path: Path) -> dict:
    from tuner.measure.landscape import read_header
    try:
        header = read_header(path)
    except TunerError:
        return {}
    return header if isinstance(header, dict) else {}
