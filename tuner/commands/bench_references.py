"""`tuner bench`'s references outside Triton: the implementations the device's software has
for a problem (GEMM: torch._scaled_mm with block scales, DeepGEMM if importable), checked
against the float64 reference and timed in the measuring process, each as a bench row."""

from __future__ import annotations

from typing import Callable

from tuner.commands.bench_output import BenchRow
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


def gemm_reference_candidates() -> list[tuple[str, str, Callable[[dict], Callable[[], object]]]]:
    """[(family, variant, build(inputs) -> callable)]: block-FP8 GEMMs outside Triton. The
    scale layouts torch._scaled_mm takes differ between torch versions, so several are tried;
    per family the first that computes the right answer is timed."""
    import torch

    def scaled_mm(sa, sb):
        return lambda i: (lambda: torch._scaled_mm(i["A"], i["B"].t(), scale_a=sa(i), scale_b=sb(i),
                                                   out_dtype=torch.bfloat16))
    out = [("torch._scaled_mm", "As, Bs^T", scaled_mm(lambda i: i["As"], lambda i: i["Bs"].t())),
           ("torch._scaled_mm", "As column-major, Bs^T",
            scaled_mm(lambda i: i["As"].t().contiguous().t(), lambda i: i["Bs"].t())),
           ("torch._scaled_mm", "As column-major, Bs^T contiguous",
            scaled_mm(lambda i: i["As"].t().contiguous().t(), lambda i: i["Bs"].t().contiguous()))]
    try:
        import deep_gemm

        def deep(i):
            C = torch.empty((i["A"].shape[0], i["B"].shape[0]), dtype=torch.bfloat16, device=i["A"].device)
            return lambda: (deep_gemm.fp8_gemm_nt((i["A"], i["As"]), (i["B"], i["Bs"]), C), C)[1]
        out.append(("DeepGEMM", "fp8_gemm_nt", deep))
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


def reference_rows(kernel: KernelSpec, problem: Problem, M: int, floor: float, measurer) -> list[BenchRow]:
    """The references outside Triton for one (problem, M): timed in the measuring child
    (reference_timings), so that a reference that crashes or poisons its CUDA context takes
    down only that child; without a device (a replayed landscape), a note."""
    if kernel.table_kind != "fp8_gemm":
        return [BenchRow(kernel.source_label, problem.key, M, "reference", None, None, None, floor, "-",
                         reference_note(kernel))]
    if not hasattr(measurer, "run_here"):
        return [BenchRow(kernel.source_label, problem.key, M, "reference", None, None, None, floor, "-",
                         "needs a GPU (" + reference_note(kernel) + ")")]
    source = time_source(measurer.environment(), measurer.label)
    try:
        timed = measurer.run_here("tuner.commands.bench_references:reference_timings", problem, M)
    except RuntimeError as e:
        return [BenchRow(kernel.source_label, problem.key, M, "reference", None, None, None, floor, "-",
                         f"not timed: {e}")]
    return [BenchRow(kernel.source_label, problem.key, M, r["contender"], None, r.get("time_us"), r.get("spread"),
                     floor, source if r.get("time_us") else "-", r.get("error")) for r in timed]


def reference_timings(measurer, problem: Problem, M: int) -> list[dict]:
    """In the measuring process (DeviceMeasurer.run_here): every block-FP8 GEMM outside
    Triton that computes this problem right, timed the device's way on the kernel's own
    input sets (CUDA graphs and events with the L2 flushed on a GPU; the wall clock on the
    CPU device). Per family, the first variant that computes the right answer is timed. A
    CUDA error that poisons the context stops the rest, each said in one line, and the
    measuring child is replaced after this call."""
    from tuner.measure.device_measurer import poisons_context
    from tuner.measure.timing import summarize
    kernel, device = measurer.kernel, measurer.device
    sets = [kernel.make_inputs(problem.params, M, device.tensor_device, seed) for seed in range(measurer.input_sets)]
    reference = kernel.reference(sets[0])
    out: list[dict] = []
    tried: dict[str, str | None] = {}
    lost = None
    for family, variant, build in gemm_reference_candidates():
        if family in tried and tried[family] is None:
            continue                               # this family already has a working variant
        if lost:
            tried[family] = (tried.get(family) or "") + f"{variant}: not run, {lost}; "
            continue
        why = check_reference(build(sets[0]), sets[0], reference)
        if why is None:
            try:
                t = summarize(device.time_runs([build(s) for s in sets], measurer.flush, measurer.reps))
            except Exception as e:  # noqa: BLE001 - a reference that runs once but not in a graph
                text = str(e).strip().splitlines()
                why = f"{type(e).__name__}: {text[0][:160] if text else ''}"
            else:
                tried[family] = None
                out.append({"contender": f"{family} ({variant})", "time_us": t.median_us, "spread": t.spread})
                continue
        tried[family] = (tried.get(family) or "") + f"{variant}: {why}; "
        if poisons_context(why):
            lost, measurer.poisoned = f"the CUDA context was lost ({why})", True
    out += [{"contender": family, "error": f"not usable here: {why.rstrip('; ')}"}
            for family, why in tried.items() if why]
    if not any(f == "DeepGEMM" for f, _, _ in gemm_reference_candidates()):
        out.append({"contender": "DeepGEMM", "error": "not importable here"})
    return out
