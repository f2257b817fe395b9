"""A partial table: one whose run tuned only some of the batch sizes it planned (a time box ran out).

Its manifest entry says so as `"partial": {"tuned": [M...], "planned": [M...], "why": "..."}`
(`planned`: every batch size the run meant to tune; the rows it holds, `entries`, are the ones it
did), or as a `--minutes` window writes it, `{"tuned": [M...], "incumbent": {M: whose row}}` (the
batch sizes not tuned hold the incumbent in the table file). `tuner install` puts only the tuned
rows over a table the engine reads (never the incumbent rows: issue 51, item 2), says so for each
partial table (with --merge the other batch sizes keep the rows the engine reads today) and
records it in the backup record, where `tuner audit` reads it back.
"""

from __future__ import annotations

from pathlib import Path

KEY = "partial"
MAX_WHY = 200               # `why` is one line a run wrote ("the --minutes window ended"), printed as it is
SHOWN = 12                  # batch sizes a line lists; more are cut to the first and last few


def problem(value) -> str | None:
    """What is wrong with a manifest entry's "partial" value (None: fine or absent)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return "'partial' is not an object"
    from tuner.plan.batch_keys import is_batch_key
    for key in ("planned", "tuned"):
        ms = value.get(key)
        if ms is not None and not (isinstance(ms, list) and all(isinstance(m, int) and is_batch_key(m) for m in ms)):
            return f"partial.{key} is not a list of batch sizes"
    if value.get("incumbent") is not None and not isinstance(value["incumbent"], dict):
        return "partial.incumbent is not an object"
    why = value.get("why")
    if why is not None and not (isinstance(why, str) and len(why) <= MAX_WHY and why.isprintable()):
        # printed as it is: a newline would forge a line of our output, an escape rewrite the terminal
        return f"partial.why is not a line of text (at most {MAX_WHY} printable characters)"
    return None


def of_entry(table_entry: dict) -> dict | None:
    """{"tuned": [M...], "planned": [M...], "left": [M...], "why": str} of a manifest table
    entry that tuned fewer batch sizes than it planned; None for a whole table."""
    value = table_entry.get(KEY)
    if not isinstance(value, dict) or problem(value):
        return None
    from tuner.plan.batch_keys import batch_key
    entries = table_entry.get("entries")
    tuned = sorted(m for k in (entries if isinstance(entries, dict) else {}) if (m := batch_key(k)) is not None
                   and (value.get("tuned") is None or m in value["tuned"]))
    planned = sorted({*(value.get("planned") or []), *tuned,
                      *(m for k in (value.get("incumbent") or {}) if (m := batch_key(k)) is not None)})
    left = [m for m in planned if m not in tuned]
    if not left:
        return None
    incumbent = {m: str(who) for k, who in (value.get("incumbent") or {}).items() if (m := batch_key(k)) is not None}
    return {"tuned": tuned, "planned": planned, "left": left, "why": value.get("why") or "",
            **({"incumbent": {str(m): incumbent[m] for m in sorted(incumbent)}} if incumbent else {})}


def _ms(ms) -> str:
    """Batch sizes as a line lists them: all of a few, the first and last of many (a line stays short)."""
    ms = list(ms)
    if len(ms) <= SHOWN:
        return ",".join(map(str, ms))
    return ",".join(map(str, ms[:SHOWN - 3])) + ",...," + ",".join(map(str, ms[-2:])) + f" ({len(ms)} in all)"


def install_note(rel: str, part: dict, engine: str, merged: bool, reads_none: bool, held: set[int]) -> str:
    """What `tuner install` says of a partial table: what its batch sizes not tuned run once it is
    installed (`merged`: the rows the engine reads today, kept; `reads_none`: the engine reads no
    table of this name today; `held`: the batch sizes the file installed has a row for)."""
    if merged:
        rest = f"--merge keeps the rows {engine} reads today for them"
    elif reads_none and set(part["left"]) <= held:
        who = sorted(set((part.get("incumbent") or {}).values()))
        rest = (f"{engine} reads no table of this name today, and they hold the row the run took as incumbent ("
                + ("the engine's default config" if who == ["default"] else "the row its engine read, else the "
                   "default config") + ")")
    else:
        rest = "they run the nearest tuned row" + ("" if reads_none else
                                                   f" (--merge keeps the rows {engine} reads today for them)")
    return (f"partial: {Path(rel).name} was tuned at M={_ms(part['tuned'])} only ({len(part['tuned'])} of the "
            f"{len(part['planned'])} batch sizes planned; {part['why'] or 'its run stopped early'}); "
            f"M={_ms(part['left'])} were not tuned: {rest}")


def audit_line(name: str, record_entry: dict) -> str | None:
    """What `tuner audit` says of an installed table its install recorded as partial."""
    part = record_entry.get(KEY)
    if not isinstance(part, dict) or not isinstance(part.get("tuned"), list) or problem(part):
        return None             # a record damaged or edited by hand: nothing said of it, no crash
    kept = (record_entry.get("merged") or {}).get("kept") or []
    return (f"partial: {name} was tuned at M={_ms(part['tuned'])} only ({len(part['tuned'])} of "
            f"{len(part.get('planned') or [])} planned; installed by tuner); "
            + (f"M={_ms(kept)} run the rows kept from the table the engine read before" if kept else
               "the other batch sizes run the nearest tuned row"))


def run_line(run: Path, table: Path) -> str | None:
    """What `tuner audit` says of a table audited in a tuner run's own folder (not installed) that its run
    tuned in part, from the run's manifest; None for a whole table, or a manifest it cannot read.
    Before, audit said so only once the table was installed (found by a new-user pass)."""
    from tuner.errors import TunerError
    from tuner.reading import read_json_file
    try:
        manifest = read_json_file(run / "manifest.json", "manifest ")
        rel = table.resolve().relative_to(run.resolve()).as_posix()
    except (TunerError, ValueError, OSError):
        return None
    for entry in manifest.get("tables", []) if isinstance(manifest, dict) else []:
        files = entry.get("files") if isinstance(entry, dict) else None
        if isinstance(files, dict) and rel in files.values() and (part := of_entry(entry)):
            return (f"partial: {table.name} was tuned at M={_ms(part['tuned'])} only ({len(part['tuned'])} of the "
                    f"{len(part['planned'])} batch sizes planned; {part['why'] or 'its run stopped early'}); not "
                    f"installed: M={_ms(part['left'])} run the nearest tuned row of this file")
    return None
