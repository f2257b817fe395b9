"""One reading of a batch-size key, for every table, manifest and record.

`str.isdigit()` accepts '²', '①' and '٣', and `int()` refuses the first two and any key over
4300 digits: a key is a batch size only when it is plain ASCII digits, few enough to be one."""
from __future__ import annotations

import re

MAX_BATCH = 1 << 20                 # as the command line's --batch-sizes
_KEY = re.compile(r"[0-9]{1,7}")    # 2^20 has 7 digits: a longer key is never a batch size


def batch_key(key, upper: int = MAX_BATCH) -> int | None:
    """`key` (a str or an int, never a bool) as a batch size from 1 to `upper`, else None."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key if 1 <= key <= upper else None
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        return None
    m = int(key)
    return m if 1 <= m <= upper else None


def whole_number(text: str, otherwise: int) -> int:
    """A version's part ('23' of 0.5.23) as a number; `otherwise` when it is no ASCII number
    (or one too long to be a version's)."""
    return int(text) if re.fullmatch(r"[0-9]{1,18}", text) else otherwise


def is_batch_key(key, upper: int = MAX_BATCH) -> bool:
    return batch_key(key, upper) is not None
