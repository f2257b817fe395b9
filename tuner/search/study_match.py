"""A stored study checked before a run continues it: it must be this run's, and whole.

- Its identity (tuner/search/identity.py): a study timed on another device, kernel code, space or
  Triton, or whose times came from elsewhere (a SYNTHETIC landscape, another landscape, the CPU
  device), is refused: its results are not this run's and must never be reused. Studies from
  before identities were recorded are taken as they are, unless their environment says otherwise.
- Its configs' encoding: each launch-config key a categorical parameter over the values the study
  recorded (`choices`); a study stored with another encoding (an older tuner's) is refused.
- Its space as stored: the recorded values of every key, and every trial's parameters drawn from
  those values. A storage edited or damaged so that they do not match (a SQLite page that still
  parses, a hand edit) would end the run in Optuna's "CategoricalDistribution does not support
  dynamic value space"; it is refused in one line instead, naming the study, nothing written.
Each refusal is one line that says what to do: another --out (or --storage, or --study-prefix).
"""

from __future__ import annotations

from typing import Sequence

import optuna

from tuner.errors import TunerError
from tuner.search.identity import identity_differences, stored_identity

# How trial parameters encode a config: each key a categorical parameter over its values.
# Studies stored before this attribute existed encoded each key as an index (an int).
ENCODING = "categorical-values/2"
ELSEWHERE = "give another --out (or --storage, or --study-prefix)"


def check_identity(study: optuna.Study, mine: dict) -> None:
    """Refuse a study whose times are of something else; record this run's identity on a new one."""
    stored = stored_identity(study.user_attrs)
    what = identity_differences(stored, mine) if stored else ""
    if what:
        raise TunerError(f"the storage already holds study {study.study_name} timed with another {what}; "
                         f"its results are not this run's: {ELSEWHERE}")
    if study.user_attrs.get("identity") is None:
        study.set_user_attr("identity", mine)


def _values(v) -> bool:
    return (isinstance(v, list) and bool(v) and len(v) <= 1 << 16
            and all(isinstance(x, int) and not isinstance(x, bool) for x in v) and v == sorted(set(v)))


def stored_choices(study: optuna.Study, keys: Sequence[str], choices: dict[str, list[int]]) -> dict[str, list[int]]:
    """The values per key the study's trials are drawn from: the stored ones (recorded now on a new
    study), each trial's parameters checked against them. Refused in one line: another encoding, or a
    stored space that does not match the study's own trials or keys (an edited or damaged storage)."""
    name = study.study_name
    stored = study.user_attrs.get("choices")
    trials = study.get_trials(deepcopy=False)
    if stored is None and not any(t.distributions for t in trials):
        study.set_user_attr("choices", choices)
        study.set_user_attr("encoding", ENCODING)
        return choices
    if study.user_attrs.get("encoding") != ENCODING:
        raise TunerError(f"the storage holds study {name} from an older tuner that encoded configs as "
                         f"{study.user_attrs.get('encoding') or 'indices'}, not {ENCODING}: "
                         f"{ELSEWHERE}, or delete that storage")
    damaged = f"the storage's study {name} does not match its search space (damaged or edited: "
    if not isinstance(stored, dict) or set(stored) != set(keys) or not all(_values(stored[k]) for k in keys):
        raise TunerError(damaged + f"its recorded values of {', '.join(keys)} are not lists of whole numbers); "
                         f"{ELSEWHERE}, or delete that storage")
    for t in trials:
        for k, dist in t.distributions.items():
            ok = (k in stored and isinstance(dist, optuna.distributions.CategoricalDistribution)
                  and list(dist.choices) == stored[k])
            if not ok or (k in t.params and t.params[k] not in stored[k]):
                raise TunerError(damaged + f"trial {t.number}'s {k} is drawn from other values than the study's); "
                                 f"{ELSEWHERE}, or delete that storage")
    return {k: list(stored[k]) for k in keys}
