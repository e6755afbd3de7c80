"""A script's start and end, and its signals: its first line (before_torch_loads), guarded(main). It loads only
os, signal and sys, which the interpreter has loaded already, so that Ctrl-C is handled milliseconds after the start
(docs/faults.md; docs/reproduce.md, Stopping)."""
import os
import signal
import sys

# {import name: pip name} of what each kind of entry point needs. The article's "Run it yourself" block installs
# only ARTICLE's (torch transformers safetensors scipy pillow, with numpy and tqdm, which they bring); the backbone
# adds the second article's datasets and accelerate (Trainer); the job and its tools take requirements.txt's.
# matplotlib is in none: without it the scripts draw no figures and say so.
ARTICLE = {"torch": "torch", "transformers": "transformers", "safetensors": "safetensors", "scipy": "scipy",
           "PIL": "pillow", "numpy": "numpy", "tqdm": "tqdm", "huggingface_hub": "huggingface_hub"}
BACKBONE = {**ARTICLE, "datasets": "datasets", "accelerate": "accelerate"}
JOB = {**BACKBONE, "psutil": "psutil"}
MATPLOTLIB_MISSING = "matplotlib is not installed (pip install matplotlib)"  # --plots and the page say so
JOB_PID = "VIT_PART3_JOB_PID"  # set by the job for a script it starts (job/child_process.py): the job's pid
CHECK_ONLY = "VIT_PART3_CHECK_ONLY"  # set to 1: a script checks its flags and paths, then stops before its sections
IN_JOB = "VIT_PART3_IN_JOB"  # set to 1 by reproduce.py for its scripts: the job's last lines say what to run next
SET_UP = ("activate the project's environment (. .venv/bin/activate, which `make quick` or `make test` makes) or "
          "install requirements.lock into yours (docs/setup.md)")


def speaks():
    """Whether this process talks to the terminal: torchrun's first, or any outside torchrun (a stray RANK aside)."""
    return os.environ.get("RANK", "0") == "0" or int(os.environ.get("WORLD_SIZE", "1")) <= 1


def say(text=""):
    """The one way to tell the person at the terminal something: stderr (results go to stdout), once under torchrun."""
    if speaks():
        print(text, file=sys.stderr, flush=True)


def before_torch_loads(packages=JOB):
    """Until guarded() runs main(), Ctrl-C is one line and status 130, SIGTERM one line and 143; a Python without one
    of `packages` ({import name: pip name}) is one line with the pip command, 2; torchrun's others draw no bars."""
    if not speaks():
        os.environ["TQDM_DISABLE"] = "1"

    def leave(signum, frame):
        print("interrupted" if signum == signal.SIGINT else "stopped by SIGTERM", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, leave)
    signal.signal(signal.SIGTERM, leave)
    job = os.environ.pop(JOB_PID, None)  # started by a job: end with it (the script's own children do not)
    if job and sys.platform.startswith("linux"):
        end_with(int(job), signal.SIGTERM)
    if hasattr(signal, "pthread_sigmask"):  # reproduce.py starts a script with Ctrl-C held back until here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    from importlib.util import find_spec  # not loaded at the interpreter's start: imported once Ctrl-C is handled

    missing = [package for name, package in packages.items() if find_spec(name) is None]  # by their pip names
    if missing:
        fix = SET_UP if packages is JOB else f"pip install {' '.join(missing)}, or {SET_UP}"
        if speaks():  # once under torchrun
            print(f"error: this Python ({sys.executable}) has no {', '.join(missing)}: {fix}", file=sys.stderr)
        sys.exit(2)


def end_with(parent, signum):
    """signum to this process when its parent (its pid) ends, as when it has ended already (Linux's PDEATHSIG)."""
    import ctypes  # only where it is asked for: a script the job starts, a loader's worker

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signum))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the request was made
        os.kill(os.getpid(), signum)


class UserError(Exception):
    """A problem the user can fix: its message is one line naming what is missing and how to get it. Several
    problems, UserError(first, second), read as one line, "first; also second", each kept apart in .args."""

    def __str__(self):
        return "; also ".join(map(str, self.args))


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, `timeout`, `docker stop`), raised where the program is, as Ctrl-C is."""


def quiet_if_nobody_reads():
    """Send stdout and stderr to /dev/null where the pipe they write to has lost its reader (a job killed at once,
    whose script was then sent SIGTERM): a write there would raise before the step in flight is saved."""
    import select  # once a signal came: not at the start

    if not hasattr(select, "poll"):  # Windows: no pipes to a job that the system ends with it
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
            if any(event & select.POLLERR for _, event in poller.poll(0)):  # a pipe whose reading end is closed
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        except (OSError, ValueError):  # no file descriptor (captured by a test), or closed
            pass


def guarded(main):
    """main()'s status; a UserError, Ctrl-C or SIGTERM ends in one line (once under torchrun) and 2, 130 or 143.
    Under torchrun, each process then leaves through leave()."""
    def terminate(signum, frame):
        quiet_if_nobody_reads()
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt again
    message = None
    try:
        status = main()
    except UserError as problem:
        message, status = f"error: {problem}", 2
    except Terminated:
        message, status = "stopped by SIGTERM", 128 + signal.SIGTERM
    except KeyboardInterrupt:
        message, status = "interrupted", 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    if message and speaks():
        print(message, file=sys.stderr)
    if torchrun_started():
        leave(status)  # torchrun's processes: the process group ended first; it never returns
    return status


LEAVING = {"together": False}  # set once every process has finished its sections (fine-tuning's finish_together)


def torchrun_started():
    """Whether fine-tuning started torchrun's process group (torch.distributed is loaded by then, if at all)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def leave(status):
    """sys.exit(status), torchrun's process group ended first; once every torchrun process has finished, os._exit: a
    finalizing interpreter can abort under a gloo thread (docs/performance.md, "Several processes")."""
    if torchrun_started():
        sys.modules["torch.distributed"].destroy_process_group()
    if not LEAVING["together"]:
        sys.exit(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
