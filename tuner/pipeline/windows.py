"""A run in time-boxed windows (--minutes): which study first, and what is left after.

Every study of the plan is ranked by its expected value per GPU second:
    weight(M) x gap(problem, M) / (budget x seconds per trial)
  weight  the batch size's share of the traffic profile's passes (--traffic), else an equal
          share of the plan's batch sizes (the engines' grid);
  gap     how far the incumbent (the engine's default config) is above the roofline floor,
          1 - floor / incumbent, where a recorded landscape knows the incumbent's time; else 1;
  cost    the study's trial budget (the seconds a trial of this kernel takes are the same
          factor for every study of one run, so they order nothing within a run; they price
          what is left).
A study begun in an earlier window and not finished comes first: its trials are paid for.
Tables tied together (SGLang's up and _down) go as one: the study they hang on first.
The order is made from the plan, the landscape and what is stored, never from the clock, so
a window that continues another takes the studies in the order one longer run would have; a run
without --minutes takes them in this order too (tuner/pipeline/studies.py), so windows add up
to what it leaves.

What is left is priced from what the storage says the run has spent, all in, on the monotonic
clock (tuner/search/window.py): a measured trial's share of its batch's round (the sampler, the
claim, the measurement, the tell), and a study's time besides its trials' (its seeds, its close:
finalists timed again and checked, its tables written). The trials left are the budgets' rest
(at most), and as many as the finished studies measured on average where some finished (a
study stops early when it converges: tuner/search/stopping.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from optuna.storages import BaseStorage

from tuner.pipeline.run_plan import RunPlan
from tuner.plan.problems import Problem

WIDTH = 120


@dataclass
class StudyState:
    problem: Problem
    M: int
    budget: int
    measured: int            # distinct configs measured so far (every window)
    seconds: float           # the measured trials' shares of their batches' time (monotonic), summed
    finished: bool
    empty: bool = False      # finished without a config: a table tied to it has nothing to tie to
    timed: int = 0           # the measured trials whose time is stored (a storage from before: none)
    spent: float = 0.0       # the study's time all in, every window (SPENT_ATTR)
    close: float | None = None   # its close's time (CLOSE_ATTR), once closed
    last: float = 0.0        # when its last trial was told (the wall clock's timestamp: orders studies only)


def study_states(opts: RunPlan, storage: BaseStorage | None) -> dict[tuple[str, int], StudyState]:
    """What the storage holds of each study of the plan (None: no storage yet, nothing begun)."""
    import optuna

    from tuner.search.settings import study_name
    from tuner.search.storage import counts
    from tuner.search.stored_state import checked_result
    from tuner.search.window import CLOSE_ATTR, SPENT_ATTR, plausible
    names = set(optuna.get_all_study_names(storage)) if storage is not None else set()
    out = {}
    for p in opts.problems:
        for M in opts.ms_for(p):
            budget = opts.settings.budget_for(p, M)
            name = study_name(p, M, opts.prefix, opts.kernel.source)
            if storage is None or name not in names:
                out[(p.key, M)] = StudyState(p, M, budget, 0, 0.0, False)
                continue
            study = optuna.load_study(study_name=name, storage=storage)
            trials = [t for t in study.get_trials(deepcopy=False) if counts(t)]
            shares = [s for s in map(trial_share, trials) if s is not None]
            configs = {tuple(sorted(t.user_attrs["config"].items())) for t in trials}
            attrs = study.user_attrs
            result = checked_result(name, attrs.get("result"))
            # finished as the runner takes it: a study stopped at a smaller budget than this run's goes on
            done = result is not None and (result.get("stopped") != "budget" or result.get("trials", 0) >= budget)
            out[(p.key, M)] = StudyState(p, M, budget, len(configs), sum(shares), done,
                                         done and not (result or {}).get("config"), len(shares),
                                         plausible(attrs.get(SPENT_ATTR), DAY) or 0.0,
                                         plausible(attrs.get(CLOSE_ATTR), DAY),
                                         max((t.datetime_complete.timestamp() for t in trials
                                              if t.datetime_complete is not None), default=0.0))
    for (key, M), s in out.items():      # a tied table's study is never run where its partner found nothing
        partner = out.get((s.problem.tied_to, M)) if s.problem.tied_to else None
        if partner is not None and partner.empty:
            s.finished = True
    return out


def weights(opts: RunPlan) -> dict[int, float]:
    """Each batch size's share: of the traffic profile's passes, else equal."""
    ms = sorted({m for p in opts.problems for m in opts.ms_for(p)})
    if opts.traffic is not None:
        from tuner.plan.traffic import key_coverage
        return {c.key: c.share for c in key_coverage(ms, opts.traffic)}
    return {m: 1.0 / len(ms) for m in ms} if ms else {}


def gap(opts: RunPlan, landscape, problem: Problem, M: int) -> float:
    """1 - roofline floor / the incumbent's time, where a recorded landscape times the incumbent."""
    if landscape is None:
        return 1.0
    from tuner.measure import ceilings
    from tuner.plan.kernel_api import config_tuple
    point = (landscape.lookup(problem.params, M) or {}).get(
        config_tuple(opts.kernel, opts.kernel.default_config(problem.params, M)))
    if point is None or not point.time_us:
        return 1.0
    floor = ceilings.load(opts.gpu).floor_us(opts.kernel.bytes_moved(problem.params, M),
                                             opts.kernel.flops(problem.params, M))
    return min(1.0, max(0.01, 1.0 - floor / point.time_us))


def study_order(opts: RunPlan, states: dict[tuple[str, int], StudyState], landscape=None) -> list[tuple[Problem, int]]:
    """The plan's studies in the order a window takes them (the module's docstring says why)."""
    by_key = {p.key: p for p in opts.problems}

    def root(p: Problem) -> Problem:
        seen = set()
        while p.tied_to and p.tied_to in by_key and p.key not in seen:
            seen.add(p.key)
            p = by_key[p.tied_to]
        return p

    w = weights(opts)
    groups: dict[tuple[str, int], list[tuple[Problem, int]]] = {}
    for p in opts.problems:
        for M in opts.ms_for(p):
            groups.setdefault((root(p).key, M), []).append((p, M))

    def rank(item) -> tuple:
        (key, M), members = item
        st = [states[(p.key, m)] for p, m in members]
        begun = any(s.measured for s in st) and not all(s.finished for s in st)
        value = w.get(M, 0.0) * gap(opts, landscape, by_key[key], M) / max(1, sum(s.budget for s in st))
        return (not begun, -value, M, key)

    order = []
    for _, members in sorted(groups.items(), key=rank):
        order += sorted(members, key=lambda pm: pm[0].key != root(pm[0]).key)
    return order


DAY = 86400.0          # a stored time beyond this is no study's (bounds what an edited storage can claim)


def trial_share(trial) -> float | None:
    """A measured trial's share of its batch's time (monotonic, from its round's start to the tell),
    within what a batch can plausibly take; None where the storage has no such time."""
    from tuner.search.window import BATCH_ATTR, TOOK_ATTR, plausible
    took = plausible(trial.user_attrs.get(TOOK_ATTR), DAY)
    n = trial.user_attrs.get(BATCH_ATTR, 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1024 else 1
    return None if took is None else took / n


RECENT_STUDIES = 6      # what is left is priced by the latest studies finished: the next are most like them


def recent(states) -> list:
    """The studies to price what is left by: the RECENT_STUDIES finished last (studies later in a run's order
    are larger, and a study's tables cost more as more are written), else every study begun."""
    done = sorted((s for s in states if s.finished and s.measured), key=lambda s: s.last)
    return done[-RECENT_STUDIES:] or [s for s in states if s.measured]


def per_trial_seconds(states) -> float | None:
    """The seconds a measured trial took, all in (its share of its batch's round), None before any."""
    n = sum(s.timed for s in states)
    return sum(s.seconds for s in states) / n if n else None


def per_study_seconds(states) -> float | None:
    """The seconds a study took besides its trials (seeds, close, tables), over the studies closed."""
    closed = [s for s in states if s.close is not None and s.spent > 0 and s.timed == s.measured]
    return sum(max(0.0, s.spent - s.seconds) for s in closed) / len(closed) if closed else None


def stored_close_seconds(states: dict) -> float:
    """The longest close a study of the run took (0 before any): a window's estimate of the next."""
    return max((s.close for s in states.values() if s.close is not None), default=0.0)


def trials_left(states) -> tuple[int, int]:
    """(at most, as many as the latest studies finished measured on average) trials left."""
    todo = [s for s in states if not s.finished]
    most = sum(max(0, s.budget - s.measured) for s in todo)
    done = [s for s in recent(states) if s.finished]
    if not done:
        return most, most
    mean = sum(s.measured for s in done) / len(done)
    return most, sum(min(max(0, s.budget - s.measured), max(0, round(mean) - s.measured)) for s in todo)


def left_estimate(states) -> str:
    """', about T as measured (X s a trial, Y s a study besides)', or '' before anything is measured: the rates
    of the latest studies finished (`recent`)."""
    st = list(states)
    latest = recent(st)
    each = per_trial_seconds(latest)
    if each is None:
        return ""
    todo = [s for s in st if not s.finished]
    most, expected = trials_left(st)
    study = per_study_seconds(latest)
    total = expected * each + len(todo) * (study or 0.0)
    what = f"{each:.2f} s a trial" + (f", {study:.1f} s a study besides" if study is not None
                                      else "; a study's close not measured yet")
    likely = f" (likely {expected} trials)" if expected != most else ""
    return f"{likely}, about {duration(total)} as measured ({what}, all in)"


def left_lines(opts: RunPlan, states: dict[tuple[str, int], StudyState], minutes: float) -> list[str]:
    """What a window leaves: studies and trials not done, and what they would take."""
    st = list(states.values())
    todo = [s for s in st if not s.finished]
    head = f"{opts.kernel.name}"
    if not todo:
        return [f"{head}: all {len(st)} studies finished; every table of the plan is written"]
    trials, _ = trials_left(st)
    begun = sum(1 for s in todo if s.measured)
    lines = [wrap(f"{head}: {len(st) - len(todo)} of {len(st)} studies finished; left {len(todo)} "
                  f"({begun} begun), at most {trials} trials{left_estimate(st)}")]
    done = {(s.problem.key, s.M) for s in st if s.finished}
    for p in opts.problems:
        # tables tied together are written together (tuner/pipeline/emission.py with_incumbents): a
        # row is tuned where every table of its group finished its study at that M
        root = p.tied_to or p.key
        group = [q for q in opts.problems if root in (q.key, q.tied_to)]
        missing = [m for m in opts.ms_for(p) if not all((q.key, m) in done for q in group if m in opts.ms_for(q))]
        if missing:
            waiting = [m for m in missing if (p.key, m) in done]
            lines.append(wrap(f"  {p.key}: not tuned yet M={','.join(map(str, missing))} "
                              "(their rows keep the incumbent" + (
                                  f"; at M={','.join(map(str, waiting))} its study finished: written once its tied "
                                  "table's study is" if waiting else "") + ")"))
    return lines


def window_length(minutes: float) -> str:
    """A window's length as printed: as given where it is a plain number of minutes ('0.3 min'),
    else in the unit that reads ('1.2 s', '17.5 min'): a night's share of its slot is a fraction
    nobody typed (0.0196884 min)."""
    if round(minutes, 2) == minutes:
        return f"{minutes:g} min"
    return f"{minutes * 60:.1f} s" if minutes < 1 else f"{minutes:.1f} min"


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def continue_command(argv: list[str] | None, out: str | None = None) -> str:
    """The command that continues this run: the same, with its output folder named."""
    if argv is None:                # made in Python (tuner.api): the same request again
        return "the same request again" + (f" (out={out})" if out else "")
    argv = list(argv)
    if out and "--out" not in argv and "--storage" not in argv and not any(a.startswith("--out=") for a in argv):
        argv += ["--out", out]
    return "tuner " + " ".join(shlex.quote(a) for a in argv)


def wrap(text: str, width: int | None = None) -> str:
    """A line of prose as printed: fitted to the terminal's width (at most 120), whole when piped,
    the one rule of every command (tuner/textwidth.py); a command to paste: textwidth.command_lines."""
    from tuner.textwidth import fit_line, output_width
    width = width or output_width()
    return text if width is None else "\n".join(fit_line(text, min(width, WIDTH)))
