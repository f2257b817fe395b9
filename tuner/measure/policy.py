"""How a config is timed (the measurement policy): CUDA-graph replay or eager launches, the L2
flushed (cold) or left warm, the routing of a MoE layer's tokens, and the clocks.

A table tuned under one policy answers for that policy only: vLLM runs decode under CUDA
graphs and prefill eagerly, and a config that wins one way can lose the other (launch
overhead, L2 reuse of the weights, how skewed the experts' loads are). So the policy is
recorded for every result (manifest, landscape header), is part of a study's identity
(tuner/search/identity.py: a study timed under another policy is never resumed into this
one), and is shown by `tuner report`, `tuner drift` and `tuner audit`. The device module
(tuner/measure/device.py) carries it out, the CPU device the same way as a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import TunerError

TIMINGS = ("graph", "eager")       # CUDA-graph replay (how engines run decode), or eager launches (prefill)
L2_STATES = ("cold", "warm")       # L2 flushed before each timed run, or left as the last run left it
# Clocks: the tuner never locks them; a GPU is timed at whatever the driver runs it at (NVML's
# reading is kept with every result: environment.clocks_now), and throttled runs are taken again.
CLOCKS = "unlocked"


@dataclass(frozen=True)
class MeasurementPolicy:
    timing: str = "graph"
    l2: str = "cold"
    routing: str | None = None     # a MoE problem's routing ("uniform", "zipf", "recorded:<name>@<hash>"); None: no routing
    clocks: str = CLOCKS

    def __post_init__(self) -> None:
        if self.timing not in TIMINGS:
            raise TunerError(f"--timing {self.timing!r} is not one of {', '.join(TIMINGS)}")
        if self.l2 not in L2_STATES:
            raise TunerError(f"--l2 {self.l2!r} is not one of {', '.join(L2_STATES)}")

    @property
    def graph(self) -> bool:
        return self.timing == "graph"

    @property
    def flush_l2(self) -> bool:
        return self.l2 == "cold"

    def as_dict(self) -> dict:
        """As manifests, landscape headers and study identities record it."""
        out = {"timing": self.timing, "l2": self.l2, "clocks": self.clocks}
        return {**out, "routing": self.routing} if self.routing else out

    @classmethod
    def from_dict(cls, d: dict | None) -> "MeasurementPolicy":
        d = d or {}
        return cls(timing=d.get("timing", "graph"), l2=d.get("l2", "cold"), routing=d.get("routing"),
                   clocks=d.get("clocks", CLOCKS))

    def text(self) -> str:
        """In words, for plans, reports and drift."""
        words = [("CUDA-graph replay" if self.graph else "eager launches"),
                 ("L2 flushed before each run" if self.flush_l2 else "L2 warm"),
                 f"clocks {self.clocks}"]
        if self.routing:
            words.append(f"routing {self.routing}")
        return ", ".join(words)


DEFAULT = MeasurementPolicy()


UNKNOWN = "unknown"      # a replayed landscape that does not say how it was timed


def policy_text(d: dict | None) -> str:
    """A recorded policy (a manifest's or a landscape's) in words; 'not recorded' for results
    from before policies were recorded (they were timed as the default: graph, L2 cold)."""
    if not d:
        return "not recorded (older results: CUDA-graph replay, L2 flushed)"
    if d.get("timing") == UNKNOWN:
        return "as the replayed landscape was recorded (it does not say how)" + (
            f", routing {d['routing']}" if d.get("routing") else "")
    try:
        return MeasurementPolicy.from_dict(d).text()
    except TunerError:
        return f"unreadable ({d!r:.60})"


def replay_policy(recorded: dict | None, asked: dict | None) -> dict:
    """The policy of a replay's times: the landscape's, with the run's routing (a problem's
    routing is in the landscape's problems); unknown where the landscape does not say."""
    routing = (asked or {}).get("routing")
    out = dict(recorded) if recorded else {"timing": UNKNOWN, "l2": UNKNOWN, "clocks": UNKNOWN}
    return {**out, **({"routing": routing} if routing else {})}


def check_replay_policy(path: str, recorded: dict | None, asked: dict | None) -> None:
    """A replay answers with the landscape's timings: asking for another timing or L2 policy
    than the one it was recorded under is one line, not a table of the wrong policy. A
    landscape that does not say (recorded elsewhere, or before policies were recorded) is
    taken as it is; the manifest then says the policy is the landscape's."""
    if not recorded or not asked:
        return
    for key, option in (("timing", "--timing"), ("l2", "--l2")):
        if asked.get(key) and recorded.get(key) and asked[key] != recorded[key]:
            raise TunerError(f"landscape {path} was recorded with {key} {recorded[key]}, not {option} {asked[key]}: "
                             "its times are of another measurement policy")
