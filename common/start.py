"""A script's first line, before anything slow loads: Ctrl-C is one line from here on, and a Python without the
project's packages is told so in one line (docs/faults.md). It imports os, signal and sys alone, so that a Ctrl-C
is handled a few milliseconds after the interpreter's own start (docs/reproduce.md, Stopping)."""
import os
import signal
import sys

# The import names of requirements.txt's packages (matplotlib aside: without it the scripts draw no figures).
PACKAGES = {"torch": "torch", "transformers": "transformers", "datasets": "datasets", "accelerate": "accelerate",
            "safetensors": "safetensors", "huggingface_hub": "huggingface_hub", "scipy": "scipy", "PIL": "pillow",
            "numpy": "numpy", "tqdm": "tqdm", "psutil": "psutil"}
SET_UP = ("activate the project's environment (. .venv/bin/activate, which `make quick` or `make test` makes) or "
          "install requirements.lock into yours (docs/setup.md)")


def speaks():
    """Whether this process talks to the terminal: torchrun's first, or any outside torchrun (a stray RANK aside)."""
    return os.environ.get("RANK", "0") == "0" or int(os.environ.get("WORLD_SIZE", "1")) <= 1


def missing_packages():
    """requirements.txt's packages that this Python cannot import, by their pip names."""
    from importlib.util import find_spec  # not loaded at the interpreter's start: imported once Ctrl-C is handled

    return [package for name, package in PACKAGES.items() if find_spec(name) is None]


def before_torch_loads():
    """Until guarded() runs main(), Ctrl-C (while torch loads) is one line and status 130, leaving at once; a Python
    without the project's packages is one line and status 2; a torchrun process but the first draws no progress bars
    (tqdm reads TQDM_DISABLE once, as torch imports it)."""
    if not speaks():
        os.environ["TQDM_DISABLE"] = "1"

    def leave(signum, frame):
        print("interrupted", file=sys.stderr, flush=True)
        os._exit(130)

    signal.signal(signal.SIGINT, leave)
    if hasattr(signal, "pthread_sigmask"):  # reproduce.py starts a script with Ctrl-C held back until here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    missing = missing_packages()
    if missing:
        if speaks():  # once under torchrun
            print(f"error: this Python ({sys.executable}) has no {', '.join(missing)}: {SET_UP}", file=sys.stderr)
        sys.exit(2)
