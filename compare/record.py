"""A run's record, what --json writes and --compare reads: the flags, where and how the run ran (library versions,
device, precision, seed, commit, time, memory), its setup's differences from the article's, every printed number,
and the verdicts beside the article's (compare/verdicts.py)."""
import contextlib
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from common.run import float32_arithmetic
from compare.marks import STANDIN_MARK
from compare.published_files import checkpoint_difference
from compare.verdicts import comparison_lines, flag_differences, judge

RECORD_FORMAT = 1  # the layout of --json's records: a reader of another layout refuses them in one line (job/page.py)


def judged(run, report, setup_differences=None, article_model=None, article_flags=None):
    """(--compare's lines, --json's record: None where this process writes none) of a run whose sections are
    done. The setup's differences from the article's: --model against article_model, the flags against article_flags
    ({item: (dest, the article's value)}), then setup_differences(run, those)'s (the data's, and any of those it
    amends), asked now, when the data the sections loaded is known."""
    checkpoint = checkpoint_difference(run.args.model, article_model) if article_model else {}
    flags = flag_differences(run.args, article_flags) if article_flags else {}
    own = setup_differences(run, {**checkpoint, **flags}) if setup_differences else {}
    differences = {**checkpoint, **own, **{item: flags[item] for item in flags if item not in own}}
    rows, conclusions = judge(report.script, named(report.script, report.given)[0], differences)
    record = run_record(run, report, rows, differences, conclusions) if run.args.json and run.rank == 0 else None
    return "\n".join(comparison_lines(rows, conclusions, differences)), record


def named(script, given):
    """({name: {"value": float}, an accuracy's with its counts (right, of)}, {name: a pass over pictures}) of a Report's
    given numbers: a pass (a dict) as its seconds and waiting seconds, a list or array entry by entry, name[i,j]."""
    numbers, passes = {}, {}
    for given_numbers, counts in given:
        for name, value in given_numbers.items():
            if isinstance(value, dict):  # a pass over pictures
                passes[name] = value
                entries = {f"{name} seconds": value["seconds"], f"{name} waiting seconds": value["waiting seconds"]}
            elif isinstance(value, (list, tuple)):
                entries = {f"{name}[{','.join(str(i + 1) for i in index)}]": entry
                           for index, entry in np.ndenumerate(np.asarray(value, dtype=float))}
            else:
                entries = {name: value}
            for entry, number in entries.items():
                if entry in numbers:
                    raise ValueError(f"{script}: the number {entry!r} is recorded twice")
                right, of = counts.get(entry, (None, None))
                numbers[entry] = {"value": float(number)} | ({} if right is None else
                                                             {"right": right, "of": of, "scale": 100})
    return numbers, passes


def run_record(run, report, rows, differences, conclusions=()):
    """What --json writes: the flags, the environment, the setup, every printed number, the comparison and the
    conclusions' verdicts."""
    numbers, passes = named(report.script, report.given)
    record = {"format": RECORD_FORMAT, "script": report.script, "flags": vars(run.args),
              "setup differences": differences, "environment": environment(run), "printed": report.lines,
              "numbers": numbers, "series": report.series, "passes": passes,
              "could_not_run": [{"section": title, "why": str(problem)} for title, problem in report.could_not_run]}
    if rows is not None:
        record["comparison"] = rows
    record["conclusions"] = list(conclusions)
    given = (getattr(run.args, "model", None), getattr(run.args, "data_dir", None))
    standins = [str(path) for path in given if path and (Path(path) / STANDIN_MARK).is_file()]
    if standins:  # job/standins.py made the checkpoint or the data: the numbers mean nothing
        record["stand-ins"] = standins
    return record


# the libraries a run's numbers depend on: its record, the page and the job's digest of a script's code read them here
LIBRARIES = ("torch", "transformers", "numpy", "scipy", "pillow", "datasets", "accelerate")


def library_versions():
    """{library: version} of those of LIBRARIES that are installed (the backbone's Trainer needs only some)."""
    found = {}
    for name in LIBRARIES:
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def environment(run):
    """Library versions, device, precision, seed, git commit, start time and duration of the run."""
    args = run.args
    precision = getattr(args, "precision", "fp32")
    return {"python": platform.python_version(), **library_versions(),
            "device": device_name(run.device), "processes": run.world,
            "precision": precision, "float32": float32_arithmetic(run.device, precision, run.fp32_rule),
            "seed": getattr(args, "seed", "-"),
            "commit": git_commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(run.started)),
            "seconds": round(time.time() - run.started, 1), "peak memory GB": peak_memory(run.device)}


def peak_memory(device):
    """The process's peak resident memory (not on Windows, which has no getrusage) and, on a CUDA GPU, the most
    torch held allocated there, in GB."""
    import torch

    peak = {}
    if sys.platform != "win32":
        import resource

        resident = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
        peak["resident"] = round(resident / (1e9 if sys.platform == "darwin" else 1e6), 2)
    if device is not None and device.type == "cuda":
        peak["GPU"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
    return peak


def device_name(device):
    import torch

    if device is None or device.type == "cpu":
        name = platform.processor() or platform.machine()
        cpuinfo = Path("/proc/cpuinfo")
        if cpuinfo.exists():
            name = next((text.split(":", 1)[1].strip() for text in cpuinfo.read_text().splitlines()
                         if text.startswith("model name")), name)
        return f"CPU: {name}, {os.cpu_count()} cores"
    if device.type == "cuda":
        return f"GPU: {torch.cuda.get_device_name(device)}"
    return f"Apple {device.type}: {platform.machine()}"


def git_commit():
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                              text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
