"""`tuner audit --numerics`: every distinct row an audited deployment uses, as the loader hands
it over, run on the engine's own kernel against the float64 reference (tuner check's
machinery): compiled on a GPU at the deployment's shapes, or in Triton's interpreter on a
small model's shapes.
"""

from __future__ import annotations

from typing import Any

from tuner.emit.audit import AuditReport, KernelAudit
from tuner.emit.audit_rules import Finding
from tuner.emit.engine_tables import (
    FolderFiles,
    Installation,
    WheelFiles,
)
from tuner.errors import TunerError


# -- --numerics: the rows in use on the engine's own kernel -------------------------------------------
def run_numerics(report: AuditReport, inst: Installation, numerics_model, seed: int, log=print) -> None:
    """Every distinct row in use (as the loader hands it over) on the engine's own kernel
    against the float64 reference, through tuner check's machinery. Without a GPU, in
    Triton's interpreter on `numerics_model`'s shapes (a small model); on a GPU, at the
    deployment's real shapes. Without a GPU, TRITON_INTERPRET=1 must be set before anything
    imports Triton's jit (the command line does)."""
    import os

    import torch

    from tuner.measure.device import device_name
    from tuner.measure.isolation import isolated_gpu_measurer
    from tuner.plan.gpus import resolve_gpu
    from tuner.plan.kernel_api import config_from_entry
    from tuner.plan.kernel_registry import kernel_for
    from tuner.plan.models import gemm_problems, moe_problems

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = "cuda" if on_gpu else "cpu"
    spec = resolve_gpu(None, device)
    origin = _code_origin(inst)
    report.header["numerics"] = (f"compiled on {device_name(device, spec)} at the deployment's shapes" if on_gpu
                                 else f"Triton's interpreter on the CPU device, on {numerics_model.name}'s shapes "
                                      "(no GPU here)")
    # Each kernel's rows run in an isolated measuring child (tuner/measure/isolation.py), as `tuner
    # check` runs them: a row that crashes it or poisons its CUDA context fails alone.
    measurers: dict[str, Any] = {}
    try:
        for i, ka in enumerate(report.kernels):
            if ka.table is None or not ka.rows:
                continue
            if ka.kind not in measurers:
                kernel = kernel_for(ka.kind, inst.engine, inst.engine, [origin], params=ka.problem.params)
                measurers[ka.kind] = isolated_gpu_measurer(kernel, spec.key, compile_workers=0, device=device)
            measurer = measurers[ka.kind]
            kernel = measurer.kernel
            problem = ka.problem if on_gpu else _small_problem(ka, numerics_model, moe_problems, gemm_problems)
            done: dict[tuple, dict] = {}
            for row in ka.rows:
                if row.get("loaded") is None:
                    continue
                config = config_from_entry(kernel, row["loaded"])
                ident = (row["key"], tuple(sorted(config.items())))
                if ident in done:
                    continue
                M = row["key"] if row["first"] <= row["key"] <= row["last"] else row["first"]
                case_seed = seed + len(done) + 100 * i
                check = measurer.check_numerics(problem, M, config, case_seed)
                status = "pass" if check.status == "passed" else "fail"
                entry = {"key": row["key"], "M": M, "status": status, "rel_error": check.rel_error,
                         "detail": check.detail or f"seed {case_seed}", "config": config, "problem": problem.key,
                         "kernel": kernel.source_label}
                done[ident] = entry
                ka.numerics.append(entry)
                rel = f"{check.rel_error:.2e}" if check.rel_error is not None else "-"
                log(f"numerics {status.upper():4s} rel {rel:>8s}  {ka.kind} {ka.part} key {row['key']} at M={M} "
                    f"on {problem.key}")
                if status != "pass":
                    what = f"rel. error {check.rel_error:.2e}" if check.rel_error is not None else "no result"
                    f = Finding("error", "numerics", f"key {row['key']} at M={M}: {what} ({entry['detail']}) on "
                                f"{kernel.source_label}'s kernel, {problem.key}", ka.where, [row["key"]])
                    ka.findings.append(f)
                    report.findings.append(f)
    finally:
        for m in measurers.values():
            m.close()


def _code_origin(inst: Installation) -> str:
    files = inst.files
    if files is None:
        raise TunerError(f"--numerics needs {inst.engine}'s kernel code: give --site-packages or --engine-source")
    if isinstance(files, WheelFiles):
        return str(files.wheel)
    assert isinstance(files, FolderFiles)
    return str(files.root / inst.engine)


def _small_problem(ka: KernelAudit, model, moe_problems, gemm_problems):
    """The small model's problem standing in for this table's: the same part of its MoE, or
    its GEMM shape with the largest K (so that K spans several weight blocks)."""
    params = ka.problem.params
    if ka.kind == "fused_moe":
        dtype = params["dtype"]
        candidates = [p for p in moe_problems(model, 1, 1, dtype, engines=[ka.family.engine])
                      if p.params.get("part") == params.get("part")]
    else:
        candidates = sorted(gemm_problems(model, 1, 1), key=lambda p: -p.params["K"])
    if not candidates:
        raise TunerError(f"--numerics-model {model.name} has no {ka.kind} problem to run {ka.title}'s rows on")
    return candidates[0]
