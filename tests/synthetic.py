"""Test helpers over SYNTHETIC landscapes (the cost model lives in tuner/measure/synthetic.py):
scaled copies of a landscape, slowed or self-killing command lines, small models."""

from __future__ import annotations

from tuner.measure.landscape import LandscapeWriter, Point, read_landscape
from tuner.measure.synthetic import fake_time_us, write_synthetic_landscape  # noqa: F401 (re-exported for tests)


def scaled_landscape(src, dst, kernel, factor: float, only_m=None, only=None, **header):
    """A copy of a landscape with every time (at batch sizes `only_m`, default all; of the
    points only(params, M, config) picks, default all) times `factor`, and header fields
    replaced: a GPU or software stack that got faster or slower."""
    land = read_landscape(src, kernel)
    w = LandscapeWriter(dst, kernel, {**land.header, **header})
    for (key, M), pts in land.points.items():
        for cfg, p in pts.items():
            picked = only is None or only(land.problems[key], M, dict(zip(kernel.config_keys, cfg)))
            f = factor if (only_m is None or M in only_m) and picked else 1.0
            w.write(land.problems[key], M, dict(zip(kernel.config_keys, cfg)),
                    Point(p.time_us * f if p.time_us else None, p.error, p.spread))
    w.close()
    return dst


def slowed_cli(seconds_per_config: float) -> str:
    """Python source that runs the tuner's command line with replayed measurements slowed
    down, so that test processes overlap (python -c SOURCE ARGS...)."""
    return f"""
import sys, time
from tuner.measure import measurers as measure
real = measure.ReplayMeasurer.measure
def slow(self, problem, M, configs):
    time.sleep({seconds_per_config} * len(configs))
    return real(self, problem, M, configs)
measure.ReplayMeasurer.measure = slow
from tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def cli_killed_at_claim(claim: int) -> str:
    """Python source that runs the tuner's command line and SIGKILLs itself the instant it
    has written the config of its `claim`-th claimed trial, before measuring it (python -c
    SOURCE ARGS...)."""
    return f"""
import os, signal, sys
import optuna
real = optuna.trial.Trial.set_user_attr
claims = [0]
def write_then_maybe_die(self, key, value):
    real(self, key, value)
    if key == "config":
        claims[0] += 1
        if claims[0] == {claim}:
            os.kill(os.getpid(), signal.SIGKILL)
optuna.trial.Trial.set_user_attr = write_then_maybe_die
from tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def block_fp8_model(path, hidden: int, heads: int, intermediate: int | None = None):
    """A small model YAML (128-wide heads, 128x128 FP8 weight blocks) with few GEMM shapes."""
    text = f"hidden_size: {hidden}\nnum_attention_heads: {heads}\nhead_dim: 128\n"
    if intermediate:
        text += f"intermediate_size: {intermediate}\n"
    path.write_text(text + "quantization_config: {weight_block_size: [128, 128]}\n")
    return path
