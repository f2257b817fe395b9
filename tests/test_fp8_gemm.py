"""Numerics of kernels/fp8_gemm.py against a float64 reference (Triton interpreter on CPU)."""

import pytest
import torch

from kernels import fp8_gemm
from kernels.fp8_gemm import (
    block_quant_weight,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_reference,
    w8a8_block_fp8_matmul,
)
from tuner.measure.numerics import relative_error

pytestmark = pytest.mark.triton         # runs Triton kernels (tests/conftest.py)


def cfg(bm, bn, bk, g=1, warps=4, stages=2):
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": g,
            "num_warps": warps, "num_stages": stages}


@pytest.mark.parametrize("M,N,K,config", [
    (1, 256, 256, None),                          # decode: one token, the engines' default config
    (33, 384, 512, cfg(16, 64, 64, g=2)),         # M not a multiple of BLOCK_SIZE_M; 2 K steps per group
    (70, 200, 256, cfg(32, 128, 128, g=1)),       # N not a multiple of the tile nor of the 128 block
    (130, 256, 384, cfg(64, 32, 128, g=4)),       # several M tiles walked in groups
])
def test_gemm_matches_reference(M, N, K, config):
    params = {"N": N, "K": K, "block_shape": [128, 128]}
    inputs = fp8_gemm.make_inputs(params, M, "cpu", seed=M * 7 + N)
    inputs["out"].fill_(float("nan"))           # poisoned: an unwritten element stays NaN
    out = fp8_gemm.run(inputs, config)
    assert out.data_ptr() == inputs["out"].data_ptr()
    assert not torch.isnan(out).any()
    ref = fp8_gemm.reference(inputs)
    assert ref.abs().max() > 0
    assert relative_error(out, ref) < fp8_gemm.KERNEL.tolerance


def test_gemm_tiles_disagree_when_scales_are_wrong():
    # The check has teeth: swapping two weight-block scales must break the result.
    params = {"N": 256, "K": 256, "block_shape": [128, 128]}
    inputs = fp8_gemm.make_inputs(params, 5, "cpu", seed=3)
    ref = fp8_gemm.reference(inputs)
    inputs["Bs"] = inputs["Bs"].flip(0).contiguous()
    out = fp8_gemm.run(inputs, cfg(16, 64, 128))
    assert relative_error(out, ref) > 0.05


def test_block_k_must_divide_group():
    params = {"N": 128, "K": 256, "block_shape": [128, 128]}
    inputs = fp8_gemm.make_inputs(params, 4, "cpu", seed=0)
    with pytest.raises(ValueError, match="BLOCK_SIZE_K"):
        fp8_gemm.run(inputs, cfg(16, 64, 256))


def test_per_token_group_quant_matches_reference():
    torch.manual_seed(0)
    x = (torch.randn(7, 384) * torch.exp(torch.randn(7, 1))).to(torch.bfloat16)
    q, s = per_token_group_quant_fp8(x, 128)
    q_ref, s_ref = per_token_group_quant_fp8_reference(x, 128)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (7, 3)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    assert torch.equal(q.float(), q_ref.float())
    # Dequantized values stay within e4m3's half step (2^-4 relative) of the input.
    deq = q.float().reshape(7, 3, 128) * s[:, :, None]
    err = (deq.reshape(7, 384) - x.float()).abs()
    assert (err <= x.float().abs() * 2 ** -4 + s.repeat_interleave(128, 1) * 2 ** -9).all()


def test_quantized_gemm_end_to_end():
    # bf16 activations through our quantizer and GEMM, against a float64 matmul of the
    # dequantized operands.
    torch.manual_seed(1)
    x = torch.randn(9, 256).to(torch.bfloat16)
    w = torch.randn(192, 256) * 0.02
    A, As = per_token_group_quant_fp8(x, 128)
    B, Bs = block_quant_weight(w, (128, 128))
    out = torch.full((9, 192), float("nan"), dtype=torch.bfloat16)
    w8a8_block_fp8_matmul(A, B, As, Bs, [128, 128], config=cfg(16, 64, 128), out=out)
    ref = fp8_gemm.reference({"A": A, "B": B, "As": As, "Bs": Bs, "block_size": [128, 128]})
    assert relative_error(out, ref) < 1e-2
    # and close to the unquantized product (FP8 costs a few percent)
    assert relative_error(out, x.double() @ w.double().T) < 0.08


def test_flops_and_bytes():
    p = {"N": 7168, "K": 2048, "block_shape": [128, 128]}
    assert fp8_gemm.flops(p, 16) == 2 * 16 * 7168 * 2048
    # the weight dominates at small M: N*K bytes of FP8
    assert 7168 * 2048 < fp8_gemm.bytes_moved(p, 1) < 7168 * 2048 * 1.01
