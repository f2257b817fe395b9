"""The end of a run (and `tuner collect`): the studies' stored results become each engine's
tables and the manifest (tuner/emit/results.py), tied tables written together, traffic-keyed
tables keeping the default where the tuned config does not beat it, every table just written
checked by the audit's table rules (tuner/emit/audit.py) and by the engine's own loader."""

from __future__ import annotations

import logging
from pathlib import Path

from optuna.storages import BaseStorage

from tuner.emit.results import copied_tied_tables, manifest_entry, remove_tables, update_manifest, write_tables
from tuner.errors import TunerError
from tuner.measure.environment import software_versions
from tuner.paths import atomic_write_json
from tuner.pipeline.run_plan import RunPlan
from tuner.pipeline.studies import by_key, stored_result, wait_for_result
from tuner.plan.problems import Problem
from tuner.search.runner import StudyResult, StudyRunner

log = logging.getLogger("tuner")


def collect(opts: RunPlan, storage: BaseStorage, quiet: bool = False, wait: bool = False) -> dict[str, list[StudyResult]]:
    """Write the tables and the manifest from the studies' stored results (tuner collect,
    and the end of every run); returns the rows written as tuned, as the files hold them (a
    study finished whose tied partner has not is not among them: its row holds the incumbent
    until both are). Batch sizes whose study has not finished are left out."""
    results: dict[str, list[StudyResult]] = {}
    envs, labels, identities = [], set(), []
    missing = 0
    for problem in opts.problems:
        rs = []
        for M in sorted(opts.ms_for(problem)):
            d = wait_for_result(storage, opts, problem, M) if wait else stored_result(storage, opts, problem, M)
            if d is None:
                missing += 1
                continue
            envs.append(d.pop("environment"))
            labels.add(d.pop("measured_by") or "")
            identities.append(d.pop("identity"))
            rs.append(StudyRunner.result_from_dict(problem, M, d))
        if rs:
            results[problem.key] = rs
    env: dict = next((e for e in envs if e), {})
    run_info = {**opts.run_info, "gpu": opts.gpu.key, "measured_by": ", ".join(sorted(x for x in labels if x)),
                "environment": env, "identity": next((i for i in identities if i), None),
                "search": {"sampler": opts.settings.sampler, "budget": opts.settings.budget,
                           "patience": opts.settings.patience, "space": opts.space.source,
                           **({"budgets": opts.settings.budgets} if opts.settings.budgets else {})}}
    from tuner.search.warm_start import summary
    run_info["warm_start"] = summary(opts.warm, ((r.search or {}).get("seeds") or {} for rs in results.values() for r in rs))
    earlier = _searched_otherwise(opts, results)
    if earlier:
        run_info["search"]["earlier_runs"] = earlier
        if not quiet:
            log.warning("%s", "; ".join(f"{e['studies']} studies were finished by an earlier run searching with "
                                        f"--trials {e['budget']} --sampler {e['sampler']}" for e in earlier)
                        + f": kept as they are (this run: --trials {opts.settings.budget} --sampler "
                        f"{opts.settings.sampler}); give another --out to tune them again with this run's")
    if opts.traffic is not None and opts.kernel.emit_table is None:
        results = _prefer_defaults(opts, results)
    written = with_incumbents(opts, results)
    done = [p for p in opts.problems if p.key in written]
    if opts.kernel.emit_table is not None:
        if done:
            _emit_own_format(opts, done, written, run_info)
    else:
        from tuner.emit.run_findings import RunFindings
        keys = by_key(opts)
        planned = {m for p in opts.problems for m in opts.ms_for(p)}
        findings = None if quiet else RunFindings(planned)
        if findings is not None and opts.replay and set(opts.batch_sizes) - planned:
            # the batch sizes were the landscape's, not the command's (tuner/pipeline/replay_coverage.py)
            findings.advice = ("the landscape replayed times no others: the engines' grid needs a landscape "
                               "recorded at its batch sizes (--record on a GPU)")
        entries: list[dict] = []
        try:
            for problem in done:
                # Tables tied together are written together, over the batch sizes both have.
                if problem.tied_to or any(q.tied_to == problem.key for q in opts.problems):
                    if not problem.tied_to or problem.tied_to not in written:
                        continue
                    group = [keys[problem.tied_to], problem]
                else:
                    group = [problem]
                entries += _emit(opts, group, [written[p.key] for p in group], env, run_info, findings)
        finally:
            # the manifest once for all the tables written (not once a table: a run collects after
            # every study, and the manifest grows with the run)
            if entries:
                update_manifest(opts.out_dir, {k: v for k, v in run_info.items() if k not in ("environment", "identity")},
                                entries)
        for line in findings.lines() if findings is not None else []:
            log.warning("%s", line)
    if missing and not quiet:
        log.warning("%d studies have no result yet; their rows keep the incumbent (the row the engine reads "
                    "today)", missing)
    # what the files hold as tuned (never a row written as the incumbent: the closing table shows these)
    return {k: tuned for k, rs in written.items() if (tuned := [r for r in rs if r.stopped != NOT_TUNED])}


def _searched_otherwise(opts: RunPlan, results: dict[str, list[StudyResult]]) -> list[dict]:
    """The studies of these results searched (by an earlier run into the same storage) with
    another budget or sampler than this run's, counted by those settings: the manifest says
    so, so that it never claims a budget its studies did not have."""
    by: dict[tuple, int] = {}
    for rs in results.values():
        for r in rs:
            s = r.search or {}
            budget = opts.settings.budget_for(r.problem, r.M)
            if s and (s.get("budget") != budget or s.get("sampler") != opts.settings.sampler):
                key = (s.get("budget"), s.get("sampler"))
                by[key] = by.get(key, 0) + 1
    return [{"budget": b, "sampler": s, "studies": n} for (b, s), n in sorted(by.items(), key=str)]


def _prefer_defaults(opts: RunPlan, results: dict[str, list[StudyResult]]) -> dict[str, list[StudyResult]]:
    """Traffic-keyed tables: the default where the tuned config does not beat it (each table
    alone, or SGLang's up table with the `_down` table tied to it: results.prefer_defaults)."""
    from tuner.emit.results import prefer_defaults
    out = dict(results)
    for p in opts.problems:
        if p.tied_to or p.key not in results:
            continue
        group = [p] + [q for q in opts.problems if q.tied_to == p.key and q.key in results]
        for q, rs in zip(group, prefer_defaults(opts.kernel, group, [results[q.key] for q in group])):
            out[q.key] = rs
    return out


def _emit_own_format(opts: RunPlan, done: list[Problem], all_results: dict, run_info: dict) -> None:
    """Kernels that no engine reads tables for write their own files (rewritten as each
    problem finishes, so a stopped run keeps what it has)."""
    pairs = [(p, all_results[p.key]) for p in done]
    emit = opts.kernel.emit_table
    if emit is None:                # only called for own-format kernels (see tune_run)
        return
    tables, file_of = emit(pairs, opts.gpu.cuda_name)
    for rel, obj in tables.items():
        atomic_write_json(opts.out_dir / rel, obj, root=opts.out_dir)
    entries = [_entry(opts, p, results, {"tuner": file_of[p.key]} if p.key in file_of else {}, run_info)
               for p, results in pairs]
    update_manifest(opts.out_dir, {k: v for k, v in run_info.items() if k not in ("environment", "identity")}, entries)


def _emit(opts: RunPlan, group: list[Problem], group_results: list[list[StudyResult]], env: dict,
          run_info: dict, findings=None) -> list[dict]:
    """Write one group's tables (a table, or tables tied together); returns their manifest entries."""
    if len(group) > 1:
        common = set.intersection(*({r.M for r in rs if r.config} for rs in group_results))
        # tied tables are written together where they agree on the keys they share (a tied
        # study not chosen with its partner yet, e.g. still running elsewhere, waits)
        keys = next((p.tied_keys for p in group if p.tied_to), ())
        by_m = [{r.M: r.config for r in rs if r.config} for rs in group_results]
        common = {m for m in common if len({tuple(c[m][k] for k in keys) for c in by_m}) == 1}
        group_results = [[r for r in rs if r.M in common] for rs in group_results]
    triton_version = env.get("triton") or software_versions()["triton"]
    entries = []
    copies = copied_tied_tables(opts.kernel, group, group_results)
    for problem, results in zip(group, group_results):
        engines = [] if problem.key in copies else opts.engines
        files = write_tables(opts.out_dir, opts.kernel, problem, results, opts.gpu.cuda_name, triton_version, engines)
        entry = _entry(opts, problem, results, files, run_info)
        if problem.key in copies:
            entry["not_written"] = copies[problem.key]
            # an earlier run's file of it goes: the engine would read it beside this run's tables
            remove_tables(opts.out_dir, opts.kernel, problem, opts.gpu.cuda_name, triton_version, opts.engines)
        entries.append(entry)
        _audit_emitted(opts, problem, files, findings)
    return entries




def _audit_emitted(opts: RunPlan, problem: Problem, files: dict[str, str], findings=None) -> None:
    """`tuner audit`'s table checks on each table just written, over the batch sizes `tuner audit`
    checks (1-4096, or up to the largest tuned where that is larger; a --traffic run's, up to its
    largest key: the traffic says which M the server runs): a tuned table should pass them; where
    it cannot (too few batch sizes tuned, studies without a result) the run says so, naming the
    batch sizes that snap far, as the audit would (a run of M = 1 and 64 said nothing of M = 129-4096
    running the entry for 64, which the audit of the same table says first). Tables
    written while the run goes on (warn=False) are partial by design: only the loader's
    reading of them is checked, and the findings are said once, for the final tables (gathered
    into `findings`, a tuner.emit.run_findings.RunFindings)."""
    from tuner.emit.audit_rules import Batches, named_table_findings
    from tuner.plan.engines import GRID_TOP, load_table, table_family
    batches = Batches(max(opts.batch_sizes) if opts.traffic is not None else max(*opts.batch_sizes, GRID_TOP))
    for engine, rel in files.items():
        family = table_family(engine, opts.kernel.table_kind)
        from tuner.reading import read_bytes
        table, crash = load_table(family, read_bytes(opts.out_dir / rel, "table "))
        if findings is not None and table is not None:
            for f in named_table_findings(family, Path(rel).name, table, rel, batches):
                findings.add(rel, f, table)
        if crash:
            raise TunerError(f"{rel} was written but {engine}'s loader would not read it ({crash}): a bug, please report")


# -- a partial table: the rows not tuned yet keep what the engine reads today ------------------------
NOT_TUNED = "not tuned"


def with_incumbents(opts: RunPlan, results: dict[str, list[StudyResult]]) -> dict[str, list[StudyResult]]:
    """The rows to write: a table some of whose batch sizes are not tuned yet (a window that
    ended, a stopped run) holds the incumbent there, the row the engine reads today at that M
    (its shipped table's, as the engine looks it up, else the engine's default), so that a
    partial table never makes the engine slower at a batch size it did not tune. Tables tied
    together change together: a batch size tuned in one and not the other keeps both incumbents."""
    from tuner.pipeline.studies import incumbent_tables, incumbents
    from tuner.search.tied_choice import table_default
    tuned = {k: {r.M for r in rs} for k, rs in results.items()}
    for p in opts.problems:          # tied tables: the batch sizes tuned in all of them
        group = [q for q in opts.problems if q.tied_to == p.key]
        if group and not p.tied_to:
            both = set.intersection(*(tuned.get(q.key, set()) for q in [p, *group]))
            for q in [p, *group]:
                tuned[q.key] = tuned.get(q.key, set()) & both
    out: dict[str, list[StudyResult]] = {}
    fills: dict[tuple[str, int], dict] = {}
    if opts.incumbents is None:          # resolved once a run: the tables each engine reads today
        opts.incumbents = incumbent_tables(opts)
    for p in sorted(opts.problems, key=lambda q: bool(q.tied_to)):     # a tied table after the one it hangs on
        if p.key not in results and not (p.tied_to and p.tied_to in out):
            continue
        rows = [r for r in results.get(p.key, []) if r.M in tuned.get(p.key, set())]
        for M in (m for m in opts.ms_for(p) if m not in tuned.get(p.key, set())):
            partner = fills.get((p.tied_to, M)) if p.tied_to else None
            default = table_default(opts.kernel, p, M, partner)
            row = incumbents(opts, opts.incumbents, p, M)      # as tuning takes it: [(label, config, where)]
            keep = row[0][1] if row and (not partner or all(row[0][1].get(k) == partner.get(k)
                                                             for k in p.tied_keys)) else default
            fills[(p.key, M)] = keep
            rows.append(StudyResult(p, M, keep, None, None, default, None, 0, NOT_TUNED,
                                    {"status": "default", "detail": "not tuned yet: the incumbent kept"},
                                    choice={"row": "installed" if keep is not default else "default",
                                            "why": "not tuned yet"}))
        if any(r.stopped != NOT_TUNED for r in rows) or p.tied_to in out:
            out[p.key] = sorted(rows, key=lambda r: r.M)
    return out


def _entry(opts: RunPlan, problem: Problem, results: list[StudyResult], files: dict, run_info: dict) -> dict:
    """The manifest's entry of a table: its tuned rows, and where it is partial (tuner/emit/partial.py)
    every batch size planned, and those whose row keeps the incumbent (and whose: installed or default)."""
    tuned = [r for r in results if r.stopped != NOT_TUNED]
    entry = manifest_entry(opts.kernel, problem, tuned, files, run_info)
    kept = {str(r.M): r.choice.get("row") for r in results if r.stopped == NOT_TUNED}
    if kept:
        # which rows were tuned, said: `tuner install` puts those alone over what an engine reads
        entry["partial"] = {"tuned": sorted(r.M for r in tuned), "planned": sorted(r.M for r in results),
                            "incumbent": kept,
                            "why": "not tuned yet (the run stopped or its --minutes window ended); their rows "
                                   "keep the incumbent, the row the engine reads today"}
    return entry
