"""Storage URLs as tuner prints them: in plans, progress lines and refusals. Kept apart from
tuner/search/storage.py so that the plan (which imports no Optuna) can print one."""

from __future__ import annotations

import re

# scheme://user:password@host...: the password, up to the last '@' before the path (a password
# with an unescaped '@' is hidden whole too)
_PASSWORD = re.compile(r"(://[^/:@]*:)[^/]*@")


def shown(url: str) -> str:
    """A storage URL as printed: a database password hidden (user:***@host)."""
    return _PASSWORD.sub(r"\1***@", url) if isinstance(url, str) else url
