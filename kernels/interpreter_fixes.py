"""Work-arounds for Triton's CPU interpreter (TRITON_INTERPRET=1), which CI runs kernels in.

Triton 3.6's interpreter truncates float32 -> bfloat16 casts, casts integers to bfloat16 as
raw bits, rounds float -> fp8 half-up (losing the carry out of the mantissa), and multiplies
bfloat16 dot operands as their raw uint16 bits. Kernels take an `INTERPRET` constexpr and, only when it is set, round to the
target grid themselves (so the cast is exact) or upcast dot operands. Compiled kernels
never run this code: on a GPU the hardware rounds to nearest even.
"""

import os

import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def round_to_grid(x, mantissa_bits: tl.constexpr, min_exponent: tl.constexpr):
    """x rounded to nearest-even on a float grid with `mantissa_bits` stored bits whose
    smallest normal exponent is `min_exponent` (below it the grid is evenly spaced).
    Adding and subtracting 1.5 * 2^23 rounds an fp32 to an integer, ties to even."""
    e = tl.maximum(tl.floor(tl.log2(tl.where(x == 0.0, 1.0, tl.abs(x)))), min_exponent)
    ulp = tl.exp2(e - mantissa_bits)
    return tl.where(x == 0.0, x, ((x / ulp + 12582912.0) - 12582912.0) * ulp)


@triton.jit
def cast_for_store(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    if INTERPRET:
        if dtype == tl.bfloat16:
            x = round_to_grid(x, 7, -126.0)
    return x.to(dtype)


@triton.jit
def dot(a, b, INTERPRET: tl.constexpr):
    """tl.dot, with bfloat16 operands upcast under the interpreter (fp32 accumulation)."""
    if INTERPRET:
        if a.dtype == tl.bfloat16:
            return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


def patch_interpreter() -> None:
    """The same fixes inside Triton's interpreter itself, for kernels we run but do not
    edit (the engines'): float32 -> bfloat16 casts round to nearest even, integer -> bfloat16
    casts take the value (the INT8 W8A16 kernel's), and bfloat16 dot operands are multiplied
    as numbers. Only under TRITON_INTERPRET=1; idempotent."""
    if not interpreting():
        return
    import numpy as np
    try:
        from triton.runtime import interpreter as ti
        builder = ti.InterpreterBuilder
        convert = ti._convert_float
    except (ImportError, AttributeError):
        return
    if getattr(builder, "_tuner_patched", False):
        return
    cast_impl, create_dot = builder.cast_impl, builder.create_dot

    def rounding_cast(self, src, dst_type):
        if dst_type.scalar == tl.bfloat16 and (src.dtype.scalar == tl.float32 or src.dtype.scalar.is_int()):
            # an integer source (INT8 weights to bf16) would otherwise land as raw bits
            data = np.asarray(src.data).astype(np.float32)
            bits = data.view(np.uint32)
            rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
            return ti.TensorHandle(np.where(np.isnan(data), np.uint16(0x7FC0), rounded), dst_type.scalar)
        return cast_impl(self, src, dst_type)

    def numeric_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = ti.TensorHandle(convert(a.data, tl.bfloat16, tl.float32, None).view(np.float32), tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = ti.TensorHandle(convert(b.data, tl.bfloat16, tl.float32, None).view(np.float32), tl.float32)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.cast_impl = rounding_cast
    builder.create_dot = numeric_dot
    builder._tuner_patched = True


def fast_interpreter() -> None:
    """Two costs of Triton 3.6's interpreter that change nothing computed. Its tl.dot on a
    transposed operand (contiguous_dot). And it patches the language anew (inspect.getmembers over
    triton.language, its tensor and math modules) at every call of a jit function from
    inside a kernel, though the launch around it has patched the same modules already and
    a callee's patches are never undone: half of an MLA launch's CPU time went there. Here a
    call inside a launch skips that when the launch already patched every language module the
    callee sees (triton.language itself, or its core module, which the language's own jit
    functions see); nothing else changes (the same functions run on the same values).
    Only under TRITON_INTERPRET=1; idempotent; a Triton without these internals is left as is."""
    if not interpreting():
        return
    import threading
    try:
        from triton.runtime import interpreter as ti
        patch_lang, executor_call = ti._patch_lang, ti.GridExecutor.__call__
        langs_of = (ti.tl, ti.tl.core)
    except (ImportError, AttributeError):
        return
    if getattr(ti, "_tuner_fast", False):
        return
    state = threading.local()
    seen: dict = {}

    def langs(fn) -> frozenset:
        if fn not in seen:
            seen[fn] = frozenset(id(v) for v in fn.__globals__.values() if any(v is m for m in langs_of))
        return seen[fn]

    class _Nothing:
        def restore(self) -> None:
            pass

    def once_per_launch(fn):
        patched = getattr(state, "patched", None)
        if patched is None:              # outside a launch, or the launch's own patch
            scope = patch_lang(fn)
            if getattr(state, "launching", False):
                state.patched = langs(fn)
            return scope
        mine = langs(fn)
        if mine <= patched:
            return _Nothing()
        scope = patch_lang(fn)           # kept until the launch ends (the interpreter never undoes it)
        state.patched = patched | mine
        return scope

    def launch(self, *args, **kwargs):
        outer = (getattr(state, "launching", False), getattr(state, "patched", None))
        state.launching, state.patched = True, None
        try:
            return executor_call(self, *args, **kwargs)
        finally:
            state.launching, state.patched = outer

    ti._patch_lang = once_per_launch
    ti.GridExecutor.__call__ = launch
    ti.InterpreterBuilder.create_dot = contiguous_dot(ti.InterpreterBuilder.create_dot, ti.TensorHandle)
    ti._tuner_fast = True
    one_blas_thread()


def one_blas_thread() -> None:
    """The interpreter's numpy on one BLAS thread: its products are tiles (16x512 by 512x64)
    that one thread multiplies in 35 us, while OpenBLAS's threads wait for each other on
    every one: 35-65 ms apiece on this 2-core machine at load 8-10 (2026-11-29), where a
    whole MLA launch then took 0.3 s."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


def contiguous_dot(create_dot, handle):
    """The interpreter's tl.dot on contiguous copies of its operands: it calls
    np.matmul(a, b, dtype=...), which on a transposed view (tl.trans(k), as attention kernels
    write q.k^T) leaves BLAS for a loop a thousand times slower (35 ms for 16x512 by 512x64).
    The same values are multiplied in the same precision."""
    import numpy as np

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a = a if a.data.flags.c_contiguous else handle(np.ascontiguousarray(a.data), a.dtype)
        b = b if b.data.flags.c_contiguous else handle(np.ascontiguousarray(b.data), b.dtype)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    return dot


fast_interpreter()       # every kernel run under the interpreter imports this module first
