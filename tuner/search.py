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

import collections
import datetime
import inspect
import os
import random
import socket
import threading
import time
import warnings
from dataclasses import dataclass, field

import optuna

from tuner.defaults import table_default
from tuner.errors import TunerError
from tuner.gpus import GpuSpec
from tuner.kernel_api import Config, KernelSpec, config_dict, config_tuple
from tuner.measure import Measurement, NumericsCheck
from tuner.problems import Problem
from tuner.space import SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)
# We drive trials with ask/tell and record heartbeats ourselves (_Heartbeat below).
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")

SAMPLERS = ("tpe", "random", "cmaes")

# Who measures a trial: host and process, so that a restarted run can tell at once which
# RUNNING trials belong to a process that no longer exists on this host.
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
ACTIVE_TRIALS: set[int] = set()      # trial ids this process is measuring right now
# A live worker names itself on a trial and gives it a config (or prunes it) within moments
# of asking for it; a RUNNING trial still unnamed or without a config after this long was
# asked for by a process that died in between.
ORPHAN_AFTER_S = 300
# Unnamed trials (asked, the next write not yet done) are not failed that early, but after
# this long they stop holding a budget slot for the trials asked after them.
UNNAMED_GRACE_S = 20
SCHEMA_RACE_RETRIES = 5
# What SQLite and PostgreSQL say when another process created the same tables first.
SCHEMA_RACE_MESSAGES = ("already exists", "alembic_version", "unique constraint", "duplicate key")


def _gone(worker: str | None, trial_id: int) -> bool:
    if not worker or ":" not in worker:
        return False
    host, pid = worker.rsplit(":", 1)
    if host != socket.gethostname():
        return False                 # another machine's: Optuna's heartbeat decides
    if int(pid) == os.getpid():
        return trial_id not in ACTIVE_TRIALS
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _close_trial(study, trial, state=None, value: float | None = None, **attrs) -> bool:
    """Write a trial's attributes, then tell it. False when another worker finished it
    first: with SQLite two workers can both pop one queued trial, and two can fail the same
    dead worker's trial at once; the first to finish it stands."""
    try:
        for key, v in attrs.items():
            trial.set_user_attr(key, v)
        if value is not None:
            study.tell(trial, value)
        else:
            study.tell(trial, state=state)
        return True
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    except ValueError:
        # tell() refuses a trial that is no longer RUNNING
        if study._storage.get_trial(trial._trial_id).state.is_finished():
            return False
        raise


def _heartbeat_enabled(storage) -> bool:
    return getattr(storage, "get_heartbeat_interval", lambda: None)() is not None


class _Heartbeat:
    """Records Optuna heartbeats for the trials being measured (RDB storages with a
    heartbeat interval), so other workers can fail them if this machine dies."""

    def __init__(self, storage, trial_ids):
        self.storage, self.ids = storage, list(trial_ids)
        self.enabled = _heartbeat_enabled(storage)
        self._stop = threading.Event()

    def _beat(self):
        interval = self.storage.get_heartbeat_interval() or 30
        while not self._stop.wait(interval):
            for tid in self.ids:
                try:
                    self.storage.record_heartbeat(tid)
                except Exception:  # noqa: BLE001 - a missed beat is retried next interval
                    pass

    def __enter__(self):
        if self.enabled:
            for tid in self.ids:
                self.storage.record_heartbeat(tid)
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._stop.set()
            self._thread.join(5)


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
    default_error: str | None = None    # why the default config has no time (it failed, or was not timed)

    @property
    def speedup(self) -> float | None:
        if self.time_us and self.default_time_us:
            return self.default_time_us / self.time_us
        return None

    def as_dict(self) -> dict:
        return {"M": self.M, "config": self.config, "time_us": self.time_us, "spread": self.spread,
                "default_config": self.default_config, "default_time_us": self.default_time_us,
                "speedup": self.speedup, "trials": self.trials, "stopped": self.stopped,
                "numerics": self.numerics, "rejected": self.rejected, "default_error": self.default_error}


def study_name(problem: Problem, M: int, prefix: str = "", source: str = "ours") -> str:
    """One study per (kernel source, problem, M): a problem timed on our kernel and on an
    engine's is two studies ('fused_moe@vllm:E=..:M=16')."""
    kernel = problem.kernel if source == "ours" else f"{problem.kernel}@{source}"
    return f"{prefix}{kernel}:{problem.key}:M={M}"


class StudyRunner:
    """Runs the study of one (problem, M) against a measurer and returns its result."""

    def __init__(self, kernel: KernelSpec, space: SearchSpace, gpu: GpuSpec, measurer,
                 storage, settings: SearchSettings, on_trial=None, prefix: str = ""):
        self.kernel = kernel
        self.space = space
        self.gpu = gpu
        self.measurer = measurer
        self.storage = storage
        self.settings = settings
        self.on_trial = on_trial or (lambda **kw: None)
        self.poll_s = 2.0          # how often to look again while other workers hold the last trials
        self.prefix = prefix

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
        default = table_default(kernel, self.space, self.gpu, params, M, fixed)
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
                               {"status": "not checked", "detail": "no config survives pruning"},
                               default_error="not timed: no config survives pruning")

        choices = {k: sorted({t[i] for t in allowed}) for i, k in enumerate(kernel.config_keys)}
        study = optuna.create_study(study_name=study_name(problem, M, self.prefix, kernel.source),
                                    storage=self.storage,
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
            return self.result_from_dict(problem, M, done)

        self._fail_stale(study, choices)
        measured, running = self._state(study.get_trials(deepcopy=False))
        for label, cfg in seed_cfgs:
            if config_tuple(kernel, cfg) not in measured:
                study.enqueue_trial(self._encode(choices, cfg), user_attrs={"seed": label}, skip_if_exists=True)

        rng = random.Random(f"{s.seed}:{study_name(problem, M, source=kernel.source)}:{os.getpid()}")
        idle_batches = 0
        while True:
            # Other workers may share this study: read its state from the storage every round.
            trials = study.get_trials(deepcopy=False)
            measured, running = self._state(trials)
            if len(measured) >= s.budget:
                stopped = "budget"
                break
            if len(measured) >= len(allowed):
                stopped = "exhausted"
                break
            if (self._trials_since_gain(trials) >= s.patience
                    and len(measured) >= min(s.budget, len(seed_cfgs) + s.patience)):
                stopped = "converged"
                break
            room = s.budget - len(measured) - len(running)
            if room <= 0:                     # the last trials are out with other workers
                time.sleep(self.poll_s)
                self._fail_stale(study, choices)
                continue
            want = min(s.batch, room)
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
                    cfg = self._suggest(trial, choices)
                    t = config_tuple(kernel, cfg)
                    if t not in allowed:
                        reason = self.space.rejected_by(params, M, self.gpu, cfg) or "not in the landscape"
                        _close_trial(study, trial, optuna.trial.TrialState.PRUNED, pruned=reason)
                    elif t in measured or t in pending:
                        _close_trial(study, trial, optuna.trial.TrialState.PRUNED, pruned="repeat")
                    else:
                        trial.set_user_attr("config", cfg)
                        batch.append((trial, cfg))
                        pending.add(t)
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue                  # another worker popped and finished it first
            batch, waiting = self._claim(study, batch, s.budget)
            if not batch and waiting:
                # The last slots are held by other workers' trials: see how they end.
                time.sleep(self.poll_s)
                self._fail_stale(study, choices)
                continue
            if not batch:
                # The sampler keeps proposing what is done or excluded: add fresh points.
                idle_batches += 1
                left = sorted(allowed - set(measured) - set(running))
                for t in rng.sample(left, min(want, len(left))):
                    study.enqueue_trial(self._encode(choices, config_dict(kernel, t)),
                                        user_attrs={"seed": "random-fill"})
                if idle_batches > 50:
                    stopped = "exhausted"
                    break
                continue
            idle_batches = 0
            ids = {t._trial_id for t, _ in batch}
            ACTIVE_TRIALS.update(ids)
            try:
                with _Heartbeat(self.storage, ids):
                    results = self.measurer.measure(problem, M, [c for _, c in batch])
                for (trial, cfg), m in zip(batch, results):
                    self._tell(study, trial, m)
            finally:
                ACTIVE_TRIALS.difference_update(ids)
            times = [v for v in measured.values() if v is not None] + [m.time_us for m in results if m.time_us]
            best = min(times, default=None)
            self.on_trial(problem=problem, M=M, done=min(len(measured) + len(batch), s.budget),
                          budget=s.budget, best=best)

        self._fail_stale(study, choices)      # leave no dead worker's trial RUNNING behind
        default_error = self._why_untimed(study, default, measured, available)
        result = self._finish(problem, M, measured, default, stopped, default_error)
        study.set_user_attr("result", result.as_dict())
        study.set_user_attr("environment", self.measurer.environment())
        study.set_user_attr("measured_by", self.measurer.label)
        return result

    # -- helpers --------------------------------------------------------------------
    def _tell(self, study, trial, m: Measurement) -> None:
        if m.time_us is None:
            _close_trial(study, trial, optuna.trial.TrialState.FAIL, error=m.error or "failed")
        elif m.spread is not None:
            _close_trial(study, trial, value=m.time_us, spread=m.spread)
        else:
            _close_trial(study, trial, value=m.time_us)

    @staticmethod
    def _counts(tr) -> bool:
        """A finished trial that measured something (not pruned, not interrupted)."""
        return ("config" in tr.user_attrs and tr.user_attrs.get("error") != "interrupted"
                and (tr.state == optuna.trial.TrialState.COMPLETE
                     or (tr.state == optuna.trial.TrialState.FAIL and "error" in tr.user_attrs)))

    def _state(self, trials) -> tuple[dict[tuple, float | None], dict[tuple, int]]:
        """(configs measured: time or None, configs being measured now: trial number)."""
        measured, running = {}, {}
        for tr in trials:
            cfg = tr.user_attrs.get("config")
            if not cfg:
                continue
            t = config_tuple(self.kernel, cfg)
            if self._counts(tr):
                measured[t] = tr.value if tr.state == optuna.trial.TrialState.COMPLETE else None
            elif tr.state == optuna.trial.TrialState.RUNNING:
                running[t] = tr.number
        return measured, running

    def _claim(self, study, batch, budget: int):
        """Keep the trials this worker may measure. Workers ask and write concurrently and
        Optuna has no compare-and-set, so each decides from what it can see, conservatively:
        - a config another trial already holds (measured, or claimed and running) is a
          repeat. Of two claims of one config, the later-written one always sees the other,
          so at most one is measured (rarely both step back; the config stays unmeasured);
        - trials count against the budget in number order, and a lower-numbered trial that
          is still being set up (asked, config not yet written) counts as taking a slot: a
          number is given at ask time, so every trial that could be kept ahead of this one
          is already visible (an unnamed one only for UNNAMED_GRACE_S, so that a process
          killed right after asking does not hold a slot for long). Budget that stays
          unused is filled in the next round. Returns (kept, whether some waited for a slot)."""
        if not batch:
            return batch, False
        mine = {tr.number: (tr, cfg) for tr, cfg in batch}
        now = datetime.datetime.now()
        holders = []                            # (number, config tuple or None)
        still_running = set()
        for tr in study.get_trials(deepcopy=False):
            if tr.number in mine and tr.state == optuna.trial.TrialState.RUNNING:
                still_running.add(tr.number)    # (not if another worker finished it meanwhile)
            cfg = tr.user_attrs.get("config")
            if self._counts(tr):
                holders.append((tr.number, config_tuple(self.kernel, cfg)))
            elif tr.state != optuna.trial.TrialState.RUNNING or "pruned" in tr.user_attrs:
                continue
            elif cfg:
                holders.append((tr.number, config_tuple(self.kernel, cfg)))
            elif not self._abandoned(tr, now, UNNAMED_GRACE_S):
                holders.append((tr.number, None))
        holders.sort()
        held = collections.Counter(t for _, t in holders)    # my own trial is one of them
        kept, waiting = [], False
        for rank, (number, t) in enumerate(holders):
            if number not in mine:
                continue
            trial, cfg = mine[number]
            reason = "repeat" if held[t] > 1 else "over budget" if rank >= budget else None
            if reason:
                _close_trial(study, trial, optuna.trial.TrialState.PRUNED, pruned=reason)
                waiting |= reason == "over budget"
            elif number in still_running:
                kept.append((trial, cfg))
        return kept, waiting

    @staticmethod
    def _abandoned(tr, now, unnamed_after_s: float) -> bool:
        """A RUNNING trial nobody will finish: its process is gone, or it was never named
        (after `unnamed_after_s`) or never given a config long after it was asked for."""
        worker = tr.user_attrs.get("worker")
        age = (now - tr.datetime_start).total_seconds() if tr.datetime_start is not None else 0.0
        if worker is None:
            return age > unnamed_after_s
        if "config" not in tr.user_attrs and age > ORPHAN_AFTER_S:
            return True
        return _gone(worker, tr._trial_id)

    def _fail_stale(self, study, choices: dict) -> None:
        """Trials left RUNNING by a worker that is gone are failed as 'interrupted' and their
        configs queued again: at once for a dead process on this host, after Optuna's
        heartbeat grace period for one elsewhere."""
        now = datetime.datetime.now()
        for tr in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if self._abandoned(tr, now, ORPHAN_AFTER_S):
                stale = optuna.Trial(study, tr._trial_id)
                if not _close_trial(study, stale, optuna.trial.TrialState.FAIL, error="interrupted"):
                    continue                  # another worker got there first and requeues it
                if tr.user_attrs.get("config"):
                    study.enqueue_trial(self._encode(choices, tr.user_attrs["config"]),
                                        user_attrs={"seed": "requeued"})
        if _heartbeat_enabled(self.storage):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)      # requeues through requeue_stale_trial


    def _trials_since_gain(self, trials) -> int:
        best, since = None, 0
        for tr in trials:
            if not self._counts(tr):
                continue
            v = tr.value
            if v is not None and (best is None or v < best * (1 - self.settings.min_gain)):
                since = 0
            else:
                since += 1
            if v is not None and (best is None or v < best):
                best = v
        return since

    def _why_untimed(self, study, default: Config, measured: dict, available) -> str | None:
        """Why the default config has no time in this study (None when it has one)."""
        t = config_tuple(self.kernel, default)
        if measured.get(t) is not None:
            return None
        if available is not None and t not in available:
            return "not in the landscape"
        for tr in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
            cfg = tr.user_attrs.get("config")
            if cfg and self._counts(tr) and config_tuple(self.kernel, cfg) == t:
                return str(tr.user_attrs["error"])
        return "not measured"

    def _finish(self, problem: Problem, M: int, measured: dict, default: Config, stopped: str,
                default_error: str | None = None) -> StudyResult:
        """Re-time the best few (and the default) together, then check numerics in order."""
        kernel = self.kernel
        timed = sorted((v, t) for t, v in measured.items() if v is not None)
        default_t = config_tuple(kernel, default)
        if not timed:
            return StudyResult(problem, M, None, None, None, default, measured.get(default_t), len(measured),
                               "no config", {"status": "not checked", "detail": "every config failed"},
                               default_error=default_error)
        finalists = [config_dict(kernel, t) for _, t in timed[: self.settings.top_k]]
        retime = finalists + ([default] if default_t in measured and measured[default_t] is not None
                              and default not in finalists else [])
        again = self.measurer.measure(problem, M, retime)
        by_cfg = {config_tuple(kernel, c): m for c, m in zip(retime, again)}
        default_time = by_cfg[default_t].time_us if default_t in by_cfg else measured.get(default_t)
        if default_time is None and default_error is None:
            default_error = (by_cfg[default_t].error if default_t in by_cfg else None) or "failed when timed again"
        ranked = sorted((m.time_us, i) for i, m in enumerate(again[: len(finalists)]) if m.time_us is not None)
        rejected = []
        for time_us, i in ranked:
            cfg = finalists[i]
            check: NumericsCheck = self.measurer.check_numerics(problem, M, cfg)
            if check.failed:
                rejected.append({"config": cfg, "numerics": check.as_dict()})
                continue
            return StudyResult(problem, M, cfg, time_us, again[i].spread, default, default_time,
                               len(measured), stopped, check.as_dict(), rejected, default_error)
        return StudyResult(problem, M, None, None, None, default, default_time, len(measured), "no config",
                           {"status": "failed", "detail": "every finalist failed the numerics check"}, rejected,
                           default_error)

    @staticmethod
    def result_from_dict(problem: Problem, M: int, d: dict) -> StudyResult:
        return StudyResult(problem, M, d["config"], d["time_us"], d["spread"], d["default_config"],
                           d["default_time_us"], d["trials"], d["stopped"], d.get("numerics", {}),
                           d.get("rejected", []), d.get("default_error"))


def requeue_stale_trial(study, trial) -> None:
    """Optuna's heartbeat callback: a trial whose worker stopped beating is measured again."""
    if trial.params:
        study.enqueue_trial(trial.params, user_attrs={"seed": "requeued"})


def open_storage(url: str):
    """An Optuna storage for a URL. Databases get Optuna's heartbeat, so that workers on
    other machines can take over the trials of one that died."""
    if url.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql"):
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        # Optuna 4.9 renamed the stale-trial callback argument.
        callback = ("heartbeat_stale_trial_callback"
                    if "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters
                    else "failed_trial_callback")
        for attempt in range(SCHEMA_RACE_RETRIES + 1):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=20,
                                                      grace_period=90, **{callback: requeue_stale_trial})
            except Exception as e:  # noqa: BLE001 - sqlalchemy's errors differ by database
                # Processes opening a fresh database at once all create its tables (and
                # Optuna's schema-version row); the losers find them there on the next try.
                if not any(m in str(e).lower() for m in SCHEMA_RACE_MESSAGES) or attempt == SCHEMA_RACE_RETRIES:
                    raise
                time.sleep(0.2 * (attempt + 1))
    return optuna.storages.get_storage(url)
