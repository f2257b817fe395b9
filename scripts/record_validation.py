#!/usr/bin/env python3
"""Add a GPU run's passed validation cases to bench/validated.json (tuner/jobs/proof_validation.py):
the next GPU run does not run a case again that passed under the same identity (GPU model, Triton,
torch, kernel code, case), but one canary per kernel source.

    python3 scripts/record_validation.py RUN_FOLDER [FILE.json ...] [--ledger bench/validated.json]
        [--assume-code 'KERNEL@SOURCE=HASH' ...]

Reads RUN_FOLDER/validate/kernels.json and ours.json (and any FILE.json of the same format; a
CPU-device rehearsal's are refused: only a GPU's cases are recorded). Cases written before
scripts/validate_kernels.py recorded each case's identity (the H200 run of 2026-11-27) take the
device, Triton and torch from their file's environment and the code hash from --assume-code
(KERNEL@SOURCE is e.g. fused_moe@vllm 0.33.0), said in each entry (code_version_from); a case with
no hash given is not recorded. scripts/commit_gpu_proof.sh runs it on every run it commits.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import TunerError  # noqa: E402


def rows_of(path: Path, assumed: dict[str, str]) -> list[dict]:
    from tuner.reading import read_json_file
    data = read_json_file(path, "a validation file ")
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise TunerError(f"{path} is not scripts/validate_kernels.py's output")
    env = data.get("environment") or {}
    if env.get("device_kind") not in (None, "cuda"):
        raise TunerError(f"{path} was measured on the {env.get('device_kind')} device, not a GPU: not recorded")
    out = []
    for row in data["cases"]:
        if not isinstance(row, dict):
            continue
        row = dict(row)
        for k in ("device", "triton", "torch"):
            row.setdefault(k, env.get(k))
        if not row.get("code_version"):
            given = assumed.get(f"{row.get('kernel')}@{row.get('kernel_source')}")
            if given:
                row["code_version"] = given
                row["code_version_from"] = "--assume-code (the run recorded no hash per case)"
        out.append(row)
    return out


def main() -> int:
    from tuner.jobs.proof_validation import LEDGER, record
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a GPU run's folder (bench/results/<gpu>-<date>)")
    ap.add_argument("files", nargs="*", help="more validation files of that run")
    ap.add_argument("--ledger", default=str(LEDGER))
    ap.add_argument("--assume-code", nargs="+", default=[], metavar="KERNEL@SOURCE=HASH")
    args = ap.parse_args()
    try:
        assumed = {}
        for item in args.assume_code:
            name, sep, value = item.rpartition("=")
            if not sep or "@" not in name or not value:
                raise TunerError(f"--assume-code {item!r}: give KERNEL@SOURCE=HASH (e.g. 'fused_moe@vllm 0.33.0=68ea...')")
            assumed[name] = value
        run = Path(args.run)
        files = [p for p in (run / "validate" / "kernels.json", run / "validate" / "ours.json") if p.is_file()]
        files += [Path(f) for f in args.files]
        rows = [r for f in files for r in rows_of(f, assumed)]
        added, kept = record(rows, run.name, Path(args.ledger))
    except TunerError as e:
        print(f"record_validation: error: {e}", file=sys.stderr)
        return 2
    print(f"record_validation: {added} cases added to {args.ledger} from {run.name} ({kept} there already)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
