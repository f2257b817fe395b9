"""Warm starts: a study seeded with configs known to be good elsewhere, each measured again.

Sources (tuner/pipeline/warm_sources.py reads them into `Known` configs):
  - `--warm-start PATH...`: earlier results folders (every study's best measured configs),
    table files, folders of tables (an engine's config folder); any GPU, any M, any shape
    of the same kernel;
  - by default, the engine's own shipped tables for this shape on sibling GPUs (the Hopper
    family: H100, H800, H200, H20 and their variants) and for the nearest shapes;
  - within a run, the best configs of the batch sizes already done (`neighbours`): the
    NEIGHBOUR_SEEDS of the nearest M, besides the warm cap (as one neighbour seed was before).
A seed is only a first guess: it is queued as a trial and measured like any other config
(never copied into a table unmeasured), and counts against the budget.

Seeds are ranked by how close their source is to the study: same GPU, then a sibling, then
any other; the same shape before the nearest; then the nearest M; then the source's own
order (its best first). They take at most WARM_SHARE of the budget, and the search's random
start shrinks by as many (STARTUP_WITH_SEEDS): on pairs of real landscapes of one kernel on
two GPUs (scripts/search_benchmark.py --pairs, bench/results/search/warm-start.md) that
share beat both a smaller and a larger one, and keeping the full random start wasted the
trials the seeds saved.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

from tuner.plan.gpus import GPUS, GpuSpec

WARM_SHARE = 0.25            # at most this share of a study's budget goes to warm seeds
STARTUP_WITH_SEEDS = 2       # random configs the model-based search still measures when seeded
PER_SOURCE_M = 10            # configs taken from one source's study (its best first)
NEIGHBOURS = 3               # best configs offered by each batch size already done in this run
NEIGHBOUR_SEEDS = 2         # of which a study takes this many (nearest M first), besides the warm cap
SHAPE_SEEDS = 2              # and this many from the nearest problem tuned (KernelSpec.warm_across)
WARM = "warm:"               # seed labels: "warm:<source>"; the sampler counts these as a warm start


@dataclass(frozen=True)
class Known:
    """A config that did well somewhere: where (source, GPU), for which shape and M, its rank
    there (0: the best), and its time there when known (a table holds none)."""
    config: dict
    kernel: str
    params: dict
    M: int
    gpu: str                  # the CUDA name, or a table's device_name part ('' when unknown)
    source: str               # the source in words: a path, "vllm 0.33.0 shipped tables", "this run"
    rank: int = 0
    time_us: float | None = None


@dataclass
class WarmPool:
    """Every known config a run may seed from, and what each source is (for plans and manifests)."""
    known: list[Known] = field(default_factory=list)
    sources: list[dict] = field(default_factory=list)      # {"source", "kind", "configs"}, in order found

    def add(self, source: str, kind: str, known: Iterable[Known]) -> int:
        found = list(known)
        self.known += found
        self.sources.append({"source": source, "kind": kind, "configs": len(found)})
        return len(found)

    def as_dict(self) -> dict:
        return {"sources": self.sources, "known": [asdict(k) for k in self.known]}

    @classmethod
    def from_dict(cls, d: dict | None) -> "WarmPool":
        d = d or {}
        return cls([Known(**k) for k in d.get("known", [])], list(d.get("sources", [])))

    def describe(self, row_gain: float) -> list[str]:
        from tuner.measure.noise import threshold_text
        """The sources in words, and how seeds are taken, for the plan."""
        if not self.sources:
            lines = ["warm start: none (no --warm-start, and no shipped tables of this kernel were found)"]
        else:
            lines = [f"warm start from {s['source']} ({s['kind']}): {s['configs']} known configs" for s in self.sources]
        return lines + [f"warm seeds per study: at most {WARM_SHARE:.0%} of its budget, closest source first (same GPU, "
                        "sibling, other; same shape, nearest; nearest M), each measured again; then a table's row "
                        f"changes only for a paired gain above {threshold_text(row_gain)}"]


def _norm(name: str) -> str:
    return " ".join(str(name).replace("_", " ").lower().split())


def gpu_tier(name: str, target: GpuSpec) -> int:
    """0: the study's GPU; 1: a sibling (another GPU of the Hopper family we tune for); 2: any other."""
    n = _norm(name)
    if n in (_norm(target.cuda_name), _norm(target.key)):
        return 0
    if any(n in (_norm(g.cuda_name), _norm(g.key)) for g in GPUS.values()) or ("nvidia h" in n and n[8:9].isdigit()):
        return 1
    return 2


def shape_distance(a: dict, b: dict) -> float:
    """How far two problems of one kernel are apart: |log2| of each numeric key's ratio, 1 for
    each other key that differs (a dtype, a routing) or that only one names; 0: the same shape."""
    d = 0.0
    for k in set(a) | set(b):
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if (isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool)
                and not isinstance(y, bool) and x > 0 and y > 0):
            d += abs(math.log2(x / y))
        else:
            d += 1.0
    return d


def closeness(k: Known, kernel: str, params: dict, M: int, gpu: GpuSpec) -> tuple | None:
    """The sort key of a known config for a study (smaller is closer); None: another kernel."""
    if k.kernel != kernel:
        return None
    return (gpu_tier(k.gpu, gpu), round(shape_distance(k.params, params), 6),
            abs(math.log2(max(k.M, 1) / max(M, 1))), k.rank)


def cap(budget: int, share: float = WARM_SHARE) -> int:
    """Warm seeds a study of `budget` trials measures at most."""
    return max(1, int(round(share * budget)))


def rank(known: Iterable[Known], kernel: str, params: dict, M: int, gpu: GpuSpec, limit: int,
         key: Callable[[dict], tuple | None]) -> list[tuple[Known, tuple]]:
    """The `limit` closest known configs, one per distinct config (`key`: a config as the
    study's tuple, None when it is not one of this kernel's configs), closest first."""
    scored = sorted(((c, k) for k in known if (c := closeness(k, kernel, params, M, gpu)) is not None),
                    key=lambda ck: ck[0])
    out: list[tuple[Known, tuple]] = []
    seen: set = set()
    for _, k in scored:
        t = key(k.config)
        if t is None or t in seen:
            continue
        seen.add(t)
        out.append((k, t))
        if len(out) >= limit:
            break
    return out


def neighbours(done: dict[int, dict[tuple, float | None]], kernel: str, params: dict, gpu: GpuSpec,
               to_config: Callable[[tuple], dict], count: int = NEIGHBOURS) -> list[Known]:
    """The best `count` configs of each batch size this run already finished ({M: {config
    tuple: time}}), as known configs of this GPU and shape."""
    out = []
    for m, measured in done.items():
        timed = sorted((v, t) for t, v in measured.items() if v is not None)
        out += [Known(to_config(t), kernel, params, m, gpu.cuda_name, "this run", i, v)
                for i, (v, t) in enumerate(timed[:count])]
    return out


NEAR_SHAPE = "neighbour-shape"      # the label of a seed from another problem tuned in this run


def seed_label(k: Known) -> str:
    return "neighbour" if k.source == "this run" else f"{WARM}{k.source}"


def is_warm(label: str) -> bool:
    """A seed from a warm start, a neighbouring batch size or problem (not a default)."""
    return label.startswith(WARM) or label in ("neighbour", NEAR_SHAPE)


def startup(n_startup: int, warm: int) -> int:
    """The random start of a study with `warm` warm seeds: it shrinks by as many, down to
    STARTUP_WITH_SEEDS (the seeds tell the model where good configs were)."""
    return n_startup if warm <= 0 else max(STARTUP_WITH_SEEDS, n_startup - warm)


def seeds_by_source(labels: Iterable[str]) -> dict[str, int]:
    """{source: seeds it gave} over a study's seed labels (the manifest's per-study count)."""
    out: dict[str, int] = {}
    for lb in labels:
        if is_warm(lb):
            src = (lb[len(WARM):] if lb.startswith(WARM) else "this run (neighbouring shapes)" if lb == NEAR_SHAPE
                   else "this run (neighbouring batch sizes)")
            out[src] = out.get(src, 0) + 1
    return out


def study_seeds(pool: WarmPool | None, kernel, params: dict, M: int, gpu: GpuSpec, budget: int,
                done: dict[int, dict[tuple, float | None]], share: float = WARM_SHARE,
                shapes: Iterable[tuple[dict, dict[int, dict[tuple, float | None]]]] = ()) -> list[tuple[str, dict]]:
    """A study's warm seeds, closest first, at most cap(budget): from the pool and from the
    batch sizes of this problem already done in this run ({M: measured}); and SHAPE_SEEDS from
    `shapes`, other problems tuned in this run ([(params, {M: measured})]: the nearest shape,
    then the nearest M). `kernel` is the study's KernelSpec: a known config it cannot take (a key
    it lacks) is skipped."""
    from tuner.plan.kernel_api import config_dict, config_from_entry, config_tuple

    def key(cfg: dict) -> tuple | None:
        try:
            return config_tuple(kernel, config_from_entry(kernel, cfg))
        except (KeyError, TypeError, ValueError):
            return None
    near = rank(neighbours(done, kernel.name, params, gpu, lambda t: config_dict(kernel, t)), kernel.name, params, M,
                gpu, NEIGHBOUR_SEEDS, key)
    taken = {t for _, t in near}
    known = [k for p, d in shapes for k in neighbours(d, kernel.name, p, gpu, lambda t: config_dict(kernel, t))]
    across = [(k, t) for k, t in rank(known, kernel.name, params, M, gpu, SHAPE_SEEDS + len(near), key)
              if t not in taken][:SHAPE_SEEDS]
    taken |= {t for _, t in across}
    far = rank(pool.known if pool else [], kernel.name, params, M, gpu, cap(budget, share) + len(taken), key)
    far = [(k, t) for k, t in far if t not in taken][:cap(budget, share)]
    return ([(seed_label(k), config_dict(kernel, t)) for k, t in near] + [(NEAR_SHAPE, config_dict(kernel, t))
                                                                          for _, t in across]
            + [(seed_label(k), config_dict(kernel, t)) for k, t in far])


def installed_rows(pool: WarmPool | None, kernel_name: str, params: dict, gpu: GpuSpec, engine: str) -> dict:
    """{M: config} of the table `engine` reads today for this GPU and shape, from its shipped
    tables in the pool ({} when it ships none): the incumbent a tuned row must beat."""
    rows = {}
    for k in pool.known if pool else []:
        if (k.kernel == kernel_name and k.source.startswith(f"{engine} ") and k.source.endswith(" shipped")
                and gpu_tier(k.gpu, gpu) == 0 and shape_distance(k.params, params) == 0):
            rows[str(k.M)] = k.config
    return rows


def summary(pool: WarmPool | None, per_study: Iterable[dict]) -> dict:
    """The manifest's account: every source with the configs it offered and the seeds the
    studies took from it (per_study: each study's {source: seeds})."""
    taken: dict[str, int] = {}
    for seeds in per_study:
        for src, n in (seeds or {}).items():
            taken[src] = taken.get(src, 0) + n
    sources = [dict(s) for s in (pool.sources if pool else [])]
    for s in sources:
        # a source's seeds are labelled by its Known.source, which begins like its name
        s["seeds"] = sum(n for src, n in taken.items() if s["source"].startswith(src) or src.startswith(s["source"]))
    within = taken.get("this run (neighbouring batch sizes)", 0)
    return {"sources": sources, "seeds_taken": taken, "neighbour_seeds": within,
            "share_cap": WARM_SHARE, "startup_with_seeds": STARTUP_WITH_SEEDS}


def incumbent(kernel, rows: dict, M: int) -> list[tuple[str, dict]]:
    """[("installed", the row the engine reads at M: the nearest key)] of an installed table's
    rows ({} or an unusable row: [], and the default is the incumbent)."""
    from tuner.plan.engines import lookup_nearest
    from tuner.plan.kernel_api import config_from_entry
    if not rows:
        return []
    try:
        return [("installed", config_from_entry(kernel, lookup_nearest(rows, M)))]
    except (KeyError, TypeError, ValueError):
        return []
