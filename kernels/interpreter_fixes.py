"""Work-arounds for Triton's CPU interpreter (TRITON_INTERPRET=1), which CI runs kernels in.

Triton 3.6's interpreter truncates float32 -> bfloat16 casts, rounds float -> fp8 half-up
(losing the carry out of the mantissa), and multiplies bfloat16 dot operands as their raw
uint16 bits. Kernels take an `INTERPRET` constexpr and, only when it is set, round to the
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
    """The same two fixes inside Triton's interpreter itself, for kernels we run but do not
    edit (the engines'): float32 -> bfloat16 casts round to nearest even, and bfloat16 dot
    operands are multiplied as numbers. Only under TRITON_INTERPRET=1; idempotent."""
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
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = np.asarray(src.data, dtype=np.float32)
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
