"""The checkpoint's precision: the dtype its weights have as the engines name their tables'
dtype (from its quantization_config or torch_dtype), and the --dtype a kernel command tunes."""

from __future__ import annotations

import logging

from tuner.errors import TunerError
from tuner.plan.models import Model

log = logging.getLogger("tuner")

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


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
        if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "moe_wna16"):
            bits = qc.get("bits", qc.get("w_bit", 4))
            return "int8_w8a16" if bits == 8 else "int4_w4a16"
        if method == "compressed-tensors":
            groups = qc.get("config_groups")
            for group in (groups.values() if isinstance(groups, dict) else []):
                if not isinstance(group, dict):
                    continue
                w, a = group.get("weights") or {}, group.get("input_activations")
                if not isinstance(w, dict):
                    continue
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
                             f"`tuner {command}` tunes {' and '.join(allowed)} tables: give --dtype to tune one "
                             "of those anyway")
        return served
    if given != served:
        log.warning("--dtype %s, but %s's checkpoint is %s (%s): the engine serving it reads the %s table%s; "
                    "tuning %s anyway", given, model.name, served,
                    "its quantization_config" if own not in (None, "bf16", "fp16", "fp32")
                    else "no quantization_config", served,
                    " unless it quantizes the weights itself (vLLM --quantization fp8)" if given == "fp8_w8a8" else "",
                    given)
    return given


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
