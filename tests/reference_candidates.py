"""Reference contenders for tests/test_bench_references.py, listed in the measuring child as
tuner.jobs.bench_references.gemm_reference_candidates lists the real ones: one that
aborts its process, one that raises, one that computes the block-FP8 GEMM right (in float64,
from M padded to a multiple of 4 and sliced back, as the block-scaled _scaled_mm row is)."""

import os

from tuner.jobs.bench_references import padded_rows


def _dequantized_gemm(i, rows: int):
    A, As = padded_rows(i["A"], rows), padded_rows(i["As"], rows)
    B, Bs = i["B"], i["Bs"]
    bn, bk = i["block_size"]
    K, N = A.shape[1], B.shape[0]
    a = A.double() * As.double().repeat_interleave(bk, 1)[:, :K]
    b = B.double() * Bs.double().repeat_interleave(bn, 0)[:N].repeat_interleave(bk, 1)[:, :K]
    M = i["A"].shape[0]
    return lambda: (a @ b.t())[:M]


def _abort(i):
    os.abort()


def _raise(i):
    def run():
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED (a stand-in)")
    return run


def candidates():
    return [("aborts", "os.abort", _abort, 1), ("raises", "at once", _raise, 1),
            ("dequantized", "float64", lambda i: _dequantized_gemm(i, -(-i["A"].shape[0] // 4) * 4), 4)]


