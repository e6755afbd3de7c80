"""The time of the miniature (job/miniature.py) from nothing to its page, whole: every seed's pictures, training and
job. The aim is at most 5 minutes on an idle 2-core CPU; the load average is printed beside it, as other work on the
machine stretches every phase.

    python benchmarks/miniature.py DIR [--seed N] [--seeds K]   # DIR must be empty or new: nothing done is timed
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for common/ and job/

from common.run import positive_int, script_parser, seed_number

AIM_SECONDS = 5 * 60  # the aim on an idle 2-core CPU, training included
MINIATURE = Path(__file__).resolve().parent.parent / "job" / "miniature.py"


def main(argv=None):
    parser = script_parser(__doc__)
    parser.add_argument("directory", help="an empty or new folder: the miniature and its jobs' results go there")
    parser.add_argument("--seed", type=seed_number, default=0, help="the first seed (default: %(default)s)")
    parser.add_argument("--seeds", type=positive_int, default=3, help="seeds (default: %(default)s)")
    args = parser.parse_args(argv)
    root = Path(args.directory)
    if root.exists() and any(root.iterdir()):
        parser.error(f"{root} is not empty: a phase done before would not be timed; give a new folder")
    load_before, wall = os.getloadavg(), time.perf_counter()
    cpu = sum(os.times()[2:4])
    status = subprocess.run([sys.executable, str(MINIATURE), str(root), "--seed", str(args.seed), "--seeds",
                             str(args.seeds)], env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False).returncode
    wall, cpu = time.perf_counter() - wall, sum(os.times()[2:4]) - cpu
    record = json.loads((root / "miniature.json").read_text()) if (root / "miniature.json").is_file() else {}
    print(f"\nthe miniature in {root}, seeds {args.seed} to {args.seed + args.seeds - 1}, {os.cpu_count()} cores, "
          f"load average {load_before[0]:.2f} before and {os.getloadavg()[0]:.2f} (1 min) / "
          f"{os.getloadavg()[1]:.2f} (5 min) after: {wall:.1f} s wall ({wall / 60:.1f} min; the aim: "
          f"{AIM_SECONDS / 60:.0f} min on an idle 2-core CPU), {cpu:.1f} s CPU, exit status {status}")
    print(f"on the miniature: {record.get('counts', 'no record')}")
    return status


if __name__ == "__main__":
    sys.exit(main())
