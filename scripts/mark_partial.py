#!/usr/bin/env python3
"""Mark the tables of a results folder that lack rows of their kernel's full batch-size grid as
partial in its manifest (tuner/emit/partial.py), and unmark the whole ones.

    python3 scripts/mark_partial.py tuned/NVIDIA_H200 [--why TEXT]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import TunerError  # noqa: E402
from tuner.pipeline.mark_partial import mark  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--why", default="the GPU run's window ended first; the next window continues it")
    args = ap.parse_args()
    try:
        for line in mark(Path(args.folder), args.why):
            print(line)
    except TunerError as e:
        print(f"mark_partial: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
