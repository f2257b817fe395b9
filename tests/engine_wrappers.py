"""Each engine version's own Python wrapper of its fused-MoE and GEMM kernels, taken from its
released wheel and run on a CPU (Triton's interpreter), with every kernel launch recorded.

What is the engine's: the wrapper functions, read from the wheel by name with `ast` and
executed verbatim (vLLM's `fused_experts_impl` with `_prepare_expert_assignment`,
`moe_align_block_size`, `dispatch_fused_moe_kernel`, `invoke_fused_moe_triton_kernel`,
`enable_swap_ab` and `w8a8_triton_block_scaled_mm`; SGLang's `_prepare_fused_moe_run`,
`_fused_moe_kernel_sequence`, its `moe_align_block_size`, `invoke_fused_moe_kernel`,
`should_enable_swap_ab` and `w8a8_block_fp8_matmul_triton`), and the jit kernels they
launch. What is shimmed, because it is a CUDA op or server state: the alignment op (the
buckets and layout its docstrings describe, written here as a plain loop), the activation
quantization and silu-and-mul (ours: same math), the top-k sum, the table lookup (it returns
the config under test), logging, the platform (sm_90, CUDA) and the server's settings
(no all-reduce fusion, no symmetric memory, no LoRA, TMA supported, no PDL in the interpreter).

Launches are recorded by wrapping `run` of the jit functions both sides launch (the
engine's kernels, cut out of the same wheel by tuner's loader), binding each launch's
arguments to the kernel's parameters (defaults applied) and describing every value:
tensors by dtype, shape and strides (integer tensors also by content), TMA descriptors by
their block shape, everything else as is, and the grid evaluated.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import functools
import inspect
import logging
import zipfile
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.fp8_gemm import FP8_MAX, per_token_group_quant_fp8
from kernels.fused_moe import silu_and_mul as _silu_and_mul
from kernels.moe_quant import per_token_group_quant_int8, per_token_quant_int8

VLLM_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
VLLM_ALIGN = "vllm/model_executor/layers/fused_moe/moe_align_block_size.py"
VLLM_UTILS = "vllm/model_executor/layers/fused_moe/utils.py"
VLLM_GEMM = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
VLLM_EXPERTS = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"
SGL_RUNNER = "sglang/srt/layers/moe/moe_runner/triton_utils"
SGL_KERNELS = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
SGL_GEMM = "sglang/kernels/ops/gemm/fp8_kernel.py"


def wheel(folder: Path, engine: str, version: str) -> Path:
    return next(folder.glob(f"{engine}-{version}-*.whl"))


def take_functions(zf: zipfile.ZipFile, rel: str, names: list[str], namespace: dict, optional=()) -> None:
    """Execute the top-level functions `names` of the wheel's file `rel` (verbatim, their
    decorators included; annotations not evaluated) into `namespace`."""
    tree = ast.parse(zf.read(rel).decode())
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = [n for n in names if n not in defs and n not in optional]
    assert not missing, f"{rel} no longer defines {missing}"
    body = [defs[n] for n in names if n in defs]
    code = compile(ast.Module(body=body, type_ignores=[]), f"<{zf.filename}:{rel}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)


# -- the CUDA ops, as their docstrings describe them (plain loops over tiny inputs) ------------
def _fill_alignment(groups, numel: int, block_size: int, sorted_ids, expert_ids, num_tokens_post_pad) -> None:
    """groups: [(expert id of the blocks, [pair indexes])] in bucket order; each padded to
    a multiple of block_size with the sentinel numel."""
    sorted_ids.fill_(numel)
    pos = 0
    for expert, pairs in groups:
        if not pairs:
            continue
        padded = -(-len(pairs) // block_size) * block_size
        sorted_ids[pos:pos + len(pairs)] = torch.tensor(pairs, dtype=torch.int32)
        expert_ids[pos // block_size:(pos + padded) // block_size] = expert
        pos += padded
    num_tokens_post_pad[0] = pos


def vllm_moe_align_op(topk_ids, num_experts, block_size, sorted_ids, expert_ids, num_tokens_post_pad,
                      expert_map=None, scatter_idx=None):
    """vLLM's ops.moe_align_block_size: experts in global order; with an expert map, the pairs
    of experts it maps to -1 are ignored and each block gets its expert's local id."""
    assert scatter_idx is None
    flat = topk_ids.flatten().tolist()
    groups = []
    for g in range(num_experts):
        local = g if expert_map is None else int(expert_map[g])
        if local < 0:
            continue
        groups.append((local, [i for i, e in enumerate(flat) if e == g]))
    _fill_alignment(groups, len(flat), block_size, sorted_ids, expert_ids, num_tokens_post_pad)


def sglang_moe_align_op(topk_ids, buckets, block_size, sorted_ids, expert_ids, num_tokens_post_pad,
                        cumsum_buffer=None, pad_sorted_token_ids=True, ignore_invalid_expert=False, **kw):
    """SGLang's sgl_kernel moe_align_block_size ("+1" convention): bucket b holds the pairs
    of expert b - 1, bucket 0 those routed to -1 (another GPU's expert), whose blocks get
    expert id -1."""
    assert pad_sorted_token_ids and not ignore_invalid_expert and not kw
    flat = topk_ids.flatten().tolist()
    groups = [(b - 1, [i for i, e in enumerate(flat) if e + 1 == b]) for b in range(buckets)]
    _fill_alignment(groups, len(flat), block_size, sorted_ids, expert_ids, num_tokens_post_pad)


def _quantize_input(A, A_scale, quant_dtype, per_act_token_quant=False, block_shape=None, **kw):
    """vLLM's moe_kernel_quantize_input (dynamic quantization only): FP8 per 128-wide group or
    per tensor; INT8 per token (its per_token_quant_int8) or per token group."""
    assert A_scale is None
    if quant_dtype is None:
        return A, None
    if quant_dtype == torch.int8:
        if block_shape is not None:
            return per_token_group_quant_int8(A, block_shape[1])
        assert per_act_token_quant
        return per_token_quant_int8(A)
    assert not per_act_token_quant
    if block_shape is not None:
        return per_token_group_quant_fp8(A, block_shape[1])
    return _per_tensor(A)


def _per_tensor(A, A_scale=None, use_per_token_if_dynamic=False):
    assert A_scale is None and not use_per_token_if_dynamic
    scale = (A.abs().amax().float() / FP8_MAX).clamp_(min=1e-10).reshape(1)
    return (A.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _silu_into(input, out=None, expert_ids=None, expert_step=1, *, sorted_token_ids=None,
               num_tokens_post_padded=None, num_valid_tokens=0):
    """silu(gate) * up into `out` (every row; the CUDA op may skip rows no GEMM reads)."""
    result = _silu_and_mul(input)
    if out is None:
        return result
    out.copy_(result)
    return out


def _group_quant(input, output_q=None, output_s=None, group_size=128, *, sorted_token_ids=None,
                 num_tokens_post_padded=None, num_valid_tokens=0, **kw):
    assert output_q is None and output_s is None and not kw
    return per_token_group_quant_fp8(input, group_size, sorted_token_ids=sorted_token_ids,
                                     num_tokens_post_padded=num_tokens_post_padded,
                                     num_valid_tokens=num_valid_tokens)


class _Logger:
    def __getattr__(self, name):
        return lambda *a, **k: None


def _common(kernels: dict) -> dict:
    return {"torch": torch, "triton": triton, "tl": tl, "F": F, "functools": functools, "Any": Any,
            "Dict": Dict, "List": List, "Optional": Optional, "Tuple": Tuple, "logger": _Logger(),
            "logging": logging, **kernels}


# -- the wrappers ------------------------------------------------------------------------------
def vllm_wrappers(folder: Path, version: str, kernels: dict, config: dict) -> dict:
    """vLLM's fused_experts_impl and w8a8_triton_block_scaled_mm of `version`, launching
    `kernels` ({name: jit function}) with `config` as the table's entry."""
    ns = _common(kernels)
    ns.update(
        try_get_optimal_moe_config=lambda *a, **k: dict(config),
        get_w8a8_block_fp8_configs=lambda *a, **k: {1: dict(config)},
        _get_config_dtype_str=lambda use_fp8_w8a8=False, **k: "fp8_w8a8" if use_fp8_w8a8 else None,
        MoEActivation=SimpleNamespace(from_str=lambda s: s),
        mk=SimpleNamespace(FusedMoEExpertsModular=SimpleNamespace(adjust_N_for_activation=lambda N, a: N // 2)),
        moe_kernel_quantize_input=_quantize_input,
        apply_moe_activation=lambda activation, out, inp: _silu_into(inp, out),
        ops=SimpleNamespace(moe_align_block_size=vllm_moe_align_op,
                            moe_sum=lambda inp, out: torch.sum(inp, dim=1, out=out)),
        current_platform=SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn, is_rocm=lambda: False,
                                         is_xpu=lambda: False,      # 0.29.0 asks it too
                                         is_device_capability=lambda cap: cap == 90),
        warn_if_moe_use_td_ineffective=lambda *a, **k: None, resolve_moe_use_td=lambda: False,
        set_triton_allocator=lambda *a: None, round_up=lambda x, m: -(-x // m) * m,
        envs=SimpleNamespace(VLLM_BATCH_INVARIANT=False),
    )
    with zipfile.ZipFile(wheel(folder, "vllm", version)) as zf:
        take_functions(zf, VLLM_MOE, ["fused_experts_impl", "_prepare_expert_assignment", "dispatch_fused_moe_kernel",
                                      "invoke_fused_moe_triton_kernel", "_get_config_quant_dtype",
                                      "_weights_host_resident"], ns, optional=("_weights_host_resident",))
        take_functions(zf, VLLM_ALIGN, ["moe_align_block_size"], ns)
        take_functions(zf, VLLM_UTILS, ["enable_swap_ab"], ns)
        take_functions(zf, VLLM_GEMM, ["w8a8_triton_block_scaled_mm"], ns)
    return ns


def sglang_wrappers(folder: Path, version: str, kernels: dict, config: dict, down_config: dict | None) -> dict:
    """SGLang's Triton-runner sequence and w8a8_block_fp8_matmul_triton of `version`, with
    `config` (and `down_config`) as the tables' entries (USE_TMA among their keys)."""
    ns = _common(kernels)
    ns.update(
        try_get_optimal_moe_config=lambda *a, return_down_config=False, **k: (
            (dict(config), (dict(down_config) if down_config else None, None)) if return_down_config
            else dict(config)),
        get_w8a8_block_fp8_configs=lambda *a, **k: {1: dict(config)},
        get_config_dtype_str=lambda use_fp8_w8a8=False, **k: "fp8_w8a8" if use_fp8_w8a8 else None,
        padding_size=0, _use_aiter=False, _is_cuda=True, _is_hip=False, _is_xpu=False, _is_musa=False,
        _is_gfx1250=False, _has_vllm_ops=False, _moe_support_tma=lambda: True,
        _SGLANG_EXPERIMENTAL_LORA_OPTI=False, SMALL_NUMEL_LIMIT=0, _CUDA_SMALL_BATCH_MAX_BUCKETS=64,
        sgl_moe_align_block_size=sglang_moe_align_op, moe_align_small_numel=sglang_moe_align_op,
        is_arch_support_pdl=lambda: False, is_batch_invariant_mode_enabled=lambda: False,
        is_sm90_supported=lambda: True, get_platform=lambda: SimpleNamespace(is_sm90=True),
        get_exec=lambda: SimpleNamespace(moe=SimpleNamespace(enable_fused_moe_sum_all_reduce=False)),
        get_parallel=lambda: SimpleNamespace(tp_group=None),
        get_tp_group=lambda: None,             # 0.5.19-0.5.20: the TP group, before get_parallel()
        use_symmetric_memory=lambda *a, **k: contextlib.nullcontext(), is_allocation_symmetric=lambda: False,
        silu_and_mul=_silu_into, per_token_group_quant=_group_quant,
        sglang_per_token_group_quant_fp8=lambda A, k: per_token_group_quant_fp8(A, k),
        per_token_group_quant_fp8=lambda A, k: per_token_group_quant_fp8(A, k), scaled_fp8_quant=_per_tensor,
        per_token_quant_int8=per_token_quant_int8, sglang_per_token_group_quant_int8=per_token_group_quant_int8,
        per_token_group_quant_int8=per_token_group_quant_int8,
        _use_moe_sum_reduce_torch_compile=lambda n: False,
        moe_sum_reduce=lambda x, out, scale: torch.sum(x, dim=1, out=out).mul_(scale),
        _B_DESC_CACHE=OrderedDict(), _B_DESC_CACHE_MAX=8, _TMA_ALLOCATOR_SET=True,
    )
    from triton.tools.tensor_descriptor import TensorDescriptor
    ns["TensorDescriptor"] = TensorDescriptor
    with zipfile.ZipFile(wheel(folder, "sglang", version)) as zf:
        take_functions(zf, f"{SGL_RUNNER}/fused_moe.py", ["_prepare_fused_moe_run", "_fused_moe_kernel_sequence",
                                                          "_activation_row_filter", "moe_combine_topk"], ns,
                       optional=("_activation_row_filter", "moe_combine_topk"))
        take_functions(zf, f"{SGL_RUNNER}/moe_align_block_size.py", ["moe_align_block_size"], ns)
        take_functions(zf, SGL_KERNELS, ["invoke_fused_moe_kernel", "should_enable_swap_ab",
                                         "_get_b_tma_desc_cached", "_set_triton_tma_allocator"], ns)
        if SGL_GEMM in zf.namelist():       # 0.5.19-0.5.20 keep their GEMM elsewhere (tuner refuses it there)
            take_functions(zf, SGL_GEMM, ["w8a8_block_fp8_matmul_triton", "select_w8a8_block_fp8_matmul_kernel",
                                          "prepare_block_fp8_matmul_inputs"], ns)
    return ns


def take_method(zf: zipfile.ZipFile, rel: str, cls: str, name: str, namespace: dict):
    """A class's method from the wheel's file, verbatim, as a plain function of `namespace`
    (its `self` is whatever the caller passes)."""
    tree = ast.parse(zf.read(rel).decode())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    code = compile(ast.Module(body=[fn], type_ignores=[]), f"<{zf.filename}:{rel}:{cls}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return namespace[name]


def vllm_wna16_apply(folder: Path, version: str, kernels: dict, config: dict, quant: dict):
    """vLLM's TritonWNA16Experts.apply of `version` (the group-wise MoE as it serves it), with
    invoke_fused_moe_wna16_triton_kernel and get_moe_wna16_block_config from the wheel and
    `config` as the table's row; `quant`: w1_scale, w2_scale, w1_zp, w2_zp, use_int4_w4a16,
    use_int8_w8a16, block_shape ([0, group]). Returns apply(output, hidden, w1, w2, weights, ids)."""
    ns = _common(kernels)
    ns.update(try_get_optimal_moe_config=lambda *a, **k: dict(config),
              _resize_cache=lambda x, v: x.flatten()[: int(torch.tensor(v).prod())].view(*v),
              moe_kernel_quantize_input=_quantize_input, current_platform=SimpleNamespace(is_cuda=lambda: True),
              ops=SimpleNamespace(moe_align_block_size=vllm_moe_align_op), round_up=lambda x, m: -(-x // m) * m)
    with zipfile.ZipFile(wheel(folder, "vllm", version)) as zf:
        take_functions(zf, VLLM_MOE, ["invoke_fused_moe_wna16_triton_kernel", "get_moe_wna16_block_config"], ns)
        take_functions(zf, VLLM_ALIGN, ["moe_align_block_size"], ns)
        apply = take_method(zf, VLLM_EXPERTS, "TritonWNA16Experts", "apply", ns)
    quant_config = SimpleNamespace(use_int4_w4a16=quant["use_int4_w4a16"], use_int8_w8a16=quant["use_int8_w8a16"],
                                   w1_zp=quant["w1_zp"], w2_zp=quant["w2_zp"], config_name=lambda dtype: None)
    this = SimpleNamespace(
        quant_config=quant_config, w1_scale=quant["w1_scale"], w2_scale=quant["w2_scale"],
        block_shape=quant["block_shape"], quant_dtype=None, per_act_token_quant=False,
        moe_problem_size=lambda a1, w1, w2, ids: (w1.shape[0], a1.size(0), w1.shape[1], a1.size(-1), ids.size(1)),
        adjust_N_for_activation=lambda N, act: N // 2,
        activation=lambda act, out, inp: _silu_into(inp, out),
        moe_sum=lambda inp, out: torch.sum(inp, dim=1, out=out))

    def run(output, hidden, w1, w2, topk_weights, topk_ids):
        M, top_k = topk_ids.shape
        N2, K = w1.shape[1], hidden.shape[1]
        workspace13 = torch.empty(M * top_k * max(N2, K), dtype=hidden.dtype)
        workspace2 = torch.empty(M * top_k * max(N2, K), dtype=hidden.dtype)
        apply(this, output, hidden, w1, w2, topk_weights, topk_ids, "silu", w1.shape[0], None, None, None,
              workspace13, workspace2, None, False)
        return output
    return run


# -- recording launches -----------------------------------------------------------------------
def describe(value):
    """A launch argument as something == can compare."""
    if isinstance(value, torch.Tensor):
        content = tuple(value.flatten().tolist()) if not value.is_floating_point() else None
        return ("tensor", str(value.dtype), tuple(value.shape), tuple(value.stride()), content)
    if type(value).__name__ == "TensorDescriptor":
        return ("tma", describe(value.base)[:4], tuple(value.shape), tuple(value.strides),
                tuple(value.block_shape))
    if isinstance(value, tl.dtype):
        return ("dtype", str(value))
    return value


class LaunchRecorder:
    """Records every launch of the given jit functions, and runs it (with execute=False only
    records it: what a launch passes does not depend on what earlier launches computed)."""

    def __init__(self, kernels: dict, execute: bool = True):
        self.kernels = kernels
        self.execute = execute
        self.launches: list[dict] = []

    def __enter__(self):
        for name, fn in self.kernels.items():
            self._wrap(name, fn)
        return self

    def __exit__(self, *exc):
        for fn in self.kernels.values():
            fn.__dict__.pop("run", None)

    def _wrap(self, name: str, fn) -> None:
        original = type(fn).run.__get__(fn)
        signature = inspect.signature(fn.fn)

        def run(*args, grid, warmup, **kwargs):
            params = {k: v for k, v in kwargs.items() if k in signature.parameters}
            options = {k: v for k, v in kwargs.items() if k not in signature.parameters}
            bound = signature.bind(*args, **params)
            bound.apply_defaults()
            g = grid(dict(bound.arguments)) if callable(grid) else grid
            described = {k: describe(v) for k, v in bound.arguments.items()}
            if "expert_ids_ptr" in described and "num_tokens_post_padded_ptr" in described:
                # blocks past the padded length are never run: their expert ids are anything
                used = -(-int(bound.arguments["num_tokens_post_padded_ptr"][0]) // bound.arguments["BLOCK_SIZE_M"])
                kind, dtype, shape, stride, content = described["expert_ids_ptr"]
                described["expert_ids_ptr"] = (kind, dtype, shape, stride, content[:used])
            self.launches.append({"kernel": name, "grid": tuple(g), "args": described, "options": options})
            if self.execute:
                return original(*args, grid=grid, warmup=warmup, **kwargs)
            return None

        fn.run = run


def differences(engine: list[dict], ours: list[dict], ignore: tuple[str, ...] = ()) -> list[str]:
    """What differs between two lists of launches, in words ([] when identical)."""
    out = []
    if len(engine) != len(ours):
        out.append(f"{len(engine)} launches by the engine, {len(ours)} by ours: "
                   f"{[x['kernel'] for x in engine]} vs {[x['kernel'] for x in ours]}")
    for i, (e, o) in enumerate(zip(engine, ours)):
        for key in ("kernel", "grid", "options"):
            if e[key] != o[key]:
                out.append(f"launch {i}: {key} {e[key]} (engine) vs {o[key]} (ours)")
        for name in sorted(set(e["args"]) | set(o["args"])):
            if name in ignore:
                continue
            if e["args"].get(name, "<absent>") != o["args"].get(name, "<absent>"):
                out.append(f"launch {i} ({e['kernel']}): {name} = {str(e['args'].get(name, '<absent>'))[:160]} "
                           f"(engine) vs {str(o['args'].get(name, '<absent>'))[:160]} (ours)")
    return out
