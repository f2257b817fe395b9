"""A night's slot (`tuner nightly --minutes M`) shared among its jobs, so that every job advances.

The jobs go in turn: the one that last had time of a slot longest ago first (a job never run
first of all; ties in the YAML's order), each job's `turn` kept in the nightly state. A job's
retune gets an equal share of what is left of the slot among itself and the jobs after it
(what a job leaves unused, an unchanged job's say, goes to those after it), less a tenth for
what follows a finished retune (keeping better previous configs, the diff, the install), but
never less than what its last window measured it needs to make progress (`needs_s`: its
start-up and its next batch or close, tuner/search/window.py), where the slot still holds that.
A job whose need the rest of the slot cannot hold waits, first in the next night's turn, and
the night says how long a slot would do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.search.window import suggested_minutes

AFTER = 0.9          # a retune's share of its job's time: the rest for what follows a finished retune


def job_order(jobs: list[dict], state: dict) -> list[dict]:
    """The jobs in the order a slot takes them: the longest without slot time first."""
    def turn(job: dict) -> int:
        t = (state.get(job["name"]) or {}).get("turn", -1)
        return t if isinstance(t, int) and not isinstance(t, bool) else -1
    return sorted(jobs, key=turn)        # stable: the YAML's order among equal turns


def next_turn(state: dict) -> int:
    """The turn a job given slot time tonight records (after every turn in the state)."""
    turns = [e.get("turn") for e in state.values() if isinstance(e, dict)]
    return 1 + max((t for t in turns if isinstance(t, int) and not isinstance(t, bool)), default=-1)


def needs_of(entry: dict | None) -> float:
    """What a job's last window measured it needs (0: nothing known)."""
    need = (entry or {}).get("needs_s")
    if isinstance(need, bool) or not isinstance(need, (int, float)) or not math.isfinite(need) or need < 0:
        return 0.0
    return float(need)


def slot_fields_ok(entry: dict) -> bool:
    """Whether a state entry's slot fields (turn, needs_s) are what a night writes (or absent)."""
    turn, need = entry.get("turn", 0), entry.get("needs_s", 0.0)
    return (isinstance(turn, int) and not isinstance(turn, bool) and turn >= 0
            and isinstance(need, (int, float)) and not isinstance(need, bool) and math.isfinite(need) and need >= 0)


@dataclass
class Share:
    seconds: float          # the job's retune's window
    short: str = ""         # why it gets none ('' where it gets one)


def share(window, jobs_left: int, need: float, first: bool = False) -> Share:
    """The retune window of the next job, `jobs_left` counting it and those after it; `first`: the first
    in turn tonight, which is never kept waiting by a need its last window measured (its start-up may have
    been a one-time one: a night is never idle, and the job's need is measured again)."""
    room = window.left() * AFTER
    equal = room / max(1, jobs_left)
    seconds = equal if not need else max(equal, min(room, need * 1.25))
    if seconds < 1.0 or (seconds < need and not first):
        want = suggested_minutes(need) / AFTER if need else 0.0
        why = (f"the {window.left():.0f} s left of the slot cannot hold the {need:.0f} s its last window needed "
               f"(its start-up and next step, measured); a slot of {math.ceil(want * 10) / 10:g} min would hold it"
               if need else "no time left in the slot")
        return Share(0.0, why)
    return Share(seconds)


def slot_lines(jobs: list[dict], state: dict, minutes: float, say) -> tuple[list[dict], dict[str, float]]:
    """A dry run's slot: how the night would share it (said); the jobs in the order it takes them, and
    each one's retune window in minutes if every job retunes."""
    ordered = job_order(jobs, state)
    from tuner.pipeline.windows import wrap
    say(wrap(f"the slot: {minutes:g} min ({minutes * 60:.0f} s), shared by the jobs in turn (the longest without "
             "slot time first): each retune gets an equal share of what is left among it and the jobs after it, "
             "less a tenth for what follows it, and at least what its last window measured it needs"))
    equal = minutes * 60 / len(ordered) * AFTER
    shares = {}
    for i, job in enumerate(ordered):
        entry = state.get(job["name"]) or {}
        need = needs_of(entry) if entry.get("unfinished") else 0.0
        given = max(equal, min(need * 1.25, minutes * 60 * AFTER))
        said = f"  {i + 1}. {job['name']}: {given:.0f} s of retuning if every job retunes"
        if need:
            said += f" (its last window needed {need:.0f} s)"
        if need > minutes * 60 * AFTER:
            want = math.ceil(suggested_minutes(need) / AFTER * 10) / 10
            said += (f"; more than the slot holds: it {'tries all the same' if i == 0 else 'waits'} (a slot of "
                     f"{want:g} min would hold it)")
        say(wrap(said))
        shares[job["name"]] = given / 60
    return ordered, shares


def slot_short_line(minutes: float, entries: list, results: list[dict]) -> str | None:
    """Where a job waited for want of slot time: how long a slot would give every unfinished retune what its
    last window measured it needs (they take turns until then)."""
    if not any(r.get("status") == "waiting" for r in results):
        return None
    needs = [needs_of(e) for e in entries if (e or {}).get("unfinished")]
    if not any(needs):
        return None
    want = math.ceil(sum(suggested_minutes(n) for n in needs if n) / AFTER * 10) / 10
    return (f"the slot of {minutes:g} min is shorter than the retunes left need together (about {want:g} min, "
            "each one's start-up and next step as measured): the jobs take turns at it")
