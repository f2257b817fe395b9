"""A study's stored state checked when it is read back: its result, and the default sampler's model
fit and random stream (tuner/search/surrogate.py). A storage edited by hand or damaged (NaN or zero
length scales, strings, an `at` that is no number, a generator state out of range, a result without
`time_us`) is whole as a journal, so `tuner repair-journal` cannot help; what does not validate is
discarded instead, said once per study and kind, and the study goes on from its trials (a result
discarded: the study is closed again from them; a fit: refitted; a stream: the seed's own).
"""

from __future__ import annotations

import logging
import math

log = logging.getLogger("tuner")
_SAID: set[tuple[str, str]] = set()


def new_run() -> None:
    """A tuning run begins (tuner/pipeline/tune.py): what an earlier run in this process said is said again."""
    _SAID.clear()


def discarded(study: str, what: str, why: str) -> None:
    """Say once (per study and kind, in this run) that a stored state was discarded."""
    if (study, what) in _SAID:
        return
    _SAID.add((study, what))
    log.warning("study %s: its stored %s does not validate (%s): discarded; the study goes on from its trials",
                study, what, why)


def _number(v, low: float = 0.0) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= low


def _config(v) -> bool:
    return isinstance(v, dict) and bool(v) and all(isinstance(k, str) and isinstance(x, int)
                                                  and not isinstance(x, bool) for k, x in v.items())


RESULT_FIELDS = {       # a stored result's fields this tool reads, and what each must be
    "config": lambda v: v is None or _config(v),
    "time_us": lambda v: v is None or (_number(v) and v > 0),
    "spread": lambda v: v is None or _number(v),
    "default_config": _config,
    "default_time_us": lambda v: v is None or (_number(v) and v > 0),
    "trials": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "stopped": lambda v: isinstance(v, str),
}
OPTIONAL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "numerics": dict, "rejected": list, "failures": dict, "tied": dict, "search": dict, "choice": dict,
    "kept_default": (dict, type(None)), "first_failure": (str, type(None)), "default_error": (str, type(None)),
}


def result_problem(d) -> str | None:
    """What is wrong with a study's stored result (an edited or damaged storage), in words; None for
    a result as this tool writes it (StudyResult.as_dict)."""
    if not isinstance(d, dict):
        return f"it is {type(d).__name__}, not an object"
    for key, ok in RESULT_FIELDS.items():
        if key not in d:
            return f"it has no {key!r}"
        if not ok(d[key]):
            return f"its {key!r} is {d[key]!r:.40}"
    if d["config"] is not None and d["time_us"] is None:
        return "it has a config and no 'time_us'"
    for key, kind in OPTIONAL_FIELDS.items():
        if d.get(key) is not None and not isinstance(d[key], kind):
            return f"its {key!r} is {d[key]!r:.40}"
    return None


def checked_result(study: str, d) -> dict | None:
    """A stored result as this tool wrote it, else None (said once): the study is closed again."""
    if d is None:
        return None
    why = result_problem(d)
    if why is None:
        return d
    discarded(study, "result", why)
    return None


def fit_problem(d, columns: int) -> str | None:
    """What is wrong with a stored model fit ({"at": observations, "ls": a length scale per column})."""
    if not isinstance(d, dict):
        return f"it is {type(d).__name__}, not an object"
    at, ls = d.get("at"), d.get("ls")
    if not (isinstance(at, int) and not isinstance(at, bool) and 0 <= at <= 1 << 20):
        return f"'at' is {at!r:.40}"
    if not isinstance(ls, list) or len(ls) != columns:
        return f"'ls' is not {columns} length scales"
    if not all(_number(v) and 1e-3 <= v <= 1e3 for v in ls):
        return f"'ls' holds {next(v for v in ls if not (_number(v) and 1e-3 <= v <= 1e3))!r:.40}"
    return None


def rng_problem(d, kind: str) -> str | None:
    """What is wrong with a stored random stream's state (numpy's `bit_generator.state` of `kind`)."""
    if not isinstance(d, dict) or d.get("bit_generator") != kind:
        return f"it is no state of a {kind} generator"
    state = d.get("state")
    if kind == "PCG64":
        if not (isinstance(state, dict) and all(isinstance(state.get(k), int) and not isinstance(state.get(k), bool)
                                                and 0 <= state[k] < 1 << 128 for k in ("state", "inc"))):
            return "its state is out of range"
        if d.get("has_uint32") not in (0, 1) or not (isinstance(d.get("uinteger"), int)
                                                     and 0 <= d["uinteger"] < 1 << 32):
            return "its buffered word is out of range"
    return None
