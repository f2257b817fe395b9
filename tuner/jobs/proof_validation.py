"""The GPU run's validation list, and which of its cases a call runs again.

A case is one kernel (ours or an engine's, with its code hash) at one problem and batch size with
one config (the default, or a shipped table's entry), checked against its float64 reference and
timed (scripts/validate_kernels.py). Its identity adds what it ran on: the GPU model, Triton and
torch. bench/validated.json records every case that passed on a GPU under its identity, and the
run it passed in (scripts/record_validation.py adds a run's; scripts/commit_gpu_proof.sh calls it).
A case recorded as passed under the same identity is not run again (`--recorded`): a change of the
GPU model, Triton, torch or the kernel's code runs it. The first case of each kernel source (a
canary) always runs, so every call still checks its machine and each engine's path on it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.errors import TunerError
from tuner.paths import REPO_ROOT

LEDGER = REPO_ROOT / "bench" / "validated.json"
FORMAT = "tuner-validated/1"
# what a case is, and what it ran on: a recorded case is the same only when all of these are
IDENTITY = ("device", "triton", "torch", "kernel", "kernel_source", "code_version", "problem", "M", "case", "config")
CANARY, RECORDED, RUN = "canary", "recorded", "run"


def identity(row: dict) -> dict:
    """A case's identity from a row of scripts/validate_kernels.py (or a ledger entry)."""
    missing = [k for k in IDENTITY if row.get(k) in (None, "")]
    if missing:
        raise TunerError(f"a validation case without its {', '.join(missing)}: not recordable")
    return {k: row[k] for k in IDENTITY}


def key(ident: dict) -> str:
    return json.dumps([ident[k] for k in IDENTITY], sort_keys=True)


def read_ledger(path: Path = LEDGER) -> dict[str, dict]:
    """{identity key: entry} of the cases recorded as passed; {} when there is no ledger."""
    from tuner.reading import read_json_file
    if not path.exists():
        return {}
    data = read_json_file(path, "the validation record ")
    cases = data.get("cases") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise TunerError(f"{path} is not a record of validated cases (\"format\": \"{FORMAT}\")")
    out = {}
    for c in cases:
        try:
            out[key(identity(c))] = c
        except TunerError as e:
            raise TunerError(f"{path}: {e}") from None
    return out


def decide(idents: list[dict], ledger: dict[str, dict]) -> list[str]:
    """Per case, in run order: CANARY (the first case of its kernel source: always runs),
    RECORDED (passed before under the same identity: not run again), or RUN."""
    seen: set[str] = set()
    out = []
    for ident in idents:
        source = str(ident["kernel_source"]).split()[0]
        if source not in seen:
            seen.add(source)
            out.append(CANARY)
        else:
            out.append(RECORDED if key(ident) in ledger else RUN)
    return out


def record(rows: list[dict], run: str, path: Path = LEDGER) -> tuple[int, int]:
    """Add the passed, timed cases of `rows` (a run's validation, each with its identity) to the
    ledger at `path`, as passed in `run`; (added, already there). A case that failed there is
    removed from the ledger: its identity passed before and fails now, so it runs again."""
    from tuner.paths import atomic_write_json
    ledger = read_ledger(path)
    added = kept = 0
    for row in rows:
        try:
            k = key(identity(row))
        except TunerError:
            continue                      # a row from before identities were written: see --assume-code
        if row.get("recorded"):
            continue                      # skipped there, recorded before
        passed = (row.get("numerics") or {}).get("status") == "passed" and bool(row.get("time_us"))
        if not passed:
            ledger.pop(k, None)
        elif k in ledger:
            kept += 1
        else:
            ledger[k] = {**identity(row), "run": run, "rel_error": (row.get("numerics") or {}).get("rel_error"),
                         "time_us": row.get("time_us"),
                         **({"code_version_from": row["code_version_from"]} if row.get("code_version_from") else {})}
            added += 1
    atomic_write_json(path, {"format": FORMAT, "cases": sorted(ledger.values(), key=lambda c: key(identity(c)))},
                      indent=1)
    return added, kept


# -- the list ----------------------------------------------------------------------------
# Issue 52: one case of each integer MoE precision on each engine kernel that runs it, at the
# model's shapes: (--dtype, the quantization_config the weights are read as; None: the model's
# own, where an FP8 block checkpoint gives INT8 its blocks and W8A16 is per channel).
MOE_PRECISION_CASES = (("int8_w8a8", None), ("int8_w8a8", {"quant_method": "w8a8_int8"}), ("int8_w8a16", None),
                       ("int8_w8a16", {"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": True}),
                       ("int4_w4a16", {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}))


def precision_case_problems(model, tp: int, engine: str) -> list:
    """The first MoE problem of each MOE_PRECISION_CASES precision `engine` runs (SGLang: its up
    table), the model's checkpoint read as that case's quantization_config."""
    import dataclasses

    from tuner.plan.engines import ENGINES
    from tuner.plan.models import moe_problems
    from tuner.plan.precision import moe_precision
    out = []
    for dtype, qc in MOE_PRECISION_CASES:
        m = model if qc is None else dataclasses.replace(model, raw={**model.raw, "quantization_config": qc},
                                                         weight_block_size=None)
        if (dtype, moe_precision(m, dtype).scheme) in ENGINES[engine].moe_precisions:
            out += moe_problems(m, tp, 1, dtype, engines=[engine])[:1]
    return out


def cases(source: str, model, tp: int, only: list[str] | None, batch_sizes: list[int] | None):
    """(problem, engine, batch sizes) whose tables `source` times."""
    from tuner.plan.models import gemm_problems, mla_problems, moe_problems

    def wanted(p) -> bool:
        return not only or any(text in p.key for text in only)
    for p in gemm_problems(model, tp):
        if not wanted(p):
            continue
        for engine in (p.engines if source == "ours" else [e for e in p.engines if e == source]):
            yield p, engine, batch_sizes or [1, 64, 1024]
            if source == "ours":
                break                      # one shared table: one case
    for p in moe_problems(model, tp, 1, "fp8_w8a8"):
        if source in ("ours", p.engines[0]) and wanted(p):
            yield p, p.engines[0], batch_sizes or [1, 64, 512]
    if source != "ours":        # issue 52: one case of each integer precision on the engine's kernel
        for p in precision_case_problems(model, tp, source):
            if wanted(p):
                yield p, source, (batch_sizes or [64])[-1:]
    if source == "ours" and model.is_mla:
        for p in mla_problems(model, tp, [4096, 32768], 64)[0]:
            if wanted(p):
                yield p, "tuner", batch_sizes or [1, 32]


def table_cases(paths: list[str], model, tp: int, batch_sizes: list[int] | None):
    """(engine, problem, M, config, label) of each shipped table's entries at `batch_sizes`
    (default 1, 256), on the model's shapes (`tuner check`'s reading of a table)."""
    from tuner.jobs.check import pick_batch_sizes, read_table, table_problems
    from tuner.plan.kernel_api import checked_config
    from tuner.plan.kernel_registry import get_kernel
    from tuner.plan.models import moe_problems
    for path in map(Path, paths):
        if not path.is_file():
            raise TunerError(f"table {path} not found")
        table = read_table(path)
        engine, work, _ = table_problems("fused_moe", path, table, model,
                                         lambda m, e: moe_problems(m, tp, 1, "fp8_w8a8", "uniform", [e]),
                                         "uniform", None)
        spec = get_kernel("fused_moe", engine, load_code=False)
        for problem, entries in work:
            for M, entry in pick_batch_sizes(entries, batch_sizes or [1, 256]).items():
                yield engine, problem, M, checked_config(spec, entry, f"{path}: the entry for M={M}"), \
                    f"shipped {path.name}"


def groups(sources: list[str], model, tp: int, only: list[str] | None, batch_sizes: list[int] | None,
           tables: list[str] | None, engine_source: list[str] | None, log=print) -> list[tuple]:
    """[(source, kernel, [(problem, M, config, label)])] in the order they run: the engines'
    kernels before ours, the MoE layer (what the proof tunes) before the GEMMs, so that a
    validation cut by its time box loses the least valuable cases."""
    from tuner.plan.kernel_registry import kernel_for
    shipped = list(table_cases(tables or [], model, tp, batch_sizes))
    for engine in sorted({e for e, *_ in shipped} - set(sources)):
        log(f"note: the {engine} tables are not checked: --kernel-source has no {engine}")
    out = []
    for source in sources:
        by_kernel: dict = {}
        for problem, engine, ms in cases(source, model, tp, only, batch_sizes):
            kernel = kernel_for(problem.kernel, engine, source, engine_source, params=problem.params)
            # a launcher's variant (the integer MoE precisions) is a kernel of its own: a group of its own
            by_kernel.setdefault((kernel.name, kernel.variant), (kernel, []))[1].extend(
                (problem, M, kernel.default_config(problem.params, M), "default") for M in ms)
        for engine, problem, M, cfg, label in shipped:
            if engine == source:
                kernel = kernel_for("fused_moe", engine, source, engine_source)
                by_kernel.setdefault((kernel.name, kernel.variant), (kernel, []))[1].append((problem, M, cfg, label))
        out += [(source, kernel, work) for kernel, work in by_kernel.values()]
    out.sort(key=lambda g: (g[0] == "ours", g[1].name != "fused_moe"))
    return out


def case_identity(kernel, problem, M: int, cfg: dict, label: str, on: dict) -> dict:
    """A case's identity; `on`: the device, Triton and torch it runs on."""
    return {"device": on["device"], "triton": on["triton"], "torch": on["torch"], "kernel": kernel.name,
            "kernel_source": kernel.source_label, "code_version": kernel.code_version, "problem": problem.key,
            "M": M, "case": label, "config": cfg}
