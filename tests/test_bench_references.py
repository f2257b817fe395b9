"""`tuner bench`'s references outside Triton, each variant in the measuring child by a call of
its own (issue 39, item 3; tuner/jobs/bench_references.py): one that aborts its process or
raises costs that contender alone, the next runs in a fresh child and is timed; a reference
that takes M in multiples of 4 (cuBLASLt's block-scaled path, padded as vLLM pads it) says so in
its row. On the CPU device, with stand-in contenders (tests/reference_candidates.py)."""

import pytest
import torch

from tuner.jobs.bench_references import BLOCK_SCALED_M_MULTIPLE, padded_rows, reference_rows
from tuner.measure.isolation import isolated_gpu_measurer
from tuner.plan.kernel_registry import get_kernel
from tuner.plan.problems import Problem

KERNEL = get_kernel("fp8_gemm")
P = Problem("fp8_gemm", {"N": 256, "K": 256, "block_shape": [128, 128]})


def test_a_reference_that_aborts_its_process_costs_that_contender_alone():
    m = isolated_gpu_measurer(KERNEL, "H200", compile_workers=1, device="cpu")
    try:
        rows = reference_rows(KERNEL, P, 1, 1.0, m, candidates="reference_candidates:candidates")
        starts = m.starts
    finally:
        m.close()
    by = {r.contender.split(" (")[0]: r for r in rows}
    assert by["aborts"].time_us is None and "the measuring process was lost" in by["aborts"].error
    assert "SIGABRT" in by["aborts"].error or "abort" in by["aborts"].error.lower()
    assert by["raises"].time_us is None and "CUBLAS_STATUS_NOT_SUPPORTED (a stand-in)" in by["raises"].error
    # timed after the abort, in a fresh child, at M = 1 padded to 4 and said so
    good = by["dequantized"]
    assert good.time_us and good.time_us > 0 and good.error is None
    assert good.contender == "dequantized (float64; M padded 1->4)"
    assert starts == 2                                  # the first child and the one after the abort
    assert by["DeepGEMM"].error == "not importable here"


def test_padding_keeps_the_rows_and_the_scales_column_major_layout():
    As = torch.rand(3, 2).t().contiguous().t()          # column-major, as vLLM builds the activation scales
    p = padded_rows(As, BLOCK_SCALED_M_MULTIPLE)
    assert p.shape == (4, 2) and p.stride(0) == 1 and torch.equal(p[:3], As) and not p[3].any()
    A = torch.rand(1, 8)
    assert padded_rows(A, 4).shape == (4, 8) and torch.equal(padded_rows(A, 4)[:1], A)
    assert padded_rows(torch.rand(4, 8), 4).shape == (4, 8)


@pytest.mark.ci_variables
def test_the_padding_is_the_one_vllms_block_scaled_scaled_mm_kernel_applies():
    """vLLM 0.33's BlockWiseTorchFP8ScaledMMLinearKernel pads M to a multiple of 4 for
    cuBLASLt's block-scaled torch._scaled_mm: read from its wheel."""
    import os
    import zipfile
    from pathlib import Path
    wheels = os.environ.get("TUNER_ENGINE_WHEELS")
    wheel = next(Path(wheels).glob("vllm-0.33.0-*.whl"), None) if wheels else None
    if wheel is None:
        pytest.skip("no vllm 0.33.0 wheel in $TUNER_ENGINE_WHEELS")
    with zipfile.ZipFile(wheel) as z:
        src = z.read("vllm/model_executor/kernels/linear/scaled_mm/pytorch.py").decode()
    body = src.split("class BlockWiseTorchFP8ScaledMMLinearKernel", 1)[1]
    assert f"pad = (-M) % {BLOCK_SCALED_M_MULTIPLE}" in body and "output[:M, :]" in body
