"""A run in time-boxed windows (--minutes): which study first, and what is left after.

Every study of the plan is ranked by its expected value per GPU second:
    weight(M) x gap(problem, M) / (budget x seconds per trial)
  weight  the batch size's share of the traffic profile's passes (--traffic), else an equal
          share of the plan's batch sizes (the engines' grid);
  gap     how far the incumbent (the engine's default config) is above the roofline floor,
          1 - floor / incumbent, where a recorded landscape knows the incumbent's time; else 1;
  cost    the study's trial budget times the seconds a trial of this kernel took so far
          (read from the storage: the same factor for every study of one run, so it orders
          nothing within a run; it prices what is left).
A study begun in an earlier window and not finished comes first: its trials are paid for.
Tables tied together (SGLang's up and _down) go as one: the study they hang on first.
The order is made from the plan, the landscape and what is stored, never from the clock, so
a window that continues another takes the studies in the order one longer run would have.
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
    seconds: float           # their time from ask to tell, summed
    finished: bool
    empty: bool = False      # finished without a config: a table tied to it has nothing to tie to


def study_states(opts: RunPlan, storage: BaseStorage | None) -> dict[tuple[str, int], StudyState]:
    """What the storage holds of each study of the plan (None: no storage yet, nothing begun)."""
    import optuna

    from tuner.search.settings import study_name
    from tuner.search.storage import counts
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
            seconds = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials
                          if t.datetime_start and t.datetime_complete)
            configs = {tuple(sorted(t.user_attrs["config"].items())) for t in trials}
            result = study.user_attrs.get("result")
            # finished as the runner takes it: a study stopped at a smaller budget than this run's goes on
            done = result is not None and (result.get("stopped") != "budget" or result.get("trials", 0) >= budget)
            out[(p.key, M)] = StudyState(p, M, budget, len(configs), seconds, done,
                                         done and not (result or {}).get("config"))
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


def per_trial_seconds(states) -> float | None:
    """The seconds a measured trial took so far (every window, this run's kernel), None before any."""
    n = sum(s.measured for s in states)
    return sum(s.seconds for s in states) / n if n else None


def left_lines(opts: RunPlan, states: dict[tuple[str, int], StudyState], minutes: float) -> list[str]:
    """What a window leaves: studies and trials not done, and what they would take."""
    st = list(states.values())
    todo = [s for s in st if not s.finished]
    head = f"{opts.kernel.name}"
    if not todo:
        return [f"{head}: all {len(st)} studies finished; every table of the plan is written"]
    trials = sum(max(0, s.budget - s.measured) for s in todo)
    each = per_trial_seconds(st)
    cost = f", about {duration(trials * each)} at {each:.2f} s a trial as measured" if each else ""
    begun = sum(1 for s in todo if s.measured)
    lines = [f"{head}: {len(st) - len(todo)} of {len(st)} studies finished; left {len(todo)} "
             f"({begun} begun), at most {trials} trials{cost}"]
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


def wrap(text: str, width: int = WIDTH, indent: str = "    ") -> str:
    """A line of prose cut at spaces to fit `width` columns (a command to paste: textwidth.command_lines)."""
    lead = text[:len(text) - len(text.lstrip(" "))]
    words, lines, line = text.lstrip(" ").split(" "), [], lead
    for word in words:
        if line.strip() and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = indent + word
        else:
            line = f"{line} {word}" if line.strip() else line + word
    lines.append(line)
    return "\n".join(lines)
