"""What the CPU device's kernels cost in Triton's interpreter, without changing what they compute
(kernels/interpreter_fixes.py fast_interpreter): a jit function called inside a launch does not
patch the language again, tl.dot multiplies contiguous operands (BLAS, not numpy's strided
loop), numpy's BLAS runs on one thread; and a config timed again on the same inputs is not
warmed up again (tuner/measure/device.py CpuDevice.time_runs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import kernels.interpreter_fixes as fixes
from tuner.measure.device import CpuDevice
from tuner.plan.gpus import get_gpu

pytestmark = pytest.mark.triton


@triton.jit
def _scaled(x, s):
    return x * s


@triton.jit
def _nested(x_ptr, y_ptr, N: tl.constexpr, CALLS: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(CALLS):
        x = _scaled(x, 2.0)
    tl.store(y_ptr + offs, x)


@triton.jit
def _qk(q_ptr, k_ptr, o_ptr, H: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    h, n, d = tl.arange(0, H), tl.arange(0, N), tl.arange(0, D)
    q = tl.load(q_ptr + h[:, None] * D + d[None, :])
    k = tl.load(k_ptr + n[:, None] * D + d[None, :])
    tl.store(o_ptr + h[:, None] * N + n[None, :], tl.dot(q, tl.trans(k)))


def _interpreting():
    if not fixes.interpreting():
        pytest.skip("the interpreter's costs: only under TRITON_INTERPRET=1")
    from triton.runtime import interpreter as ti
    return ti


def _patches_per_launch(monkeypatch, ti, calls: int) -> tuple[int, torch.Tensor]:
    count = [0]
    real = ti._patch_builtin

    def counted(*args):
        count[0] += 1
        return real(*args)
    x = torch.rand(16)
    y = torch.full((16,), float("nan"))
    _nested[(1,)](x, y, N=16, CALLS=calls)          # the rewrite cached, tl.core patched once, as on any launch
    monkeypatch.setattr(ti, "_patch_builtin", counted)
    _nested[(1,)](x, y, N=16, CALLS=calls)
    monkeypatch.setattr(ti, "_patch_builtin", real)
    return count[0], (y - x * 2.0 ** calls).abs().max()


def test_a_jit_function_called_in_a_launch_does_not_patch_the_language_again(monkeypatch):
    ti = _interpreting()
    alone, err0 = _patches_per_launch(monkeypatch, ti, 0)
    nested, err = _patches_per_launch(monkeypatch, ti, 6)
    assert alone > 0
    assert nested == alone           # before: each of the 6 calls patched triton.language again
    assert err0 == 0 and err == 0    # x * 2^6 exactly, output poisoned first


def test_the_interpreters_dot_multiplies_contiguous_operands(monkeypatch):
    ti = _interpreting()
    seen: list[bool] = []
    matmul = np.matmul

    def recorded(a, b, *args, **kwargs):
        seen.append(a.flags.c_contiguous and b.flags.c_contiguous)
        return matmul(a, b, *args, **kwargs)
    monkeypatch.setattr(ti.np, "matmul", recorded)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn((16, 64), generator=gen), torch.randn((32, 64), generator=gen)
    out = torch.full((16, 32), float("nan"))
    _qk[(1,)](q, k, out, H=16, N=32, D=64)
    monkeypatch.setattr(ti.np, "matmul", matmul)
    assert seen and all(seen)        # before: k^T reached numpy as a transposed view (its slow loop)
    ref = q.double() @ k.double().T
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2     # tf32-like tolerance of tl.dot


def test_numpy_runs_one_blas_thread_under_the_interpreter():
    _interpreting()
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        fixes.one_blas_thread()
        blas = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        assert blas and all(p["num_threads"] == 1 for p in blas)


def test_a_config_timed_again_on_the_same_inputs_is_not_warmed_up_again():
    device = CpuDevice(get_gpu("H200"))
    calls = []
    runs = [lambda: calls.append("run")]
    assert len(device.time_runs(runs, None, reps=2)) == 2 and len(calls) == 3       # a warm-up, 2 timed
    calls.clear()
    assert len(device.time_runs(runs, None, reps=2, warmed=True)) == 2 and len(calls) == 2


def test_the_measurer_says_warmed_only_for_a_config_timed_on_the_inputs_it_holds():
    from types import SimpleNamespace

    from tuner.measure.device_measurer import DeviceMeasurer
    from tuner.measure.policy import DEFAULT

    told: list[bool] = []

    class _Device:
        tensor_device, input_sets = "cpu", 1

        def time_runs(self, runs, flush, reps, graph=True, warmed=False):
            told.append(warmed)
            return [1.0, 1.0]

        def empty_cache(self):
            pass
    kernel = SimpleNamespace(make_inputs=lambda params, M, device, seed: {"M": M}, run=lambda inp, cfg: None)
    m = object.__new__(DeviceMeasurer)
    m.kernel, m.device, m.flush, m.reps, m.policy, m.input_sets = kernel, _Device(), None, 2, DEFAULT, 1
    m._inputs_key, m._inputs, m._warmed = None, [], set()
    p = SimpleNamespace(key="p", params={})
    a, b = {"BLOCK": 16}, {"BLOCK": 32}
    for M, cfg in [(1, a), (1, b), (1, a), (2, a), (2, a), (1, a)]:
        assert m._time_once(p, M, cfg).time_us == 1.0
    # new inputs (another M, or back to M=1: made again) are warmed up again
    assert told == [False, False, True, False, True, False]


@pytest.mark.parametrize("kind, pairs", [("cpu", 2), ("cuda", 4)])
def test_the_cpu_device_decides_a_row_on_two_pairs(kind, pairs):
    from types import SimpleNamespace

    from kernels.mla_decode_spec import SPEC as MLA
    from tuner.measure.measurers import Measurement
    from tuner.search.choice import choose_row
    from tuner.search.settings import StudyResult

    class _Measurer:
        def __init__(self):
            self.asked: list[int] = []

        def environment(self):
            return {"device_kind": kind}

        def measure(self, problem, M, configs):
            self.asked.append(len(configs))
            return [Measurement(1.0 if c["BLOCK_N"] == 64 else 2.0, 0.0, None) for c in configs]

    tuned = dict(BLOCK_N=64, BLOCK_H=16, num_kv_splits=1, num_warps=4, num_stages=2, merge_warps=4)
    default = {**tuned, "BLOCK_N": 32}
    result = StudyResult(SimpleNamespace(key="p", params={}), 1, tuned, 1.0, 0.0, default, 2.0, 6, "budget",
                         {"status": "passed"})
    m = _Measurer()
    chosen = choose_row(MLA, m, result, [("default", default)], 0.02)
    assert m.asked == [2 * pairs]                   # tuned, default, tuned, default, ... in one call
    assert chosen.choice["kept"] == "tuned" and chosen.choice["pairs"] == pairs
