"""Warm starts (issue 32, item 1; tuner/search/warm_start.py, tuner/pipeline/warm_sources.py): seeds
ranked by how close their source is and capped at a share of the budget, every seed measured
again, every source named with its count in the plan and the manifest. Judged on pairs of REAL
landscapes of one kernel recorded on two GPUs (Kernel Tuner's, converted by
scripts/search_benchmark.py) where they are at hand; the command line on SYNTHETIC landscapes of
two Hopper GPUs (a cost model with each GPU's SM count: labelled so, never a GPU figure)."""

import json
import os
import statistics
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.measure.landscape import LandscapeWriter, Point, read_landscape
from tuner.measure.synthetic import fake_time_us
from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_tuple
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.space import load_space
from tuner.search import warm_start as ws

REPO = Path(__file__).resolve().parents[1]
KERNEL = get_kernel("fp8_gemm")
P = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
H200 = get_gpu("H200")


def known(cfg, gpu="NVIDIA H200", params=P, M=16, rank=0, source="s"):
    return ws.Known(cfg, "fp8_gemm", params, M, gpu, source, rank)


def cfg(bm, bn=128, bk=128, g=1, w=4, s=3):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g, "num_warps": w,
            "num_stages": s}


def test_seeds_are_ranked_by_the_closeness_of_their_source_and_capped():
    pool = ws.WarmPool([
        known(cfg(16), gpu="NVIDIA A100-SXM4-80GB"),                       # another GPU, same shape and M
        known(cfg(32), gpu="NVIDIA_H100_80GB_HBM3"),                        # a sibling, as a table names it
        known(cfg(64), params={**P, "N": 4096}),                            # this GPU, a nearby shape
        known(cfg(128)),                                                    # this GPU and shape, this M
        known(cfg(256, bn=64), M=64),                                       # this GPU and shape, another M
        known(cfg(128), gpu="NVIDIA H20", rank=1),                          # the same config again: one seed
        ws.Known(cfg(16, bn=64), "fused_moe", P, 16, "NVIDIA H200", "s", 0),  # another kernel: never
    ])
    seeds = ws.study_seeds(pool, KERNEL, P, 16, H200, budget=24, done={})
    assert [c["BLOCK_SIZE_M"] for _, c in seeds] == [128, 256, 64, 32, 16]
    assert all(label == "warm:s" for label, _ in seeds)
    # at most WARM_SHARE of the budget
    assert len(ws.study_seeds(pool, KERNEL, P, 16, H200, budget=8, done={})) == ws.cap(8) == 2
    # the batch sizes this run finished seed too, nearest M first, as neighbours
    done = {8: {(16, 64, 128, 1, 4, 3): 5.0, (32, 64, 128, 1, 4, 3): 4.0}}
    near = ws.study_seeds(None, KERNEL, P, 16, H200, budget=24, done=done)
    assert near == [("neighbour", cfg(32, bn=64)), ("neighbour", cfg(16, bn=64))]
    # ...outside the warm cap, which the other sources fill as before
    both = ws.study_seeds(pool, KERNEL, P, 16, H200, budget=8, done=done)
    assert [lb for lb, _ in both] == ["neighbour", "neighbour", "warm:s", "warm:s"]
    assert ws.gpu_tier("NVIDIA_H200", H200) == 0 and ws.gpu_tier("NVIDIA H800", H200) == 1
    assert ws.gpu_tier("NVIDIA GeForce RTX 3090", H200) == 2


def test_the_random_start_shrinks_when_seeds_exist():
    assert ws.startup(8, 0) == 8 and ws.startup(8, 3) == 5 and ws.startup(8, 12) == ws.STARTUP_WITH_SEEDS


def _landscape(path, device, sm_count, ms):
    """A SYNTHETIC landscape: the cost model timed with `sm_count` SMs (H20: 78, H200: 132),
    so the two GPUs rank configs alike but not the same."""
    space = load_space(KERNEL)
    header = {"format": "tuner-landscape/1", "kernel": KERNEL.name, "code_version": KERNEL.code_version,
              "device": device, "triton": __import__("triton").__version__, "torch": "synthetic",
              "recorded": "2026-11-22T00:00:00+00:00", "synthetic": True}
    w = LandscapeWriter(path, KERNEL, header, resume=False)
    for M in ms:
        grid = {config_tuple(KERNEL, c): c for c in space.configs(P, M, get_gpu("H200"))}
        grid[config_tuple(KERNEL, KERNEL.default_config(P, M))] = KERNEL.default_config(P, M)
        for c in grid.values():
            t = fake_time_us(P, M, c, sm_count=sm_count)
            w.write(P, M, c, Point(t, None if t else "synthetic failure", 0.01 if t else None))
    w.close()
    return path


def _ratio(out: Path, land, ms) -> list[float]:
    manifest = json.loads((out / "manifest.json").read_text())
    table = next(t for t in manifest["tables"] if t["problem"] == P)
    best = {M: land.best(P, M)[1] for M in ms}
    journal_best = []
    for M in ms:
        e = table["entries"][str(M)]
        journal_best.append(e["time_us"] / best[M])
    return journal_best


def test_a_run_seeded_with_another_gpus_results_reaches_near_best_where_a_cold_run_does_not(tmp_path, capsys):
    # batch sizes where the H20's best configs are within 2% on the H200 (at M=64 they are 11% off
    # since the GEMM space holds BLOCK_SIZE_N 16: no warm start can carry across there)
    ms = [16, 128, 256]
    source = _landscape(tmp_path / "h20.jsonl", "NVIDIA H20", 78, ms)
    target = _landscape(tmp_path / "h200.jsonl", "NVIDIA H200", 132, ms)
    # (--per-rank: DeepSeek-V3 at TP8 does not leave an H20 room for its KV cache; one rank's shapes on purpose)
    args = ["gemm", "--model", "deepseek-v3", "--tp", "8", "--per-rank", "--only", "N=7168,K=2048", "--batch-sizes",
            *map(str, ms), "--kernel-source", "ours", "--quiet", "--no-warm-start"]
    # the source measures its whole budget (--patience 48): the warm start reads all it measured, not its winners
    assert main([*args, "--gpu", "H20", "--replay", str(source), "--trials", "48", "--patience", "48",
                 "--out", str(tmp_path / "h20")]) == 0
    land = read_landscape(target, KERNEL)
    # both measure their 8 (--patience 8): the two are compared at equal trials, not at where each stopped
    budget = ["--gpu", "H200", "--replay", str(target), "--trials", "8", "--patience", "8"]
    assert main([*args, *budget, "--out", str(tmp_path / "cold")]) == 0
    assert main([*args, *budget, "--out", str(tmp_path / "warm"), "--warm-start", str(tmp_path / "h20")]) == 0
    cold, warm = _ratio(tmp_path / "cold", land, ms), _ratio(tmp_path / "warm", land, ms)
    # warm: within 3 % of the H200's best at every M in 8 trials; cold: not at every M
    assert max(warm) <= 1.03 < max(cold), (warm, cold)
    manifest = json.loads((tmp_path / "warm" / "manifest.json").read_text())
    # the manifest names the source and how many seeds it gave; each study says what it took
    src = manifest["warm_start"]["sources"]
    assert [s["source"] for s in src] == [str(tmp_path / "h20")] and src[0]["kind"] == "results folder"
    assert src[0]["configs"] >= 3 * 10 and src[0]["seeds"] >= 3
    per_study = [e["search"].get("seeds", {}) for e in manifest["tables"][0]["entries"].values()]
    assert all(0 < s.get(str(tmp_path / "h20"), 0) <= ws.cap(8) for s in per_study)
    assert sum(s.get(str(tmp_path / "h20"), 0) for s in per_study) == src[0]["seeds"]
    # every seed was measured again on this GPU: the table's times are the H200 landscape's
    table = manifest["tables"][0]
    for M in ms:
        e = table["entries"][str(M)]
        assert e["time_us"] == land.lookup(P, M)[config_tuple(KERNEL, e["config"])].time_us
    # the plan names the source too
    capsys.readouterr()
    assert main([*args, *budget, "--out", str(tmp_path / "plan"), "--warm-start", str(tmp_path / "h20"),
                 "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert f"warm start from {tmp_path / 'h20'} (results folder):" in plan and "at most 25% of its budget" in plan


def test_a_folder_of_shipped_tables_seeds_from_the_nearest_shapes(tmp_path, shared_dir, capsys):
    """The engines' shipped tables (../shared/baselines: vLLM 0.33.0's) as --warm-start: the H200
    and H100 tables of DeepSeek-V3's GEMM shapes."""
    land = _landscape(tmp_path / "h200.jsonl", "NVIDIA H200", 132, [16])
    args = ["gemm", "--model", "deepseek-v3", "--tp", "8", "--only", "N=7168,K=2048", "--batch-sizes", "16",
            "--kernel-source", "ours", "--quiet", "--no-warm-start", "--gpu", "H200", "--replay", str(land),
            "--trials", "8", "--out", str(tmp_path / "out"),
            "--warm-start", str(shared_dir / "baselines" / "vllm-0.33.0" / "fp8_gemm")]
    assert main(args) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    (src,) = manifest["warm_start"]["sources"]
    # the closest are the H200 tables of the shape itself; of those this landscape (the pruned grid
    # at M=16) holds only what the pruning keeps, and a replay measures nothing else
    assert src["kind"] == "tables" and src["configs"] > 50 and 1 <= src["seeds"] <= ws.cap(8)
    assert manifest["tables"][0]["entries"]["16"]["search"]["seeds"] == {src["source"]: src["seeds"]}


@pytest.mark.ci_variables
@pytest.mark.skipif(not os.environ.get("TUNER_ENGINE_WHEELS"), reason="TUNER_ENGINE_WHEELS is not set (.ci/run "
                    "downloads the engines' wheels): the engine's shipped tables are read from its wheel")
def test_by_default_the_engines_shipped_tables_seed_the_study(capsys):
    """Without --warm-start a GPU run seeds from the engine's own shipped tables (its wheel here,
    as `tuner audit` finds it): this shape's table on this GPU first, then siblings', then the
    nearest shapes'."""
    from tuner.pipeline.warm_sources import build_pool
    from tuner.plan.models import gemm_problems, load_model
    args = ["gemm", "--model", "deepseek-v3", "--tp", "8", "--only", "N=7168,K=2048", "--batch-sizes", "16",
            "--gpu", "H200", "--engines", "vllm", "--dry-run"]
    assert main(args) == 0
    plan = capsys.readouterr().out
    assert "warm start from vllm 0.33.0 shipped tables (wheel " in plan
    assert main([*args, "--no-warm-start"]) == 0
    assert "warm start: none" in capsys.readouterr().out
    problems = [p for p in gemm_problems(load_model("deepseek-v3"), 8, 1) if p.key.startswith("N=7168,K=2048,")]
    pool = build_pool(KERNEL, problems, H200, None, True, ["vllm"], None)
    (src,) = pool.sources
    assert src["kind"] == "engine's shipped tables" and src["configs"] > 0
    assert {k.gpu for k in pool.known} <= {"NVIDIA_H100_80GB_HBM3", "NVIDIA_H200", "NVIDIA_H20", "NVIDIA_H800",
                                           "NVIDIA_H100_NVL", "NVIDIA_H100_PCIe", "NVIDIA_H200_NVL"}
    seeds = ws.study_seeds(pool, KERNEL, P, 16, H200, budget=48, done={})
    assert len(seeds) == ws.cap(48) and all(lb == "warm:vllm 0.33.0 shipped" for lb, _ in seeds)
    rows = ws.installed_rows(pool, "fp8_gemm", P, H200, "vllm")
    if rows:          # vLLM ships this shape's H200 table: its row at M=16 is the first seed and the incumbent
        from tuner.plan.engines import lookup_nearest
        assert seeds[0][1] == {**lookup_nearest(rows, 16)}


# -- on REAL landscapes: one kernel recorded by Kernel Tuner on two GPUs ---------------------------------
REAL = [Path(os.environ["TUNER_REAL_LANDSCAPES"])] if os.environ.get("TUNER_REAL_LANDSCAPES") else []
REAL += [REPO / "real-landscapes", REPO.parent / "shared" / "landscapes" / "real"]


def _real(name):
    for d in REAL:
        if (d / f"{name}.jsonl.gz").is_file():
            return d / f"{name}.jsonl.gz"
    pytest.skip(f"the real landscape {name} is not converted here (scripts/search_benchmark.py convert --only "
                f"{name}: its origin is a GitHub repository, which CI does not reach)")


@pytest.mark.ci_variables
def test_on_real_landscapes_a_warm_start_from_another_gpu_beats_a_cold_start():
    from tuner.measure.landscape import read_header
    from tuner.measure.landscape_kernel import landscape_gpu, landscape_kernel, landscape_space
    from tuner.search.offline import warm_traces
    target_path, source_path = _real("xgemm-rtx2080ti-6p"), _real("xgemm-rtx3090-6p")
    header = read_header(target_path)
    kernel = landscape_kernel(header)
    target = read_landscape(target_path, kernel)
    source = read_landscape(source_path, landscape_kernel(read_header(source_path)))
    source.kernel = kernel                     # one kernel on two GPUs: the landscapes name it by file
    space, gpu = landscape_space(kernel, header), landscape_gpu(header)
    cold = warm_traces(target, source, space, gpu, range(6), 12, None)
    warm = warm_traces(target, source, space, gpu, range(6), 12, ws.WARM_SHARE)
    c, w = statistics.fmean(t.ratio_at(12) for t in cold), statistics.fmean(t.ratio_at(12) for t in warm)
    # measured (6 seeds, 12 trials): warm 1.053, cold 1.112; bench/results/search/warm-start.md has 20
    # seeds at 24 and 48 trials on every pair
    assert w < c - 0.03, (w, c)
