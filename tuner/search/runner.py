"""The search: one Optuna study per (problem, M), driven by ask/tell.

Each launch-config key is a categorical parameter over its values (on recorded GPU
landscapes that beat index-encoded integers for TPE; scripts/search_benchmark.py), and the
default sampler (tuner/search/surrogate.py) picks among the study's own candidates. A trial is:
  COMPLETE  a measured config (value: median time in microseconds; user attr "config"),
            or a proposal repeating one, told the time measured before (user attr
            "repeat", no "config": it costs nothing and never counts as a measurement)
  FAIL      a config that failed to compile or run (user attrs "error", "failure"); or,
            without "error", a proposal of a config being measured right now
  PRUNED    a sample outside the pruned space (costs nothing; samplers learn to avoid it)
The budget counts distinct measured configs, including those a stopped run left in
the storage, so a run started again continues where it stopped. Workers sharing a study
and the trials a dead one left behind are tuner/search/storage.py's business; when to stop
is tuner/search/stopping.py's.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
import warnings
from dataclasses import dataclass, field

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from tuner.measure.failures import RUNTIME, kind_of
from tuner.measure.measurers import Measurement, Measurer, NumericsCheck
from tuner.measure.provenance import is_cpu_device
from tuner.plan.gpus import GpuSpec
from tuner.plan.kernel_api import Config, KernelSpec, config_dict, config_tuple
from tuner.plan.problems import Problem
from tuner.plan.space import SearchSpace
from tuner.search import window as _window
from tuner.search.ahead import CompileAhead
from tuner.search.choice import choose_row
from tuner.search.conclusion import failures, first_failure
from tuner.search.evidence import StopModel, table_gain
from tuner.search.identity import identity_differences, stored_identity, study_identity  # noqa: F401
from tuner.search.prior import PRIOR, agreement, earned_seeds, estimates, prior_seeds
from tuner.search.samplers import make_sampler
from tuner.search.settings import SearchSettings, StudyResult, default_settings, study_name  # noqa: F401
from tuner.search.stopping import StoppingRule, plateau_rule
from tuner.search.storage import WORKER_ID, claim, close_trial, counts, fail_stale, measuring
from tuner.search.stored_state import checked_result
from tuner.search.study_match import check_identity, stored_choices
from tuner.search.warm_start import is_warm, seeds_by_source
from tuner.search.window import BATCH_ATTR, CLOSE_CUT_ATTR, CUT_ATTR, TOOK_ATTR, Window, WindowClosed, measuring_in

optuna.logging.set_verbosity(optuna.logging.WARNING)
# We drive trials with ask/tell and record heartbeats ourselves (study_storage.Heartbeat).
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")

# Trials after the seeds that are the sampler's alone, before the stop's model shares them (tuner/search/
# evidence.py): on the H200's GEMM landscape at M=16 the best config is one the cost model and M=1 call slow,
# and the sampler's own model tries it by its third pick
SAMPLER_FIRST = 4


@dataclass
class _Target:
    """What one study searches: the configs it may measure (as tuples), the seeds queued
    first, the default config, and the study's parameter encoding (sorted values per key)."""
    problem: Problem
    M: int
    default: Config
    allowed: set[tuple]
    seeds: list[tuple[str, Config]]
    choices: dict[str, list[int]] = field(default_factory=dict)


class StudyRunner:
    """Runs the study of one (problem, M) against a measurer and returns its result."""

    def __init__(self, kernel: KernelSpec, space: SearchSpace, gpu: GpuSpec, measurer: Measurer,
                 storage: BaseStorage, settings: SearchSettings, on_trial=None, prefix: str = "",
                 policy: dict | None = None, window: Window | None = None):
        self.kernel = kernel
        self.space = space
        self.gpu = gpu
        self.measurer = measurer
        self.storage = storage
        self.settings = settings
        self.on_trial = on_trial or (lambda **kw: None)
        self.poll_s = 2.0          # how often to look again while other workers hold the last trials
        self.prefix = prefix
        self.policy = policy or {}          # the run's measurement policy (tuner/measure/policy.py)
        self.window = window                # --minutes: stop on time (tuner/search/window.py)
        self.searched_at: float | None = None   # when the last study's search ended and its close began
        self.ahead = CompileAhead.of(kernel, gpu, measurer)    # compile workers: the likely next built ahead

    def tune(self, problem: Problem, M: int, seeds: list[tuple[str, Config]],
             fixed: Config | None = None, default: Config | None = None,
             incumbents: list[tuple] | None = None,
             neighbours: dict[int, dict[tuple, float | None]] | None = None) -> StudyResult:
        """The study's result: from the storage when a run already finished it, else
        searched now (continuing what the storage holds). `fixed` pins some config keys
        (e.g. BLOCK_SIZE_M tied to another table); `default` is what the engine runs
        without this table (the kernel's default config unless given); `neighbours`, what the
        batch sizes of this problem done in this run measured ({M: {config: time}}), evidence
        for when to stop."""
        self.searched_at = None
        target = self._target(problem, M, seeds, fixed or {}, default, neighbours)
        if not target.allowed:
            return StudyResult(problem, M, None, None, None, target.default, None, 0, "no config",
                               {"status": "not checked", "detail": "no config survives pruning"})
        study = self._open(target)
        done = checked_result(study.study_name, study.user_attrs.get("result"))   # one that does not validate: closed again
        if done and (done["stopped"] != "budget" or done["trials"] >= self.settings.budget_for(problem, M)):
            result = self.result_from_dict(problem, M, done)
            result.resumed = True
            return result
        self._fail_stale(study, target)
        self._queue_seeds(study, target)
        if self.ahead is not None:
            self.ahead.studied(problem, M, [row[1] for row in incumbents or []])
        try:
            # the row the engine runs today: what a tuned row must beat (tuner/search/choice.py)
            row = self._key(incumbents[0][1]) if incumbents else self._key(target.default)
            stopped, measured = self._search(study, target, neighbours or {}, row)
            self.searched_at = _window.now()     # the close begins: its time is the pipeline's to keep (close_s)
            if self.window:       # the finalists timed again and checked: in this window, or the next
                self.window.before_close(study.get_trials(deepcopy=False), cut_s=study.user_attrs.get(CLOSE_CUT_ATTR))
            try:
                with measuring_in(self.window, closing=True):
                    result = self._finish(problem, M, measured, target.default, stopped)
                    # the row changes only for a real gain over what the engine runs today (an installed row, else
                    # the default)
                    result = choose_row(self.kernel, self.measurer, result,
                                        [*(incumbents or []), ("default", target.default)], self.settings.row_gain)
            except WindowClosed:      # the next window takes such a close as at least this long
                study.set_user_attr(CLOSE_CUT_ATTR, round(_window.now() - (self.searched_at or _window.now()), 3))
                raise
        finally:
            self._fail_stale(study, target)      # leave no dead worker's (or cut batch's) trial RUNNING behind
        result.failures = failures(study, result)
        result.first_failure = first_failure(study)
        seeded = seeds_by_source(label for label, _ in target.seeds)
        result.search = {**self.searched_with(problem, M), **({"seeds": seeded} if seeded else {})}
        study.set_user_attr("result", result.as_dict())
        study.set_user_attr("environment", self.measurer.environment())
        study.set_user_attr("measured_by", self.measurer.label)
        return result

    def sure_configs(self, problem: Problem, M: int, seeds: list[tuple[str, Config]]) -> list[Config]:
        """The configs a study of (problem, M) will time whatever it finds: its default and its
        seeds (these, and the cost model's first), as it will time them (tuner/search/ahead.py)."""
        target = self._target(problem, M, seeds, {})
        return [target.default, *(c for _, c in target.seeds)]

    def searched_with(self, problem: Problem, M: int) -> dict:
        """The settings this runner searches a study with, as its result records them."""
        s = self.settings
        return {"budget": s.budget_for(problem, M), "patience": s.patience_for(problem, M), "sampler": s.sampler,
                "seed": s.seed}

    # -- what a study searches --------------------------------------------------------
    def _key(self, cfg: Config) -> tuple:
        return config_tuple(self.kernel, cfg)

    def _target(self, problem: Problem, M: int, seeds: list[tuple[str, Config]], fixed: Config,
                default: Config | None = None, neighbours: dict | None = None) -> _Target:
        """The configs the study may measure: the pruned space with `fixed` applied, plus
        the seeds (measured even where the rules would drop them), within what the measurer
        can time (a landscape's points)."""
        params = problem.params

        def pin(cfg: Config) -> Config:
            return self.space.canonical(params, M, self.gpu, {**cfg, **fixed})

        allowed = {self._key(c) for c in self.space.configs(params, M, self.gpu)
                   if all(c[k] == v for k, v in fixed.items())}
        available = self.measurer.candidates(problem, M)
        seed_cfgs: list[tuple[str, Config]] = []
        for label, cfg in seeds:
            if cfg is None:
                continue
            cfg = pin(cfg)
            t = self._key(cfg)
            if available is not None and t not in available:
                continue
            if all(self._key(c) != t for _, c in seed_cfgs):
                seed_cfgs.append((label, cfg))
            allowed.add(t)
        if available is not None:
            allowed &= available
        # the cost model's fastest candidates next (tuner/search/prior.py), where the kernel describes its
        # work; not on the CPU device, whose interpreter runs worst the many small programs Hopper likes
        count = self._prior()
        if count and neighbours:       # as many as the model earned on the batch sizes done (tuner/search/prior.py)
            count = earned_seeds(count, agreement(self.kernel, self.gpu, params, neighbours))
        seed_cfgs += prior_seeds(self.kernel, self.gpu, params, M, sorted(allowed), count,
                                 [self._key(c) for _, c in seed_cfgs])
        return _Target(problem, M, pin(default or self.kernel.default_config(params, M)), allowed, seed_cfgs)

    def _prior(self) -> int:
        """The cost model's seeds per study: none on the CPU device (its times are the interpreter's)."""
        return 0 if is_cpu_device(self.measurer.environment()) else self.settings.prior

    def _open(self, target: _Target) -> optuna.Study:
        """Create or reopen the study; its stored parameter encoding wins, so that trials
        a stopped run left keep their meaning (what that encoding cannot say is dropped).
        A study stored with another encoding (an older tuner's) is refused in one line."""
        keys = self.kernel.config_keys
        choices = {k: sorted({t[i] for t in target.allowed}) for i, k in enumerate(keys)}
        name = study_name(target.problem, target.M, self.prefix, self.kernel.source)
        study = optuna.create_study(study_name=name, storage=self.storage, direction="minimize",
                                    sampler=optuna.samplers.RandomSampler(), load_if_exists=True)
        check_identity(study, self.identity())
        stored = stored_choices(study, keys, choices)      # a study not this run's, or damaged: one line
        if stored != choices:
            choices = stored
            target.allowed = {t for t in target.allowed if all(v in choices[k] for k, v in zip(keys, t))}
            target.seeds = [(lb, c) for lb, c in target.seeds if self._key(c) in target.allowed]
        target.choices = choices
        study.sampler = make_sampler(self.settings, keys, choices, target.allowed,
                                     warm=sum(is_warm(label) or label == PRIOR for label, _ in target.seeds),
                                     kinds=self.space.key_kinds)
        return study

    def identity(self) -> dict:
        """What a study's timings are of (tuner/search/identity.py): the device, whose kernel
        code, the search space, the Triton that compiled it, where the times come from, and the
        measurement policy (a replay's: the landscape's) with this run's routing."""
        env = self.measurer.environment() or {}
        policy = {"routing": self.policy.get("routing"), **(env.get("policy") or {})}
        return study_identity(self.kernel, self.space, self.measurer, policy)

    def _encode(self, choices: dict, cfg: Config) -> dict:
        return {k: int(cfg[k]) for k in self.kernel.config_keys}

    def _suggest(self, trial: optuna.Trial, choices: dict) -> Config:
        return {k: int(trial.suggest_categorical(k, choices[k])) for k in self.kernel.config_keys}

    def _queue_seeds(self, study: optuna.Study, target: _Target) -> None:
        measured, _ = self._state(study.get_trials(deepcopy=False))
        for label, cfg in target.seeds:
            if self._key(cfg) not in measured:
                study.enqueue_trial(self._encode(target.choices, cfg), user_attrs={"seed": label},
                                    skip_if_exists=True)

    # -- the search loop ----------------------------------------------------------------
    def _search(self, study: optuna.Study, target: _Target, neighbours: dict[int, dict[tuple, float | None]],
                row: tuple | None = None) -> tuple[str, dict[tuple, float | None]]:
        """Ask, claim, measure and tell in batches until the stopping rule says why to
        stop; returns that reason and the configs measured (time, None if failed). `row`: the
        incumbent config the table's row must beat (the evidence's stop asks what would change it)."""
        s = self.settings
        budget = s.budget_for(target.problem, target.M)
        rule = StoppingRule(budget, s.patience_for(target.problem, target.M), s.min_gain, seeds=len(target.seeds))
        model = None if rule.patience else self._stop_model(target, neighbours)    # --patience: its own stop
        if model is not None and model.alone():          # no evidence but its own trials: the plateau
            rule, model = plateau_rule(budget, s.min_gain, len(target.seeds)), None
        gain = float(s.row_gain)
        name = study_name(target.problem, target.M, source=self.kernel.source)
        idle = 0
        while True:
            began = _window.now()       # the round's start: a batch's time is its whole round's (sampler, claim too)
            # Other workers may share this study: read its state from the storage every round.
            trials = study.get_trials(deepcopy=False)
            measured, running = self._state(trials)
            outcomes = [tr.value for tr in trials if counts(tr)]
            asked: list[float] = []

            def chance(model: StopModel) -> float:
                asked.append(model.chance(measured, table_gain(measured, row, gain), list(running)))
                return asked[-1]
            stopped = rule.reason(len(measured), len(target.allowed), outcomes, idle,
                                  functools.partial(chance, model) if model is not None else None)
            if stopped:
                return stopped, measured
            room = budget - len(measured) - len(running)
            if room <= 0:                     # the last trials are out with other workers
                self._wait(study, target)
                continue
            want = min(s.batch, room)
            if self.window:     # no time for another batch: the trials measured so far stay for the next window
                self.window.before_batch(trials, want)
            if asked and model is not None and len(measured) >= len(target.seeds) + SAMPLER_FIRST \
                    and len(measured) % 2 == 0:
                # not converged, the sampler's own first picks made: every other trial (half a batch) measures
                # what the evidence says could still change the table, so that the question gets settled
                self._settle(study, target, model.likeliest, running, max(1, want // 2))
            batch, waiting = claim(study, self._ask(study, target, measured, running, want), budget, self._key)
            if not batch and waiting:         # the last slots are held by other workers' trials
                self._wait(study, target)
                continue
            if not batch:                     # the sampler keeps proposing what is done or excluded
                idle += 1
                # seeded by --seed, the study and its state (never the process id): the same seed
                # gives the same search in any process; workers at other states fill others
                self._fill(study, target, measured, running, want,
                           random.Random(f"{s.seed}:{name}:{len(trials)}"))
                continue
            idle = 0
            if self.ahead is not None:            # built while this batch is timed (tuner/search/ahead.py)
                self.ahead.hand_out(self.measurer, target, measured, running, [c for _, c in batch], s.batch)
            results = self._measure(study, target, batch, began)
            times = [v for v in measured.values() if v is not None] + [m.time_us for m in results if m.time_us]
            self.on_trial(problem=target.problem, M=target.M, done=min(len(measured) + len(batch), budget),
                          budget=budget, best=min(times, default=None))

    def _stop_model(self, target: _Target, neighbours: dict[int, dict[tuple, float | None]]) -> StopModel:
        """The evidence of a study's stop (tuner/search/evidence.py): its candidates, the batch sizes
        done and, where the kernel describes its work and seeds from it, the cost model's estimates
        (of the study's candidates at every batch size the model reads, and of what those measured)."""
        width = len(self.kernel.config_keys)
        near = {m: {t: v for t, v in d.items() if len(t) == width} for m, d in neighbours.items() if m != target.M}
        near = {m: near[m] for m in StopModel.nearest(target.M, near)}
        est: dict[tuple[int, tuple], float] = {}
        if self._prior() > 0 and self.kernel.work is not None:
            for m in [target.M, *near]:
                configs = sorted(target.allowed | set(near.get(m, {})))
                est.update({(m, t): v for t, v in estimates(self.kernel, self.gpu, target.problem.params, m,
                                                            configs).items()})
        return StopModel(self.kernel.config_keys, target.allowed, target.M, near, est, kinds=self.space.key_kinds)

    def _ask(self, study: optuna.Study, target: _Target, measured: dict, running: dict,
             want: int) -> list[tuple[optuna.Trial, Config]]:
        """Up to `want` new trials with configs nobody measured or holds; the sampler's
        other proposals are closed as pruned (with the rule that drops them), at once."""
        batch: list[tuple[optuna.Trial, Config]] = []
        pending = set(running)
        for _ in range(want * 4):                 # a few tries to fill the batch
            if len(batch) >= want:
                break
            trial = study.ask()
            try:
                # Named at once: a RUNNING trial always says whose it is (a kill between
                # two writes must not leave a claim nobody can clear), pruned ones included.
                trial.set_user_attr("worker", WORKER_ID)
                cfg = self._suggest(trial, target.choices)
                t = self._key(cfg)
                if t not in target.allowed:
                    reason = (self.space.rejected_by(target.problem.params, target.M, self.gpu, cfg)
                              or "not in the landscape")
                    close_trial(study, trial, TrialState.PRUNED, pruned=reason)
                elif t in measured:
                    # A repeat costs nothing and is told what it measured: closing it PRUNED
                    # would teach the sampler that the best region is bad. No "config" on it,
                    # so it never counts as a measurement (study_storage.counts).
                    self._tell_repeat(study, trial, measured[t], cfg)
                elif t in pending:
                    # Measured by this batch or another worker right now: no value yet, and
                    # FAIL (not PRUNED) so that no sampler reads it as a bad config.
                    close_trial(study, trial, TrialState.FAIL, pruned="pending repeat")
                else:
                    trial.set_user_attr("config", cfg)
                    batch.append((trial, cfg))
                    pending.add(t)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue                  # another worker popped and finished it first
        return batch

    def _settle(self, study: optuna.Study, target: _Target, likeliest: list[tuple], running: dict, count: int) -> None:
        """Queue the `count` candidates the stop model finds likeliest to beat the incumbent."""
        queued = {tuple(tr.params.get(k) for k in self.kernel.config_keys)
                  for tr in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
        for t in [t for t in likeliest if t not in running and t not in queued][:count]:
            study.enqueue_trial(self._encode(target.choices, config_dict(self.kernel, t)),
                                user_attrs={"seed": "evidence"})

    def _fill(self, study: optuna.Study, target: _Target, measured: dict, running: dict, want: int,
              rng: random.Random) -> None:
        """Queue random configs nobody measured or holds, for the sampler stuck on known ones."""
        left = sorted(target.allowed - set(measured) - set(running))
        for t in rng.sample(left, min(want, len(left))):
            study.enqueue_trial(self._encode(target.choices, config_dict(self.kernel, t)),
                                user_attrs={"seed": "random-fill"})

    def _measure(self, study: optuna.Study, target: _Target, batch: list[tuple[optuna.Trial, Config]],
                 began: float) -> list[Measurement]:
        """Measure and tell a batch, each trial with its round's time on the monotonic clock (TOOK_ATTR; a cut
        batch: how long it ran), never the wall clock's ask-to-tell, which a clock step stretches."""
        with measuring(self.storage, batch):
            try:
                with measuring_in(self.window):
                    results = self.measurer.measure(target.problem, target.M, [c for _, c in batch])
            except WindowClosed:
                ran = round(_window.now() - began, 3)
                for trial, _ in batch:       # failed as interrupted by fail_stale, their configs measured again
                    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                        trial.set_user_attr(CUT_ATTR, ran)
                raise
            took = round(_window.now() - began, 3)
            for (trial, _), m in zip(batch, results):
                self._tell(study, trial, m, {TOOK_ATTR: took, BATCH_ATTR: len(batch)})
        if self.window:
            self.window.batch_done(took, len(batch))
        return results

    def _wait(self, study: optuna.Study, target: _Target) -> None:
        """Other workers hold the last trials: look again after a while, failing theirs
        if they died meanwhile."""
        time.sleep(self.poll_s)
        self._fail_stale(study, target)

    def _fail_stale(self, study: optuna.Study, target: _Target) -> None:
        fail_stale(study, lambda cfg: study.enqueue_trial(self._encode(target.choices, cfg),
                                                          user_attrs={"seed": "requeued"}))

    # -- helpers --------------------------------------------------------------------
    @staticmethod
    def _tell_repeat(study: optuna.Study, trial: optuna.Trial, value: float | None, cfg: Config) -> None:
        if value is None:
            close_trial(study, trial, TrialState.FAIL, repeat=cfg)
        else:
            close_trial(study, trial, value=value, repeat=cfg)

    def _tell(self, study: optuna.Study, trial: optuna.Trial, m: Measurement, timing: dict | None = None) -> None:
        timing = timing or {}
        if m.time_us is None:
            close_trial(study, trial, TrialState.FAIL, error=m.error or "failed",
                        failure=m.kind or kind_of(m.error) or RUNTIME, **timing)
        elif m.spread is not None:
            close_trial(study, trial, value=m.time_us, spread=m.spread, **timing)
        else:
            close_trial(study, trial, value=m.time_us, **timing)

    def _state(self, trials) -> tuple[dict[tuple, float | None], dict[tuple, int]]:
        """(configs measured: time or None, configs being measured now: trial number)."""
        measured, running = {}, {}
        for tr in trials:
            cfg = tr.user_attrs.get("config")
            if not cfg:
                continue
            t = self._key(cfg)
            if counts(tr):
                measured[t] = tr.value if tr.state == TrialState.COMPLETE else None
            elif tr.state == TrialState.RUNNING:
                running[t] = tr.number
        return measured, running

    def _finish(self, problem: Problem, M: int, measured: dict, default: Config, stopped: str) -> StudyResult:
        """Re-time the best few and the default together, then check numerics in order of the
        re-timed times. The default competes like any finalist: a table never holds a config
        slower than the default measured in the same re-time (the search's times and the
        re-time's differ by noise, so a finalist can lose to the default there)."""
        kernel = self.kernel
        timed = sorted((v, t) for t, v in measured.items() if v is not None)
        default_t = config_tuple(kernel, default)
        if not timed:
            return StudyResult(problem, M, None, None, None, default, measured.get(default_t), len(measured),
                               "no config", {"status": "not checked", "detail": "every config failed"})
        finalists = [config_dict(kernel, t) for _, t in timed[: self.settings.top_k]]
        # The default goes with the finalists (a failed one too: its reason is reported).
        retime = finalists + ([] if any(config_tuple(kernel, c) == default_t for c in finalists) else [default])
        again = self.measurer.measure(problem, M, retime)
        by_cfg = {config_tuple(kernel, c): m for c, m in zip(retime, again)}
        default_time = by_cfg[default_t].time_us
        default_error = None if default_time is not None else (by_cfg[default_t].error or "failed")
        ranked = sorted((m.time_us, i) for i, m in enumerate(again) if m.time_us is not None)
        rejected = []
        for time_us, i in ranked:
            cfg = retime[i]
            check: NumericsCheck = self.measurer.check_numerics(problem, M, cfg)
            if check.failed:
                rejected.append({"config": cfg, "numerics": check.as_dict()})
                continue
            return StudyResult(problem, M, cfg, time_us, again[i].spread, default, default_time,
                               len(measured), stopped, check.as_dict(), rejected, default_error=default_error)
        return StudyResult(problem, M, None, None, None, default, default_time, len(measured), "no config",
                           {"status": "failed", "detail": "every finalist failed the numerics check"}, rejected,
                           default_error=default_error)

    @staticmethod
    def result_from_dict(problem: Problem, M: int, d: dict) -> StudyResult:
        return StudyResult(problem, M, d["config"], d["time_us"], d["spread"], d["default_config"],
                           d["default_time_us"], d["trials"], d["stopped"], d.get("numerics", {}),
                           d.get("rejected", []), d.get("failures") or {}, d.get("default_error"),
                           kept_default=d.get("kept_default"), tied=d.get("tied") or {},
                           search=d.get("search") or {}, choice=d.get("choice") or {},
                           first_failure=d.get("first_failure"))

    def store(self, result: StudyResult) -> None:
        """Store a result decided after its study (two tied tables' joint race)."""
        study = optuna.load_study(study_name=study_name(result.problem, result.M, self.prefix, self.kernel.source),
                                  storage=self.storage)
        study.set_user_attr("result", result.as_dict())

    def measured(self, problem: Problem, M: int) -> dict[tuple, float | None]:
        """What a finished study measured: {config tuple: time, None when it failed}."""
        study = optuna.load_study(study_name=study_name(problem, M, self.prefix, self.kernel.source),
                                  storage=self.storage)
        return self._state(study.get_trials(deepcopy=False))[0]
