"""Tables chosen together raced together: once SGLang's up and `_down` tables have their
joint choice (tuner/search/tied_choice.py), the chosen pair is timed again in pairs against the
pair the engine runs today at that M (the rows it reads, tuner/pipeline/incumbents.py, else the
defaults), and both rows change only when the pair's gain clears --min-gain, as a single
table's row does (tuner/search/choice.py). A pair of the up GEMM and the down GEMM is timed as
the sum of the two, each part's configs interleaved in one call."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tuner.plan.kernel_api import Config, config_from_entry, config_tuple
from tuner.plan.problems import Problem
from tuner.search.choice import paired_gain_of_parts, verdict

if TYPE_CHECKING:
    from tuner.search.runner import StudyResult, StudyRunner


def incumbent_pairs(kernel, up: Problem, down: Problem, M: int, up_incumbents: list[tuple],
                    down_installed: tuple | None) -> list[tuple[str, Config, Config, str]]:
    """[(label, up config, down config, where)] the engine would run at M, first the rows it
    reads, then the defaults: `up_incumbents` as the up study had them ([(label, config[,
    where])], the default last); `down_installed` the `_down` row the engine reads
    ((label, config, where), None: it reads none and runs the down GEMM with the up config).
    The down config takes the up config's shared keys, as SGLang's loader overrides them."""
    from tuner.search.tied_choice import table_default
    keys = down.tied_keys
    out = []
    for label, u_cfg, *where in up_incumbents:
        if u_cfg is None:
            continue
        d_cfg = (config_from_entry(kernel, down_installed[1]) if down_installed and label != "default"
                 else table_default(kernel, down, M, u_cfg))
        d_cfg = {**d_cfg, **{k: u_cfg[k] for k in keys}}
        src = " + ".join(w for w in [where[0] if where else "", down_installed[2] if down_installed and
                                     label != "default" else ""] if w)
        out.append((label, u_cfg, d_cfg, src))
    if down_installed and not any(label != "default" for label, *_ in out):
        # a `_down` table read beside no up table: with the up default
        u_cfg = next(c for label, c, *_ in out if label == "default")
        out.insert(0, (down_installed[0], u_cfg, {**config_from_entry(kernel, down_installed[1]),
                                                  **{k: u_cfg[k] for k in keys}}, down_installed[2]))
    return out


def race_tied(runner: StudyRunner, up: Problem, down: Problem, M: int, up_r: StudyResult, down_r: StudyResult,
              pairs: list[tuple[str, Config, Config, str]], min_gain: float) -> tuple[StudyResult, StudyResult]:
    """Both results with their rows decided together against the first incumbent pair that
    can be timed (`pairs`, from incumbent_pairs), stored; each result's `choice` says which
    pair was kept, the pair's paired gain and why."""
    kernel, measurer = runner.kernel, runner.measurer
    if up_r.config is None or down_r.config is None:
        return up_r, down_r
    key = (config_tuple(kernel, up_r.config), config_tuple(kernel, down_r.config))
    up_rejected = {config_tuple(kernel, r["config"]) for r in up_r.rejected}
    down_rejected = {config_tuple(kernel, r["config"]) for r in down_r.rejected}
    chosen: tuple[dict, Config | None, Config | None, list] = (
        {"kept": "tuned", "why": "no incumbent pair could be timed"}, None, None, [])
    checks: list = []
    for label, u_cfg, d_cfg, where in pairs:
        source = {"incumbent_table": where} if where else {}
        if config_tuple(kernel, u_cfg) in up_rejected or config_tuple(kernel, d_cfg) in down_rejected:
            continue
        if (config_tuple(kernel, u_cfg), config_tuple(kernel, d_cfg)) == key:
            chosen = ({"kept": label, "incumbent": label, **source,
                       "why": f"the chosen pair is the {label} pair itself"}, None, None, [])
            break
        part_us: list = []
        g = paired_gain_of_parts(measurer, [(up, up_r.config, u_cfg), (down, down_r.config, d_cfg)], M,
                                 part_us=part_us)
        if g.incumbent_us is None:
            continue
        replace, why = verdict(g, min_gain)
        info = {"kept": "tuned" if replace else label, "incumbent": label, **source,
                "why": f"up and down together: {why}", "min_gain": min_gain, "gain": g.gain, "spread": g.spread,
                "pairs": g.pairs, "tuned_us": g.tuned_us, "incumbent_us": g.incumbent_us}
        if replace:
            chosen = (info, None, None, part_us)
            break
        checks = [measurer.check_numerics(up, M, u_cfg), measurer.check_numerics(down, M, d_cfg)]
        failed = next((c for c in checks if c.failed), None)
        if failed is not None:
            chosen = ({**info, "kept": "tuned", "why": f"{info['why']}, but the {label} pair failed the numerics "
                                                       f"check ({failed.detail})"}, None, None, part_us)
        else:
            chosen = (info, u_cfg, d_cfg, part_us)
        break
    info, u_keep, d_keep, part_us = chosen
    out = []
    for i, (r, keep) in enumerate(((up_r, u_keep), (down_r, d_keep))):
        choice = {**info, "tied_with": (down if i == 0 else up).key}
        if keep is None:
            new = dataclasses.replace(r, choice=choice)
        else:
            check = checks[i]
            new = dataclasses.replace(r, choice={**choice, "tuned": r.config}, config=keep,
                                      time_us=part_us[i][1] if part_us else None, spread=None,
                                      numerics={**check.as_dict(), "detail": f"the {info['kept']} config, kept: "
                                                                             f"{info['why']}"})
        runner.store(new)
        out.append(new)
    return out[0], out[1]
