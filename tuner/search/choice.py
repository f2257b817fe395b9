"""A table's row changes only for a real gain (`--min-gain`, default 2 %).

The search's best config (after the finalists' re-time, tuner/search/runner.py) is timed again
against the incumbent, the config the engine runs at this M today: the currently installed
table's row where there is one (the nearest key, as the engine reads it), else the default.
The two are timed in pairs, interleaved in one call to the measurer (one process, one device,
back to back: tuned, incumbent, tuned, incumbent, ...), so that a drift of clocks or
temperature hits both alike. Per pair the gain is incumbent / tuned - 1; the tuned config
replaces the incumbent only when the median gain is above the threshold and the pairs agree
(the 20th percentile of the gains is above zero). The gains' p20-p80 spread is reported with
the verdict, in the table's manifest entry and by `tuner report`. `tuner install --merge`
applies the same rule to the rows it would replace (tuner/emit/install.py), from the times
both results folders hold.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from tuner.measure.measurers import Measurer
from tuner.measure.noise import threshold_text
from tuner.plan.kernel_api import Config, KernelSpec, config_tuple
from tuner.plan.problems import Problem

MIN_GAIN = 0.02          # the default --min-gain
PAIRS = 4                # interleaved pairs timed per decision
# On the CPU device (Triton's interpreter) two pairs take every step of the decision, as its
# timing takes one input set and two timed calls for the GPU's four and forty: its times mean
# nothing about a GPU, and each pair costs two interpreted launches a side.
CPU_DEVICE_PAIRS = 2


@dataclass
class PairedGain:
    gain: float | None          # median over the pairs of incumbent/tuned - 1; None: never both timed
    low: float | None           # its 20th percentile
    spread: float | None        # p80 - p20 of the per-pair gains
    pairs: int                  # pairs in which both were timed
    tuned_us: float | None      # median times over the pairs
    incumbent_us: float | None


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def paired_gain(measurer: Measurer, problem: Problem, M: int, tuned: Config, incumbent: Config,
                pairs: int = PAIRS) -> PairedGain:
    """Time `tuned` and `incumbent` in `pairs` interleaved pairs, in one call."""
    return paired_gain_of_parts(measurer, [(problem, tuned, incumbent)], M, pairs)


def paired_gain_of_parts(measurer: Measurer, parts: list[tuple[Problem, Config, Config]], M: int,
                         pairs: int = PAIRS, part_us: list | None = None) -> PairedGain:
    """The paired gain of configs chosen together for several problems (SGLang's up and `_down`
    tables: [(problem, tuned, incumbent)]): each part timed in `pairs` interleaved pairs in one
    call; pair i of the whole is the sum of the parts' pair i (a part failed: no pair).
    `part_us` gets each part's (tuned, incumbent) median time (None: never timed)."""
    a: list[float | None] = [0.0] * pairs
    b: list[float | None] = [0.0] * pairs
    for problem, tuned, incumbent in parts:
        got = measurer.measure(problem, M, [tuned, incumbent] * pairs)
        if part_us is not None:
            xs, ys = [m.time_us for m in got[0::2] if m.time_us], [m.time_us for m in got[1::2] if m.time_us]
            part_us.append((statistics.median(xs) if xs else None, statistics.median(ys) if ys else None))
        for i, (x, y) in enumerate(zip(got[0::2], got[1::2])):
            ai, bi = a[i], b[i]
            a[i] = None if ai is None or not x.time_us else ai + x.time_us
            b[i] = None if bi is None or not y.time_us else bi + y.time_us
    both = [(x, y) for x, y in zip(a, b) if x and y]
    if not both:
        return PairedGain(None, None, None, 0, statistics.median([x for x in a if x]) if any(a) else None,
                          statistics.median([y for y in b if y]) if any(b) else None)
    gains = [y / x - 1 for x, y in both]
    return PairedGain(statistics.median(gains), _quantile(gains, 0.2), _quantile(gains, 0.8) - _quantile(gains, 0.2),
                      len(both), statistics.median(x for x, _ in both), statistics.median(y for _, y in both))


def pairs_for(measurer: Measurer) -> int:
    """The pairs a decision times with this measurer: fewer on the CPU device."""
    return CPU_DEVICE_PAIRS if (measurer.environment() or {}).get("device_kind") == "cpu" else PAIRS


def verdict(g: PairedGain, min_gain: float) -> tuple[bool, str]:
    """(does the tuned config replace the incumbent, why) from a paired gain."""
    if g.gain is None or g.low is None:
        if g.tuned_us and not g.incumbent_us:
            return True, "the incumbent failed in the paired re-time"
        return False, "the tuned config failed in the paired re-time"
    spread = f"spread {g.spread:.1%} over {g.pairs} pairs"
    if g.gain <= min_gain:
        return False, f"gain {g.gain:+.1%} ({spread}) is not above {threshold_text(min_gain)}"
    if g.low <= 0:
        return False, f"gain {g.gain:+.1%} but not in most pairs ({spread}, p20 {g.low:+.1%})"
    return True, f"gain {g.gain:+.1%} ({spread}) above {threshold_text(min_gain)}"


def choose_row(kernel: KernelSpec, measurer: Measurer, result, incumbents: list[tuple],
               min_gain: float):
    """The study's result with its row decided: the search's config where it beats the first
    incumbent that can be timed by more than `min_gain` in paired re-timing, else that
    incumbent. `result` is a StudyResult; its `choice` says which was kept and why.
    `incumbents`: [(label, config)] or [(label, config, the file it is read from)]."""
    if result.config is None:
        return result
    tuned = config_tuple(kernel, result.config)
    rejected = {config_tuple(kernel, r["config"]) for r in result.rejected}
    for label, cfg, *where in incumbents:
        source = {"incumbent_table": where[0]} if where and where[0] else {}
        if cfg is None or config_tuple(kernel, cfg) in rejected:
            continue                                # failed the numerics check already: never kept
        if config_tuple(kernel, cfg) == tuned:
            return dataclasses.replace(result, choice={"kept": label, "incumbent": label, **source,
                                                       "why": f"the search's best is the {label} config itself"})
        g = paired_gain(measurer, result.problem, result.M, result.config, cfg, pairs_for(measurer))
        if g.incumbent_us is None:
            continue                               # not timeable (not in a landscape, failed): the next one
        replace, why = verdict(g, min_gain)
        info = {"kept": "tuned" if replace else label, "incumbent": label, **source, "why": why, "min_gain": min_gain,
                "gain": g.gain, "spread": g.spread, "pairs": g.pairs, "tuned_us": g.tuned_us,
                "incumbent_us": g.incumbent_us}
        if replace:
            return dataclasses.replace(result, choice=info)
        check = measurer.check_numerics(result.problem, result.M, cfg)
        if check.failed:                            # an installed row that computes wrong results goes
            return dataclasses.replace(result, choice={**info, "kept": "tuned", "why": f"{why}, but the {label} "
                                                       f"config failed the numerics check ({check.detail})"})
        return dataclasses.replace(result, choice={**info, "tuned": result.config}, config=cfg,
                                   time_us=g.incumbent_us, spread=None,
                                   numerics={**check.as_dict(), "detail": f"the {label} config, kept: {why}"})
    return dataclasses.replace(result, choice={"kept": "tuned", "why": "no incumbent could be timed"})


def choice_text(choice: dict | None) -> str:
    """Which config a row holds and why, in words (results table, report)."""
    if not choice:
        return "tuned"
    return f"{choice.get('kept', 'tuned')}: {choice.get('why', '')}".rstrip(": ")


def choice_short(choice: dict | None) -> str:
    """Which config a row holds, and the tuned config's paired gain over the incumbent where one
    was measured ('default +1.8%'), for a terminal table's column; the why is choice_text's."""
    if not choice:
        return "tuned"
    gain, kept = choice.get("gain"), choice.get("kept", "tuned")
    if isinstance(gain, (int, float)):
        # a table tied to another (SGLang's up and _down): the gain is the pair's, both tables together
        return f"{kept} {gain:+.1%}" + (" pair" if choice.get("tied_with") else "")
    # no pair timed: the search's best was the incumbent itself (nothing to gain), or none could be timed
    return f"{kept} (same)" if choice.get("incumbent") == kept else kept
