"""A results folder as a tuning run leaves it (each engine's table files and a manifest entry
for each), made by hand for the install tests: what `tuner install` reads."""

import json
from pathlib import Path

ENVIRONMENT = {"device": "NVIDIA H200", "triton": "3.6.0"}


def results_folder(root: Path, kernel: str, tables: dict[str, dict], engine: str = "vllm") -> Path:
    """`tables`: each table's path under `root` (as the manifest names it) and its JSON; one
    manifest entry per table, for `engine`, numerics passed on an H200."""
    entries = []
    for i, (rel, table) in enumerate(tables.items()):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(table))
        entries.append({"kernel": kernel, "problem": {"i": i}, "files": {engine: rel}, "environment": ENVIRONMENT,
                        "numerics_passed": True})
    (root / "manifest.json").write_text(json.dumps({"format": "tuner-manifest/1", "tables": entries}))
    return root
