"""Where the repository's data folders are, and atomic file writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
MODELS_DIR = CONFIGS_DIR / "models"
SPACES_DIR = CONFIGS_DIR / "spaces"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one.

    The data goes to a temporary file in the same folder (same file system), is
    flushed to disk, then renamed over the target: a kill at any moment leaves no
    half-written file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, obj, indent: int | None = 4) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")
