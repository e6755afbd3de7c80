"""reproduce.py's estimate of the time a job takes: reference times scaled by this machine's measured speed.

The reference times are the README's for a 2-core CPU, with that CPU's matrix-multiply speed; this
machine's speed is the benchmark's roofline product measured now on the scripts' device; the scripts
that finish then say how far that scaling is off on whole scripts (a GPU is faster on whole scripts
by less than on matrix products), and the rest of the estimate is corrected by that ratio.
"""
import subprocess
import sys
import time
from pathlib import Path

from job.environment import scripts_environment

MINUTE, HOUR = 60, 3600


def duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / MINUTE:.1f} min" if seconds < 90 * MINUTE else f"{seconds / HOUR:.1f} h"


def clock(seconds):
    """A measured time as the terminal, reproduce.json and the page all show it: seconds to a tenth, and past 90 s the
    minutes or hours too."""
    return f"{seconds:.1f} s" + (f" ({duration(seconds)})" if seconds >= 90 else "")


def probe_gflops(device_name):
    """GFLOP/s of a 2048 x 2048 float32 matrix product on the device (8192 on a GPU), the better of two after a
    warm-up: the benchmark's roofline, whose figures the reference machines have."""
    import torch

    device = torch.device(device_name)
    n = 2048 if device.type == "cpu" else 8192
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    best = float("inf")
    for attempt in range(3):
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()
        if attempt:  # the first one pays for the library's warm-up
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def measure_speed(device):
    """This machine's GFLOP/s on the scripts' device, or None; measured in a process of its own, with the scripts'
    environment, so that the job holds no GPU memory and starts no thread pool of its own."""
    probe = "import sys; from job.time_estimate import probe_gflops; print(probe_gflops(sys.argv[1]))"
    try:
        done = subprocess.run([sys.executable, "-c", probe, str(device)], cwd=Path(__file__).resolve().parent.parent,
                              capture_output=True, text=True, timeout=300, check=False, env=scripts_environment())
        return float(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def estimate_seconds(scripts, reference, gflops, finished, no_model=("setup",)):
    """Seconds the scripts will take: reference["seconds"] scaled by reference["gflops"] / gflops, then by the
    finished scripts ({script: seconds}) with a model (setup's time is start-up: it says nothing of the device)."""
    scale = reference["gflops"] / gflops if gflops else 1.0

    def predicted(script):
        return reference["seconds"][script] * scale

    measured = {script: seconds for script, seconds in finished.items() if script not in no_model}
    correction = (sum(measured.values()) / sum(predicted(script) for script in measured)) if measured else 1.0
    return correction * sum(predicted(script) for script in scripts)


def how_estimated(reference, gflops, device):
    speed = (f"this machine's matrix-multiply speed, {gflops:,.0f} GFLOP/s measured now on {device}" if gflops
             else "no speed measured on this machine")
    return (f"an estimate: the README's times on {reference['machine']} ({reference['gflops']} GFLOP/s), scaled by "
            f"{speed}, then by each finished script's time against its estimate")
