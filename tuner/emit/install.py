"""`tuner install`: put a results folder's tables where an engine reads them.

Everything is checked before anything is written: the engine's package is found, every
destination is resolved and must lie inside the engine's config folder (a manifest naming
`../` paths is refused), every table must be one that engine's loader and kernel accept,
the tables' provenance is compared with the target environment (device, Triton and engine
versions, numerics), and every target folder must be writable. Installs into one folder
are serialized by a lock; temporary files and backup folders a killed install left are
cleared first. Replaced files are backed up outside the engine's folders, and `tuner install
--restore` puts the last backup back, never touching a file outside the folders it recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tuner.emit import backups, merge_rule, partial
from tuner.emit.backups import (  # noqa: F401 (RECORD, read_record: the names users of this module know)
    RECORD,
    check_writable_folders,
    clear_leftovers,
    locked,
    new_backup_folder,
    read_record,
    sha256_of,
)
from tuner.emit.engine_tables import installed_version
from tuner.emit.results import read_manifest
from tuner.emit.table_origin import k_refusals
from tuner.errors import TunerError, os_error_words
from tuner.measure.environment import now_iso
from tuner.paths import (  # noqa: F401 (inside: used by the audit and tests)
    atomic_write_json,
    atomic_write_text,
    inside,
    make_folder,
    read_json,
    writable_folder,
)
from tuner.plan.batch_keys import batch_key
from tuner.plan.engines import ENGINE_NAMES, ENGINES, TABLE_FAMILIES, reading_note, table_family

log = logging.getLogger("tuner")
BACKUP_ROOT = Path(os.environ.get("TUNER_BACKUP_DIR", Path.home() / ".cache" / "tuner" / "backups"))
# each engine's MoE config-folder variable (--moe-config-dir)
ENV_VARS = {e: table_family(e, "fused_moe").env_var for e in ENGINE_NAMES}
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_=,\[\] .+-]+\.json$")


@dataclass
class Copy:
    source: Path
    dest: Path
    label: str      # what the file is, for the printout
    root: Path      # the engine config folder dest must stay inside
    kind: str = ""  # the table family ("fused_moe", "fp8_gemm"); "" for shipped tables copied along
    text: str | None = None       # what to write when not the source as it is (a --merge)
    merged: dict | None = None    # {"new": [M...], "kept": [M...]} of a --merge, recorded in the backup
    times: dict | None = None     # {M: time_us} of its rows and what they were timed on (merge_rule.py)
    timed_on: dict | None = None
    not_a_gpu: str = ""           # "SYNTHETIC" or "CPU DEVICE": its times never came from a GPU (said loudly)
    partial: dict | None = None   # a table tuned at fewer batch sizes than planned (tuner/emit/partial.py)
    problem: dict | None = None   # what it was tuned for (the K its name lacks): recorded, for the audit
    model: str | None = None      # the model it was tuned for

    def content(self) -> str:
        from tuner.reading import read_text
        return self.text if self.text is not None else read_text(self.source, "table ")


def _base(version: str | None) -> str | None:
    return version.split("+")[0] if version else None


def local_gpu_name() -> str | None:
    try:
        import torch
        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def config_roots(site: Path, engine: str, moe_config_dir: Path | None) -> dict[str, Path]:
    """Per table family, the one folder (of the engine's package, or the config-dir variable's
    folder) tables of that family may be written under."""
    eng = ENGINES[engine]
    roots = {"fp8_gemm": site / eng.gemm_folder, "fused_moe": site / eng.moe_folder}
    if moe_config_dir is not None:
        # SGLang's variable replaces <package>/.../triton_utils, whose tables sit in configs/.
        roots["fused_moe"] = moe_config_dir / "configs" if eng.moe_folder_per_triton else moe_config_dir
    return roots


def _relative_table_path(rel, where: str) -> tuple[str, str, str]:
    """(engine, kind, tail) of a manifest's file entry '<engine>/<kind>/[sub/]<file>.json',
    refused unless every part is a plain name."""
    if not isinstance(rel, str) or not rel:
        raise TunerError(f"{where}: a file entry is not a path ({rel!r})")
    parts = rel.split("/")
    if len(parts) < 3 or any(p in ("", ".", "..") for p in parts) or rel.startswith("/") or "\\" in rel:
        raise TunerError(f"{where}: file entry {rel!r} is not a plain <engine>/<kind>/<file> path; refusing it")
    if not _TABLE_NAME.match(parts[-1]):
        raise TunerError(f"{where}: file entry {rel!r} does not name a .json table")
    return parts[0], parts[1], "/".join(parts[2:])


def validate_table(path: Path, engine: str, kind: str, params: dict | None = None) -> dict:
    """The table at `path`, if `engine`'s loader and kernel take it (else one clear line):
    a JSON object keyed by positive integer batch sizes (vLLM's MoE loader alone drops a
    'triton_version' key), each value a config of exactly the keys that engine's kernel
    reads, with positive integer values (power-of-two tiles, warps and splits) or JSON
    booleans for its switches."""
    from tuner.plan.kernel_registry import engine_variant, get_kernel, has_engine_kernel
    from tuner.plan.key_kinds import power_of_two
    table = read_json(path, "table ", "; refusing to install it")
    if not isinstance(table, dict) or not table:
        raise TunerError(f"table {path} is not a non-empty JSON object of batch sizes")
    spec = (get_kernel(kind, engine, load_code=False, variant=engine_variant(kind, engine, params))
            if has_engine_kernel(kind, engine) else get_kernel(kind))
    allowed, required = set(spec.config_keys), set(spec.config_keys) - set(spec.optional_keys)
    # the keys the engine's loader drops before int() (vLLM's MoE loader: 'triton_version')
    family = TABLE_FAMILIES.get((engine, kind))
    drops_version = family is not None and "triton_version" in family.dropped_keys
    for key, cfg in table.items():
        if key == "triton_version" and drops_version:
            continue
        if batch_key(key) is None:
            raise TunerError(f"table {path}: key {key!r} is not a batch size ({engine}'s loader would crash on it)")
        if not isinstance(cfg, dict):
            raise TunerError(f"table {path}: the entry for M={key} is not a config object")
        extra, missing = set(cfg) - allowed, required - set(cfg)
        if extra or missing:
            raise TunerError(f"table {path}: the entry for M={key} "
                             + (f"has keys {engine}'s kernel does not take ({', '.join(sorted(extra))})" if extra
                                else f"lacks {', '.join(sorted(missing))}"))
        for k, v in cfg.items():
            if k in spec.bool_keys:
                if not isinstance(v, bool):
                    raise TunerError(f"table {path}: M={key}: {k} must be true or false, not {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TunerError(f"table {path}: M={key}: {k} must be a positive integer, not {v!r}")
            if (k.startswith("BLOCK_SIZE_") or k in ("num_warps", "SPLIT_K")) and not power_of_two(v):
                raise TunerError(f"table {path}: M={key}: {k}={v} is not a power of two (Triton needs one)")
    return table


def plan_install(results: Path, engine: str, site: Path, force: bool = False,
                 moe_config_dir: Path | None = None, target_gpu: str | None = None,
                 merge: bool = False, engine_version: str | None = None,
                 package_present: bool = True, min_gain: float = 0.02, model=None) -> tuple[list[Copy], list[str]]:
    """(copies to make, notes). Raises TunerError, one line, when the install must not happen,
    among others when a table would replace one that covers batch sizes it lacks (unless
    `merge`: the old entries for those are kept, or `force`), and when a table was tuned for
    another K than `model`'s layers (the model the engine serves), or would replace a table
    tuner installed for another K (unless `force`: the file name has no K, so the other
    model would read it: tuner/emit/table_origin.py). Without the engine's package
    (`package_present` False: a config folder for `engine_version`), the tables no config-folder
    variable covers are left out, with a note."""
    manifest = read_manifest(results)
    tables = [t for t in manifest["tables"] if (t.get("files") or {}).get(engine)]
    if not tables:
        raise TunerError(f"{results} holds no {engine} tables")
    eng = ENGINES[engine]
    roots = config_roots(site, engine, moe_config_dir)
    target_triton = installed_version(site, "triton")
    target_engine = installed_version(site, engine) or engine_version
    gpu = target_gpu or local_gpu_name()     # the GPU the engine will run on, when known
    from tuner.emit.engine_reads import package_files, reads_today
    package = package_files(site, engine, package_present, target_engine)
    copies: list[Copy] = []
    notes: list[str] = []
    timed_on_ours: list[str] = []
    left_out: list[str] = []
    forced: dict[str, list[str]] = {}          # why -> the tables forced for it (said once per reason)
    seen: dict[str, str] = {}
    where = f"{results / 'manifest.json'}"
    for t in tables:
        rel = t["files"][engine]
        owner, kind, tail = _relative_table_path(rel, where)
        if owner != engine or kind not in roots:
            raise TunerError(f"{where}: file entry {rel!r} is not a {engine} table of a kind it reads")
        if not package_present and moe_config_dir is not None and kind != "fused_moe":
            left_out.append(kind)           # only the engine's package folder holds these: not here
            continue
        source = results / rel
        if not inside(source, results):
            raise TunerError(f"{where}: {rel!r} leads out of {results}; refusing it")
        if not source.is_file():
            raise TunerError(f"the manifest lists {rel}, but {source} is missing")
        validate_table(source, engine, kind, t.get("problem"))
        env = t.get("environment") or {}
        problems = []
        if not t.get("numerics_passed"):
            problems.append("its numerics check did not pass (or was not run: replayed timings)")
        from tuner.measure.provenance import CPU_DEVICE, is_cpu_device, is_synthetic
        not_a_gpu = "SYNTHETIC" if is_synthetic(env) else CPU_DEVICE if is_cpu_device(env) else ""
        if is_synthetic(env):
            problems.append("its times are SYNTHETIC (a cost model, `tuner landscape synth`): its configs were "
                            "never timed on a GPU")
        elif is_cpu_device(env):
            problems.append("it was timed on the CPU device (Triton's interpreter on a CPU, standing in for a "
                            "GPU in CI): its configs were never timed on a GPU")
        if env.get("triton") and target_triton and _base(env["triton"]) != _base(target_triton):
            problems.append(f"it was measured under Triton {env['triton']}, the target runs {target_triton}")
        if gpu and env.get("device") and env["device"] != gpu:
            problems.append(f"it was measured on {env['device']}, the target GPU is {gpu}")
        timed_by = t.get("kernel_source") or {"source": "ours"}
        if timed_by.get("source") == engine and timed_by.get("version") and target_engine \
                and timed_by["version"] != target_engine:
            problems.append(f"it was timed on {engine} {timed_by['version']}'s kernel, the target runs "
                            f"{engine} {target_engine}")
        elif timed_by.get("source") == "ours" and not is_synthetic(env):     # (a SYNTHETIC table timed nothing)
            timed_on_ours.append(rel)
        root = roots[kind]
        dest = _destination(eng, kind, tail, root, moe_config_dir)
        problems += k_refusals(t, kind, dest, engine, model, BACKUP_ROOT)
        if problems:
            if not force:
                raise TunerError(f"refusing {rel}: {'; '.join(problems)} (--force installs it anyway)")
            forced.setdefault("; ".join(problems), []).append(rel)
        if not inside(dest, root):
            raise TunerError(f"{where}: {rel!r} would be written outside {root}; refusing it")
        if str(dest) in seen:
            raise TunerError(f"{where}: {rel!r} and {seen[str(dest)]!r} go to the same file {dest}")
        seen[str(dest)] = rel
        copy = Copy(source, dest, f"{kind} {t.get('problem')}", root, kind, not_a_gpu=not_a_gpu,
                    times=merge_rule.row_times(t), timed_on=merge_rule.timed_on(t),
                    problem=t.get("problem") if isinstance(t.get("problem"), dict) else None,
                    model=str(manifest.get("model") or "") or None)
        copy.partial = partial.of_entry(t)
        old = reads_today(site, engine, kind, moe_config_dir, dest, package, target_engine)
        notes += _coverage(copy, engine, rel, force, merge, old, min_gain, copy.partial)
        if copy.partial is not None:
            held = {int(k) for k in json.loads(copy.content()) if k.isdigit()}
            notes.append(partial.install_note(rel, copy.partial, engine, bool(copy.merged), old is None, held))
        copies.append(copy)
    for why, rels in forced.items():
        names = ", ".join(Path(r).name for r in rels[:2]) + (f" and {len(rels) - 2} more" if len(rels) > 2 else "")
        notes.append(f"forced {len(rels)} table(s) ({names}): {why}")
    if left_out and not copies:        # nothing to write: refused, not an empty install --restore would undo
        raise TunerError(f"{results} holds no {engine} table that an install into --moe-config-dir {moe_config_dir} "
                         f"would write: its {len(left_out)} {'/'.join(sorted(set(left_out)))} table(s) are read "
                         f"from {engine}'s package folder only; install them where {engine} is installed")
    if left_out:
        notes.append(f"{len(left_out)} {'/'.join(sorted(set(left_out)))} table(s) left out: {engine} reads them from "
                     f"its package folder only (no variable names another), which is not here; install them where "
                     f"{engine} is installed")
    unknown = [what for what, known in (("the GPU it runs on (--gpu)", gpu), ("its Triton", target_triton),
                                        (f"{engine}'s version (--engine-version)", target_engine)) if not known]
    if unknown:      # each check above needs its target: say which were not made (a CPU login node's install)
        notes.append(f"not checked against the target, unknown here: {', '.join(unknown)}")
    if timed_on_ours:
        notes.append(f"{len(timed_on_ours)} of these tables were timed on our kernels, not {engine}'s own "
                     "(--kernel-source ours): the engine's kernel may rank configs differently")
    said = set()
    for t in tables:
        kind = t["files"][engine].split("/")[1]
        note = reading_note(engine, kind, t.get("problem"))
        if note and (kind, note) not in said:
            said.add((kind, note))
            notes.append(f"when {eng.facts_for} reads these {kind} tables on Hopper: {note}")
    return copies, notes


def _destination(eng, kind: str, tail: str, root: Path, moe_config_dir: Path | None) -> Path:
    """Where a results folder's table (its path under <engine>/<kind>/) goes under `root`."""
    if kind == "fused_moe" and eng.moe_env_subfolder and tail.startswith(eng.moe_env_subfolder + "/"):
        tail = tail[len(eng.moe_env_subfolder) + 1:]    # results: <engine>/fused_moe/configs/triton_X/
    if kind == "fused_moe" and moe_config_dir is not None and not eng.moe_folder_per_triton:
        tail = tail.rsplit("/", 1)[-1]                  # vLLM's variable folder is flat
    return root / tail


def _coverage(copy: Copy, engine: str, rel: str, force: bool, merge: bool, old_reads,
              min_gain: float = 0.02, part: dict | None = None) -> list[str]:
    """Refuse (or with `merge`, fill in; with `force`, note) a table that would replace or hide
    the one the engine reads today (`old_reads`: tuner/emit/engine_reads.py) where that one covers
    batch sizes it lacks: those would run an entry tuned for another M. Of a partial table
    (`part`: tuner/emit/partial.py of_entry) only the rows its run tuned go over the engine's,
    never the others (the incumbent a --minutes window wrote), and a merge keeps what the engine
    reads today at every batch size planned and not tuned. A merge that cannot read the
    engine's table is refused, never claimed."""
    from tuner.emit.engine_reads import Unknown
    from tuner.plan.engines import load_table
    family = table_family(engine, copy.kind)
    rows = {int(k): v for k, v in read_json(copy.source, "table ").items() if k not in family.dropped_keys}
    new = {m: v for m, v in rows.items() if part is None or m in part["tuned"]}
    untuned = sorted(set(rows) - set(new))      # a partial table's incumbent rows: never over the engine's
    if untuned and old_reads is not None:       # its tuned rows only (a merge adds what the engine reads)
        copy.text = json.dumps({str(m): new[m] for m in sorted(new)}, indent=4) + "\n"
    if isinstance(old_reads, Unknown):
        if merge:
            raise TunerError(f"cannot merge {rel}: {old_reads.why}, so --merge cannot keep its rows: "
                             f"`{old_reads.fetch}` fetches it (then install again), or install without --merge "
                             "(nothing was installed)")
        return [f"{family.env_var} is read before {engine}'s package: {copy.dest.name} there hides the table "
                f"{engine} ships of that name, if it ships one (no wheel of its version is at hand to read it: "
                f"`{old_reads.fetch}`, then --merge keeps its rows)"] \
            if family.env_var and not family.env_replaces_root and copy.kind == "fused_moe" else []
    if old_reads is None:
        return []
    old_path = old_reads.where
    old, crash = load_table(family, old_reads.data)
    if old is None:
        return [f"{rel} replaces {old_path}, which {engine}'s loader cannot read ({crash})"]
    verb = "hide" if old_reads.hidden else "replace"

    def hides() -> list[str]:       # vLLM's config folder is read first: what it hides, said (once merged or not)
        return [f"{family.env_var} is read before {engine}'s package: {copy.dest.name} there hides {old_path} "
                f"({len(old)} batch sizes)" + ("; --merge kept the rows it reads for the batch sizes not tuned here"
                                               if copy.merged else "")] if old_reads.hidden else []
    # Keys below 1 are no batch size (every table we install is refused with one): a merge
    # drops them rather than keep them, and says so. Their entries ran only where no batch
    # size key was nearer, which the merged table's keys now are.
    not_sizes = sorted(m for m in old if m < 1)
    lost = sorted(set(old) - set(new) - set(not_sizes))
    # a batch size planned and not tuned that the engine's table has no key for: the row it reads there today
    from tuner.plan.table_lookup import nearest_key
    sizes = [m for m in old if m >= 1]
    fill = {m: old[nearest_key(sizes, m)] for m in {*untuned, *(part or {}).get("left", [])} if m not in old and sizes}
    installed = merge_rule.installed_times(copy.dest, engine, BACKUP_ROOT) if merge else None
    kept = merge_rule.keep_installed(old, new, installed[0], copy.times or {}, installed[1] == copy.timed_on,
                                     min_gain) if installed else {}
    dropped = ([f"merged {rel}: the entries of {old_path} for keys {','.join(map(str, not_sizes))} are dropped: no "
                "batch size (recorded in the backup record)"] if not_sizes else [])
    if merge and (lost or kept or fill):
        keep = sorted({*lost, *kept, *fill})
        merged = {**new, **{m: old[m] for m in [*lost, *kept]}, **fill}
        copy.text = json.dumps({str(m): merged[m] for m in sorted(merged)}, indent=4) + "\n"
        copy.merged = {"new": sorted(set(new) - set(kept)), "kept": keep, "from": old_path,
                       **({"kept_installed": {str(m): why for m, why in kept.items()}} if kept else {}),
                       **({"not_tuned": untuned} if untuned else {}), **({"dropped": not_sizes} if not_sizes else {})}
        copy.times = {**(copy.times or {}), **{m: (installed or ({}, {}))[0][m] for m in kept}}   # the rows it holds
        rest = sorted({*lost, *fill} - set(kept))
        return hides() + [f"merged {rel}: {why}" for why in kept.values()] + (
            [f"merged {rel}: the {len(rest)} entries {engine} reads today from {old_path} for "
             f"M={','.join(map(str, rest))} are kept (recorded in the backup record)"] if rest else []) + dropped
    if not lost:
        return hides()
    what = (f"{rel} covers M={','.join(map(str, sorted(new)))}"
            + (f" (tuned; not its rows at M={','.join(map(str, untuned))})" if untuned else "")
            + f" and would {verb} {old_path}, which also covers M={','.join(map(str, lost))}")
    if force:
        return hides() + [f"forced {what}: those batch sizes now run the entry tuned for the nearest M"]
    raise TunerError(f"refusing {what}: those batch sizes would run an entry tuned for another M (--merge keeps the "
                     "old entries for them, --force replaces it anyway)")


def check_destinations(copies: Sequence[Copy]) -> None:
    """Every file an install would replace is a regular file (or a link to one inside its
    folder): a folder, a FIFO or a device there is refused before anything is written, never
    backed up (a FIFO would be waited on) or half replaced."""
    for c in copies:
        if not os.path.lexists(c.dest):
            continue
        try:
            st = os.stat(c.dest)
        except OSError as e:
            raise TunerError(f"cannot install {c.dest}: {os_error_words(e)} (nothing was installed)") from None
        if not stat.S_ISREG(st.st_mode):
            what = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
                "not a regular file"
            raise TunerError(f"{c.dest} is {what}, not a table: refusing to replace it (nothing was installed)")


def install(copies: list[Copy], engine: str, extra: Sequence[Copy] = (), backup_root: Path | None = None,
            lock: bool = True) -> Path:
    """Back up what would be replaced, then write every table atomically. Returns the backup
    folder (its record.json lists what restore must undo and the folders it may touch).
    `lock=False`: the caller holds the install lock of every target folder already (a
    --merge planned under it)."""
    backup_root = backup_root or BACKUP_ROOT
    # one write per file, the last one asked (ours over a shipped table copied along), every
    # path absolute: a restore from another folder finds the same files
    last = {os.path.abspath(c.dest): c for c in [*extra, *copies]}
    everything = [dataclasses.replace(c, dest=Path(d), root=Path(os.path.abspath(c.root))) for d, c in last.items()]
    roots = sorted({c.root for c in everything}, key=str)
    for c in everything:                         # every target checked before the first write
        if not inside(c.dest, c.root) or c.dest == c.root:
            raise TunerError(f"{c.dest} is outside {c.root}: refusing to write there (nothing was installed)")
    with locked(roots, backup_root) if lock else contextlib.nullcontext():
        clear_leftovers(roots, engine, backup_root)
        for undone in backups.interrupted(engine, backup_root, roots):
            log.warning("%s", f"an interrupted install into these folders is rolled back first: "
                        f"{backups.describe(undone, read_record(undone, engine))}")
            backups.undo(undone, read_record(undone, engine), engine)
        check_destinations(everything)
        check_writable_folders([c.dest for c in everything] + [backup_root / "x" / "x"])
        texts = [c.content() for c in everything]
        final = {str(c.dest): sha256_of(t.encode()) for c, t in zip(everything, texts)}
        backup, seq = new_backup_folder(engine, backup_root)
        entries = []
        for i, c in enumerate(everything):
            saved = None
            if c.dest.exists():
                saved = backup / "files" / f"{i:04d}-{c.dest.name}"
                make_folder(saved.parent, backup_root)
                shutil.copy2(c.dest, saved)
            entry: dict = {"dest": str(c.dest), "backup": str(saved) if saved else None, "root": str(c.root),
                           "sha256": final[str(c.dest)]}
            if c.merged:
                entry["merged"] = c.merged
            if c.partial:
                entry["partial"] = c.partial
            if c.problem:                    # the K its name lacks: the audit compares it (table_origin.py)
                entry["problem"] = c.problem
                if c.model:
                    entry["model"] = c.model
            if c.times is not None:          # what a later --merge compares against (merge_rule.py)
                entry["times"] = {str(m): t for m, t in c.times.items()
                                  if not c.merged or m not in c.merged.get("kept", []) or str(m) in
                                  c.merged.get("kept_installed", {})}
                entry["timed_on"] = c.timed_on
            entries.append(entry)
        # The record goes down before the first write, so an interrupted install can be undone.
        record = {"engine": engine, "sequence": seq, "installed": now_iso(), "state": backups.WRITING,
                  "roots": [str(r) for r in roots], "files": entries}
        atomic_write_json(backup / RECORD, record, root=backup_root)
        done = 0
        try:
            for c, text in zip(everything, texts):
                atomic_write_text(c.dest, text, root=c.root)
                done += 1
        except (OSError, TunerError) as e:      # a full disk mid-way: say what stands, and how to undo it
            why = os_error_words(e).split(";")[0] if isinstance(e, OSError) else str(e)
            raise TunerError(f"cannot install {c.dest}: {why}; {done} of {len(everything)} files were installed "
                             f"when it stopped: `tuner install --restore --engine {engine}` puts back what was "
                             "there (the next install also rolls them back first)") from None
        atomic_write_json(backup / RECORD, {**record, "state": backups.DONE}, root=backup_root)
    return backup


def latest_backup(engine: str, backup_root: Path | None = None) -> Path:
    return backups.latest_backup(engine, backup_root or BACKUP_ROOT)


def restore(engine: str, backup_root: Path | None = None, roots: list[Path] | None = None) -> list[str]:
    """Undo the last install for an engine, or into `roots` (tuner/emit/backups.py)."""
    return backups.restore(engine, backup_root or BACKUP_ROOT, roots)


def shipped_moe_tables(site: Path, engine: str) -> list[tuple[Path, str]]:
    """The engine's own MoE tables, as (file, path under its configs folder)."""
    root = site / ENGINES[engine].moe_folder
    return [(p, str(p.relative_to(root))) for p in sorted(root.rglob("*.json"))]


# -- what the install leaves in place, as `tuner audit` sees it (the engine's own lines: install_target.py) --
def audit_install(copies: list[Copy], engine: str) -> list:
    """The audit's table checks (tuner/emit/audit.py) on what the install would leave in place:
    every table it writes (rows, keys over the engines' batch sizes 1..4096) and, where the
    engine has `_down` tables, each pair as it will stand (ours, or the file already there)."""
    from tuner.emit.audit_rules import Batches, Finding, named_table_findings, pair_findings
    from tuner.plan.engines import DEFAULT_BATCH_SIZES, load_table
    batches = Batches(max(DEFAULT_BATCH_SIZES))
    after = {str(c.dest): c.content() for c in copies if c.kind}
    findings: list = []

    def table_at(path: Path, family):
        text = after.get(str(path))
        if text is None and path.is_file():
            from tuner.reading import read_text
            text = read_text(path, "installed table ")
        return load_table(family, text.encode())[0] if text is not None else None

    for c in copies:
        if not c.kind:
            continue
        family = table_family(engine, c.kind)
        table, crash = load_table(family, c.content().encode())
        if table is None:
            findings.append(Finding("error", "crashes_loader", crash or "unreadable", str(c.dest)))
            continue
        findings += named_table_findings(family, c.dest.name, table, str(c.dest), batches)
        if family.has_down:
            down = c.dest.name.endswith("_down.json")
            up_path = c.dest.with_name(c.dest.name[: -len("_down.json")] + ".json") if down else c.dest
            down_path = c.dest if down else c.dest.with_name(c.dest.name[: -len(".json")] + "_down.json")
            if down or str(down_path) not in after:          # each pair once
                up_t, down_t = table_at(up_path, family), table_at(down_path, family)
                if up_t is not None and down_t is not None:
                    findings += pair_findings(up_t, down_t, str(down_path), batches, family)
    return findings
