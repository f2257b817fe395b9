"""The GEMM spaces of both engines' kernels (configs/spaces/fp8_gemm*.yaml), pruned by what the
first H200 run showed, still hold what can approach the floor at decode sizes: the H200
landscape's best configs, SGLang's split-K up to the K steps with SWAP_AB and narrow N tiles,
for every DeepSeek-V3 TP8 GEMM shape."""

import gzip
import json
from pathlib import Path

import pytest

from tuner.plan.gpus import get_gpu
from tuner.plan.kernel_api import config_from_entry, config_tuple
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.models import gemm_problems, load_model
from tuner.plan.space import load_space

REPO = Path(__file__).resolve().parents[1]
H200 = get_gpu("H200")
LANDSCAPE = REPO / "landscapes" / "NVIDIA_H200" / "fp8_gemm.vllm-deepseek-v3-tp8.jsonl.gz"


def engine_kernel(source):
    return get_kernel("fp8_gemm", source, load_code=False)


def test_vllms_pruned_space_holds_the_h200_landscapes_best_configs():
    kernel = engine_kernel("vllm")
    space = load_space(kernel)
    lines = [json.loads(x) for x in gzip.open(LANDSCAPE, "rt")][1:]
    for M in (1, 16):
        timed = sorted((r["time_us"], config_tuple(kernel, config_from_entry(kernel, r["config"]))) for r in lines
                       if r["M"] == M and r["time_us"])
        params = lines[0]["problem"]
        held = {config_tuple(kernel, c) for c in space.configs(params, M, H200)}
        best = timed[0][0]
        near = [t for v, t in timed if v <= best * 1.05]        # every config within 5 % of the best
        assert near and all(t in held for t in near), M
        # and what the rules drop was never near the best: BLOCK_SIZE_K 64 in 128-wide groups
        dropped = [v for v, t in timed if t not in held and t[0] == 16]
        assert dropped and min(dropped) >= 1.2 * best, M


def test_block_k_is_the_scale_group_so_64_stays_for_64_wide_groups():
    kernel = engine_kernel("sglang")
    space = load_space(kernel)
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 3, "SWAP_AB": 0, "SPLIT_K": 1}
    assert space.rejected_by({"N": 4608, "K": 7168, "block_shape": [128, 128]}, 1, H200, cfg) == "block_k_is_group"
    assert space.rejected_by({"N": 4608, "K": 7168, "block_shape": [64, 64]}, 1, H200, cfg) is None


@pytest.mark.parametrize("source", ["vllm", "sglang"])
def test_every_deepseek_v3_tp8_gemm_shape_has_decode_configs_that_spread_over_the_sms(source):
    # vLLM's launcher takes no split or swap: its space keeps BLOCK_SIZE_M 16 and N tiles from 32
    # (16 was left out: on the CPU device a 16-wide tile runs 8x the programs, and the H200 run
    # never timed one); SGLang's takes both, and a 16-wide N tile
    kernel = engine_kernel(source)
    space = load_space(kernel)
    problems = gemm_problems(load_model("deepseek-v3"), 8)
    assert len(problems) >= 6
    for problem in problems:
        assert any(c["BLOCK_SIZE_M"] == 16 for c in space.configs(problem.params, 1, H200))
        steps = -(-problem.params["K"] // problem.params["block_shape"][1])
        for M in (1, 16, 64, 128):
            configs = list(space.configs(problem.params, M, H200))
            if source == "sglang":
                assert any(c["BLOCK_SIZE_N"] == 16 for c in configs), (problem.key, M)
                splits = {c["SPLIT_K"] for c in configs}
                # split-K up to the K steps (powers of two, as SGLang's launcher asserts), with and without SWAP_AB
                top = max(s for s in (1, 2, 4, 8, 16, 32) if s <= steps)
                assert max(splits) == top, (problem.key, M, splits)
                assert {(c["SWAP_AB"], c["SPLIT_K"]) for c in configs} >= {(0, top), (1, top), (1, 1)}
