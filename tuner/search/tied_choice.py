"""Tables tied together (SGLang's `_down` table shares BLOCK_SIZE_M with its up table): what
such a table's default is, and the choice of the keys they share, made for both together once
both studies are done."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from tuner.plan.kernel_api import KernelSpec
from tuner.plan.problems import Problem

if TYPE_CHECKING:
    from tuner.measure.measurers import Measurer
    from tuner.search.runner import StudyResult, StudyRunner


def table_default(kernel: KernelSpec, problem: Problem, M: int, tied_config: dict | None) -> dict:
    """What the engine runs at M without this table: for a table tied to another (SGLang's
    `_down` table, tied to its up table), the config of that table (SGLang runs the down GEMM
    with the up config when it has no `_down` table); else the kernel's default config. The
    one notion of a table's default, for tuning and for drift alike."""
    from tuner.plan.kernel_api import config_from_entry
    if tied_config:
        return config_from_entry(kernel, tied_config)
    return kernel.default_config(problem.params, M)


def choose_tied(runner: StudyRunner, measurer: Measurer, problem: Problem, up: Problem, M: int, top_k: int,
                stored: Callable[[Problem], dict | None]) -> StudyResult | None:
    """Choose the keys a tied table shares with the table it is tied to (SGLang's `_down`
    table and its up table share BLOCK_SIZE_M) for both together, once both studies are done:
    the candidate pairs are the best up config for each shared value with each down config
    measured with that value, ranked by the sum of the two times; the best few are timed again
    as the engine runs the two together, where the kernel can (`tied_params`: for SGLang the
    whole layer, whose up GEMM stores in sorted order before a TMA down GEMM), else ranked by
    the sum. Both studies are then concluded on the winning pair (numerics checked); returns
    the tied table's result (None when the studies measured no pair). `up`: the problem it is
    tied to; `top_k`: how many pairs are timed again; `stored`: a study's stored result at M."""
    from tuner.plan.kernel_api import config_dict
    from tuner.search.conclusion import conclude  # Optuna's: loaded where tables are concluded
    kernel, keys = runner.kernel, problem.tied_keys
    if problem.tied_to is None:
        return None

    def shared(cfg: dict) -> tuple:
        return tuple(cfg[k] for k in keys)

    def timed(p: Problem) -> list[tuple[float, dict]]:
        # by time alone: two configs of the same time must not be compared (dicts do not order)
        return sorted(((t, config_dict(kernel, c)) for c, t in runner.measured(p, M).items() if t is not None),
                      key=lambda tc: tc[0])
    best_up: dict[tuple, tuple[float, dict]] = {}
    ups = timed(up)
    for t, c in ups:
        best_up.setdefault(shared(c), (t, c))
    pairs = sorted(((best_up[shared(d)][0] + t, best_up[shared(d)][1], d) for t, d in timed(problem)
                    if shared(d) in best_up), key=lambda p: p[0])          # ranked by the sum
    if not pairs:
        return None
    candidates = pairs[: max(1, top_k)]
    together: list[float | None] = [None] * len(candidates)
    if kernel.tied_params is not None:
        for i, (_, u, d) in enumerate(candidates):
            pair = Problem(kernel.name, kernel.tied_params(problem.params, u), problem.layers, problem.engines)
            together[i] = measurer.measure(pair, M, [d])[0].time_us
    timed_together = all(t is not None for t in together)
    ranking = [t if timed_together and t is not None else s_ for t, (s_, _, _) in zip(together, candidates)]
    order = sorted(range(len(candidates)), key=lambda i: ranking[i])
    _, u_cfg, d_cfg = candidates[order[0]]
    info = {"keys": {k: u_cfg[k] for k in keys}, "timed_together": timed_together,
            "candidates": [{"up": u, "down": d, "sum_us": round(s_, 3),
                            "together_us": None if t is None else round(t, 3)}
                           for (s_, u, d), t in zip(candidates, together)], "chosen": order[0]}

    def in_line(first: dict, ranked: list[tuple[float, dict]]) -> list[dict]:
        rest = [c for _, c in ranked if shared(c) == shared(first) and c != first]
        return [first] + rest[: top_k - 1]
    u_result = stored(up) or {}
    info["up_alone"] = {k: (u_result.get("config") or {}).get(k) for k in keys}    # what the up study chose by itself
    if u_result.get("config") != u_cfg:
        u_now = conclude(runner, up, M, in_line(u_cfg, ups), kernel.default_config(up.params, M), shared=keys)
        u_cfg = u_now.config or u_cfg
    default = table_default(kernel, problem, M, u_cfg)
    return conclude(runner, problem, M, in_line(d_cfg, timed(problem)), default, info, shared=keys)

