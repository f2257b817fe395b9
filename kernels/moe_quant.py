"""The fused MoE's integer precisions as the engines run them: which flags a problem's precision
sets on their kernels (`MoeQuant`), its expert weights quantized and laid out as the engines'
checkpoint loaders leave them, its activations quantized before a W8A8 GEMM, and both
dequantized in float64 for the reference.

Layouts (vLLM 0.31-0.33 and SGLang 0.5.21-0.5.23 alike):
  int8_w8a8 per channel: w int8 [E, n, k], scale float32 [E, n, 1] (w8a8_int8, compressed-tensors);
  int8_w8a8 block: w int8 [E, n, k], scale float32 [E, n/bn, k/bk] (blockwise_int8);
  int8_w8a16 per channel: w int8 [E, n, k], scale float32 [E, n] (vLLM's experts_int8);
  weight-only in K groups (moe_wna16, and compressed-tensors W4A16 repacked for Triton):
    w uint8 [E, n, k / pack] (INT4: two values a byte along K, the even one in the low nibble),
    scale bf16 [E, n, k / group], zero points uint8 [E, n / pack, k / group] (INT4: two a byte
    along n) or none (the format's midpoint: 8 for INT4, 128 for INT8).
Activations of W8A8 INT8: per token (per channel weights) or per token and K group (block
weights), scale = absmax / 127, values rounded to nearest. This module is ours: same math as
the engines' quantization, other code."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tuner.plan.kernel_api import Params

INT8_MAX = 127.0


@dataclass(frozen=True)
class MoeQuant:
    """A fused-MoE problem's precision as the engines' kernels take it."""
    dtype: str
    block_shape: tuple | None = None       # [bn, bk] weight blocks
    group_size: int | None = None          # weight-only K groups
    zero_point: bool = False

    @classmethod
    def of(cls, params: Params) -> MoeQuant:
        block = params.get("block_shape")
        return cls(params["dtype"], tuple(block) if block else None, params.get("group_size") or None,
                   bool(params.get("zero_point")))

    @property
    def int8(self) -> bool:
        return self.dtype in ("int8_w8a8", "int8_w8a16", "int4_w4a16")

    @property
    def wna16(self) -> bool:
        """Weight-only in K groups: the engines' fused_moe_kernel_gptq_awq."""
        return self.dtype in ("int8_w8a16", "int4_w4a16") and bool(self.group_size)

    @property
    def pack(self) -> int:
        """Values a stored byte holds (INT4: 2)."""
        return 2 if self.dtype == "int4_w4a16" else 1

    @property
    def engine_block_shape(self) -> list[int] | None:
        """The block_shape the engines pass their launch: [bn, bk], or [0, group] (weight-only)."""
        if self.block_shape:
            return list(self.block_shape)
        return [0, self.group_size] if self.group_size else None

    def flags(self) -> dict:
        """The use_* flags and per_channel_quant the engines' wrappers take."""
        return {"use_fp8_w8a8": self.dtype == "fp8_w8a8", "use_int8_w8a8": self.dtype == "int8_w8a8",
                "use_int8_w8a16": self.dtype == "int8_w8a16", "use_int4_w4a16": self.dtype == "int4_w4a16",
                "per_channel_quant": self.dtype == "int8_w8a8" and not self.block_shape}


# -- weights --------------------------------------------------------------------------------------
def _pack_pairs(q: torch.Tensor, dim: int) -> torch.Tensor:
    """Two 4-bit values a byte along `dim`: the even index in the low nibble."""
    idx = torch.arange(q.shape[dim], device=q.device)
    lo = q.index_select(dim, idx[0::2])
    hi = q.index_select(dim, idx[1::2])
    return (lo | (hi << 4)).to(torch.uint8)


def unpack_pairs(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """The inverse of the packing: [.., n / 2, ..] bytes -> [.., n, ..] values 0..15."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=dim + 1).flatten(dim, dim + 1)


def quantize_weight(w: torch.Tensor, q: MoeQuant) -> dict:
    """Float weights [e, n, k] as the engine's loader holds them at precision `q`:
    {"w": ..., "scale": ..., "zp": ... or None} (the layouts in the module docstring)."""
    e, n, k = w.shape
    if q.dtype == "int8_w8a8" and q.block_shape:
        bn, bk = q.block_shape
        blocks = w.reshape(e, n // bn, bn, k // bk, bk)
        scale = (blocks.abs().amax(dim=(2, 4)) / INT8_MAX).clamp_(min=1e-12)
        qw = (blocks / scale[:, :, None, :, None]).round_().clamp_(-INT8_MAX, INT8_MAX)
        return {"w": qw.reshape(e, n, k).to(torch.int8), "scale": scale.float(), "zp": None}
    if q.dtype in ("int8_w8a8", "int8_w8a16") and not q.group_size:
        scale = (w.abs().amax(dim=2) / INT8_MAX).clamp_(min=1e-12)
        qw = (w / scale[:, :, None]).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        # W8A8: [e, n, 1] (compressed-tensors, w8a8_int8); W8A16: [e, n] (experts_int8)
        return {"w": qw, "scale": (scale[:, :, None] if q.dtype == "int8_w8a8" else scale).float(), "zp": None}
    if not q.wna16:
        raise ValueError(f"no integer layout for {q}")
    g = q.group_size
    levels = 15 if q.dtype == "int4_w4a16" else 255
    groups = w.reshape(e, n, k // g, g)
    if q.zero_point:                                  # asymmetric: AWQ, GPTQ without sym
        lo, hi = groups.amin(dim=3), groups.amax(dim=3)
        scale = ((hi - lo) / levels).clamp_(min=1e-8).to(torch.bfloat16)
        zp = (-lo / scale.float()).round_().clamp_(0, levels)
    else:                                             # symmetric around the midpoint
        scale = (groups.abs().amax(dim=3) / (levels // 2)).clamp_(min=1e-8).to(torch.bfloat16)
        zp = torch.full_like(scale, (levels + 1) // 2, dtype=torch.float32)
    qw = (groups / scale.float()[..., None] + zp[..., None]).round_().clamp_(0, levels).reshape(e, n, k)
    qw = qw.to(torch.uint8)
    zps = zp.to(torch.uint8) if q.zero_point else None
    if q.pack == 2:
        qw = _pack_pairs(qw, 2)
        zps = _pack_pairs(zps, 1) if zps is not None else None
    return {"w": qw, "scale": scale, "zp": zps}


def dequantize_weight(w: torch.Tensor, scale: torch.Tensor | None, zp: torch.Tensor | None, q: MoeQuant
                      ) -> torch.Tensor:
    """One expert's weight [n, k] (w, scale, zp: that expert's slices) in float64, as the
    kernel computes with it: a weight-only one rounded to bf16 after (q - zero) * scale, as
    the group-wise kernel does before its dot."""
    if q.wna16:
        vals = unpack_pairs(w, 1) if q.pack == 2 else w
        g = q.group_size
        if zp is None:
            zero = torch.full((vals.shape[0], vals.shape[1] // g), 8.0 if q.pack == 2 else 128.0)
        else:
            zero = (unpack_pairs(zp, 0) if q.pack == 2 else zp).float()
        scale_f = scale.float()
        deq = (vals.float() - zero.repeat_interleave(g, 1)) * scale_f.repeat_interleave(g, 1)
        return deq.to(torch.bfloat16).double()
    if scale is None:
        return w.double()
    if q.block_shape:
        bn, bk = q.block_shape
        return w.double() * scale.double().repeat_interleave(bn, 0)[: w.shape[0]] \
            .repeat_interleave(bk, 1)[:, : w.shape[1]]
    s = scale.double().reshape(-1)
    return w.double() * (s[:, None] if s.numel() == w.shape[0] else s)


# -- activations ----------------------------------------------------------------------------------
def per_token_quant_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k] -> (int8 [m, k], float32 scales [m, 1]): per token, absmax / 127, rounded."""
    xf = x.float()
    absmax = xf.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-10)
    return (xf * (INT8_MAX / absmax)).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), absmax / INT8_MAX


def per_token_group_quant_int8(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k] -> (int8 [m, k], float32 scales [m, k / group]): per token and K group."""
    m, k = x.shape
    xf = x.float().reshape(m, k // group, group)
    scale = xf.abs().amax(dim=-1).clamp_(min=1e-10) / INT8_MAX
    qx = (xf / scale[..., None]).round_().clamp_(-128, INT8_MAX).to(torch.int8)
    return qx.reshape(m, k), scale


def quantize_activation(x: torch.Tensor, q: MoeQuant) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a W8A8 INT8 GEMM reads of a bf16 activation (weight-only: x itself)."""
    if q.dtype != "int8_w8a8":
        return x, None
    return per_token_group_quant_int8(x, q.block_shape[1]) if q.block_shape else per_token_quant_int8(x)


def fake_quant_activation(x: torch.Tensor, q: MoeQuant) -> torch.Tensor:
    """What the kernel's activation quantization keeps of x, in float64."""
    qx, s = quantize_activation(x, q)
    if s is None:
        return x.double()
    if q.block_shape:
        return qx.double() * s.double().repeat_interleave(q.block_shape[1], 1)
    return qx.double() * s.double()


# -- compiling without memory --------------------------------------------------------------------
def phantom_moe_weights(E: int, n_out: int, k_in: int, q: MoeQuant, dev: str):
    """(weight, scale, zero points) of one MoE GEMM in the layout of `q`, the weight owning no
    memory (a compile worker builds the launch on them and runs nothing)."""
    from kernels.engines.base import phantom
    if q.wna16:
        g = q.group_size or 1
        zp = phantom((E, n_out // q.pack, k_in // g), torch.uint8) if q.zero_point else None
        return (phantom((E, n_out, k_in // q.pack), torch.uint8),
                torch.empty((E, n_out, k_in // g), dtype=torch.bfloat16, device=dev), zp)
    if q.block_shape:
        bn, bk = q.block_shape
        scale: tuple = (E, -(-n_out // bn), -(-k_in // bk))
    else:
        scale = (E, n_out, 1) if q.dtype == "int8_w8a8" else (E, n_out)
    return phantom((E, n_out, k_in), torch.int8), torch.empty(scale, dtype=torch.float32, device=dev), None


def phantom_moe_activation(rows: int, k_in: int, q: MoeQuant, dev: str):
    """(activation, its scale) a MoE GEMM of precision `q` reads."""
    if q.dtype != "int8_w8a8":
        return torch.empty((rows, k_in), dtype=torch.bfloat16, device=dev), None
    cols = -(-k_in // q.block_shape[1]) if q.block_shape else 1
    return (torch.empty((rows, k_in), dtype=torch.int8, device=dev),
            torch.empty((rows, cols), dtype=torch.float32, device=dev))
