"""The GPU proof's time plan: how much of its call's --minutes each step may take.

A step gets its share of what is left when it starts (SHARES, over the steps still to run),
so a step that finishes early leaves its time to the next; a step that must not be cut short
on a cold machine has a floor (FLOORS). A step out of time is stopped (SIGTERM, then SIGKILL
after STOP_GRACE_S) and keeps what it wrote.

Why the smoke test has a floor: it is the first thing that measures on a freshly started
machine, so it pays every cold start of the call: Python and torch imported from a cold disk,
CUDA initialised in the measuring child, 16 compile workers started, Triton's cache empty (the
first compile of vLLM's fused-MoE kernel), DeepSeek-V3's expert weights made on the GPU, the
float64 reference. Its share alone (0.12 of what is left after the environment: 31 s of the
4.5-minute call 1 a 15-minute lease allows) is what the CPU device's rehearsal of it took at
worst (31-52 s), with no margin; 150 s is about three times that. A smoke that finishes sooner leaves the rest to the next steps.
The environment step has a floor too (30 s): `tuner ceilings` is a new process on that cold
machine (torch imported, CUDA initialised, a bandwidth and two matmul rates measured), and with
the 15-minute lease's short call 1 (--minutes 4.5) its share alone would be 16 s.
`tuner proof --plan` prints the boxes.
"""

from __future__ import annotations

CALLS = {"1": ("environment", "smoke", "validate", "tune-vllm"),
         "2": ("tune-sglang", "bench-moe", "bench-gemm", "landscapes"),
         "local": ("report", "sampler")}
STEPS = tuple(s for steps in CALLS.values() for s in steps)
# Share of its call's budget per step (what one step leaves, the next ones get).
SHARES = {"environment": 0.06, "smoke": 0.12, "validate": 0.22, "tune-vllm": 0.60,
          "tune-sglang": 0.56, "bench-moe": 0.16, "bench-gemm": 0.16, "landscapes": 0.12,
          "report": 0.3, "sampler": 0.7}
FLOORS = {"environment": 30.0, "smoke": 150.0}   # seconds a step gets at least (when the call has them left)
STOP_GRACE_S = 20.0                # a step out of time: SIGTERM, then SIGKILL this much later


def time_box(order: list[str], i: int, left: float) -> float:
    """Seconds step order[i] may take when `left` seconds of its call remain."""
    name = order[i]
    later = sum(SHARES[n] for n in order[i:])
    share = left * SHARES[name] / later if later else left
    return max(0.0, min(left, max(share, FLOORS.get(name, 0.0))))


def boxes(steps: list[str] | tuple[str, ...], minutes: float, taken: dict[str, float] | None = None) -> list[tuple]:
    """[(step, box in seconds, seconds assumed taken)] for `steps` run in the proof's order
    within `minutes`: each step assumed to take its whole box unless `taken` says otherwise
    (the worst case: the boxes then add up to the budget)."""
    order = [s for s in STEPS if s in steps]
    left, out = minutes * 60.0, []
    for i, name in enumerate(order):
        box = time_box(order, i, left)
        took = min(box, (taken or {}).get(name, box))
        out.append((name, box, took))
        left -= took
    return out


def plan_lines(call_steps: list[str], minutes: float, device: str) -> list[str]:
    """What `tuner proof --plan` prints: each step's time box in the worst case (every earlier
    step using its whole box) and the most it can get (every earlier step taking no time)."""
    worst = boxes(call_steps, minutes)
    order = [name for name, _, _ in worst]
    best = {name: time_box(order, i, minutes * 60.0) for i, name in enumerate(order)}
    where = "the CPU device (a rehearsal)" if device == "cpu" else "the GPU"
    lines = [f"time plan of {' '.join(order)} within --minutes {minutes:g} on {where}: each step's box in seconds "
             f"(estimates from the plan's shares, not measurements; a step out of time is stopped, SIGTERM then "
             f"SIGKILL {STOP_GRACE_S:.0f} s later, and keeps what it wrote)"]
    for name, box, _ in worst:
        floor = f", floor {FLOORS[name]:.0f}" if name in FLOORS else ""
        lines.append(f"  {name:12s} {box:6.0f} s if every earlier step uses its whole box; up to {best[name]:.0f} s "
                     f"(share {SHARES[name]:.2f} of what is left{floor})")
    lines.append(f"  total        {sum(b for _, b, _ in worst):6.0f} s of {minutes * 60:.0f} s, plus at most "
                 f"{STOP_GRACE_S:.0f} s for a stopped step")
    return lines
