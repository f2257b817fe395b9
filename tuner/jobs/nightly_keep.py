"""A nightly retune's tables against the last night's: where the previous config is not slower than the
new one, both timed now in the same call, the previous one is kept (tied tables decide together), and the
new run's tables and manifest are written again from what was kept (`tuner nightly`, step 4)."""

from __future__ import annotations

from pathlib import Path

from tuner.paths import atomic_write_json, atomic_write_text


def _tables_of(run: Path) -> dict:
    from tuner.emit.results import read_manifest, table_file_key
    manifest = read_manifest(run)
    return {table_file_key(t): t for t in manifest["tables"]}


def _engines(table: dict) -> tuple:
    return tuple(sorted(map(str, table.get("files") or {})))


def keep_better(prev_run: Path, new_run: Path, job: dict, noise: float) -> int:
    """Where the previous config is not slower than the new one now, keep it (tied tables
    decide together). Rewrites the new run's tables and manifest; returns how many entries
    were kept."""
    from tuner.emit.results import table_json
    from tuner.jobs.drift import Measurers
    from tuner.jobs.nightly_modes import run_landscape
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_api import table_entry
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.problems import Problem
    from tuner.search.runner import StudyRunner
    old, new = _tables_of(prev_run), _tables_of(new_run)
    measurers = Measurers(get_gpu(job["gpu"]), run_landscape(job, new_run), kernel_source=job.get("kernel_source"),
                          engine_source=job.get("engine_source"))
    kept = 0
    try:
        # a tied table's group: the table of the problem it is tied to, for the same engines' files
        by_problem_key = {(Problem(t["kernel"], t["problem"]).key, _engines(t)): k for k, t in new.items()}
        groups: dict[str, list[str]] = {}
        for k, t in new.items():
            root = by_problem_key.get((t.get("tied_to"), _engines(t)), k) if t.get("tied_to") else k
            groups.setdefault(root, []).append(k)
        for keys in groups.values():
            if any(k not in old for k in keys):
                continue          # nothing to compare: keep the new one
            first = new[keys[0]]
            # the kernel that timed the table: the engine's own, or ours
            engine = next(iter(first.get("files") or {"tuner": None}))
            kernel = measurers.kernel(first["kernel"], engine, first["problem"])
            measure = measurers(kernel)
            for M in sorted(set.intersection(*(set(new[k]["entries"]) & set(old[k]["entries"]) for k in keys)), key=int):
                prev_total = new_total = 0.0
                timed = []
                for k in keys:
                    problem = Problem(kernel.name, new[k]["problem"])
                    a, b = old[k]["entries"][M]["config"], new[k]["entries"][M]["config"]
                    if not a or not b:
                        break
                    ma, mb = measure.measure(problem, int(M), [a, b])
                    if ma.time_us is None or mb.time_us is None:
                        break
                    prev_total += ma.time_us
                    new_total += mb.time_us
                    timed.append((k, a, ma))
                else:
                    if new_total >= prev_total * (1 - noise):
                        for k, a, ma in timed:
                            e = new[k]["entries"][M]
                            e.update({"config": a, "time_us": ma.time_us, "spread": ma.spread, "kept_previous": True,
                                      "speedup": (e["default_time_us"] / ma.time_us
                                                  if e.get("default_time_us") else None)})
                        kept += 1
    finally:
        measurers.close()
    # rewrite every table of the new run from its (possibly updated) entries
    own_format: dict[str, list] = {}
    for t in new.values():
        kernel = measurers.kernel(t["kernel"], next(iter(t.get("files") or {"tuner": None})), t["problem"])
        if kernel.emit_table is not None:          # one file may hold several problems
            problem = Problem(kernel.name, t["problem"])
            results = [StudyRunner.result_from_dict(problem, int(m), e) for m, e in t["entries"].items()]
            own_format.setdefault(kernel.name, []).append((problem, results))
            continue
        table = {int(m): table_entry(kernel, e["config"], t["problem"]) for m, e in t["entries"].items()
                 if e.get("config")}
        for rel in t["files"].values():
            atomic_write_text(new_run / rel, table_json(table), root=new_run)
    for name, pairs in own_format.items():
        tables, _ = get_kernel(name).emit_table(pairs, measurers.gpu.cuda_name)
        for rel, obj in tables.items():
            atomic_write_json(new_run / rel, obj, root=new_run)
    from tuner.emit.results import read_manifest
    manifest = read_manifest(new_run)
    manifest["tables"] = list(new.values())
    atomic_write_json(new_run / "manifest.json", manifest, indent=2, root=new_run)
    return kept
