"""How a study ends besides its search: its failures counted by kind, its first error in one
line, and a study concluded again once a choice made for two tied tables (SGLang's up and
`_down`, tuner/search/tied_choice.py) says which of its configs the table holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from tuner.measure.failures import NUMERICS, count_by_kind, kind_of, one_line
from tuner.measure.measurers import Measurement, NumericsCheck
from tuner.plan.kernel_api import Config, config_tuple
from tuner.plan.problems import Problem
from tuner.search.settings import StudyResult, study_name
from tuner.search.storage import counts
from tuner.search.stored_state import checked_result

if TYPE_CHECKING:
    from tuner.search.runner import StudyRunner


def failures(study: optuna.Study, result: StudyResult) -> dict[str, int]:
    """The study's failed configs by kind: measured ones that failed (trials stored
    before kinds existed are classified from their error text), and finalists the
    numerics check rejected."""
    kinds = [tr.user_attrs.get("failure") or kind_of(tr.user_attrs.get("error"))
             for tr in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if counts(tr)]
    return count_by_kind(kinds + [NUMERICS] * len(result.rejected))


def first_failure(study: optuna.Study) -> str | None:
    """The error of the study's first failed measurement, in one line (None: none failed)."""
    failed = sorted((tr for tr in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                     if counts(tr) and tr.user_attrs.get("error")), key=lambda tr: tr.number)
    return one_line(failed[0].user_attrs["error"]) if failed else None


def conclude(runner: StudyRunner, problem: Problem, M: int, ordered: list[Config], default: Config,
             tied: dict | None = None, shared: tuple[str, ...] = ()) -> StudyResult:
    """Make the first of `ordered` that passes the numerics check the study's result, its
    time and the default's taken again together (the choice was made elsewhere: two
    tables deciding together). The default wins instead where it was faster in that
    re-time and agrees with `ordered` on the `shared` keys (those the choice fixed for
    both tables). Keeps the study's trial count, stop reason and failures."""
    kernel = runner.kernel
    study = optuna.load_study(study_name=study_name(problem, M, runner.prefix, kernel.source),
                              storage=runner.storage)
    before = checked_result(study.study_name, study.user_attrs.get("result")) or {}
    default_t = config_tuple(kernel, default)
    retime = ordered + ([] if any(config_tuple(kernel, c) == default_t for c in ordered) else [default])
    again = runner.measurer.measure(problem, M, retime)
    by_cfg = {config_tuple(kernel, c): m for c, m in zip(retime, again)}
    d = by_cfg[default_t]
    default_error = None if d.time_us is not None else (d.error or "failed")
    result = StudyResult(problem, M, None, None, None, default, d.time_us, before.get("trials", 0),
                         before.get("stopped", "budget"), {"status": "failed",
                                                           "detail": "every candidate failed the numerics check"},
                         default_error=default_error, tied=tied or {},
                         search=before.get("search") or runner.searched_with(problem, M))

    def passes(cfg: Config, m: Measurement) -> bool:
        check: NumericsCheck = runner.measurer.check_numerics(problem, M, cfg)
        if check.failed:
            result.rejected.append({"config": cfg, "numerics": check.as_dict()})
            return False
        result.config, result.time_us, result.spread, result.numerics = cfg, m.time_us, m.spread, check.as_dict()
        return True

    in_play = (d.time_us is not None and default_t not in {config_tuple(kernel, c) for c in ordered}
               and bool(ordered) and all(default.get(k) == ordered[0].get(k) for k in shared))
    # The first candidate that passes, unless the default was faster than it in this re-time.
    for cfg, m in zip(ordered, again):
        if m.time_us is None:
            continue
        if in_play and d.time_us is not None and d.time_us < m.time_us:
            if passes(default, d):
                break
            in_play = False
        if passes(cfg, m):
            break
    else:
        if in_play:
            passes(default, d)
    if result.config is None:
        result.stopped = "no config"
    result.failures = failures(study, result)
    result.first_failure = before.get("first_failure") or first_failure(study)
    study.set_user_attr("result", result.as_dict())
    return result
