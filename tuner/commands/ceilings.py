"""`tuner ceilings`: measure this GPU's copy bandwidth and matmul rates (tuner/measure/ceilings.py
measures them and reads them back for bench, drift and the plan)."""

from __future__ import annotations

from pathlib import Path

from tuner.commands.options import device_option
from tuner.file_kinds import CEILINGS
from tuner.measure.ceilings import default_path, measure, summary_lines, write
from tuner.paths import check_output


def add_parser(sub, common) -> None:
    """`tuner ceilings` and its options."""
    ceil = sub.add_parser("ceilings", help="measure this GPU's copy bandwidth and matmul rates",
                          description="Measure device-to-device copy bandwidth (bytes read plus written: the best of "
                          "3 sizes x 3 methods), FP8 and BF16 dense matmul rates at 8192^3, L2 size and SM count, "
                          "after warming the clocks and with the clocks read while timed; a figure under 70% of "
                          "the datasheet is measured again, then marked SUSPECT (bench, drift and the plan then "
                          "use the datasheet's). Needs the GPU.")
    ceil.add_argument("--gpu", required=True)
    ceil.add_argument("--out", default=None, metavar="FILE",
                      help="default bench/ceilings/<gpu>.json (with --device cpu: runs/ceilings-<gpu>-cpu-device.json)")
    device_option(ceil)


def run(args) -> int:
    from tuner.plan.gpus import get_gpu
    gpu = get_gpu(args.gpu)
    path = Path(args.out) if args.out else default_path(gpu, args.device)
    # before measuring: only a ceilings file is replaced there (never notes, a device, a link)
    check_output(path, CEILINGS, "--out" if args.out else "")
    data = measure(gpu, device=args.device)
    write(data, path)
    for line in summary_lines(data):
        print(line)
    print(f"ceilings: {path}")
    return 0
