#!/usr/bin/env python3
"""How many trials does each sampler need to come within 1 % and 3 % of a landscape's best?

    python scripts/search_efficiency.py LANDSCAPE.jsonl.gz --gpu H200 [--budget 64] [--seeds 3] [--space FILE]

Prints a Markdown table. The study searches the landscape's own kernel (ours, or the engine's
it was recorded on: a vLLM-kernel landscape has vLLM's keys and BLOCK_SIZE_M 8) over that
kernel's space (or --space, the one it was recorded with). Run it on landscapes recorded on
a GPU; on a synthetic one (header "synthetic": true) the figures describe the cost model,
and on one recorded on the CPU device the interpreter, not a GPU.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import TunerError  # noqa: E402
from tuner.jobs.report import markdown_table  # noqa: E402
from tuner.measure.landscape import read_header, read_landscape  # noqa: E402
from tuner.plan.gpus import get_gpu  # noqa: E402
from tuner.plan.kernel_registry import get_kernel  # noqa: E402
from tuner.plan.space import load_space  # noqa: E402
from tuner.search.offline import VARIANTS, search_efficiency, summary_table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("landscape")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--space", default=None, help="search-space YAML (default: the landscape's kernel's own)")
    args = ap.parse_args()
    notes = []
    try:
        header = read_header(args.landscape)
        if not isinstance(header, dict):
            raise TunerError(f"{args.landscape} is not a landscape")
        source = header.get("kernel_source", "ours")
        name = header.get("kernel", "")
        kernel = get_kernel(name) if source == "ours" else get_kernel(name, source, load_code=False)
        land = read_landscape(args.landscape, kernel)
        space = load_space(kernel, args.space)
        if header.get("space") and header["space"] != space.version:
            notes.append(f"the landscape was recorded with another search space than {space.source}: the study "
                         "runs over the points both hold")
        runs = search_efficiency(land, space, get_gpu(args.gpu), args.budget, args.seeds, VARIANTS)
    except TunerError as e:
        print(f"search_efficiency: error: {e}", file=sys.stderr)
        return 2
    print(f"Kernel: {kernel.source_label}'s {kernel.name}; space {space.source}; budget {args.budget}, "
          f"{args.seeds} seeds per sampler.\n")
    for note in notes:
        print(f"Note: {note}.\n")
    if land.header.get("synthetic"):
        print("**SYNTHETIC landscape: these figures describe a cost model, not a GPU.**\n")
    from tuner.measure.provenance import is_cpu_device
    if is_cpu_device(land.header):
        print("**CPU DEVICE landscape: these figures describe Triton's interpreter on a CPU, not a GPU.**\n")
    print(markdown_table(summary_table(runs, args.budget)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
