"""What a search is asked to do and what it gives back, as plain data: the settings of a run's
studies (budget, patience, sampler; per batch size where traffic says), the result of one study,
and a study's name. Apart from the search itself (tuner/search/runner.py, Optuna), so that a plan
reads them without loading Optuna."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.plan.kernel_api import Config
from tuner.plan.problems import Problem

JOURNAL = "journal:///"      # a run's storage URL: journal:///FILE (FILE as in sqlite:///FILE: relative, or /absolute)

@dataclass
class SearchSettings:
    budget: int = 48                # distinct configs measured per (problem, M)
    # --patience: stop after this many measured trials without a gain, instead of on evidence
    # (0: on evidence, tuner/search/stopping.py)
    patience: int = 0
    min_gain: float = 0.005         # what counts as a gain (0.5 %)
    top_k: int = 3                  # finalists re-timed before choosing
    batch: int = 1                  # trials asked at once (the configs compiled in parallel on a GPU)
    sampler: str = "gp"
    seed: int = 0
    # Budgets of single batch sizes, as {"M": trials} (JSON-safe: stored plans carry them);
    # a batch size not named here gets `budget`. Set from a traffic profile (tuner/plan/traffic.py).
    budgets: dict[str, int] = field(default_factory=dict)
    # a table's row changes only for a paired gain above this (--min-gain; tuner/search/choice.py)
    row_gain: float = 0.02
    # budgets sized by each M's pruned space (tuner/search/budget.py): the rule, "" when --trials gave one
    sized: str = ""
    # read from plans stored before issue 48, where it meant the default patience (half of a study's budget),
    # not one the user gave: such a plan stops on evidence, as one made now
    patience_share: float = 0.0
    # candidates the Hopper cost model ranks fastest, measured first (tuner/search/prior.py; 0: none)
    prior: int = 6

    def budget_for(self, problem: Problem, M: int) -> int:
        """The budget of the study of (problem, M)."""
        return int(self.budgets.get(str(M), self.budget))

    def patience_for(self, problem: Problem, M: int) -> int:
        """--patience, grown with a study's share of the budget so that a batch size given more
        trials is not stopped as early as one given the average; 0 where none was given."""
        own = self.budget_for(problem, M)
        if self.patience_share or not self.patience:
            return 0
        return self.patience if own <= self.budget else max(self.patience, round(self.patience * own / self.budget))


def default_settings(trials: int, *, sampler: str = "gp", seed: int = 0, patience: int | None = None,
                     parallel: int = 1) -> SearchSettings:
    """The search a tuning command runs: at most `trials` distinct configs per study, stopped
    earlier on evidence (tuner/search/stopping.py), or, with `patience` (--patience), after that
    many trials without a gain instead; batches as large as the configs compiled in parallel
    (`parallel`: the compile workers; 1 on a replay, capped at 8)."""
    return SearchSettings(budget=trials, patience=patience or 0, sampler=sampler, seed=seed,
                          batch=max(1, min(8, parallel)))


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
    failures: dict = field(default_factory=dict)   # failed configs by kind (tuner/measure/failures.py)
    default_error: str | None = None    # why the default config has no time (failed, not in a landscape)
    resumed: bool = False               # read back from the storage, finished by an earlier run
    # With a traffic profile, where the tuned config did not beat the default beyond noise and
    # the default was written instead: the tuned config, its time and why (tuner/emit/results.py).
    kept_default: dict | None = None
    # for a table tied to another (SGLang's _down): how the shared keys were chosen for both
    # (tuner.search.tied_choice.choose_tied): the candidate pairs, their times, which won
    tied: dict = field(default_factory=dict)
    # what the study was searched with (budget, patience, sampler, seed): a later run with
    # other settings that finds it finished reuses it, and the manifest says so
    search: dict = field(default_factory=dict)
    # the first failed measurement's error in one line ("Type: message"): why a study that
    # timed nothing timed nothing (tuner/measure/failures.py)
    # which config the row holds (the tuned one, the installed row or the default) and why,
    # from paired re-timing against the incumbent (tuner/search/choice.py)
    choice: dict = field(default_factory=dict)
    first_failure: str | None = None

    @property
    def timed_nothing(self) -> bool:
        """No config of the study was timed: every one failed, or none survived pruning (a
        study whose timed finalists failed the numerics check timed them)."""
        return self.config is None and self.numerics.get("status") == "not checked"

    @property
    def speedup(self) -> float | None:
        if self.time_us and self.default_time_us:
            return self.default_time_us / self.time_us
        return None

    def as_dict(self) -> dict:
        return {"M": self.M, "config": self.config, "time_us": self.time_us, "spread": self.spread,
                "default_config": self.default_config, "default_time_us": self.default_time_us,
                "speedup": self.speedup, "trials": self.trials, "stopped": self.stopped,
                "numerics": self.numerics, "rejected": self.rejected, "failures": self.failures,
                "default_error": self.default_error,
                **({"kept_default": self.kept_default} if self.kept_default else {}),
                **({"tied": self.tied} if self.tied else {}),
                **({"search": self.search} if self.search else {}),
                **({"choice": self.choice} if self.choice else {}),
                **({"first_failure": self.first_failure} if self.first_failure else {})}


def study_name(problem: Problem, M: int, prefix: str = "", source: str = "ours") -> str:
    """One study per (kernel source, problem, M): a problem timed on our kernel and on an
    engine's is two studies ('fused_moe@vllm:E=..:M=16')."""
    kernel = problem.kernel if source == "ours" else f"{problem.kernel}@{source}"
    return f"{prefix}{kernel}:{problem.key}:M={M}"
