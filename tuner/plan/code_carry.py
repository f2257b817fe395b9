"""Code versions carried over: a launcher's code version that launches as an older one did, so
what was stored under the older one (a study, a recorded landscape) is continued under it.

configs/carried_code_versions.yaml lists each by its exact hash with the version it carries and
why (an edit of kernels/engines/ that leaves every launch as it was, checked by
tests/test_engine_versions.py against the engines' own wrappers). Only listed hashes are carried,
so a later edit is a new, unlisted version again.
"""

from __future__ import annotations

import re
from functools import lru_cache

from tuner.errors import TunerError
from tuner.paths import CONFIGS_DIR

CARRIED = CONFIGS_DIR / "carried_code_versions.yaml"
_HASH = re.compile(r"^[0-9a-f]{16}$")


@lru_cache(maxsize=1)
def carried() -> dict[str, str]:
    """{new code version: the version it carries}, checked field by field."""
    from tuner.reading import parse_yaml, read_text
    if not CARRIED.is_file():
        return {}
    data = parse_yaml(read_text(CARRIED, "the carried code versions "), str(CARRIED))
    entries = data.get("carried") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise TunerError(f"{CARRIED}: 'carried' must map code versions to what they carry")
    out = {}
    for new, entry in entries.items():
        old = entry.get("from") if isinstance(entry, dict) else None
        if not (isinstance(new, str) and _HASH.match(new) and isinstance(old, str) and _HASH.match(old)
                and isinstance(entry.get("why"), str) and entry["why"].strip()):
            raise TunerError(f"{CARRIED}: {new!r} needs 16 hex digits, 'from' (16 hex digits) and 'why'")
        out[new] = old
    return out


def same_code(stored: str, now: str) -> bool:
    """Whether code `now` launches as `stored` did: the same, or carried from it (in a chain)."""
    seen = set()
    while now and now not in seen:
        if now == stored:
            return True
        seen.add(now)
        now = carried().get(now, "")
    return False
