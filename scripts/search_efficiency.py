#!/usr/bin/env python3
"""How many trials does each sampler need to come within 1 % and 3 % of a landscape's best?

    python scripts/search_efficiency.py LANDSCAPE.jsonl.gz --gpu H200 [--budget 64] [--seeds 3]

Prints a Markdown table. Run it on landscapes recorded on a GPU; on a synthetic one
(header "synthetic": true) the figures describe the cost model, not a GPU.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import get_kernel  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.gpus import get_gpu  # noqa: E402
from tuner.landscape import read_header, read_landscape  # noqa: E402
from tuner.offline import search_efficiency, summary_table  # noqa: E402
from tuner.report import markdown_table  # noqa: E402
from tuner.space import load_space  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("landscape")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    try:
        kernel = get_kernel(read_header(args.landscape).get("kernel", ""))
        land = read_landscape(args.landscape, kernel)
        runs = search_efficiency(land, load_space(kernel), get_gpu(args.gpu), args.budget, args.seeds)
    except TunerError as e:
        print(f"search_efficiency: error: {e}", file=sys.stderr)
        return 2
    if land.header.get("synthetic"):
        print("**SYNTHETIC landscape: these figures describe a cost model, not a GPU.**\n")
    print(markdown_table(summary_table(runs, args.budget)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
