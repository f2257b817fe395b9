"""Mark a results folder's tables partial where they lack rows of their kernel's full
batch-size grid (scripts/mark_partial.py, after a GPU window). Apart from tuner/emit/partial.py,
which the manifest writer imports: this one reads the manifest back, and the planned grids are
the pipeline's."""
from __future__ import annotations

from pathlib import Path

from tuner.emit.partial import KEY, of_entry, problem
from tuner.errors import TunerError


def mark(folder: Path, why: str) -> list[str]:
    """Mark each table of a results folder's manifest that lacks rows of its kernel's full
    batch-size grid as partial (and unmark the whole ones), atomically; what it did, per table."""
    from tuner.emit.results import MANIFEST, read_manifest
    from tuner.paths import atomic_write_json
    from tuner.plan.kernel_registry import batch_grid
    if problem({"why": why}):               # what install would refuse the manifest for
        raise TunerError(f"the reason given: {problem({'why': why})}")
    manifest = read_manifest(folder)
    said = []
    for t in manifest["tables"]:
        planned = batch_grid(str(t.get("kernel")))        # the kernel's spec says its grid
        t[KEY] = {**(t.get(KEY) if isinstance(t.get(KEY), dict) else {}), "planned": list(planned), "why": why}
        part = of_entry(t)
        name = ", ".join(Path(f).name for f in (t.get("files") or {}).values()) or str(t.get("problem"))
        if part is None:
            del t[KEY]
            said.append(f"whole: {name}")
        else:
            t[KEY]["tuned"] = part["tuned"]
            said.append(f"partial ({len(part['tuned'])} of {len(planned)} batch sizes): {name}")
    atomic_write_json(folder / MANIFEST, manifest, indent=2, root=folder)
    return said
