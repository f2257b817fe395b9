"""One module per command (two for gemm/moe/mla: their options in kernel_commands.py, the run in
tune.py): `add_parser(sub, common)` adds its options to the command line, `run(args)` does its
job and returns the exit status. Modules here import no heavy library at module level (torch,
Triton, Optuna, pandas): `tuner --help` builds every parser. tuner/cli.py lists them in help order.
"""
