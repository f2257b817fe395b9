"""What the audit finds in the tables a run just wrote, said once per fact.

The audit's table checks (tuner/emit/audit.py) run on every table a run writes. Many of their
findings are one fact about the run, not about each table: a run told to tune a few batch sizes
writes tables of those keys only, and every table then is "truncated" with "far keys". Those are
said once, as what they are (the batch sizes chosen), never as the overwrite of a multi-GPU run
the audit would suspect in an installation; every other finding is said once per kind and
reason, naming its tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# findings that a table of exactly the batch sizes a run tuned has because of that choice
BY_THE_BATCH_SIZES = ("truncated", "far_keys")


@dataclass
class RunFindings:
    """The findings of a run's tables, gathered as they are written, said at the end."""
    tuned: set[int]                                  # the batch sizes the run tuned
    # how to tune the batch sizes a server runs: a replay narrowed to its landscape's needs another landscape
    advice: str = "leave --batch-sizes out to tune the engines' grid, the batch sizes a server runs"
    found: list[tuple[str, Any, list[int]]] = field(default_factory=list)   # (table, Finding, its keys)

    def add(self, table: str, finding, keys) -> None:
        self.found.append((table, finding, sorted(keys)))

    def lines(self) -> list[str]:
        out: list[str] = []
        chosen = [(t, f) for t, f, keys in self.found if f.kind in BY_THE_BATCH_SIZES and set(keys) <= self.tuned]
        if chosen:
            tables = sorted({t for t, _ in chosen})
            far = next((f.reason for _, f in chosen if f.kind == "far_keys"), "")
            out.append(f"the {len(tables)} table(s) hold only the batch sizes tuned (M={','.join(map(str, sorted(self.tuned)))})"
                       + (f": {far}" if far else "")
                       + f"; {self.advice}")
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for t, f, keys in self.found:
            if f.kind in BY_THE_BATCH_SIZES and set(keys) <= self.tuned:
                continue
            grouped.setdefault((f.severity, f.kind, f.reason), []).append(t)
        for (severity, kind, reason), tables in grouped.items():
            names = ", ".join(tables[:2]) + (f" and {len(tables) - 2} more" if len(tables) > 2 else "")
            out.append(f"{kind}: {reason} ({names})")
        return out
