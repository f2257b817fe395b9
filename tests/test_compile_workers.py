"""Compile workers build what the timed run looks up, without real-size tensors.

The compile worker of the CPU device is the real one (tuner.measure.device.init_compile_worker, in a
ProcessPoolExecutor as the measuring child makes it): kernels compiled, not interpreted, for
sm_90. In it each kernel's compile_only launch and its real run on real (small) inputs are
taken apart by Triton's jit cache hook, which gives the cache key of every launch and skips
the build: the keys must match, for ours and the engines' kernels, in every launch variant
(swap-AB, the small-batch path, TMA, split-K, MLA's two stages).
"""

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest
import torch

from kernels.engines.base import phantom
from tuner.measure.device import init_compile_worker
from tuner.plan.kernel_registry import get_kernel

pytestmark = pytest.mark.triton         # runs Triton kernels (tests/conftest.py)

SMALL_MOE = {"E": 8, "N": 256, "K": 256, "topk": 2, "dtype": "fp8_w8a8", "block_shape": [128, 128],
             "routing": "uniform"}
GEMM = {"N": 256, "K": 256, "block_shape": [128, 128]}
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}


@pytest.fixture(scope="module")
def worker():
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=init_compile_worker,
                             initargs=("cpu",)) as pool:
        yield pool


def keys(pool, kernel, params, M, config):
    from compile_keys import launch_keys
    compiled, ran = pool.submit(launch_keys, kernel.ref, params, M, config).result(timeout=120)
    return compiled, ran


def engine(name, source):
    wheels = os.environ.get("TUNER_ENGINE_WHEELS")
    if not wheels:
        pytest.skip("needs the engines' wheels (TUNER_ENGINE_WHEELS; .ci/run provides them)")
    from tuner.plan.kernel_registry import kernel_for
    return kernel_for(name, source, source, [wheels])


CASES = [
    ("ours", "fp8_gemm", GEMM, 16, CFG),
    ("ours", "fp8_gemm", GEMM, 1, {**CFG, "BLOCK_SIZE_N": 128, "num_stages": 4}),
    ("ours", "fused_moe", {**SMALL_MOE, "part": "op"}, 16, CFG),
    ("ours", "fused_moe", {**SMALL_MOE, "part": "down"}, 1, CFG),
    ("ours", "mla_decode", {"heads": 16, "kv_lora_rank": 512, "qk_rope_dim": 64, "page_size": 16, "context": 64}, 2,
     {"BLOCK_N": 16, "BLOCK_H": 16, "num_kv_splits": 2, "num_warps": 4, "num_stages": 2, "merge_warps": 4}),
    ("vllm", "fused_moe", {**SMALL_MOE, "part": "op"}, 1, CFG),                  # no alignment (M*topk*4 <= E)
    ("vllm", "fused_moe", {**SMALL_MOE, "part": "op"}, 16, CFG),                 # swap-AB on sm_90
    ("vllm", "fused_moe", {**SMALL_MOE, "part": "op"}, 16, {**CFG, "BLOCK_SIZE_M": 64}),
    ("vllm", "fp8_gemm", GEMM, 16, CFG),
    ("sglang", "fused_moe", {**SMALL_MOE, "part": "up"}, 16, {**CFG, "USE_TMA": 0}),
    ("sglang", "fused_moe", {**SMALL_MOE, "part": "up"}, 16, {**CFG, "BLOCK_SIZE_M": 64, "USE_TMA": 1}),
    ("sglang", "fused_moe", {**SMALL_MOE, "part": "down"}, 16, {**CFG, "BLOCK_SIZE_M": 64, "USE_TMA": 1}),
    ("sglang", "fp8_gemm", GEMM, 16, {**CFG, "SWAP_AB": 1, "SPLIT_K": 2}),
]


@pytest.mark.parametrize("source,name,params,M,config", [
    pytest.param(*c, marks=() if c[0] == "ours" else pytest.mark.ci_variables) for c in CASES],
                         ids=[f"{c[0]}-{c[1]}-{c[2].get('part', '')}-M{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_a_compile_workers_build_has_the_timed_runs_cache_key(worker, source, name, params, M, config):
    kernel = get_kernel(name) if source == "ours" else engine(name, source)
    compiled, ran = keys(worker, kernel, params, M, config)
    assert compiled, "compile_only launched nothing"
    # every launch it builds is one the run makes (the run also quantizes its activations)
    missing = [k for k in compiled if k not in ran]
    assert not missing, f"compiled under keys the run never looks up: {missing}"
    # and the run's launches of the same kernels are all among them
    names = {n for n, _ in compiled}
    assert sorted(k for k in ran if k[0] in names) == compiled


def test_compile_tensors_own_no_memory():
    """A compile worker builds an engine's launch on meta tensors: no storage, so neither the
    bounds check that sank the old few-byte views nor gigabytes per worker (MLA at 128 x 32K)."""
    w = phantom((256, 512, 7168), torch.float8_e4m3fn)
    assert w.shape == (256, 512, 7168) and w.is_meta and w.data_ptr() % 16 == 0
    from tuner.plan.kernel_api import COMPILE_DEVICE
    assert COMPILE_DEVICE == "meta"
