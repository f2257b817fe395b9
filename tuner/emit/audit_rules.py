"""The audit's rules: what is wrong with one table wherever it is, as findings (its rows against
what the kernel takes and what the engine rewrites, its keys against the batch sizes served,
SGLang's up and `_down` tables against each other), the finding kinds with their severity,
and the batch sizes audited. Which table and row an engine reads (the resolution) is in
tuner/emit/audit.py; these rules also check the tables a tuning run or an install writes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from tuner.plan.engines import (
    DEFAULT_BATCH_SIZES,
    TRITON_CUDA_OPTIONS,
    TableFamily,
)
from tuner.plan.table_lookup import (
    FAR_KEY_FACTOR,
    TRUNCATED_BELOW,
    far_ranges,
    nearest_key,
    snap_ranges,
    truncated_slice,
)

SEVERITIES = ("error", "warning", "info")
# Finding kinds, in the order reports list them, with their heading.
KINDS = {
    "crashes_loader": "tables or folders the loader raises on (the engine does not start)",
    "not_measured": "tables chosen on times no GPU took (SYNTHETIC, the CPU device's)",
    "bad_row": "rows the launch fails on",
    "numerics": "rows that compute wrong results (--numerics)",
    "block_k_above_block": "rows with BLOCK_SIZE_K above the weight block",
    "k_mismatch": "tables of ours tuned for another K than the layer's (the file name has no K)",
    "no_table": "no table: the engine's default config runs",
    "unfused_table": "tables for the routed experts alone (read only with --disable-shared-experts-fusion)",
    "triton_fallback": "tables of another Triton version (SGLang's fallback)",
    "truncated": "truncated tables (a contiguous slice of the engines' grid)",
    "far_keys": f"batch sizes whose nearest key is more than {FAR_KEY_FACTOR}x away",
    "traffic_far": f"keys that serve a share of the traffic more than {FAR_KEY_FACTOR}x from their M",
    "down_block_m": "down BLOCK_SIZE_M the engine replaces with the up table's",
    "down_copy": "_down tables that are copies of the up table",
    "down_reuses_up": "no _down table: the up table's configs run the down GEMM",
    "unloadable": "files no loader asks for",
    "device_name": "device-name mismatches",
    "ignored_key": "keys the engine ignores or overrides",
    "not_read": "tables the engine's backend choice does not read",
    "override_unused": "override folders the engine reads no table of this deployment from",
    "loader_changed": "loader functions other than those the rules were read from",
}
REQUIRED_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")


@dataclass
class Finding:
    severity: str
    kind: str
    reason: str                       # one line
    table: str = ""                   # the file (display path) or the name looked up
    rows: list[int] = field(default_factory=list)     # the table keys concerned (row findings)

    @property
    def count(self) -> int:
        return len(self.rows) or 1

    def as_dict(self) -> dict:
        return {"severity": self.severity, "kind": self.kind, "reason": self.reason, "table": self.table,
                "rows": self.rows}


@dataclass(frozen=True)
class Batches:
    """The batch sizes audited: 1..hi, or an explicit list."""
    hi: int
    explicit: tuple[int, ...] | None = None

    @property
    def lo(self) -> int:
        return self.explicit[0] if self.explicit else 1

    @property
    def top(self) -> int:
        return self.explicit[-1] if self.explicit else self.hi

    def label(self) -> str:
        return ", ".join(map(str, self.explicit)) if self.explicit else f"1-{self.hi}"

    def runs(self, keys: list[int]) -> list[tuple[int, int, int]]:
        """[(key, first M, last M)]: the key the nearest-key rule takes, as runs of M."""
        if self.explicit is None:
            return snap_ranges(keys, 1, self.hi)
        return _group([(M, nearest_key(keys, M)) for M in self.explicit])

    def far(self, keys: list[int]) -> list[tuple[int, int, int, float]]:
        if self.explicit is None:
            return far_ranges(snap_ranges(keys, 1, self.hi))
        far = [(M, k) for M in self.explicit for k in [nearest_key(keys, M)]
               if k < 1 or k > FAR_KEY_FACTOR * M or M > FAR_KEY_FACTOR * k]
        return [(k, a, b, max(k / a, b / k, a / k, k / b) if k >= 1 else math.inf) for k, a, b in _group(far)]


def _group(pairs: list) -> list:
    """[(value, first, last)] of consecutive (M, value) pairs with the same value."""
    out: list = []
    for M, v in pairs:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1], M)
        else:
            out.append((v, M, M))
    return out


def m_range(first: int, last: int) -> str:
    return f"M={first}" if first == last else f"M={first}-{last}"


def _cfg_text(cfg: dict) -> str:
    short = {"BLOCK_SIZE_M": "BM", "BLOCK_SIZE_N": "BN", "BLOCK_SIZE_K": "BK", "GROUP_SIZE_M": "G", "num_warps": "w",
             "num_stages": "s"}
    return " ".join(f"{short.get(k, k)}{'=' if k not in short else ''}{json.dumps(v) if isinstance(v, bool) else v}"
                    for k, v in cfg.items()) if isinstance(cfg, dict) else repr(cfg)


# -- checks on one table, wherever it is ------------------------------------------------------
def _cuda_options() -> set[str]:
    names = set(TRITON_CUDA_OPTIONS)
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        names |= set(CUDAOptions.__dataclass_fields__)
    except Exception:  # noqa: BLE001 - an older or CPU-only Triton: the fixed list
        pass
    return names


def row_findings(family: TableFamily, table: dict, where: str, block_shape, K: int | None,
                 device: str | None) -> list[Finding]:
    """Rows the launch fails on, rows whose BLOCK_SIZE_K steps over weight blocks, and keys
    the engine ignores or overrides. `K`: the GEMM's inner size when known (None: the up
    GEMM of a MoE table, whose K is the model's hidden size); `device`: the table's device
    name (keys Triton's CUDA launcher refuses are errors on NVIDIA devices only)."""
    out: list[Finding] = []
    missing: list[int] = []
    not_pow2: list[int] = []
    wide: list[int] = []
    refused: dict[str, list[int]] = {}
    forced: dict[str, list[int]] = {}
    nvidia = bool(device) and str(device).startswith("NVIDIA")
    options = _cuda_options() if nvidia else set()
    for M, entry in table.items():
        if not isinstance(entry, dict):
            missing.append(M)
            continue
        if any(k not in entry for k in REQUIRED_KEYS):
            missing.append(M)
            continue
        for key in entry:
            if nvidia and key not in family.accepted_keys and key not in options:
                refused.setdefault(key, []).append(M)
        if any(k.startswith("BLOCK_SIZE_") and isinstance(v, int) and (v < 1 or v & (v - 1))
               for k, v in entry.items()):
            not_pow2.append(M)
        bk = entry.get("BLOCK_SIZE_K")
        if block_shape and isinstance(bk, int) and bk > block_shape[1]:
            wide.append(M)
        for key, value in family.forced:
            if key in entry and entry[key] != value:
                forced.setdefault(key, []).append(M)
    if missing:
        out.append(Finding("error", "bad_row", f"entries lack one of {', '.join(REQUIRED_KEYS)} (or are not "
                                               "objects): the launch raises KeyError", where, sorted(missing)))
    for key, ms in refused.items():
        out.append(Finding("error", "bad_row", f"key {key!r} is neither a kernel argument nor a Triton CUDA launch "
                                               "option: Triton's launcher raises KeyError on an NVIDIA GPU",
                           where, sorted(ms)))
    if not_pow2:
        out.append(Finding("error", "bad_row", "a BLOCK_SIZE_* that is not a power of two: Triton refuses it",
                           where, sorted(not_pow2)))
    if wide:
        bk = max(table[M]["BLOCK_SIZE_K"] for M in wide)
        if family.clamp_block_k:
            out.append(Finding("warning", "block_k_above_block",
                               f"BLOCK_SIZE_K {bk} over {block_shape[1]}-wide weight blocks: {family.engine} clamps it "
                               f"and runs {min(block_shape)}, not what the table says", where, sorted(wide)))
        elif family.block_k_runs_wrong(block_shape, K):
            out.append(Finding("error", "block_k_above_block",
                               f"BLOCK_SIZE_K {bk} over {block_shape[1]}-wide weight blocks: {family.engine} has no "
                               "clamp and its kernel reads one scale per K step, so two scale groups share one "
                               "(wrong results)", where, sorted(wide)))
    for key, ms in forced.items():
        value = dict(family.forced)[key]
        out.append(Finding("warning", "ignored_key", f"{key} other than {value}: {family.engine} launches {key}={value}",
                           where, sorted(ms)))
    return out


def times(ratio: float) -> str:
    """A far key's ratio as printed: rounded up to a tenth, so that one more than 2x away never
    reads as 2x (2.5 is '2.5', 2.01 '2.1', 32 '32')."""
    return f"{math.ceil(round(ratio * 10, 6)) / 10:.1f}".removesuffix(".0")


def key_findings(keys: list[int], where: str, batches: Batches) -> list[Finding]:
    """Truncated key sets and the batch sizes whose nearest key is far."""
    out = []
    if truncated_slice(keys):
        ks = sorted(keys)
        out.append(Finding("warning", "truncated",
                           f"{len(ks)} of the engines' {len(DEFAULT_BATCH_SIZES)} batch sizes ({ks[0]}..{ks[-1]}), a "
                           f"contiguous slice under {TRUNCATED_BELOW} keys (tuned at a few batch sizes only, or "
                           "the part of a multi-GPU tuning run that overwrote the rest)", where))
    far = batches.far(keys)
    if far:
        parts = [f"{m_range(a, b)} run the entry for {k} " + ("(a key that is no batch size)" if math.isinf(ratio)
                                                            else f"(up to {times(ratio)}x away)") for k, a, b, ratio in far]
        out.append(Finding("warning", "far_keys", "; ".join(parts), where, sorted({k for k, *_ in far})))
    return out


def pair_findings(up: dict, down: dict, where: str, batches: Batches, family: TableFamily) -> list[Finding]:
    """A `_down` table against its up table: a copy, and the batch sizes where the engine
    replaces the down BLOCK_SIZE_M (and the other tied keys) with the up table's."""
    out = []
    if up == down:
        out.append(Finding("warning", "down_copy", "the _down table is a copy of the up table: the down GEMM was not "
                                                   "tuned (without the file SGLang reuses the up table anyway)", where))
        return out
    ukeys, dkeys = list(up), list(down)
    bad = []
    for (uk, dk), a, b in _combined(batches, ukeys, dkeys):
        u, d = up.get(uk), down.get(dk)
        if isinstance(u, dict) and isinstance(d, dict) and any(
                key in u and key in d and u[key] != d[key] for key in family.tied_down_keys):
            bad.append((a, b, dk, uk))
    if bad:
        parts = [f"{m_range(a, b)} (down {dk}, up {uk})" for a, b, dk, uk in bad[:4]] + (["..."] if len(bad) > 4 else [])
        out.append(Finding("warning", "down_block_m",
                           f"{'/'.join(family.tied_down_keys)} differs from the up table's at {', '.join(parts)}: "
                           "SGLang runs the up table's", where, sorted({dk for _, _, dk, _ in bad})))
    return out


def _combined(batches: Batches, ukeys: list[int], dkeys: list[int]) -> list:
    """[((up key, down key), first M, last M)] over the audited batch sizes."""
    if batches.explicit is not None:
        return _group([(M, (nearest_key(ukeys, M), nearest_key(dkeys, M))) for M in batches.explicit])
    cuts = sorted({a for _, a, _ in batches.runs(ukeys)} | {a for _, a, _ in batches.runs(dkeys)})
    ends = cuts[1:] + [batches.hi + 1]
    return _group_segments([((nearest_key(ukeys, a), nearest_key(dkeys, a)), a, e - 1) for a, e in zip(cuts, ends)])


def _group_segments(segs: list) -> list:
    out: list = []
    for v, a, b in segs:
        if out and out[-1][0] == v and out[-1][2] + 1 == a:
            out[-1] = (v, out[-1][1], b)
        else:
            out.append((v, a, b))
    return out


def named_table_findings(family: TableFamily, name: str, table: dict, where: str, batches: Batches) -> list[Finding]:
    """Row and key findings of one loadable table, its weight blocks, K and device read from
    its file name (as --all does for every table, and tuner install for what it writes)."""
    m = family.name_pattern().match(name)
    g = m.groupdict() if m else {}
    block = [int(g["bn"]), int(g["bk"])] if g.get("bn") else None
    K = int(g["K"]) if g.get("K") else (int(g["N"]) if g.get("down") else None)
    return row_findings(family, table, where, block, K, g.get("device")) + key_findings(list(table), where, batches)
