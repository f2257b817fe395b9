"""`tuner bench`'s references outside Triton: the implementations the device's software has
for a problem (GEMM: torch._scaled_mm with block scales, DeepGEMM if importable), checked
against the float64 reference and timed in the measuring process, each variant by a call of its
own, so that one that fails or kills its process costs that variant alone; each a bench row."""

from __future__ import annotations

from typing import Callable

from tuner.jobs.bench_output import BenchRow
from tuner.measure.provenance import time_source
from tuner.plan.kernel_api import KernelSpec
from tuner.plan.problems import Problem


def reference_note(kernel: KernelSpec) -> str:
    """What exists outside Triton for this kernel, in words (also where nothing does)."""
    return {
        "fp8_gemm": "torch._scaled_mm with 1x128 / 128x128 block scales where the device's torch takes them; "
                    "DeepGEMM if importable",
        "fused_moe": "no fused-MoE op in torch; the engines' non-Triton MoE (DeepGEMM, FlashInfer CUTLASS) "
                     "need the engines installed and are not timed here",
        "mla_decode": "no MLA decode op in torch; FlashMLA / FlashAttention-MLA need their packages and are "
                      "not timed here",
    }.get(kernel.table_kind, "none known")


# cuBLASLt's block-scaled path (1x128 activation, 128x128 weight scales) takes M in multiples of
# 4: vLLM 0.33's BlockWiseTorchFP8ScaledMMLinearKernel pads A and its column-major scales up to
# it and slices the output back (at M = 1 unpadded: CUBLAS_STATUS_NOT_SUPPORTED on the H200).
BLOCK_SCALED_M_MULTIPLE = 4
CANDIDATES = "tuner.jobs.bench_references:gemm_reference_candidates"


def padded_rows(t, rows: int):
    """`t` with its rows padded (zeros) to `rows`, in its own memory layout (a column-major
    scale tensor stays column-major, as vLLM builds it)."""
    import torch
    if t.shape[0] >= rows:
        return t
    if t.dim() == 2 and t.stride(0) == 1 and t.shape[1] > 1:          # column-major
        out = torch.zeros((t.shape[1], rows), dtype=t.dtype, device=t.device).t()
    else:
        out = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


def gemm_reference_candidates() -> list[tuple[str, str, Callable[[dict], Callable[[], object]], int]]:
    """[(family, variant, build(inputs) -> callable, the multiple of M it takes)]: block-FP8
    GEMMs outside Triton. The scale layouts torch._scaled_mm takes differ between torch
    versions, so several are tried; per family the first that computes the right answer is
    timed. A build pads M up to its multiple (the output sliced back), outside the timing."""
    import torch
    mult = BLOCK_SCALED_M_MULTIPLE

    def scaled_mm(sa, sb):
        def build(i):
            M = i["A"].shape[0]
            rows = -(-M // mult) * mult
            A, As = padded_rows(i["A"], rows), padded_rows(sa(i), rows)
            B, Bs = i["B"].t(), sb(i)
            return lambda: torch._scaled_mm(A, B, scale_a=As, scale_b=Bs, out_dtype=torch.bfloat16)[:M]
        return build
    out = [("torch._scaled_mm", "As, Bs^T", scaled_mm(lambda i: i["As"], lambda i: i["Bs"].t()), mult),
           ("torch._scaled_mm", "As column-major, Bs^T",
            scaled_mm(lambda i: i["As"].t().contiguous().t(), lambda i: i["Bs"].t()), mult),
           ("torch._scaled_mm", "As column-major, Bs^T contiguous",
            scaled_mm(lambda i: i["As"].t().contiguous().t(), lambda i: i["Bs"].t().contiguous()), mult)]
    try:
        import deep_gemm

        def deep(i):
            C = torch.empty((i["A"].shape[0], i["B"].shape[0]), dtype=torch.bfloat16, device=i["A"].device)
            return lambda: (deep_gemm.fp8_gemm_nt((i["A"], i["As"]), (i["B"], i["Bs"]), C), C)[1]
        out.append(("DeepGEMM", "fp8_gemm_nt", deep, 1))
    except ImportError:
        pass
    return out


def check_reference(fn, inputs: dict, reference) -> str | None:
    """None when fn computes the GEMM right, else why not."""
    import torch
    try:
        got = fn().double()
    except Exception as e:  # noqa: BLE001 - an unsupported layout raises: that is the answer
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0][:160] if text else ''}"
    rel = (torch.linalg.vector_norm(got - reference) / torch.linalg.vector_norm(reference)).item()
    return None if rel <= 2e-2 else f"wrong result (relative error {rel:.2e})"


def reference_rows(kernel: KernelSpec, problem: Problem, M: int, floor: float, measurer,
                   candidates: str = CANDIDATES) -> list[BenchRow]:
    """The references outside Triton for one (problem, M), each variant checked and timed in
    the measuring child by a call of its own (reference_timing), like a Triton config: one
    that raises, poisons its CUDA context, aborts or hangs costs that variant alone (the
    child is replaced) and the next is tried in a fresh one. Per family, the first variant
    that computes the right answer is timed. Without a device (a replayed landscape), a note.
    `candidates`: the `module:function` listing them (gemm_reference_candidates)."""
    def note(contender: str, text: str) -> BenchRow:
        return BenchRow(kernel.source_label, problem.key, M, contender, None, None, None, floor, "-", text)
    if kernel.table_kind != "fp8_gemm":
        return [note("reference", reference_note(kernel))]
    if not hasattr(measurer, "run_here"):
        return [note("reference", "needs a GPU (" + reference_note(kernel) + ")")]
    source = time_source(measurer.environment(), measurer.label)
    try:
        names = measurer.run_here("tuner.jobs.bench_references:reference_names", candidates)
    except RuntimeError as e:
        return [note("reference", f"not timed: {e}")]
    rows: list[BenchRow] = []
    failed: dict[str, str | None] = {}
    for family, variant in names:
        if family in failed and failed[family] is None:
            continue                               # this family already has a working variant
        try:
            r = measurer.run_here("tuner.jobs.bench_references:reference_timing", problem, M, family, variant,
                                  candidates)
        except RuntimeError as e:                  # it took the measuring process down: that variant alone
            r = {"error": f"the measuring process was lost ({str(e).splitlines()[0][:160]})"}
        if r.get("time_us"):
            failed[family] = None
            rows.append(BenchRow(kernel.source_label, problem.key, M, r["contender"], None, r["time_us"],
                                 r.get("spread"), floor, source, None))
        else:
            failed[family] = (failed.get(family) or "") + f"{variant}: {r.get('error')}; "
    rows += [note(family, f"not usable here: {why.rstrip('; ')}") for family, why in failed.items() if why]
    if not any(f == "DeepGEMM" for f, _ in names):
        rows.append(note("DeepGEMM", "not importable here"))
    return rows


def reference_names(measurer, candidates: str = CANDIDATES) -> list[tuple[str, str]]:
    """In the measuring process: the (family, variant) of every reference its software has."""
    return [(family, variant) for family, variant, *_ in _load(candidates)()]


def _load(candidates: str):
    import importlib
    module, attr = candidates.split(":")
    return getattr(importlib.import_module(module), attr)


def reference_timing(measurer, problem: Problem, M: int, family: str, variant: str,
                     candidates: str = CANDIDATES) -> dict:
    """In the measuring process (DeviceMeasurer.run_here): one reference variant checked
    against the float64 reference and timed the device's way on the kernel's own input sets
    (CUDA graphs and events with the L2 flushed on a GPU; the wall clock on the CPU device):
    {"contender", "time_us", "spread"} or {"error"}. A CUDA error that poisons the context
    marks the measurer poisoned, so that the parent replaces this process after the call."""
    from tuner.measure.device_measurer import poisons_context
    from tuner.measure.timing import summarize
    kernel, device = measurer.kernel, measurer.device
    found = [c for c in _load(candidates)() if c[0] == family and c[1] == variant]
    if not found:
        return {"error": "not offered by this process's software"}
    _, _, build, multiple = found[0]
    sets = [kernel.make_inputs(problem.params, M, device.tensor_device, seed) for seed in range(measurer.input_sets)]
    padded = -(-M // multiple) * multiple
    label = f"{family} ({variant}" + (f"; M padded {M}->{padded}" if padded != M else "") + ")"
    why = check_reference(build(sets[0]), sets[0], kernel.reference(sets[0]))
    if why is None:
        try:
            t = summarize(device.time_runs([build(s) for s in sets], measurer.flush, measurer.reps))
        except Exception as e:  # noqa: BLE001 - a reference that runs once but not in a graph
            text = str(e).strip().splitlines()
            why = f"{type(e).__name__}: {text[0][:160] if text else ''}"
        else:
            return {"contender": label, "time_us": t.median_us, "spread": t.spread}
    if poisons_context(why):
        measurer.poisoned = True
        why = f"{why} (the CUDA context was lost: the measuring process is replaced)"
    return {"error": why}
