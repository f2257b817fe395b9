"""One module per command beyond the core tuning run's parsing (tuner/cli.py): each takes plain
options and does its job (tune, bench, check, ceilings, drift, nightly, proof, report).
"""
