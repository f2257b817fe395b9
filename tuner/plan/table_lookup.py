"""Which file and which row an engine's loader reads: the loaders' search through the override
folder, the package and SGLang's triton_* folders (resolve_table), and the nearest-key rule
over a table's keys (which key each M gets, how far it is, a table a multi-GPU tuning run
truncated). Mirrors the config loaders of vLLM 0.31.0-0.33.0 and SGLang 0.5.21-0.5.23 (the
loader functions are identical within each engine across those releases); their rules as data
are in tuner/plan/engine_rules/. Used by tuner/emit/audit.py and install."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from tuner.plan.engine_rules.schema import TableFamily, moe_name_args
from tuner.plan.engines import DEFAULT_BATCH_SIZES

# Batch sizes a nearest key may be from M before the snap counts as far (k > 2M or k < M/2).
FAR_KEY_FACTOR = 2
# A table whose keys are a contiguous slice of the engines' grid with fewer than this many
# keys is what the engines' multi-GPU tuning overwrite leaves behind (e.g. 2048, 3072, 4096).
TRUNCATED_BELOW = 9


def nearest_key(keys: list[int], M: int) -> int:
    """The key both engines take for batch size M: min(keys, key=|k - M|), so a tie goes to
    the key that comes first in the file."""
    return min(keys, key=lambda k: abs(k - M))


def snap_ranges(keys: list[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """[(key, first M, last M)] covering lo..hi: which key the nearest-key rule takes for
    every M, as ranges (keys in file order; ties at a midpoint to the earlier one)."""
    order = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    ks = sorted(order)
    bounds: list[tuple[int, int, int]] = []          # (key, first, last) over all integers
    start = -(1 << 62)
    for a, b in zip(ks, ks[1:]):
        if (a + b) % 2 == 0:
            mid = (a + b) // 2
            last_a = mid if order[a] < order[b] else mid - 1
        else:
            last_a = (a + b) // 2
        bounds.append((a, start, last_a))
        start = last_a + 1
    bounds.append((ks[-1], start, 1 << 62))
    out: list[tuple[int, int, int]] = []
    for key, first, last in bounds:
        first, last = max(first, lo), min(last, hi)
        if first <= last:
            out.append((key, first, last))
    return out


def far_ranges(ranges: list[tuple[int, int, int]], factor: int = FAR_KEY_FACTOR) -> list[tuple[int, int, int, float]]:
    """Of snap ranges, the parts whose key is more than `factor` times away from M:
    [(key, first M, last M, worst ratio)]."""
    out = []
    for key, first, last in ranges:
        if key < 1:             # no batch size (a loader takes "0" or "-8" all the same): every M is far
            out.append((key, first, last, math.inf))
            continue
        below = (first, min(last, -(-key // factor) - 1))          # key > factor * M
        if below[0] <= below[1]:
            out.append((key, below[0], below[1], key / below[0]))
        above = (max(first, factor * key + 1), last)                # M > factor * key
        if above[0] <= above[1]:
            out.append((key, above[0], above[1], above[1] / key))
    return out


def truncated_slice(keys: list[int], grid: list[int] = DEFAULT_BATCH_SIZES) -> bool:
    """Whether a table's keys are a contiguous slice of the engines' grid with fewer than
    TRUNCATED_BELOW of its keys: what an overwritten multi-GPU tuning run leaves."""
    ks = sorted(set(keys))
    if not ks or not set(ks) <= set(grid) or len(ks) >= TRUNCATED_BELOW:
        return False
    i = grid.index(ks[0])
    return grid[i:i + len(ks)] == ks


def gpu_family(device_file_name: str) -> str | None:
    """The GPU model word of a device name (NVIDIA_H200_NVL -> H200), to tell variants apart."""
    m = re.search(r"(?:^|_)([A-Z]+\d+[A-Z]*)(?=$|[_-])", device_file_name.replace("NVIDIA_", "_", 1))
    return m.group(1) if m else None


@dataclass
class Resolved:
    """Which file a loader reads for one lookup, and how it got there."""
    name: str                          # the file name the loader asks for
    files: Any = None                  # the TableFiles holding what it reads (None: nothing)
    rel: str | None = None             # that file, relative to `files`
    how: str = "none"                  # "override folder", "package", "Triton fallback", "the up table", "none"
    triton_folder: str | None = None   # SGLang: the triton_X_Y_Z folder read
    tried: list[str] = field(default_factory=list)   # the paths the loader looked at, in order
    crash: str | None = None           # why the loader raises instead (a bad folder name, ...)

    @property
    def found(self) -> bool:
        return self.rel is not None


def table_names(family: TableFamily, problem, cuda_name: str) -> tuple[str, str | None]:
    """(the file name `family`'s loader asks for on `cuda_name` for `problem`, and for a `_down`
    table the up table's name, which the loader reads when no `_down` file is found)."""
    params = problem.params
    block = params.get("block_shape")
    if problem.kernel != "fused_moe":
        return family.lookup_name(cuda_name, N=params["N"], K=params["K"], block_shape=block), None
    ask = moe_name_args(family.precisions, params)
    if params.get("part") == "down":
        return family.lookup_name(cuda_name, **ask, down=True), family.lookup_name(cuda_name, **ask)
    return family.lookup_name(cuda_name, **ask), None


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def resolve_table(family: TableFamily, name: str, package, override, triton_version: str,
                  down_of: str | None = None) -> Resolved:
    """The file `family`'s loader reads when asked for `name`, as it searches: vLLM's MoE
    loader tries the override folder, then the package; SGLang's reads <root>/configs/
    triton_<version>/ (root: the override folder if set, else the package's), then every
    other triton_* folder there, newest first; for a `_down` name (`down_of`: the up name)
    found nowhere, the up table. `package` and `override` are TableFiles (or None)."""
    res = Resolved(name)
    if family.per_triton:
        files, configs = (override, "configs") if override is not None else (package, family.folder)
        if files is None:
            return res
        exact = f"{configs}/{family.triton_folder(triton_version)}/{name}"
        res.tried.append(files.display(exact))
        if files.exists(exact):
            res.files, res.rel, res.how, res.triton_folder = files, exact, "exact Triton folder", \
                family.triton_folder(triton_version)
            return res
        listing = files.listdir(configs)
        if listing is None:
            res.crash = (f"{files.display(configs)} does not exist: the loader's fallback lists it and raises "
                         "FileNotFoundError; " + (
                             f"point {family.env_var} at a folder holding configs/{family.triton_folder(triton_version)}/"
                             f" (a results folder's {family.engine}/{family.kind}/, or the DIR of `tuner install "
                             f"RESULTS --engine {family.engine} --moe-config-dir DIR`), or unset it"
                             if override is not None else f"reinstall {family.engine}: its package lacks the folder"))
            return res
        versions = [d.removeprefix("triton_").replace("_", ".") for d in listing if d.startswith("triton_")]
        try:
            ordered = sorted(versions, key=_version_tuple, reverse=True)
        except ValueError:
            bad = next(v for v in versions if not all(x.isdigit() for x in v.split(".")))
            res.crash = (f"{files.display(configs)}/triton_{bad.replace('.', '_')} is not a version folder: the "
                         "loader's fallback sorts the folder names as integers and raises ValueError; rename it "
                         "triton_X_Y_Z (digits only) or move it out of configs/")
            return res
        for v in ordered:
            if v == triton_version:
                continue
            rel = f"{configs}/triton_{v.replace('.', '_')}/{name}"
            if files.exists(rel):
                res.files, res.rel, res.how, res.triton_folder = files, rel, "Triton fallback", f"triton_{v.replace('.', '_')}"
                return res
        if down_of is not None:
            up = resolve_table(family, down_of, package, override, triton_version)
            if up.found:
                res.files, res.rel, res.how, res.triton_folder = up.files, up.rel, "the up table", up.triton_folder
            res.crash = up.crash
        return res
    places = []
    if override is not None and family.env_var and not family.env_replaces_root:
        places.append((override, name, "override folder"))
    if package is not None:
        places.append((package, f"{family.folder}/{name}", "package"))
    for files, rel, how in places:
        res.tried.append(files.display(rel))
        if files.exists(rel):
            res.files, res.rel, res.how = files, rel, how
            return res
    return res
