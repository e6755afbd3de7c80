"""A script run by reproduce.py: its command checked, its output passed through and logged, signals passed on, its
end tied to the job's.

The job holds an exclusive lock on OUT/.reproduce.lock (only_job_on) and each script it starts
inherits it (run_logged), so the lock lasts while any of them lives: a new job never writes into an
OUT where a script of an ended job still runs. On Linux that script was sent SIGTERM when its job
ended (start_script) and saves and stops as on any SIGTERM, so the new job waits for it. The job
removes the file as it ends (JobLock.close), unless a script of it still runs.
"""
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil

from common.files import reason, write_atomic
from common.start_and_end import CHECK_ONLY, IN_JOB, JOB_PID, UserError, guarded
from job.environment import scripts_environment

LOG_EVERY = 30  # seconds between snapshots of a running script's log
LOCK = ".reproduce.lock"


class StopRequests:
    """Ctrl-C and SIGTERM while the job runs: remembered, and passed on once each to the running script (in a
    process group of its own, so a Ctrl-C at the terminal reaches it only through here; fine-tuning reads a second
    one as "stop at once"). Its loader's workers are not signalled: the script ends them, as when it runs alone."""

    def __init__(self):
        self.asked, self.forwarded, self.child = [], 0, None

    def __enter__(self):
        self.previous = {signum: signal.signal(signum, self.handle) for signum in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def handle(self, signum, frame):
        self.asked.append(signum)
        self.forward()

    def forward(self):
        while self.child is not None and self.forwarded < len(self.asked):
            signum = self.asked[self.forwarded]
            self.forwarded += 1  # counted first: a signal arriving in between is not sent twice
            self.child.send_signal(signum)


def start_script(command, env, **popen):
    """Popen of a script in a process group of its own, with no preexec_fn: no Python runs between fork and exec, safe
    whatever threads the starting process has (the job keeps to one: one_thread). What a preexec_fn would do, the
    script does itself (common/start_and_end.py): Ctrl-C stays held back until its first line handles it, for the
    child keeps the signal mask this thread holds while it forks; on Linux it asks for SIGTERM when the job ends, told
    the job's pid (JOB_PID)."""
    held = hasattr(signal, "pthread_sigmask")
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if held else None
    try:
        return subprocess.Popen(command, env={**env, JOB_PID: str(os.getpid())}, process_group=0, **popen)
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def final_states(output):
    """The output as a log keeps it: of each line's redraws (a progress bar's \\r), the last with text, as the
    terminal showed it last, not every redraw."""
    lines = []
    for line in bytes(output).split(b"\n"):
        drawn = [part for part in line.split(b"\r") if part.strip()]
        lines.append(drawn[-1] if drawn else b"")
    return b"\n".join(lines)


def save_log(path, log, warned, say):
    """The log so far, whole (common/files.py), each progress bar at its final state; a log that cannot be written is
    said once (unless warned), the run goes on. Whether it is written."""
    try:
        write_atomic(path, lambda f: f.write(final_states(log)), what="log")
    except UserError as problem:
        if not warned:
            say(f"warning: {problem}")
        return False
    return True


def run_logged(command, cwd, log_path, stop, lock, say):
    """Run one script, its stdout and stderr passed through to ours as they come and kept in log_path (rewritten
    whole every LOG_EVERY seconds and at the end); it inherits the job's lock. Returns (exit status, seconds, whether
    the log is written whole)."""
    started = time.perf_counter()
    env = {**scripts_environment(), "PYTHONUNBUFFERED": "1", IN_JOB: "1"}
    if sys.stderr.isatty():  # progress bars as wide as the terminal, which the script's pipe cannot tell it
        columns, lines = shutil.get_terminal_size()
        env.update(COLUMNS=str(columns), LINES=str(lines))
    child = start_script(command, env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, pass_fds=[lock.fileno()] if lock else [])
    if lock:
        lock.scripts.append(child)
    stop.child = child
    stop.forward()  # a signal that came while it started
    passes_to = {child.stdout: sys.stdout.buffer, child.stderr: sys.stderr.buffer}
    log, saved_at, warned = bytearray(), time.perf_counter(), False
    with child.stdout, child.stderr, selectors.DefaultSelector() as selector:  # the pipes closed however this ends
        for pipe in passes_to:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select(timeout=LOG_EVERY):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                passes_to[key.fileobj].write(chunk)
                passes_to[key.fileobj].flush()
                log += chunk
            if time.perf_counter() - saved_at > LOG_EVERY:
                warned, saved_at = not save_log(log_path, log, warned, say) or warned, time.perf_counter()
    status = child.wait()
    stop.child = None
    logged = save_log(log_path, log, warned, say)
    return status, time.perf_counter() - started, logged


CHECKED = "checked "  # check_in_turn's own lines on its stdout, told apart from anything a library writes there


def first_refusal(commands, cwd):
    """Check the commands {name: [python, script, *flags]} in turn, with CHECK_ONLY=1 (a script checks its flags,
    values and paths, then stops before its sections): (name, its last line) of the first that refuses, or None. They
    run in one new process (check_in_turn), which loads torch and transformers once for them all. That line's
    pointer to the script's --help is left out: the command that failed is the job's."""
    with subprocess.Popen([sys.executable, "-c", "from job.child_process import check_in_turn; check_in_turn()"],
                          cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          errors="replace", env={**scripts_environment(), CHECK_ONLY: "1"}) as check:  # closed after
        try:
            said, failed = check.communicate(json.dumps(commands))
        finally:  # stopped and waited for, however this ends
            if check.poll() is None:
                check.kill()
            check.wait()
    told = [json.loads(line.removeprefix(CHECKED)) for line in said.splitlines() if line.startswith(CHECKED)]
    if told and told[-1] is None:
        return None
    if told and isinstance(told[-1], list):
        name, last = told[-1]
    elif told:  # the process ended during the check of the last name it said
        name, last = told[-1], f"exit status {check.returncode}"
    else:  # it could not start: its own last line
        name, last = next(iter(commands)), last_line(failed, check.returncode)
    return name, last.removeprefix("error: ").removesuffix(" (--help lists every flag)")


def last_line(text, status):
    """The last line a process wrote that is not blank, else its exit status."""
    return ([line for line in text.splitlines() if line.strip()] or [f"exit status {status}"])[-1]


def check_in_turn():
    """first_refusal's process: each command of the JSON {name: [python, script, *flags]} on stdin run here, in
    turn, as `python script flags` runs it, with this process's environment each time. It says each name as its check
    starts, then [that name, the last line it wrote] where one refuses, or null once all have passed; a check that
    ends the process is the last name said."""
    import contextlib
    import functools
    import io
    import runpy
    import traceback

    environment = dict(os.environ)
    for name, (_, script, *flags) in json.load(sys.stdin).items():
        print(f"\n{CHECKED}{json.dumps(name)}", flush=True)  # on a line of its own, whatever was written before
        written = io.StringIO()
        sys.argv = [script, *flags]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(written):
            try:
                status = guarded(functools.partial(runpy.run_path(script)["main"], flags))
            except SystemExit as ending:  # argparse's refusal, a Python without the packages, or begin()'s end: 0
                status = 0 if ending.code is None else ending.code
                if not isinstance(status, int):  # a text: printed, status 1, as Python ends with it
                    print(status, file=sys.stderr)
                    status = 1
            except Exception:  # noqa: BLE001 - a bug: its traceback, whose last line is the reason, as alone
                traceback.print_exc()
                status = 1
        os.environ.clear()  # what a check set is not the next one's
        os.environ.update(environment)
        if status:
            print(f"\n{CHECKED}{json.dumps([name, last_line(written.getvalue(), status)])}", flush=True)
            return
    print(f"\n{CHECKED}{json.dumps(None)}", flush=True)


class JobLock:
    """The job's lock (only_job_on): its open file, which each script the job starts inherits (fileno), and those
    scripts (run_logged)."""

    def __init__(self, path, handle):
        self.path, self.handle, self.scripts = path, handle, []

    def fileno(self):
        return self.handle.fileno()

    def close(self):
        """The job's end, however it ends: the file removed while the lock is still held, then closed, which frees
        the lock; the file stays while a script of the job still runs and holds the lock (a new job waits for it
        there), or when the path is no longer this lock's file."""
        if self.handle.closed:
            return
        try:
            if all(script.poll() is not None for script in self.scripts) and is_locked_file(self.path, self.handle):
                self.path.unlink()
        except OSError:
            pass  # a file that cannot be removed stays, as it would have: the next job takes it
        finally:
            self.handle.close()


def is_locked_file(path, handle):
    """Whether path is still the file the handle is open on: a job that ended removed the file it had locked."""
    try:
        named, held = os.stat(path), os.fstat(handle.fileno())
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def only_job_on(out, say):
    """An exclusive lock on OUT/.reproduce.lock, held while the job or a script it started lives: two jobs on one
    OUT would move each other's JSON aside and write one fine-tuning folder. A job still running is one line; a
    script of an ended job is waited for. A JobLock is returned (the lock lasts while it is open; closing it at the
    job's end removes the file); where the system has no flock nothing is locked."""
    try:
        import fcntl
    except ImportError:
        return None
    path, waited = out / LOCK, False
    while True:
        handle = open_lock(path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if job_is_alive(path):
                handle.close()
                raise UserError(f"another reproduce.py is running on {out}: wait for it, or give this one another "
                                f"OUT") from error
            if not waited:
                say(f"a script of an ended job still runs on {out}; it was sent SIGTERM and saves what it can: "
                    f"waiting for it to end (Ctrl-C gives up)")
            waited = True
            try:
                fcntl.flock(handle, fcntl.LOCK_EX)
            except BaseException:
                handle.close()
                raise
        if is_locked_file(path, handle):
            break
        handle.close()  # the job that held it removed the file as it ended: the lock is now the file there
    try:
        handle.truncate(0)
        handle.write(f"{os.getpid()} {pid_space()}\n")  # for a later job to tell this one from a script it left
        handle.flush()
    except OSError as error:  # a full or failing disk
        handle.close()
        path.unlink(missing_ok=True)
        raise UserError(f"cannot write the lock file {path} ({reason(error)}): free space there, or give this job "
                        f"another OUT") from error
    return JobLock(path, handle)


def open_lock(path):
    """The lock's file, open for the whole job; one that cannot be opened (a folder, another user's) is one line."""
    try:
        return open(path, "a+")
    except OSError as error:
        raise UserError(f"the lock file {path} cannot be opened ({reason(error)}): remove it, or give this job another "
                        f"OUT") from error


def job_is_alive(lock_path):
    """Whether the job that took the lock, named in its file, still runs (unknown: taken as running, as is a job of
    another machine or container sharing OUT, whose process number means nothing here)."""
    try:
        pid, space = lock_path.read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        return True
    return space != pid_space() or pid != os.getpid() and psutil.pid_exists(pid)  # a requeued job: its old number


def pid_space():
    """Where this process's number means something: the host and, on Linux, the PID namespace (a container's)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        namespace = "-"
    return f"{socket.gethostname()}/{namespace}"
