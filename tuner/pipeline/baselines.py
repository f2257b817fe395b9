"""--baseline: the table a run's studies must beat, from an earlier run of ours or the engines'
shipped files; read and checked before anything is written, and seeded into every study."""

from __future__ import annotations

from pathlib import Path

from tuner.emit.results import MANIFEST, read_manifest
from tuner.errors import TunerError
from tuner.pipeline.run_plan import RunPlan
from tuner.plan.engines import ENGINES
from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import KernelSpec
from tuner.plan.problems import Problem


def load_baseline_table(baseline_dir: str, kernel: KernelSpec, gpu: GpuSpec, problem: Problem) -> dict | None:
    """The table to beat for this problem and GPU: from an earlier run of ours (its
    manifest: the table of the same kernel, problem and engine), or the engines' shipped
    file (searched recursively; the problem's own engines' file names first)."""
    root = Path(baseline_dir)
    if (root / MANIFEST).is_file():
        manifest = read_manifest(root)
        for t in manifest.get("tables", []) if manifest.get("gpu") == gpu.key else []:
            if (t.get("kernel") == kernel.name and Problem(t["kernel"], t["problem"]).key == problem.key
                    and set(t.get("files") or {}) & set(problem.engines or ENGINES)):
                table = {m: e["config"] for m, e in t.get("entries", {}).items() if e.get("config")}
                if table:
                    return table
    # The problem's own engines' file names first (SGLang's up and _down tables, vLLM's).
    order = [e for e in problem.engines if e in ENGINES] + [e for e in ENGINES if e not in problem.engines]
    names = [ENGINES[e].table_relpath(kernel.table_kind, problem.params, gpu.cuda_name, "0.0.0")
             .rsplit("/", 1)[-1] for e in order]
    # Of one name in several triton_<version> folders, the newest first (as SGLang falls back).
    files = sorted(root.rglob("*.json"), reverse=True)
    for path in sorted((p for p in files if p.name in names), key=lambda p: names.index(p.name)):
        from tuner.reading import read_json_file
        try:
            table = read_json_file(path, "baseline table ")
        except TunerError as e:
            raise TunerError(f"{e} (not readable JSON)") from None
        if not isinstance(table, dict):
            raise TunerError(f"baseline table {path} is not a JSON object of batch sizes and configs")
        return {k: v for k, v in table.items() if k != "triton_version"}
    return None


def check_baselines(opts: RunPlan) -> None:
    """--baseline's tables, read and checked before anything is written."""
    if not opts.baseline:
        return
    from tuner.plan.kernel_api import checked_config, table_batch_size
    for problem in opts.problems:
        table = load_baseline_table(opts.baseline, opts.kernel, opts.gpu, problem)
        for key, entry in (table or {}).items():
            where = f"--baseline {opts.baseline}: the table for {problem.key} has an unusable entry {str(key)[:40]!r}"
            table_batch_size(key, where)
            checked_config(opts.kernel, entry, where)
