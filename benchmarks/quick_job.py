"""The time of `python reproduce.py --quick` as one job, on ViT-B/16-sized stand-ins, and where it goes.

Builds the stand-ins in DIR/standins once (benchmarks/timing_standins.py, 100 pictures a class: fine-tuning's
checks read 100 a class), runs the whole quick job on them into a fresh DIR/job (model loading included),
then prints the job's wall time and each script's (the seconds OUT/reproduce.json keeps), each pass over
pictures with its pictures and seconds, this machine's ViT-B/16 pictures/s at 224 (every 224 inference
pass of posemb and few-shot together), and the times scaled to the README's Quick check machine as its
table is: seconds x (pictures/s here) / (its pictures/s). Few-shot and the backbone run with --no-cache, so that a
second benchmark costs what a reader's first run costs, not a read of cached features.

    python benchmarks/quick_job.py /tmp/quick-bench               # builds the stand-ins the first time
    python benchmarks/quick_job.py /tmp/quick-bench --job-only    # the job's figures of DIR/job again, no run
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the repository root, for common/ and reproduce

from common.run import script_parser
from job.scripts import SCRIPTS

TABLE_PICTURES_PER_S = 3.3  # the README's Quick check machine: ViT-B/16 at 224, fp32
MODELS = {"vit-b16-1k": "vit-base-patch16-224", "vit-b16-in21k": "vit-base-patch16-224-in21k"}


def standins(directory):
    """DIR/standins (built when missing) and DIR/models, the --models layout of links to its checkpoints."""
    made = directory / "standins"
    if not (made / "nette").is_dir():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "timing_standins.py"), str(made), "--per-class",
                        "100"], check=True)
    google = directory / "models" / "google"
    google.mkdir(parents=True, exist_ok=True)
    for folder, name in MODELS.items():
        link = google / name
        if not link.exists():
            link.symlink_to(made / folder, target_is_directory=True)
    return made


def run_job(directory):
    """The quick job into a fresh DIR/job; its wall time in seconds, the job's start-up and page included."""
    made, out = standins(directory), directory / "job"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, str(ROOT / "reproduce.py"), "--quick", "--models", str(directory / "models"),
               "--imagenette", str(made / "nette"), "--beans", str(made / "beans"), "--extra", "fewshot=--no-cache",
               "--extra", "backbone=--no-cache", str(out)]
    begun = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    return time.perf_counter() - begun


def pictures_per_second(runs):
    """ViT-B/16's pictures/s at 224 over the 224 inference passes: posemb's "224" row, few-shot's two."""
    chosen = [timing for script, name, timing in passes(runs)
              if (script, name) == ("posemb", "224") or script == "fewshot"]
    pictures, seconds = sum(t.get("pictures", 0) for t in chosen), sum(t.get("seconds", 0) for t in chosen)
    return pictures / seconds if seconds else None


def passes(runs):
    """[(script, pass, {"seconds", "waiting seconds", "pictures"})] of every script's JSON."""
    found = []
    for script, run in runs.items():
        for name, timing in (run.get("passes") or {}).items():
            if isinstance(timing, dict) and "seconds" in timing:
                found.append((script, name, timing))
    return found


def report(out, wall):
    """The lines the benchmark prints from the job's OUT."""
    job = json.loads((out / "reproduce.json").read_text())
    runs = {script: json.loads((out / f"{script}.json").read_text()) for script in SCRIPTS
            if (out / f"{script}.json").exists()}
    speed = pictures_per_second(runs)
    scale = speed / TABLE_PICTURES_PER_S if speed else None
    lines = [f"ViT-B/16 at 224 here: {speed:.2f} pictures/s; the README's table machine: {TABLE_PICTURES_PER_S}"
             if speed else "no 224 pass was timed: nothing scaled"]

    def shown(seconds):
        scaled = f", {seconds * scale / 60:.1f} min scaled to the table's machine" if scale else ""
        return f"{seconds:.1f} s ({seconds / 60:.1f} min{scaled})"

    if wall is not None:
        lines.append(f"the whole job: {shown(wall)}")
    lines.append(f"the five scripts' processes: {shown(sum(job[s]['seconds'] for s in SCRIPTS if s in job))}")
    for script in SCRIPTS:
        lines.append(f"  {script}: {shown(job[script]['seconds'])}" if script in job else f"  {script}: not run")
    for script, name, timing in passes(runs):
        lines.append(f"    {script} {name}: {timing.get('pictures', 0):,} pictures, {timing['seconds']:.1f} s "
                     f"({timing.get('waiting seconds', 0):.1f} s waiting for pictures)")
    return lines


def main(argv=None):
    parser = script_parser(__doc__)
    parser.add_argument("directory", help="where the stand-ins and the job's OUT (DIR/job) are kept")
    parser.add_argument("--job-only", action="store_true", help="print the figures of DIR/job again, run nothing")
    args = parser.parse_args(argv)
    directory = Path(args.directory).resolve()
    load = os.getloadavg()
    wall = None if args.job_only else run_job(directory)
    print(f"\nload average before the job: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)")
    for line in report(directory / "job", wall):
        print(line)


if __name__ == "__main__":
    main()
