import os
import sys
from pathlib import Path

# Without a GPU, Triton kernels run in Triton's interpreter (NumPy on the CPU).
try:
    import torch
    _has_gpu = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _has_gpu = False
if not _has_gpu:
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest


@pytest.fixture
def shared_dir():
    """../shared beside the checkout: the engines' facts and shipped tables."""
    d = Path(__file__).resolve().parents[2] / "shared"
    if not (d / "baselines").is_dir():
        pytest.skip("needs the engines' shipped tables in ../shared/baselines beside this checkout (kept "
                    "outside the repository; absent in a clone elsewhere)")
    return d


@pytest.fixture(autouse=True)
def _backups_in_tmp(tmp_path, monkeypatch):
    """`tuner install` backs up into ~/.cache by default; tests keep theirs in tmp_path."""
    from tuner.emit import install
    monkeypatch.setattr(install, "BACKUP_ROOT", tmp_path / "backups")
