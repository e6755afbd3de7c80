"""Where and how a run ran, for its --json record: library versions, device, precision, seed, commit, time, memory,
and the mark of the stand-ins job/standins.py generates (the record names them: their numbers mean nothing)."""
import contextlib
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

STANDIN_MARK = "STAND-IN.txt"  # job/standins.py leaves this file in every folder it generates
MINIATURE_MARK = "MINIATURE.txt"  # job/miniature.py leaves this one: a ViT trained here, its numbers its own


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
    from common.device import float32_arithmetic

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
