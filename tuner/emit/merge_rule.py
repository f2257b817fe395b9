"""`tuner install --merge`: an installed row is replaced only for a real gain (issue 32, item 3).

The rule of tuner/search/choice.py, applied where the paired re-time cannot be made again: an
install records each row's time and what it was timed on (device and measurement policy) in
its backup record; a later `--merge` install of the same file keeps an installed row wherever
both rows have times taken on the same device under the same policy and the new row's gain over
the installed one (installed / new - 1) is not above --min-gain. Where either time is missing
or they were taken on something else, the new row goes in as before (nothing to compare). What
was kept, and why, goes in the new backup record and is said.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

RECORD = "record.json"


def row_times(table_entry: dict) -> dict[int, float]:
    """{M: time_us} of a manifest table entry's rows that have a time."""
    entries = table_entry.get("entries")
    return _times({m: e.get("time_us") for m, e in entries.items() if isinstance(e, dict)}
                  if isinstance(entries, dict) else {})


def _times(raw: dict) -> dict[int, float]:
    """{M: time} of the rows whose key is a batch size and whose time a positive finite number."""
    from tuner.plan.batch_keys import batch_key
    return {m: float(t) for k, t in raw.items()
            if (m := batch_key(k)) is not None and isinstance(t, (int, float)) and not isinstance(t, bool)
            and 0 < t < float("inf")}


def timed_on(table_entry: dict) -> dict:
    """What a table's times were taken on: the device and the measurement policy, and where no
    GPU timed them, "not_a_gpu" (SYNTHETIC or CPU DEVICE): the mark travels into every install
    record and what reads one (the audit; a --merge compares no such times with a GPU's)."""
    from tuner.measure.provenance import CPU_DEVICE, is_cpu_device, is_synthetic
    env = table_entry.get("environment") or {}
    policy = table_entry.get("measurement") or {}
    on = {"device": env.get("device"), "timing": policy.get("timing"), "l2": policy.get("l2"),
          "routing": policy.get("routing")}
    mark = "SYNTHETIC" if is_synthetic(env) else CPU_DEVICE if is_cpu_device(env) else None
    return {**on, "not_a_gpu": mark} if mark else on


def installed_times(dest: Path, engine: str, backup_root: Path) -> tuple[dict[int, float], dict] | None:
    """The times and identity the newest install of `dest` recorded (None: none recorded), the
    installs taken newest first by their sequence (tuner/emit/backups.py), never by name."""
    entry = installed_entry(dest, engine, backup_root, lambda e: isinstance(e.get("times"), dict))
    if entry is None:
        return None
    on = entry.get("timed_on")
    return _times(entry["times"]), on if isinstance(on, dict) else {}


def installed_entry(dest: Path, engine: str, backup_root: Path, wanted=lambda e: True) -> dict | None:
    """The backup record's entry for `dest` of its newest install (that `wanted` accepts)."""
    from tuner.emit.backups import order_key
    from tuner.errors import TunerError
    from tuner.reading import read_json_file
    # the same file whichever path names it: the install's, or one through a link (an audit of
    # the folder by another path found no record and passed a forced SYNTHETIC install)
    dest_abs, dest_real = os.path.abspath(dest), os.path.realpath(dest)
    records = [(k, r) for r in backup_root.glob(f"{engine}-*/{RECORD}")
               if (k := order_key(r.parent, engine)) is not None and not r.parent.is_symlink()]
    for _, record in sorted(records, reverse=True):
        try:
            data = read_json_file(record, "backup record ")
        except TunerError:
            continue
        for entry in data.get("files", []) if isinstance(data, dict) else []:
            if not (isinstance(entry, dict) and isinstance(entry.get("dest"), str)):
                continue
            there = entry["dest"]
            if (os.path.abspath(there) == dest_abs or os.path.realpath(there) == dest_real) and wanted(entry):
                return entry
    return None


def keep_installed(old: dict[int, Any], new: dict[int, Any], old_times: dict[int, float],
                   new_times: dict[int, float], same: bool, min_gain: float) -> dict[int, str]:
    """{M: why} of the installed rows to keep: where both rows differ, both have times taken
    on the same device and policy (`same`), and the new row gains no more than `min_gain`."""
    if not same:
        return {}
    kept = {}
    for m in sorted(set(old) & set(new)):
        if old[m] == new[m] or m not in old_times or m not in new_times:
            continue
        gain = old_times[m] / new_times[m] - 1
        if gain <= min_gain:
            kept[m] = (f"M={m}: the installed row ({old_times[m]:.2f} us) is kept: the new one ({new_times[m]:.2f} us) "
                       f"gains {gain:+.1%}, not above --min-gain {min_gain:.0%}")
    return kept
