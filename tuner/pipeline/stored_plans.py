"""A run's plan kept in its storage beside the studies, so that `tuner worker` and `tuner
collect` need only the storage URL and the study prefix: saved (after checking that a plan of
the same name there is this run's), and read back as plans whose request is the worker's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from optuna.storages import BaseStorage

from tuner.errors import TunerError
from tuner.pipeline.request import KERNEL_OF, TuneRequest
from tuner.pipeline.run_plan import RunPlan, run_storage
from tuner.plan.problems import Problem
from tuner.plan.space import SearchSpace
from tuner.search.runner import SearchSettings, identity_differences
from tuner.search.storage_checks import open_checked_storage, storage_holds_anything
from tuner.search.warm_start import WarmPool

PLAN_FORMAT = "tuner-plan/1"


def plan_study_name(prefix: str, kernel_name: str, source: str = "ours") -> str:
    return f"{prefix}tuner-plan:{kernel_name}" + ("" if source == "ours" else f"@{source}")


def save_plan(storage: BaseStorage, opts: RunPlan) -> None:
    """Store what to tune beside the studies, so `tuner worker` and `tuner collect` need
    only the storage URL and the study prefix."""
    import optuna
    check_plan(storage, opts)          # read first, write after: another plan is refused unwritten
    study = optuna.create_study(study_name=plan_study_name(opts.prefix, opts.kernel.name, opts.kernel.source),
                                storage=storage, load_if_exists=True)
    identity = plan_identity(opts)
    study.set_user_attr("plan", {
        "identity": identity,
        "format": PLAN_FORMAT, "kernel": opts.kernel.name, "kernel_ref": opts.kernel.ref, "gpu": opts.gpu.key,
        "problems": [{"params": p.params, "layers": list(p.layers), "engines": list(p.engines),
                      "tied_to": p.tied_to, "tied_keys": list(p.tied_keys)} for p in opts.problems],
        "batch_sizes": {p.key: sorted(opts.ms_for(p)) for p in opts.problems},
        "settings": dataclasses.asdict(opts.settings),
        "space": {"choices": opts.space.choices, "constraints": opts.space.constraints,
                  "source": opts.space.source, "kinds": opts.space.kinds},
        "engines": opts.engines, "baseline": opts.baseline, "run_info": opts.run_info,
        **({"warm": opts.warm.as_dict()} if opts.warm else {}),
    })


def check_plan(storage: BaseStorage, opts: RunPlan) -> None:
    """Reading only: a plan of the same name in the storage must be this run's (the same
    device, kernel, code and space), else one line and nothing written to the storage
    (create_study(load_if_exists) would append a create operation before it loads)."""
    import optuna
    name = plan_study_name(opts.prefix, opts.kernel.name, opts.kernel.source)
    if name not in optuna.get_all_study_names(storage):
        return
    stored = optuna.load_study(study_name=name, storage=storage).user_attrs.get("plan") or {}
    what = identity_differences(stored.get("identity") or {}, plan_identity(opts))
    if what:
        raise TunerError(f"the storage already holds a plan ({name}) for another {what}; its studies "
                         "are not this run's: give another --out (or --storage, or --study-prefix)")


def plan_identity(opts: RunPlan) -> dict:
    """What a plan's studies will be timed on, as far as it is known before measuring
    (tuner/search/identity.py); a replay's policy is the landscape's, so only its routing is known."""
    from tuner.search.identity import plan_identity as identity
    policy = opts.policy if not opts.replay else {"routing": opts.policy.get("routing")}
    return identity(opts.device_name, opts.kernel, opts.space, opts.times, policy)


def load_plans(store: BaseStorage, prefix: str, out_dir: Path | None = None, load_code: bool = False,
               engine_source: list[str] | None = None, **overrides) -> list[RunPlan]:
    """The plans stored under a prefix; `overrides`: the options of the request the plan
    leaves to each worker (replay file, storage URL, compile workers...). load_code: an
    engine kernel's code is needed (a worker measuring on a GPU); it is read from
    `engine_source` when given (another machine's paths mean nothing here), else from where
    the plan's machine read it, the installed engine, or $TUNER_ENGINE_WHEELS."""
    import optuna

    names = [n for n in optuna.get_all_study_names(store) if n.startswith(plan_study_name(prefix, ""))]
    plans = []
    for name in sorted(names):
        plan = optuna.load_study(study_name=name, storage=store).user_attrs.get("plan")
        if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
            continue
        try:
            plans.append(_plan_of(name, plan, prefix, out_dir, load_code, engine_source, overrides))
        except TunerError as e:
            raise TunerError(f"the stored plan {name}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # written by another tuner version, or by hand: one line, not a traceback
            raise TunerError(f"the stored plan {name} is not one this tuner can read ({type(e).__name__}: {e}); "
                             "start the run again under another --study-prefix") from None
    if not plans:
        raise TunerError(f"the storage holds no tuning plan under the study prefix {prefix!r}; "
                         "start one with `tuner gemm|moe|mla ... --storage URL --study-prefix NAME`")
    return plans


def _plan_of(name: str, plan: dict, prefix: str, out_dir: Path | None, load_code: bool,
             engine_source: list[str] | None, overrides: dict) -> RunPlan:
    """One stored plan read back as a RunPlan whose request is the worker's."""
    from tuner.plan.gpus import get_gpu
    from tuner.plan.kernel_registry import get_kernel

    ref = dict(plan.get("kernel_ref") or {"name": plan["kernel"]})
    if ref.get("source", "ours") != "ours" and (engine_source or not Path(ref.get("origin") or "").exists()):
        from tuner.plan.kernel_sources import origin_for
        ref["origin"] = origin_for(ref["source"], engine_source)
    kernel = get_kernel(**ref, load_code=load_code)
    space = SearchSpace(kernel, {k: list(v) for k, v in plan["space"]["choices"].items()},
                        plan["space"]["constraints"], plan["space"]["source"], dict(plan["space"].get("kinds") or {}))
    problems = [Problem(kernel.name, d["params"], tuple(d["layers"]), tuple(d["engines"]),
                        d.get("tied_to"), tuple(d.get("tied_keys", ()))) for d in plan["problems"]]
    command = next((c for c, k in KERNEL_OF.items() if k == kernel.name), None)
    if command is None:
        raise TunerError(f"it tunes {kernel.name}, which no tuning command tunes")
    # the worker's request: the plan's own options, and the worker's (its replay, storage, device...)
    request = TuneRequest(command=command, model=str((plan.get("run_info") or {}).get("model") or ""),
                          gpu=plan["gpu"], engines=plan["engines"], baseline=plan["baseline"],
                          study_prefix=prefix, **overrides)
    opts = RunPlan(request=request, kernel=kernel, space=space, gpu=get_gpu(plan["gpu"]), problems=problems,
                   batch_sizes=sorted({m for ms in plan["batch_sizes"].values() for m in ms}),
                   settings=SearchSettings(**plan["settings"]), out_dir=out_dir or Path("."),
                   run_info=plan["run_info"], plan_ms=plan["batch_sizes"],
                   warm=WarmPool.from_dict(plan["warm"]) if plan.get("warm") else None)
    if (plan.get("run_info") or {}).get("traffic"):
        from tuner.plan.traffic import TrafficProfile
        opts.traffic = TrafficProfile.from_manifest(plan["run_info"]["traffic"], "the stored plan")
    if (plan.get("run_info") or {}).get("routing"):
        from tuner.plan.routing import use_stored
        use_stored(opts.out_dir / "routing")       # the recorded routing's ids (tuner/plan/routing.py)
    return opts


def open_run_storage(opts: RunPlan) -> BaseStorage:
    return open_checked_storage(run_storage(opts))


def storage_exists(opts: RunPlan) -> bool:
    """Whether the run's storage holds anything yet (tuner/search/storage_checks.py)."""
    return storage_holds_anything(run_storage(opts))
