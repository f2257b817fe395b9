"""What each launch-config key is, as the search's model should see it (issue 43).

A key's values are integers, but they mean different things to a kernel:

  log       a power-of-two size (a tile, a warp count, a number of stages in powers of two):
            its effect follows the value's logarithm, so the model sees log2(value).
  ordered   an integer size whose values are not all powers of two (block sizes in steps of
            16, tile sizes 1-4, ...): the model sees log2(value) AND how aligned it is (log2
            of the largest power of two that divides it). On AMD's MI250X every convolution
            block size that is not a power of two runs 11-16x slower (Kernel Tuner's
            convolution cache, scripts/search_benchmark.py): on log2(value) alone the best
            value (64, between 48 and 80) looked as bad as its neighbours, and the GP spent 4 %
            of its trials there against TPE's 23 %.
  category  values that do not order the time: a flag, a layout, a method, an unordered set
            of sizes. Each value is its own column (one-hot); no value is "between" others.

A space file declares a key's kind under `kinds:` (configs/spaces/*.yaml; a recorded
landscape's header likewise); a key it does not declare gets the kind its values imply
(`implied_kind`). Light on purpose (no numpy): the plan reads it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tuner.errors import TunerError

KINDS = ("log", "ordered", "category")


def power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def implied_kind(values: Sequence[int]) -> str:
    """The kind a key's values imply when the space does not declare one: two values (a
    flag, or a choice of two) and an enumeration from 0 (0, 1, 2, ...: a method or mode)
    are categories; positive powers of two are sizes on a log scale; any other integers
    are ordered sizes whose alignment may matter."""
    vals = sorted(set(int(v) for v in values))
    if len(vals) <= 2 or vals == list(range(len(vals))):
        return "category"
    if all(power_of_two(v) for v in vals):
        return "log"
    return "ordered"


def checked_kinds(declared: object, choices: Mapping[str, Sequence[int]], where: str) -> dict[str, str]:
    """A space file's `kinds:` mapping, checked: only known keys, only known kinds, and a log
    key's values all positive (a log scale has no 0)."""
    if declared is None:
        return {}
    if not isinstance(declared, dict):
        raise TunerError(f"{where}: 'kinds' must map config keys to one of {', '.join(KINDS)}")
    out = {}
    for key, kind in declared.items():
        if key not in choices:
            raise TunerError(f"{where}: kinds names {key!r}, which is not a config key of the space")
        if kind not in KINDS:
            raise TunerError(f"{where}: kind {kind!r} of {key} is not one of {', '.join(KINDS)}")
        if kind in ("log", "ordered") and min(choices[key]) <= 0:
            raise TunerError(f"{where}: {key} takes {min(choices[key])}, which a {kind} key's log scale cannot hold")
        out[str(key)] = str(kind)
    return out


def resolved_kinds(choices: Mapping[str, Sequence[int]], declared: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every key's kind: the declared one, else the one its values imply."""
    declared = declared or {}
    return {k: declared.get(k) or implied_kind(v) for k, v in choices.items()}


def kinds_text(kinds: Mapping[str, str], declared: Mapping[str, str] | None = None) -> str:
    """'BLOCK_SIZE_M log, USE_TMA category*' (* declared in the space file) for the plan."""
    declared = declared or {}
    return ", ".join(f"{k} {v}{'*' if k in declared else ''}" for k, v in kinds.items())
