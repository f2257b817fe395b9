"""A table's configs run on a chosen kernel against the float64 reference (`tuner check`, the GPU run's validation).

Before a table goes into a new engine version, or as the first step of a GPU run: each
(problem, M) entry of the table runs on fresh random inputs into a NaN-poisoned output, and
its relative error is compared with the kernel's tolerance. On a GPU the compiled kernel
runs; without one, Triton's interpreter (slow: a small model keeps it fast).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TunerError
from tuner.paths import read_json
from tuner.plan.engines import ENGINE_NAMES
from tuner.plan.gpus import resolve_gpu
from tuner.plan.problems import Problem


@dataclass
class CheckRow:
    problem: Problem
    M: int
    config: dict
    status: str              # "pass", "fail"
    rel_error: float | None
    detail: str
    seconds: float


def read_table(path: Path) -> dict:
    obj = read_json(path, "table ")
    if not isinstance(obj, dict) or not obj:
        raise TunerError(f"table {path} is not a JSON object of batch sizes and configs")
    return obj


def entries_of(table: dict, path: Path) -> dict[int, dict]:
    """{M: config} of an engine's table (the 'triton_version' key vLLM's tuner writes is skipped)."""
    out = {}
    for key, cfg in table.items():
        if key == "triton_version":
            continue
        from tuner.plan.kernel_api import table_batch_size
        m = table_batch_size(key, f"table {path}")
        if not isinstance(cfg, dict):
            raise TunerError(f"table {path}: the entry for M={key} is not a config object")
        out[m] = cfg
    return out


def pick_batch_sizes(entries: dict[int, dict], wanted: list[int] | None) -> dict[int, dict]:
    """Every M of the table, or the given ones with the entry the engine would use for them."""
    if not wanted:
        return dict(sorted(entries.items()))
    from tuner.plan.engines import lookup_nearest
    table = {str(m): c for m, c in entries.items()}
    return {m: lookup_nearest(table, m) for m in sorted(set(wanted))}


def table_problems(kernel_name: str, table_path: Path, table: dict, model, make_problems, routing: str,
                   engine_hint: str | None) -> tuple[str, list[tuple[Problem, dict]], list[str]]:
    """(the engine whose table it is, [(problem, {M: config})], notes). The problems come from
    the model (make_problems(model, engine), as the tuning commands make them); the table's
    file name picks which of them it is for, or, where the model has no such shape (a small
    model for a CPU check), the table's configs are run on every one of them."""
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.table_files import parse_table_file

    kernel = get_kernel(kernel_name)
    if kernel.read_table is not None:                # our own format (MLA decode): problems inside
        held = kernel.read_table(table)
        if not held:
            raise TunerError(f"{table_path} is not a {kernel_name} table of ours (format {table.get('format')!r})")
        return "tuner", [(Problem(kernel_name, params, engines=("tuner",)), rows) for params, rows in held], []
    entries = entries_of(table, table_path)
    read_as = parse_table_file(table_path, model, routing)
    parsed = [t for t in read_as if t.problem.kernel == kernel_name]
    if read_as and not parsed:
        # its file name is the engines' name of another kernel's table: its rows would be run as this
        # kernel's configs and pass (found by a new-user pass: a fused MoE table checked as a GEMM's)
        from tuner.pipeline.request import KERNEL_OF
        other = read_as[0].problem.kernel
        flag = next((c for c, k in KERNEL_OF.items() if k == other), other)
        raise TunerError(f"--table {table_path.name} is named as {read_as[0].engine}'s {other} table, not a {kernel_name} "
                         f"one: give --kernel {flag}")
    engine = parsed[0].engine if parsed else (engine_hint or "vllm")
    # SGLang's `_down` file is the down projection's table; any other, the layer's or the up one's.
    part = parsed[0].problem.params.get("part") if parsed else None
    candidates = [p for p in make_problems(model, engine) if engine in p.engines]
    candidates = [p for p in candidates if part is None or p.params.get("part") == part] or candidates
    notes: list[str] = []
    if parsed:
        named = parsed[0].problem.params
        same = [p for p in candidates if all(p.params.get(k) == named[k] for k in ("E", "N", "K") if k in named)]
        if same:
            return engine, [(p, entries) for p in same], notes
        # name the shape as the file does (only what the engine keys it by), not as parsed with this model
        shape = ",".join(f"{k}={named[k]}" for k in ("E", "N", "K") if k in named and f"{k}=" in Path(table_path).name)
        notes.append(f"the table is for {shape or Path(table_path).name}, which {model.name} does not run; "
                     f"its configs run on {model.name}'s shapes instead")
    return engine, [(p, entries) for p in candidates], notes


def run_check(kernel_name: str, table_path: Path, model, make_problems, routing: str,
              source: str, origins: list[str] | None, batch_sizes: list[int] | None, seed: int | None,
              log=print, device: str | None = None, gpu: str | None = None) -> list[CheckRow]:
    """Check every (problem, M) of the table on the chosen kernel; log one line each. The
    kernel runs in an isolated measuring child (tuner/measure/isolation.py) on a GPU or the CPU
    device, so a config that crashes the child, hangs or poisons its CUDA context fails its
    own line and the next runs in a fresh child."""
    from tuner.measure.device import device_name, require
    from tuner.measure.isolation import isolated_gpu_measurer
    from tuner.plan.kernel_api import checked_config
    from tuner.plan.kernel_registry import kernel_for

    device = device or default_device()
    spec = resolve_gpu(gpu, device)
    require(device, spec, "checking a table on the GPU", "--device cpu runs it in Triton's interpreter")
    table = read_table(table_path)
    hint = source if source in ENGINE_NAMES else None
    engine, work, notes = table_problems(kernel_name, table_path, table, model, make_problems, routing, hint)
    kernel = kernel_for(kernel_name, engine, source, origins, params=work[0][0].params if work else None)
    log(f"kernel: {kernel.description} [{kernel.source_label}" + (f", {kernel.origin}]" if kernel.origin else "]"))
    log("device: " + (device_name(device, spec) if device == "cuda"
                      else f"{device_name(device, spec)}: Triton's interpreter (slow; a small model keeps it fast)"))
    for note in notes:
        log(f"note: {note}")
    plan = []
    base_seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    for problem, entries in work:
        for i, (M, entry) in enumerate(pick_batch_sizes(entries, batch_sizes).items()):
            config = checked_config(kernel, entry, f"{table_path}: the entry for M={M}")
            plan.append((problem, M, config, base_seed + i))
    rows = []
    measurer = isolated_gpu_measurer(kernel, spec.key, compile_workers=0, device=device)
    try:
        for problem, M, config, case_seed in plan:
            t0 = time.monotonic()
            check = measurer.check_numerics(problem, M, config, case_seed)
            row = CheckRow(problem, M, config, "pass" if check.status == "passed" else "fail", check.rel_error,
                           check.detail or f"seed {case_seed}", time.monotonic() - t0)
            rows.append(row)
            rel = f"{row.rel_error:.2e}" if row.rel_error is not None else "-"
            log(f"{row.status.upper():4s}  rel {rel:>8s}  M={M:<5d} {problem.key}  "
                f"{' '.join(f'{k}={v}' for k, v in config.items())}  ({row.detail}; {row.seconds:.1f}s)")
    finally:
        measurer.close()
    return rows


def default_device() -> str:
    """cuda where a GPU is visible, else the CPU device."""
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


