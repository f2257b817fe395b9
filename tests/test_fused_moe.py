"""Numerics of kernels/fused_moe.py against a float64 reference (Triton interpreter on CPU)."""

import pytest
import torch

from kernels import fused_moe as fm
from kernels import fused_moe_inputs as fmi
from tuner.measure.numerics import relative_error

pytestmark = pytest.mark.triton         # runs Triton kernels (tests/conftest.py)

PRECISIONS = [("bf16", None), ("fp8_w8a8", [128, 128]), ("fp8_w8a8", None)]


def cfg(bm=16, bn=64, bk=64, g=1):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
            "num_warps": 4, "num_stages": 2}


def params(dtype, block_shape, part="op", topk=2, E=8, N=128, K=256, routing="uniform"):
    return {"E": E, "N": N, "K": K, "topk": topk, "dtype": dtype, "block_shape": block_shape,
            "part": part, "routing": routing}


def check(p, M, config, seed):
    inputs = fmi.make_inputs(p, M, "cpu", seed)
    inputs["out"].fill_(float("nan"))
    out = fm.run(inputs, config)
    assert not torch.isnan(out).any(), "an output element was never written"
    ref = fmi.reference(inputs)
    assert ref.abs().max() > 0
    err = relative_error(out, ref)
    assert err < fm.KERNEL.tolerance, err
    return inputs, out


@pytest.mark.parametrize("dtype,block_shape", PRECISIONS)
@pytest.mark.parametrize("M,topk,config", [
    (1, 1, cfg()),                     # one token, one expert: 7 of 8 experts skipped
    (5, 3, cfg(16, 32, 128, g=2)),     # runs shorter than BLOCK_SIZE_M are padded
    (40, 2, cfg(32, 128, 64, g=1)),    # several blocks per expert; N tile wider than K/N edge
])
def test_whole_layer(dtype, block_shape, M, topk, config):
    check(params(dtype, block_shape, "op", topk), M, config, seed=M + topk)


@pytest.mark.parametrize("dtype,block_shape", PRECISIONS)
@pytest.mark.parametrize("part", ["up", "down"])
def test_each_projection(dtype, block_shape, part):
    check(params(dtype, block_shape, part, topk=2), 9, cfg(16, 64, 64), seed=11)


def test_skewed_routing_and_default_config():
    p = params("fp8_w8a8", [128, 128], "op", topk=2, routing="zipf")
    inputs, _ = check(p, 24, None, seed=5)
    counts = torch.bincount(inputs["topk_ids"].flatten().long(), minlength=8)
    assert counts.max() > 2 * counts.float().mean()       # zipf: a few experts take most tokens


def test_public_api_and_down_config():
    p = params("fp8_w8a8", [128, 128], "op", topk=2)
    inp = fmi.make_inputs(p, 6, "cpu", 3)
    args = (inp["x"], inp["w1"], inp["w2"], inp["topk_weights"], inp["topk_ids"])
    kw = dict(use_fp8_w8a8=True, w1_scale=inp["w1_scale"], w2_scale=inp["w2_scale"], block_shape=[128, 128])
    one = fm.fused_moe(*args, **kw, config=cfg(16, 64, 128))
    two = fm.fused_moe(*args, **kw, config=cfg(16, 64, 128), down_config=cfg(16, 128, 64, g=4))
    ref = fmi.reference(inp)
    for out in (one, two):
        assert out.shape == (6, 256) and out.dtype == torch.bfloat16
        assert relative_error(out, ref) < fm.KERNEL.tolerance
    with pytest.raises(ValueError, match="same BLOCK_SIZE_M"):
        fm.fused_moe(*args, **kw, config=cfg(16), down_config=cfg(32))
    with pytest.raises(ValueError, match="BLOCK_SIZE_K"):
        fm.fused_moe(*args, **kw, config=cfg(16, 64, 256))


def test_alignment_groups_and_pads_by_expert():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [5, 3]], dtype=torch.int32)
    sorted_ids, expert_ids, num_rows = fm.moe_align_block_size(ids, 4, 8)
    n = ids.numel()
    used = int(num_rows)
    # experts 0 (2 pairs), 1 (1), 3 (4), 5 (1): each padded to 4 rows -> 16
    assert used == 16 and sorted_ids.shape[0] >= used
    blocks = sorted_ids[:used].view(-1, 4)
    assert expert_ids[: used // 4].tolist() == [0, 1, 3, 5]
    flat = ids.flatten()
    for b, e in zip(blocks, expert_ids[: used // 4].tolist()):
        real = b[b < n]
        assert (flat[real.long()] == e).all()          # every real row belongs to the block's expert
    assert sorted(sorted_ids[sorted_ids < n].tolist()) == list(range(n))   # each pair once
    assert (sorted_ids[used:] == n).all()


def test_flops_and_bytes_count_touched_experts():
    p = params("fp8_w8a8", [128, 128], "op", topk=8, E=256, N=256, K=7168)
    one = fm.bytes_moved(p, 1)
    assert 8 * 3 * 256 * 7168 <= one < 8 * 3 * 256 * 7168 * 1.01   # M=1 reads 8 experts
    assert fm.bytes_moved(p, 4096) > 250 * 3 * 256 * 7168           # M=4096 touches almost all 256
    assert fm.flops(p, 2) == 2 * 2 * 8 * 3 * 256 * 7168
