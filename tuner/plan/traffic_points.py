"""A traffic profile given as points: a CSV (`M,weight` per line) or JSON ({"M": weight},
[[M, weight], ...] or [{"M": .., "weight": ..}, ...]) of the M the kernel sees, taken as given."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from tuner.errors import TunerError
from tuner.plan.traffic_profile import MAX_ROWS, _row


def _csv_rows(text: str, path: Path) -> list[tuple[int, float]]:
    rows: list[tuple[int, float]] = []
    for n, fields in enumerate(csv.reader(io.StringIO(text)), 1):
        if not fields or not "".join(fields).strip() or fields[0].lstrip().startswith("#"):
            continue
        if len(fields) != 2:
            raise TunerError(f"traffic profile {path}:{n}: expected `M,weight`, got {','.join(fields)[:60]!r}")
        if not rows and re.fullmatch(r"[A-Za-z_ ]+", fields[0].strip()):
            continue                               # a header line (M,weight)
        rows.append(_row(fields[0], fields[1], f"traffic profile {path}:{n}"))
        if len(rows) > MAX_ROWS:
            raise TunerError(f"traffic profile {path} has more than {MAX_ROWS} rows")
    if not rows:
        raise TunerError(f"traffic profile {path} holds no `M,weight` rows")
    return rows


def _json_rows(text: str, path: Path) -> list[tuple[int, float]]:
    from tuner.reading import parse_json
    data = parse_json(text, f"traffic profile {path}")
    where = f"traffic profile {path}"
    if isinstance(data, dict):
        pairs = list(data.items())
    elif isinstance(data, list) and all(isinstance(x, dict) for x in data):
        try:
            pairs = [(x["M"], x["weight"]) for x in data]
        except KeyError:
            raise TunerError(f"{where}: each object needs \"M\" and \"weight\"") from None
    elif isinstance(data, list) and all(isinstance(x, list) and len(x) == 2 for x in data):
        pairs = [tuple(x) for x in data]
    else:
        raise TunerError(f"{where}: expected {{\"M\": weight, ...}}, [[M, weight], ...] or "
                         "[{\"M\": .., \"weight\": ..}, ...]")
    if not pairs:
        raise TunerError(f"{where} holds no rows")
    if len(pairs) > MAX_ROWS:
        raise TunerError(f"{where} has more than {MAX_ROWS} rows")
    for m, w in pairs:
        if isinstance(m, bool) or isinstance(w, bool) or not isinstance(w, (int, float, str)):
            raise TunerError(f"{where}: row {m!r}: {w!r} is not a weight")
    return [_row(str(m), str(w), f"{where}: row {m!r}") for m, w in pairs]
