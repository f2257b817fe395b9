"""The search: one Optuna study per (problem, M), driven by ask/tell.

Each launch-config key is an ordinal parameter (an index into its sorted values), so
TPE and CMA-ES see that 64 lies between 32 and 128. A trial is one of:
  COMPLETE  a measured config (value: median time in microseconds)
  FAIL      a config that failed to compile or run (user attr "error")
  PRUNED    a sample outside the pruned space, or a repeat of a measured config
            (costs nothing, does not count against the budget; TPE learns to avoid it)
The budget counts distinct measured configs, including those a stopped run left in
the storage, so a run started again continues where it stopped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import optuna

from tuner.errors import TunerError
from tuner.gpus import GpuSpec
from tuner.kernel_api import Config, KernelSpec, config_dict, config_tuple
from tuner.measure import Measurement, NumericsCheck
from tuner.problems import Problem
from tuner.space import SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)

SAMPLERS = ("tpe", "random", "cmaes")


@dataclass
class SearchSettings:
    budget: int = 48                # distinct configs measured per (problem, M)
    patience: int = 16              # stop after this many measured trials without a gain
    min_gain: float = 0.005         # what counts as a gain (0.5 %)
    top_k: int = 3                  # finalists re-timed before choosing
    batch: int = 8                  # trials asked at once (compiled in parallel on a GPU)
    sampler: str = "tpe"
    seed: int = 0


def make_sampler(settings: SearchSettings) -> optuna.samplers.BaseSampler:
    s = settings
    if s.sampler == "tpe":
        return optuna.samplers.TPESampler(
            seed=s.seed, n_startup_trials=max(4, min(10, s.budget // 4)), multivariate=True,
            constant_liar=True)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=s.seed, warn_independent_sampling=False)
    raise TunerError(f"unknown sampler {s.sampler!r}; choose from {', '.join(SAMPLERS)}")


@dataclass
class StudyResult:
    problem: Problem
    M: int
    config: Config | None
    time_us: float | None
    spread: float | None
    default_config: Config
    default_time_us: float | None
    trials: int
    stopped: str                        # "budget", "converged", "exhausted", "no config"
    numerics: dict = field(default_factory=dict)
    rejected: list = field(default_factory=list)   # finalists that failed the numerics check

    @property
    def speedup(self) -> float | None:
        if self.time_us and self.default_time_us:
            return self.default_time_us / self.time_us
        return None

    def as_dict(self) -> dict:
        return {"M": self.M, "config": self.config, "time_us": self.time_us, "spread": self.spread,
                "default_config": self.default_config, "default_time_us": self.default_time_us,
                "speedup": self.speedup, "trials": self.trials, "stopped": self.stopped,
                "numerics": self.numerics, "rejected": self.rejected}


def study_name(problem: Problem, M: int) -> str:
    return f"{problem.kernel}:{problem.key}:M={M}"


class StudyRunner:
    """Runs the study of one (problem, M) against a measurer and returns its result."""

    def __init__(self, kernel: KernelSpec, space: SearchSpace, gpu: GpuSpec, measurer,
                 storage, settings: SearchSettings, on_trial=None):
        self.kernel = kernel
        self.space = space
        self.gpu = gpu
        self.measurer = measurer
        self.storage = storage
        self.settings = settings
        self.on_trial = on_trial or (lambda **kw: None)

    # -- the study's parameter encoding -------------------------------------------------
    def _encode(self, choices: dict, cfg: Config) -> dict:
        return {k: choices[k].index(cfg[k]) for k in self.kernel.config_keys}

    def _suggest(self, trial: optuna.Trial, choices: dict) -> Config:
        return {k: choices[k][trial.suggest_int(k, 0, len(choices[k]) - 1)] for k in self.kernel.config_keys}

    def tune(self, problem: Problem, M: int, seeds: list[tuple[str, Config]],
             fixed: Config | None = None) -> StudyResult:
        """`fixed` pins some config keys (e.g. BLOCK_SIZE_M tied to another table)."""
        kernel, s = self.kernel, self.settings
        params = problem.params
        fixed = fixed or {}
        pin = lambda cfg: self.space.canonical(params, M, self.gpu, {**cfg, **fixed})  # noqa: E731
        default = pin(kernel.default_config(params, M))
        allowed = {config_tuple(kernel, c) for c in self.space.configs(params, M, self.gpu)
                   if all(c[k] == v for k, v in fixed.items())}
        available = self.measurer.candidates(problem, M)
        seed_cfgs = []
        for label, cfg in seeds:
            if cfg is None:
                continue
            cfg = pin(cfg)
            t = config_tuple(kernel, cfg)
            if available is not None and t not in available:
                continue
            if all(config_tuple(kernel, c) != t for _, c in seed_cfgs):
                seed_cfgs.append((label, cfg))
            allowed.add(t)       # seeds are measured even when the rules would drop them
        if available is not None:
            allowed &= available
        if not allowed:
            return StudyResult(problem, M, None, None, None, default, None, 0, "no config",
                               {"status": "not checked", "detail": "no config survives pruning"})

        choices = {k: sorted({t[i] for t in allowed}) for i, k in enumerate(kernel.config_keys)}
        study = optuna.create_study(study_name=study_name(problem, M), storage=self.storage,
                                    direction="minimize", sampler=make_sampler(s), load_if_exists=True)
        stored = study.user_attrs.get("choices")
        if stored is None:
            study.set_user_attr("choices", choices)
        elif stored != choices:
            # Keep the stored encoding so old trials keep their meaning; drop what it cannot say.
            choices = {k: [int(v) for v in stored[k]] for k in kernel.config_keys}
            allowed = {t for t in allowed if all(v in choices[k] for k, v in zip(kernel.config_keys, t))}
            seed_cfgs = [(lb, c) for lb, c in seed_cfgs if config_tuple(kernel, c) in allowed]

        done = study.user_attrs.get("result")
        if done and (done["stopped"] != "budget" or done["trials"] >= s.budget):
            return self._result_from_attrs(problem, M, done)

        measured = self._recover(study, choices)
        for label, cfg in seed_cfgs:
            if config_tuple(kernel, cfg) not in measured:
                study.enqueue_trial(self._encode(choices, cfg), user_attrs={"seed": label}, skip_if_exists=True)

        rng = random.Random(f"{s.seed}:{study_name(problem, M)}")
        best = min((v for v in measured.values() if v is not None), default=None)
        since_gain = self._trials_since_gain(study)
        idle_batches = 0
        stopped = "budget"
        while len(measured) < s.budget:
            if len(measured) >= len(allowed):
                stopped = "exhausted"
                break
            if since_gain >= s.patience and len(measured) >= min(s.budget, len(seed_cfgs) + s.patience):
                stopped = "converged"
                break
            want = min(s.batch, s.budget - len(measured))
            batch: list[tuple[optuna.Trial, Config]] = []
            pending: set[tuple] = set()
            for _ in range(want * 4):                 # a few tries to fill the batch
                if len(batch) >= want:
                    break
                trial = study.ask()
                cfg = self._suggest(trial, choices)
                t = config_tuple(kernel, cfg)
                if t not in allowed:
                    reason = self.space.rejected_by(params, M, self.gpu, cfg) or "not in the landscape"
                    trial.set_user_attr("pruned", reason)
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                elif t in measured or t in pending:
                    trial.set_user_attr("pruned", "repeat")
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    trial.set_user_attr("config", cfg)
                    batch.append((trial, cfg))
                    pending.add(t)
            if not batch:
                # The sampler keeps proposing what is done or excluded: add fresh points.
                idle_batches += 1
                left = sorted(allowed - set(measured))
                for t in rng.sample(left, min(want, len(left))):
                    study.enqueue_trial(self._encode(choices, config_dict(kernel, t)),
                                        user_attrs={"seed": "random-fill"})
                if idle_batches > 50:
                    stopped = "exhausted"
                    break
                continue
            idle_batches = 0
            results = self.measurer.measure(problem, M, [c for _, c in batch])
            for (trial, cfg), m in zip(batch, results):
                self._tell(study, trial, m)
                measured[config_tuple(kernel, cfg)] = m.time_us
                if m.time_us is not None and (best is None or m.time_us < best * (1 - s.min_gain)):
                    since_gain = 0
                else:
                    since_gain += 1
                if m.time_us is not None and (best is None or m.time_us < best):
                    best = m.time_us
                self.on_trial(problem=problem, M=M, done=len(measured), budget=s.budget, best=best)

        result = self._finish(problem, M, measured, default, stopped)
        study.set_user_attr("result", result.as_dict())
        return result

    # -- helpers --------------------------------------------------------------------
    def _tell(self, study, trial, m: Measurement) -> None:
        if m.time_us is None:
            trial.set_user_attr("error", m.error or "failed")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            if m.spread is not None:
                trial.set_user_attr("spread", m.spread)
            study.tell(trial, m.time_us)

    def _recover(self, study, choices: dict) -> dict[tuple, float | None]:
        """Configs already measured in this study; trials a killed run left RUNNING are
        failed as 'interrupted' and their configs queued again."""
        measured: dict[tuple, float | None] = {}
        for tr in study.get_trials(deepcopy=False):
            cfg = tr.user_attrs.get("config")
            if tr.state == optuna.trial.TrialState.RUNNING:
                stale = optuna.Trial(study, tr._trial_id)
                stale.set_user_attr("error", "interrupted")
                study.tell(stale, state=optuna.trial.TrialState.FAIL)
                if cfg:
                    study.enqueue_trial(self._encode(choices, cfg), user_attrs={"seed": "requeued"})
                continue
            if not cfg or tr.user_attrs.get("error") == "interrupted":
                continue
            if tr.state == optuna.trial.TrialState.COMPLETE:
                measured[config_tuple(self.kernel, cfg)] = tr.value
            elif tr.state == optuna.trial.TrialState.FAIL:
                measured[config_tuple(self.kernel, cfg)] = None
        return measured

    def _trials_since_gain(self, study) -> int:
        best, since = None, 0
        for tr in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                          optuna.trial.TrialState.FAIL)):
            if "config" not in tr.user_attrs or tr.user_attrs.get("error") == "interrupted":
                continue
            v = tr.value
            if v is not None and (best is None or v < best * (1 - self.settings.min_gain)):
                since = 0
            else:
                since += 1
            if v is not None and (best is None or v < best):
                best = v
        return since

    def _finish(self, problem: Problem, M: int, measured: dict, default: Config, stopped: str) -> StudyResult:
        """Re-time the best few (and the default) together, then check numerics in order."""
        kernel = self.kernel
        timed = sorted((v, t) for t, v in measured.items() if v is not None)
        default_t = config_tuple(kernel, default)
        if not timed:
            return StudyResult(problem, M, None, None, None, default, measured.get(default_t), len(measured),
                               "no config", {"status": "not checked", "detail": "every config failed"})
        finalists = [config_dict(kernel, t) for _, t in timed[: self.settings.top_k]]
        retime = finalists + ([default] if default_t in measured and measured[default_t] is not None
                              and default not in finalists else [])
        again = self.measurer.measure(problem, M, retime)
        by_cfg = {config_tuple(kernel, c): m for c, m in zip(retime, again)}
        default_time = by_cfg[default_t].time_us if default_t in by_cfg else measured.get(default_t)
        ranked = sorted((m.time_us, i) for i, m in enumerate(again[: len(finalists)]) if m.time_us is not None)
        rejected = []
        for time_us, i in ranked:
            cfg = finalists[i]
            check: NumericsCheck = self.measurer.check_numerics(problem, M, cfg)
            if check.failed:
                rejected.append({"config": cfg, "numerics": check.as_dict()})
                continue
            return StudyResult(problem, M, cfg, time_us, again[i].spread, default, default_time,
                               len(measured), stopped, check.as_dict(), rejected)
        return StudyResult(problem, M, None, None, None, default, default_time, len(measured), "no config",
                           {"status": "failed", "detail": "every finalist failed the numerics check"}, rejected)

    def _result_from_attrs(self, problem: Problem, M: int, d: dict) -> StudyResult:
        return StudyResult(problem, M, d["config"], d["time_us"], d["spread"], d["default_config"],
                           d["default_time_us"], d["trials"], d["stopped"], d.get("numerics", {}),
                           d.get("rejected", []))
