"""The checkpoint's precision: the dtype its weights have as the engines name their tables'
dtype (from its quantization_config or torch_dtype), the --dtype a kernel command tunes, and
how a fused MoE of that dtype lays its weights out (blocks, per-channel or group-wise scales,
zero points), as the engines' checkpoint loaders take them from the checkpoint."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.errors import TunerError

if TYPE_CHECKING:
    from tuner.plan.models import Model

log = logging.getLogger("tuner")

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}

# The precisions `tuner moe` tunes (first: the default), as the engines name their tables' dtype
# (bf16: tables without a dtype part). `tuner coverage` and the audit take them from here.
MOE_DTYPES = ("fp8_w8a8", "bf16", "int8_w8a8", "int8_w8a16", "int4_w4a16")
WEIGHT_ONLY = ("int8_w8a16", "int4_w4a16")          # 16-bit activations, integer weights
_GPTQ_LIKE = ("awq", "gptq", "awq_marlin", "gptq_marlin", "moe_wna16")
# the smallest K group the engines' group-wise MoE loaders halve a group down to (they assert it)
MIN_GROUP = 32
# a weight-only checkpoint's K group when it names none (GPTQ's and AWQ's default)
DEFAULT_GROUP = 128


def _linear_group(qc: dict) -> dict | None:
    """A compressed-tensors config's scheme for the linear layers (experts included): the
    first config group with weights."""
    groups = qc.get("config_groups")
    for group in (groups.values() if isinstance(groups, dict) else []):
        if isinstance(group, dict) and isinstance(group.get("weights"), dict):
            return group
    return None


def checkpoint_dtype(model: Model) -> str | None:
    """The precision of the checkpoint's weights as the engines name their tables' dtype,
    from its quantization_config ("fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16", or
    the quantization method's own name for anything else, e.g. "mxfp4"), else from its
    torch_dtype ("bf16", "fp16", "fp32"); None when the model says neither."""
    qc = model.raw.get("quantization_config")
    if isinstance(qc, dict) and qc:
        method = str(qc.get("quant_method") or "").lower()
        if method in ("fp8", "fbgemm_fp8"):
            return "fp8_w8a8"
        if method in ("blockwise_int8", "w8a8_int8"):          # SGLang's block- and channel-INT8 checkpoints
            return "int8_w8a8"
        if method in _GPTQ_LIKE:
            bits = qc.get("bits", qc.get("w_bit", 4))
            return "int8_w8a16" if bits == 8 else "int4_w4a16"
        if method == "compressed-tensors":
            group = _linear_group(qc)
            if group is not None:
                w, a = group["weights"], group.get("input_activations")
                if w.get("type") == "float" and w.get("num_bits") == 8:
                    return "fp8_w8a8"
                if w.get("type") == "int" and w.get("num_bits") == 8:
                    return "int8_w8a8" if a else "int8_w8a16"
                if w.get("type") == "int" and w.get("num_bits") == 4:
                    return "int4_w4a16"
        if method:
            return method
        if qc.get("weight_block_size") is not None:       # block-scaled weights without a method: FP8
            return "fp8_w8a8"
    torch_dtype = model.raw.get("torch_dtype") or model.raw.get("dtype")
    return _TORCH_DTYPES.get(str(torch_dtype).lower()) if torch_dtype else None


def resolve_dtype(model: Model, given: str | None, allowed: tuple[str, ...], command: str) -> str:
    """The --dtype a kernel command tunes: given, or the checkpoint's own precision (bf16 when
    the checkpoint is not quantized), as the engines' tuning scripts take it. A given one that
    differs from the checkpoint's is warned about (one line): the engine serving this
    checkpoint reads the checkpoint's table, not that one."""
    own = checkpoint_dtype(model)
    served = own if own not in (None, "fp16", "fp32") else "bf16"   # unquantized: tables without dtype
    if given is None:
        if served not in allowed:
            raise TunerError(f"{model.name}'s checkpoint is quantized as {own} (its quantization_config); "
                             f"`tuner {command}` tunes {', '.join(allowed)} tables: give --dtype to tune one "
                             "of those anyway")
        return served
    if given != served:
        log.warning("--dtype %s, but %s's checkpoint is %s (%s): the engine serving it reads the %s table%s; "
                    "tuning %s anyway", given, model.name, served,
                    "its quantization_config" if own not in (None, "bf16", "fp16", "fp32")
                    else "no quantization_config", served,
                    " unless it quantizes the weights itself (vLLM --quantization fp8)" if given == "fp8_w8a8" else
                    " unless it quantizes the experts itself (vLLM --quantization experts_int8)"
                    if given == "int8_w8a16" else "",
                    given)
    return given


# -- a fused MoE's weights -------------------------------------------------------------------------
@dataclass(frozen=True)
class MoePrecision:
    """How a fused MoE of one dtype holds its expert weights: `block_shape` [bn, bk] scale
    blocks (fp8/int8 block), `group_size` (weight-only: one scale per output row and K group;
    None with no block either: one scale per output row, or per tensor for fp8), zero points
    (weight-only: stored per group, else the format's fixed midpoint), and where that was read."""
    dtype: str
    block_shape: tuple[int, int] | None = None
    group_size: int | None = None
    zero_point: bool = False
    source: str = ""

    @property
    def scheme(self) -> str:
        """"block", "group", "channel" (one scale per output row), "tensor" (fp8 per tensor)
        or "none" (bf16): with the dtype, what decides the engine's kernel and table name."""
        if self.block_shape:
            return "block"
        if self.group_size:
            return "group"
        if self.dtype in ("int8_w8a8", "int8_w8a16"):
            return "channel"
        return "tensor" if self.dtype == "fp8_w8a8" else "none"

    def params(self) -> dict:
        """The problem params that say it (group_size and zero_point only where they apply)."""
        out: dict = {"dtype": self.dtype, "block_shape": list(self.block_shape) if self.block_shape else None}
        if self.group_size:
            out["group_size"] = self.group_size
        if self.zero_point:
            out["zero_point"] = True
        return out

    def describe(self) -> str:
        """In words, for the plan: 'int4_w4a16, K groups of 128 with zero points (its quantization_config)'."""
        what = {"block": f"{self.block_shape and list(self.block_shape)} weight blocks",
                "group": f"K groups of {self.group_size}" + (" with zero points" if self.zero_point else
                                                             ", zero at the format's midpoint"),
                "channel": "one scale per output channel" + (", per-token activations"
                                                             if self.dtype == "int8_w8a8" else ""),
                "tensor": "one scale per tensor", "none": "unquantized"}[self.scheme]
        return f"{self.dtype}, {what}" + (f"; {self.source}" if self.source else "")


def _int_option(qc: dict, key: str, default):
    value = qc.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _from_checkpoint(model: Model, dtype: str) -> MoePrecision | None:
    """The checkpoint's own MoE precision when it is `dtype`, else None."""
    if checkpoint_dtype(model) != dtype:
        return None
    qc = model.raw.get("quantization_config") or {}
    method = str(qc.get("quant_method") or "").lower()
    block = model.weight_block_size
    if dtype == "fp8_w8a8":
        return MoePrecision(dtype, block, source="as its quantization_config says")
    if dtype == "int8_w8a8":
        if method == "blockwise_int8" and block is None:
            raise TunerError(f"{model.name}'s quantization_config is blockwise_int8 without a weight_block_size: "
                             "the engines cannot load it")
        return MoePrecision(dtype, block if method == "blockwise_int8" else None,
                            source=f"as its quantization_config says ({method})")
    if method in _GPTQ_LIKE:
        group = _int_option(qc, "group_size", _int_option(qc, "q_group_size", DEFAULT_GROUP))
        zp = bool(qc.get("zero_point", True)) if method.startswith("awq") else not bool(qc.get("sym", True))
        return MoePrecision(dtype, None, group if group > 0 else None, zp,
                            f"as its quantization_config says ({method}, group_size {group})")
    linear = _linear_group(qc) or {}
    w = linear.get("weights") or {}
    group = w.get("group_size") if w.get("strategy") == "group" else None
    return MoePrecision(dtype, None, group if isinstance(group, int) and group > 0 else None,
                        not bool(w.get("symmetric", True)), f"as its quantization_config says ({method})")


def moe_precision(model: Model, dtype: str) -> MoePrecision:
    """The fused MoE's weights at --dtype `dtype`: the checkpoint's own layout when it is of
    that dtype; else what an engine makes of this checkpoint at that dtype (int8_w8a8: the
    checkpoint's weight blocks if it has any, as SGLang's block-INT8 DeepSeek checkpoints keep
    the FP8 ones, else per channel; int8_w8a16: per channel, vLLM's experts_int8; int4_w4a16:
    GPTQ's symmetric K groups of 128)."""
    own = _from_checkpoint(model, dtype)
    if own is not None:
        if dtype == "int4_w4a16" and not own.group_size:
            raise TunerError(f"{model.name}'s INT4 weights have one scale per output channel (no K groups): no "
                             "engine's Triton fused MoE runs them (its group-wise kernel needs a group size)")
        return own
    block = model.weight_block_size
    if dtype == "fp8_w8a8":
        return MoePrecision(dtype, block, source="its weight_block_size" if block else "per tensor")
    if dtype == "int8_w8a8":
        return MoePrecision(dtype, block, source="the checkpoint's weight blocks" if block
                            else "per channel, as w8a8_int8 and compressed-tensors INT8 checkpoints hold them")
    if dtype == "int8_w8a16":
        return MoePrecision(dtype, source="per channel, as vLLM's experts_int8 quantizes the experts at load")
    if dtype == "int4_w4a16":
        return MoePrecision(dtype, None, DEFAULT_GROUP, False, "GPTQ's symmetric default: K groups of 128")
    return MoePrecision(dtype, source="")


def served_group(group: int, n: int, k: int, where: str) -> int:
    """The K group the engines' group-wise loaders run: halved until it divides both the
    expert's shard width `n` and the hidden size `k` (at least MIN_GROUP, which they assert)."""
    g = group
    while g >= MIN_GROUP and (n % g or k % g):
        g //= 2
    if g < MIN_GROUP:
        raise TunerError(f"{where}: no K group of {group} or a half of it down to {MIN_GROUP} divides both the "
                         f"expert width {n} and the hidden size {k}; the engines' loaders refuse such a shard")
    return g


# What an engine serves a checkpoint of each precision as, besides the checkpoint's own: an
# FP8 checkpoint is also served dequantized to BF16 (DeepSeek's own conversion script; the
# DataCrunch DeepSeek-V3 on H200 write-up served both), a BF16 one quantized to FP8 when loaded
# (vLLM --quantization fp8, SGLang --quantization fp8: per-tensor scales, no block_shape). Integer
# checkpoints are served as they are.
_ALSO_SERVED = {"fp8_w8a8": ("bf16",), "bf16": ("fp8_w8a8",)}


def served_dtypes(model: Model) -> list[str]:
    """The precisions an engine can serve this checkpoint at, as its tables name their dtype:
    the checkpoint's own first (bf16 for an unquantized one), then those the engines convert
    it to (see _ALSO_SERVED). A precision added to checkpoint_dtype flows in here as it lands;
    whether a kernel takes it is the kernel's problems' to say (tuner/plan/models.py)."""
    own = checkpoint_dtype(model)
    served = own if own not in (None, "fp16", "fp32") else "bf16"
    return [served, *(d for d in _ALSO_SERVED.get(served, ()) if d != served)]
