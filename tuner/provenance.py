"""Where the times a command shows came from, in words: measured on a GPU, replayed from
a landscape recorded on device X, or made up by the synthetic cost model.

Every output that shows times (the closing table, report, plots, diff, drift, collect)
states its source with these lines, and a synthetic source is shouted, so that numbers
nobody measured can never pass for measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

SYNTHETIC_WARNING = "SYNTHETIC TIMES: made up by a cost model (tuner/synthetic.py), not measured on any GPU"


@dataclass(frozen=True)
class TimeSource:
    kind: str             # "gpu", "replay", "synthetic", or "unknown"
    detail: str           # what, in words: the device and software, the landscape file

    @property
    def synthetic(self) -> bool:
        return self.kind == "synthetic"

    def line(self) -> str:
        """One line for the top of an output."""
        if self.synthetic:
            return f"{SYNTHETIC_WARNING} ({self.detail})"
        return f"times: {self.detail}"

    def banner(self) -> list[str]:
        """The line framed so that a synthetic source cannot be missed."""
        if not self.synthetic:
            return [self.line()]
        rule = "!" * min(100, len(self.line()))
        return [rule, self.line(), rule]

    def short(self) -> str:
        """A few words for a plot's title."""
        if self.synthetic:
            return "SYNTHETIC: a cost model, not measured"
        return self.detail.split(";")[0]


def _software(env: dict) -> str:
    parts = [f"{k} {env[k]}" for k in ("driver", "cuda", "torch", "triton") if env.get(k)]
    return ", ".join(parts)


def from_header(header: dict, path: str = "") -> TimeSource:
    """The source of a landscape's times (its header)."""
    where = f"landscape {path}" if path else "a landscape"
    if header.get("synthetic"):
        return TimeSource("synthetic", f"{where}, labelled for {header.get('device', '?')}")
    soft = _software(header)
    recorded = f" on {header['recorded'][:10]}" if header.get("recorded") else ""
    return TimeSource("replay", f"replayed from {where}, recorded on {header.get('device', '?')}{recorded}"
                      + (f"; {soft}" if soft else ""))


def from_environment(label: str, env: dict) -> TimeSource:
    """The source of a run's times: its measurer's label ("gpu", "replay:<file>") and the
    environment it reported."""
    env = env or {}
    label = label or ""
    replays = [part[len("replay:"):] for part in label.split(", ") if part.startswith("replay:")]
    if env.get("synthetic"):
        return TimeSource("synthetic", f"landscape {', '.join(replays) or '?'}, labelled for {env.get('device', '?')}")
    soft = _software(env)
    if replays:
        recorded = f" on {str(env['recorded'])[:10]}" if env.get("recorded") else ""
        return TimeSource("replay", f"replayed from landscape {', '.join(replays)}, recorded on "
                          f"{env.get('device', '?')}{recorded}" + (f"; {soft}" if soft else ""))
    if label.startswith("gpu"):
        return TimeSource("gpu", f"measured on {env.get('device', 'a GPU')}" + (f"; {soft}" if soft else ""))
    return TimeSource("unknown", "source not recorded")


def from_manifest(manifest: dict) -> TimeSource:
    """The source of a results folder's times (its manifest). A folder whose tables came
    from several sources is reported as such; any synthetic table makes it synthetic."""
    tables = manifest.get("tables") or []
    label = manifest.get("measured_by") or ""
    sources = {from_environment(label, t.get("environment") or {}) for t in tables} or {from_environment(label, {})}
    synthetic = [s for s in sources if s.synthetic]
    if synthetic:
        return synthetic[0]
    if len(sources) == 1:
        return next(iter(sources))
    return TimeSource("mixed", "; ".join(sorted(s.detail for s in sources)))


def from_landscape_file(path: str) -> TimeSource:
    from tuner.landscape import read_header
    return from_header(read_header(path), str(path))


def for_run(replay: str | None, cuda_name: str) -> TimeSource:
    """The source of the times a tuning or drift run is about to take."""
    if replay:
        return from_landscape_file(replay)
    return TimeSource("gpu", f"measured on this machine's {cuda_name}")
