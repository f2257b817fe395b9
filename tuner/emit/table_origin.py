"""Whose a table file is: one of ours (a tuner results folder's, found by the manifest.json a few
folders up; or one `tuner install` wrote, found in its backup record), with the manifest entry
that says what it was tuned for; None for a table of the engine's own.

Table file names carry no K (the hidden size a fused-MoE layer multiplies by): two models
whose experts have the same count and width read one file (vllm#54668: GLM-5.3's K=6144 and
DeepSeek's K=7168). Our manifest records the K each table was tuned for (its problem), so the
audit can say when a deployment reads one of ours tuned for another K, and install can refuse
to put it there (`k_mismatch`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
RESULTS_DEPTH = 5            # a table lies at most this many folders below its results folder


@dataclass(frozen=True)
class Ours:
    """A table of ours: where its manifest entry came from, and the entry (its problem, kernel
    source, environment, partial mark)."""
    where: str                   # "the tuner results folder DIR" or "installed by tuner (backup record)"
    entry: dict

    @property
    def K(self) -> int | None:
        k = (self.entry.get("problem") or {}).get("K")
        return k if isinstance(k, int) and not isinstance(k, bool) else None

    @property
    def model(self) -> str:
        return str(self.entry.get("model") or "")


def backup_root() -> Path:
    """Where `tuner install` keeps its backup records (tuner/emit/install.py BACKUP_ROOT, set
    there from $TUNER_BACKUP_DIR), without importing install when it is not loaded yet (it
    brings Optuna: seconds, for `tuner coverage`'s thousand lookups)."""
    import sys
    loaded = sys.modules.get("tuner.emit.install")
    if loaded is not None:
        return Path(loaded.BACKUP_ROOT)
    return Path(os.environ.get("TUNER_BACKUP_DIR", Path.home() / ".cache" / "tuner" / "backups"))


def results_folder(table: Path) -> Path | None:
    """The tuner results folder a table file lies in (its manifest.json a few folders up), if any,
    whichever path names the file: a link to the folder or into it is followed."""
    for folder in list(Path(os.path.realpath(table)).parents)[:RESULTS_DEPTH]:
        if (folder / MANIFEST).is_file():
            return folder
    return None


def manifest_entry_of(table: Path, engine: str) -> dict | None:
    """The entry of the results folder's manifest whose `engine` file is `table` (the model the
    run tuned for added as "model"); None when the table lies in no results folder or the
    manifest does not list it."""
    folder = results_folder(table)
    if folder is None:
        return None
    from tuner.errors import TunerError
    from tuner.reading import read_json_file
    try:
        manifest = read_json_file(folder / MANIFEST, "manifest ")
    except TunerError:
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tables"), list):
        return None
    rel = os.path.relpath(os.path.realpath(table), folder).replace(os.sep, "/")
    for t in manifest["tables"]:
        if isinstance(t, dict) and isinstance(t.get("files"), dict) and t["files"].get(engine) == rel:
            return {**t, "model": manifest.get("model")}
    return None


def ours(table: Path, engine: str, backup_root: Path | None = None) -> Ours | None:
    """The table at `table` as one of ours (see the module docstring), or None."""
    entry = manifest_entry_of(table, engine)
    if entry is not None:
        return Ours(f"the tuner results folder {results_folder(table)}", entry)
    if backup_root is not None:
        from tuner.emit.merge_rule import installed_entry
        record = installed_entry(table, engine, backup_root, lambda e: isinstance(e.get("problem"), dict))
        if record is not None:
            return Ours("installed by tuner (its backup record)",
                        {"problem": record["problem"], "model": record.get("model"),
                         **({"partial": record["partial"]} if record.get("partial") else {})})
    return None


def k_mismatch(table_K: int | None, layer_K: int, model: str = "") -> str | None:
    """Why a table of ours tuned for `table_K` does not fit a layer of `layer_K` (None: it does,
    or the K it was tuned for is not known)."""
    if table_K is None or table_K == layer_K:
        return None
    return (f"tuned for K={table_K}" + (f" ({model})" if model else "") + f", this layer has K={layer_K}: the file "
            "name has no K, so the engine reads it all the same, with configs chosen for another GEMM shape")


def k_refusals(table: dict, kind: str, dest: Path, engine: str, model, backups: Path) -> list[str]:
    """Why `tuner install` must not put a results folder's MoE table (its manifest entry) at
    `dest` (unless --force): it was tuned for another K than `model`'s layers (the model the
    engine serves, when given), or it would replace a table tuner installed there for another
    K (that model would read this one). A GEMM table's name has its K: never refused here."""
    problem: dict = table["problem"] if isinstance(table.get("problem"), dict) else {}
    K = problem.get("K") if isinstance(problem.get("K"), int) else None
    if K is None or kind != "fused_moe":
        return []
    out = []
    if model is not None and K != model.hidden_size:
        out.append(f"it was tuned for K={K}, but {model.name}'s layers have K={model.hidden_size} (the file name has "
                   "no K: the engine would read it for them)")
    there = ours(dest, engine, backups) if dest.is_file() else None
    if there is not None and there.K is not None and there.K != K:
        out.append(f"it would replace {dest.name}, which tuner installed for K={there.K}"
                   + (f" ({there.model})" if there.model else "") + f"; this one was tuned for K={K}: that model "
                   "would read it (the file name has no K)")
    return out
