"""One run of a script: its flags, device, resources and sections, --compare and --json, and how it ends
(docs/layout.md; the signals: docs/faults.md)."""
import contextlib
import functools
import importlib.util
import json
import os
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from common.device import keep_freed_memory, pick_device, set_precision
from common.distributed import finish_together, first_process_first
from common.distributed import start as start_processes
from common.errors import UserError
from common.files import write_text
from common.output import MATPLOTLIB_MISSING, Report, say


class Run(SimpleNamespace):
    __hash__ = object.__hash__  # by identity: the scripts cache what a run loads (functools.cache)


def start_run(args, device=None, rank=0, world=1, fp32_rule="strict", torchrun=False):
    """One run: the parsed flags, the device and its arithmetic (fp32_rule: what --precision fp32 means on GPUs with
    TF32, the rule of the article's run; common/device.py), its processes (torchrun: those torchrun started, each on
    its device; common/distributed.py), and `kept`: what a section loaded, for the next sections and the setup's
    differences."""
    keep_freed_memory()  # large host blocks kept, not handed back and faulted in again at every batch
    if torchrun:
        rank, world, device = start_processes(args.device)
    device = device or (pick_device(args.device) if "device" in args else None)
    autocast = set_precision(device, args.precision, fp32_rule) if "precision" in args else contextlib.nullcontext()
    return Run(args=args, device=device, fp32_rule=fp32_rule, autocast=autocast, rank=rank, world=world, kept={},
               started=time.time())


def loaded(*loads, run=None):
    """Each load() in turn, their values; when any raises a UserError, one that names every problem of them all, so
    that one line says all that an offline run lacks. With the run: each by its first process first (it downloads)."""
    values, problems = [], []
    for load in loads:
        try:
            if run is None:
                values.append(load())
            else:
                values.append(first_process_first(run, load))
        except UserError as problem:
            problems += [reason for reason in problem.args if reason not in problems]
    if problems:
        raise UserError(*problems)
    return values


CHECK_ONLY = "VIT_PART3_CHECK_ONLY"  # set to 1: a script checks its flags and paths, then stops before its sections
IN_JOB = "VIT_PART3_IN_JOB"  # set to 1 by reproduce.py for its scripts: the job's last lines say what to run next


def begin(script, args, **run):
    """start_run(args, **run) and the Report the sections print to; a --json or --plots path that cannot be written
    refused before any work. Under reproduce.py's check (CHECK_ONLY) the process ends here, status 0."""
    run = start_run(args, **run)
    if args.json:  # a typo in the path must not cost the run
        check_output(args.json, "--json")
    if getattr(args, "plots", None):
        check_output(args.plots, "--plots", folder=True)
        if importlib.util.find_spec("matplotlib") is None:  # said now, not after the long work
            say(f"figures: {MATPLOTLIB_MISSING}; no figure saved")
    if os.environ.get(CHECK_ONLY) == "1":  # reproduce.py asks, before its job, whether this command would start
        raise SystemExit(0)
    return run, Report(script, quiet=run.rank != 0)


def section(function):
    """A script's section, which main() calls by name: a UserError it raises (what it needs is missing) is one line,
    'cannot run section "<its docstring's first line>": why', and the run goes on with the next section."""
    title = (function.__doc__ or function.__name__).strip().splitlines()[0]  # python -OO drops docstrings

    @functools.wraps(function)
    def run_section(run, report, *args, **kwargs):
        try:
            return function(run, report, *args, **kwargs)
        except (UserError, NotImplementedError) as problem:
            if not isinstance(problem, UserError) and (run.device is None or run.device.type != "mps"):
                raise
            report.cannot_run(title, problem if isinstance(problem, UserError) else UserError(
                f"an operation is missing from Apple's mps backend in torch {sys.modules['torch'].__version__} "
                f"({str(problem).splitlines()[0][:120]}): run with PYTORCH_ENABLE_MPS_FALLBACK=1 to do it on the "
                f"CPU, or upgrade torch"))

    return run_section


def conclude(run, report, setup_differences=None, article_model=None, article_flags=None):
    """After the sections: --compare and --json (compare/record.py's judged(), which finds the setup's differences
    from article_model, article_flags and setup_differences(run, known)), the lines on what could not run; status 1
    when a section could not run or --json could not be written."""
    args, status = run.args, 1 if report.could_not_run else 0
    if args.compare or args.json:  # the judging layer, asked only then, with this run's record
        from compare.record import judged

        comparison, record = judged(run, report, setup_differences, article_model, article_flags)
        if args.compare:
            report.print(comparison)
    if report.could_not_run:
        say("\n".join(closing_lines(report.could_not_run)))
    if args.json and run.rank == 0:
        try:  # the numbers are printed above whatever happens here
            write_text(args.json, json.dumps(record, indent=2, default=str), what="--json file")
        except UserError as problem:
            say(f"error: {problem}; every number is printed above")
            status = 1
    if run.world > 1:  # a process that leaves while the first writes its JSON can abort gloo
        finish_together(run.world)
    return status


def closing_lines(could_not_run):
    """A script's last lines when a section could not run: each reason once, then the command to run next."""
    titles = ", ".join(title for title, _ in could_not_run)
    reasons = dict.fromkeys(reason for _, problem in could_not_run for reason in problem.args)
    lines = [f"\n{len(could_not_run)} section(s) could not run ({titles}):", *(f"  {why}" for why in reasons)]
    if os.environ.get(IN_JOB) != "1":  # the job's own command, not the script's, continues a job
        lines.append(f"next: do what each line above says, then {same_command()} runs every section")
    return lines


def same_command():
    """The command this process was started with, as typed: python and the script's path as given, then its flags."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "the same torchrun command"
    if not Path(sys.argv[0]).name.startswith("vit_"):  # main() called from Python, not from the shell
        return "the same command"
    return shlex.join(["python", *sys.argv])


def check_output(path, flag, folder=False):
    """Refuse, before any work, an output file (folder=True: a folder) that cannot be written: make the folder it
    needs and write a probe file there, the one sure test whatever the permissions say."""
    target = Path(path)
    if folder and target.exists() and not target.is_dir():
        raise UserError(f"{flag} {path} is a file, not a folder: pass a folder, which is created if needed")
    if not folder and target.is_dir():
        raise UserError(f"{flag} {path} is a folder: give a file name, such as {target / 'results.json'}")
    where = target if folder else target.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        probe = where / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UserError(f"{flag} {path} cannot be written ({error.strerror or error}): "
                        f"choose a place you can write to") from error
