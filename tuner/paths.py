"""Where the repository's data folders are, reading JSON files, and atomic file writes."""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
import time
from pathlib import Path

from tuner.errors import TunerError

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
MODELS_DIR = CONFIGS_DIR / "models"
SPACES_DIR = CONFIGS_DIR / "spaces"
TMP_SUFFIX = ".tmp"


def _new_file_mode() -> int:
    """What open() would give a new file: 0666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def read_json(path: Path, what: str = "", then: str = ""):
    """The JSON in `path`, or one clear line: unreadable, or not JSON. `what` names the
    kind of file in the message ("table "), `then` says what follows ("; refusing ...")."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise TunerError(f"cannot read {what}{path}: {e.strerror}{then}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TunerError(f"{what}{path} is not valid JSON: {e}{then}") from None


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one.

    The data goes to a temporary file in the same folder (same file system), is
    flushed to disk, then renamed over the target: a kill at any moment leaves no
    half-written file behind (a stray `.<name>.*.tmp` at worst, which
    remove_stale_temporaries clears). The file keeps the mode of the one it replaces,
    else gets the umask's (an engine running as another user must read what we install).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = _new_file_mode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def finite_json(obj):
    """obj with every NaN or infinity replaced by None: JSON has no such numbers (strict
    readers refuse them), and where we have one it means "no number"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def atomic_write_json(path: Path, obj, indent: int | None = 4) -> None:
    atomic_write_text(path, json.dumps(finite_json(obj), indent=indent, allow_nan=False) + "\n")


def remove_stale_temporaries(folder: Path, older_than_s: float = 0.0) -> list[Path]:
    """Remove the temporary files atomic writes leave when killed (`.<name>.<random>.tmp`)
    under `folder`, older than `older_than_s` (0: every one; call it only where no other
    writer can be at work, e.g. under a lock)."""
    removed: list[Path] = []
    now = time.time()
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for tmp in folder.rglob(f".*{TMP_SUFFIX}"):
        try:
            if tmp.is_file() and now - tmp.stat().st_mtime >= older_than_s:
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            continue
    return removed


def writable_folder(path: Path) -> tuple[bool, Path]:
    """(whether a file can be created at or under `path`, the folder that decides it)."""
    p = Path(path)
    while not p.exists():
        p = p.parent
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK), p


def is_disk_full(e: BaseException | None) -> bool:
    """Whether an error (or one it was raised from: Optuna wraps SQLite's in its own
    "exception during the commit") is a full disk."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or \
                "database or disk is full" in str(e).lower() or "no space left" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False
