"""The time of the miniature (job/miniature.py) from nothing to its page, phase by phase: the pictures, the
training, the job. The aim is at most 5 minutes on a 2-core CPU; the load average is printed beside it, as other
work on the machine stretches every phase.

    python benchmarks/miniature.py DIR      # DIR must be empty or new: a phase already done would not be timed
"""
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for common/ and job/
os.environ.setdefault("OMP_NUM_THREADS", "1")  # as job/miniature.py runs, before torch loads

from common.cli import script_parser
from job import miniature  # torch loads later, in the training: one thread, as set above

AIM_SECONDS = 5 * 60  # the aim on a 2-core CPU, training included


def timed(phases, name, work):
    """Run work(), keep its wall and CPU seconds (this process's and its children's) under name."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    work()
    phases[name] = (time.perf_counter() - wall, cpu_seconds() - cpu)


def cpu_seconds():
    mine, children = os.times()[:2], os.times()[2:4]
    return sum(mine) + sum(children)


def main(argv=None):
    parser = script_parser(__doc__)
    parser.add_argument("directory", help="an empty or new folder: the miniature and its job's results go there")
    root = Path(parser.parse_args(argv).directory)
    if root.exists() and any(root.iterdir()):
        parser.error(f"{root} is not empty: a phase done before would not be timed; give a new folder")
    from transformers.utils import logging

    logging.set_verbosity_error()
    phases, load_before = {}, os.getloadavg()
    timed(phases, "pictures", lambda: miniature.build_pictures(root))
    timed(phases, "training", lambda: miniature.build_checkpoints(root))
    command = [sys.executable, str(miniature.REPRODUCE), str(root / "results"), *miniature.job_flags(root)]
    timed(phases, "job", lambda: subprocess.run(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False))
    total = sum(wall for wall, _ in phases.values())
    print(f"\nthe miniature in {root}, {os.cpu_count()} cores, load average {load_before[0]:.2f} before and "
          f"{os.getloadavg()[0]:.2f} (1 min) / {os.getloadavg()[1]:.2f} (5 min) after:")
    for name, (wall, cpu) in phases.items():
        print(f"  {name:<9} {wall:6.1f} s wall, {cpu:6.1f} s CPU")
    print(f"  {'in all':<9} {total:6.1f} s wall ({total / 60:.1f} min; the aim: {AIM_SECONDS / 60:.0f} min on an "
          f"idle 2-core CPU)")
    print(f"  the page: {root / 'results' / 'report.md'}")
    print("\nthe articles' conclusions on the miniature's own numbers (its inputs differ from the articles' by "
          "design, so they are judged as they stand, not set aside as not comparable):")
    print("\n".join(own_conclusions(root / "results")))
    return 0


def own_conclusions(results):
    """Each script's conclusions over its recorded numbers, with no setup differences: its validation pictures are
    the miniature's whole set, not a sample of Imagenette's."""
    import json

    from common.verdicts import counts_text, judge, verdict_text

    lines = []
    for script in ("setup", "posemb", "fewshot", "finetune", "backbone"):
        path = results / f"{script}.json"
        if not path.is_file():
            lines.append(f"  {script}: no record")
            continue
        rows = judge(script, json.loads(path.read_text())["numbers"])[1]
        lines += [f"  {script}: {counts_text(rows)}", *(f"    {verdict_text(row)}: {row['says']}" for row in rows)]
    return lines


if __name__ == "__main__":
    sys.exit(main())
