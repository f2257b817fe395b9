"""`order: value` in a nightly config: the night runs its jobs by expected value from the coverage
map (tuner/emit/coverage.py), as the GPU run's window does (tuner/jobs/proof_work.py): the
MoE jobs whose tables run the engine's default config first, then those that run a fallback,
then a shipped table (each by the gain the committed GPU runs measured over that status); then
the GEMM jobs (their tables are read only with a backend flag) and MLA decode, in the file's
order. With a --minutes slot, what the night does not reach is what pays least."""

from __future__ import annotations

from tuner.emit.coverage import STATUSES
from tuner.errors import TunerError

ORDERS = ("file", "value")


def job_rank(job: dict, rows: list, gains: dict) -> tuple:
    """(kernel rank, minus the expected gain, status rank) of one job: its MoE tables' least
    tuned status among `rows` (the coverage rows of its model, GPU, TP, EP and dtype)."""
    if job["kernel"] != "moe":
        return (1 if job["kernel"] == "gemm" else 2, 0.0, 0)
    tp, ep = job.get("tp"), int(job.get("ep") or 1)
    mine = [r for r in rows if (tp is None or r.served.tp == int(tp)) and r.served.ep == ep
            and (not job.get("dtype") or r.dtype == job["dtype"])
            and (not job.get("engines") or r.engine in job["engines"])]
    if not mine:
        return (0, 0.0, len(STATUSES))
    status = min((r.status for r in mine), key=STATUSES.index)
    return (0, -(gains.get(status) or 0.0), STATUSES.index(status))


def ordered_jobs(cfg: dict, log=print) -> list[dict]:
    """The config's jobs in the order its `order` asks (file: as written; value: see the module
    docstring), saying the order when it is by value."""
    order = cfg.get("order", "file")
    if order not in ORDERS:
        raise TunerError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    jobs = list(cfg["jobs"])
    if order == "file":
        return jobs
    from tuner.jobs.proof_work import expected_gains, moe_coverage
    from tuner.plan.gpus import get_gpu
    rows_of: dict[tuple[str, str], list] = {}
    notes: list[str] = []
    for job in jobs:
        key = (str(job["model"]), str(job["gpu"]))
        if job["kernel"] == "moe" and key not in rows_of:
            rows, said = moe_coverage(key[0], get_gpu(key[1]), None, None)
            rows_of[key], notes = rows, notes + said
    gains = expected_gains([r for rows in rows_of.values() for r in rows])
    position = {id(j): i for i, j in enumerate(jobs)}
    ranked = sorted(jobs, key=lambda j: (*job_rank(j, rows_of.get((str(j["model"]), str(j["gpu"])), []), gains),
                                         position[id(j)]))
    for line in dict.fromkeys(notes):
        log(f"order: {line}")
    log("order by expected value (tuner coverage): " + ", ".join(j["name"] for j in ranked))
    return ranked
