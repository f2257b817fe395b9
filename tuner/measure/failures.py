"""Kinds of failed measurements, so that reports can count them.

A failed config has a kind (one of KINDS) and a detail (the error text). Measurers set
the kind where they know it (a hang is a timeout, a dead worker a crash); anything else,
and every failure stored before kinds existed (a landscape's or a trial's "error" text), is
classified from its text by `kind_of`.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

COMPILE, RUNTIME, TIMEOUT, CRASH, OUT_OF_RESOURCES, NUMERICS, INVALID = (
    "compile", "runtime", "timeout", "crash", "out_of_resources", "numerics", "invalid")
KINDS = (COMPILE, RUNTIME, TIMEOUT, CRASH, OUT_OF_RESOURCES, NUMERICS, INVALID)

# (kind, texts any of which marks it), first match wins: a crash or a hang says so before
# whatever the child was doing, and resource errors often come out of the compiler.
_MARKERS = (
    (TIMEOUT, ("hang:", "no result within", "timed out", "timeout")),
    (CRASH, ("worker killed by", "worker exited with", "worker died", "worker was gone", "context lost",
             "sigsegv", "sigabrt", "sigbus", "core dumped")),
    (OUT_OF_RESOURCES, ("outofresources", "out of resources", "outofmemory", "out of memory",
                        "shared memory", "too many resources")),
    (COMPILE, ("compilationerror", "compileerror", "compiletimeassertion", "compilation", "ptxas",
               "mlir", "triton.compiler")),
    (NUMERICS, ("numerics", "nan in the output", "nan left", "tolerance")),
    (INVALID, ("invalid", "not in the landscape", "not a positive finite", "non-finite")),
)


def kind_of(error: str | None) -> str | None:
    """The kind of a failure from its text (None for no failure); RUNTIME when nothing
    more specific is recognised."""
    if not error:
        return None
    text = error.lower()
    for kind, markers in _MARKERS:
        if any(m in text for m in markers):
            return kind
    return RUNTIME


def exception_kind(e: BaseException) -> str:
    """The kind of an exception a kernel raised while compiling or running."""
    name = type(e).__name__
    if name in ("OutOfResources", "OutOfMemoryError"):
        return OUT_OF_RESOURCES
    if "Compil" in name or type(e).__module__.startswith("triton.compiler"):
        return COMPILE
    return kind_of(f"{name}: {e}") or RUNTIME


def count_by_kind(kinds: Iterable[str | None]) -> dict[str, int]:
    """{kind: how many}, in KINDS order, leaving out what is no kind (None, NaN: no failure)."""
    counts = Counter(k for k in kinds if isinstance(k, str) and k)
    return {k: counts[k] for k in (*KINDS, *sorted(set(counts) - set(KINDS))) if counts[k]}


def summary(counts: dict[str, int]) -> str:
    """'compile 2, timeout 1' ('' for none)."""
    return ", ".join(f"{k} {n}" for k, n in counts.items() if n)


def one_line(error: str | None, limit: int = 400) -> str | None:
    """A failure's text as one line, cut to `limit` characters: what a summary, a manifest
    and the closing line of a run say about why something was not timed."""
    if not error:
        return None
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."
