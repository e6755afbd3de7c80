"""One run of a script: its command line, device and arithmetic, the printed lines with their numbers recorded by
name, its sections, --compare and --json, and its exit status (docs/layout.md)."""
import argparse
import contextlib
import copy
import ctypes
import errno
import functools
import importlib.util
import json
import math
import os
import reprlib
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from common.files import write_text
from common.pretrained import check_model_flag
from common.start_and_end import CHECK_ONLY, IN_JOB, MATPLOTLIB_MISSING, UserError, say


def begin(script, args, device=None, rank=0, world=1, fp32_rule="strict", figures=()):
    """(the run: the flags, the device and its arithmetic (fp32_rule: the article's rule for --precision fp32), its
    processes (rank and world: torchrun's); the Report the sections print to). An output that cannot be written, or
    would replace an input or a figure it saves (figures: their names), is refused; CHECK_ONLY then ends the process."""
    if "device" in args:  # a script that runs a model on batches of pictures (setup runs none)
        keep_freed_memory()  # large host blocks kept, not handed back and faulted in again at every batch
    device = device or (pick_device(args.device) if "device" in args else None)
    autocast = set_precision(device, args.precision, fp32_rule) if "precision" in args else contextlib.nullcontext()
    run = SimpleNamespace(args=args, device=device, fp32_rule=fp32_rule, autocast=autocast, rank=rank, world=world,
                          started=time.time())
    reads = {"--model": getattr(args, "model", None), "--data-dir": getattr(args, "data_dir", None)}
    for flag, folder in (("save_dir", True), ("plots", True), ("json", False)):  # a typo must not cost the run
        if getattr(args, flag, None):  # the folders first: --json where one is would be refused, not lost at the end
            check_output(getattr(args, flag), "--" + flag.replace("_", "-"), folder, reads)
    if getattr(args, "json", None) and Path(args.json).resolve() in {Path(args.plots, name).resolve()
                                                                    for name in figures if args.plots}:
        raise UserError(f"--json {args.json} is where --plots {args.plots} saves a figure: give another file")
    if getattr(args, "plots", None) and importlib.util.find_spec("matplotlib") is None:  # said now, not after the run
        say(f"figures: {MATPLOTLIB_MISSING}; no figure saved")
    if os.environ.get(CHECK_ONLY) == "1":  # reproduce.py asks, before its job, whether this command would start
        if getattr(args, "data_dir", None) and not os.path.exists(args.data_dir):  # each section would refuse it
            raise UserError(f"--data-dir {args.data_dir} does not exist")
        raise SystemExit(0)
    return run, Report(script, quiet=run.rank != 0)


def section(function):
    """A script's section, which main() calls by name with the report first. A UserError it raises, or is given in
    place of what it needs (tried()), is one line, 'cannot run section "<its docstring's first line>": why'; the run
    goes on, the next sections given that UserError in place of what this one returns."""
    title = (function.__doc__ or function.__name__).strip().splitlines()[0]  # python -OO drops docstrings

    @functools.wraps(function)
    def run_section(report, *args, **kwargs):
        try:
            if missing := [value for value in (*args, *kwargs.values()) if isinstance(value, UserError)]:
                raise UserError(*dict.fromkeys(reason for problem in missing for reason in problem.args))  # each once
            return function(report, *args, **kwargs)
        except (UserError, NotImplementedError) as problem:
            problem = mps_gap(problem) if isinstance(problem, NotImplementedError) else problem
            report.print(f'  cannot run section "{title}": {problem}')
            report.could_not_run.append((title, problem))  # for the last lines
            return problem

    return run_section


def mps_gap(gap):
    """The UserError of an operation missing from Apple's mps backend; any other NotImplementedError raised again."""
    if "MPS" not in str(gap):  # torch's words for an mps gap
        raise gap
    return UserError(f"an operation is missing from Apple's mps backend in torch {torch.__version__} "
                     f"({str(gap).splitlines()[0][:120]}): run with PYTORCH_ENABLE_MPS_FALLBACK=1 to do it on the "
                     f"CPU, or upgrade torch")


def tried(load, *args):
    """load(*args), or the UserError that says why it cannot be had: the sections given it say so, the others run."""
    try:
        return load(*args)
    except UserError as problem:
        return problem


def conclude(run, report, setup_differences=None, article_model=None, article_flags=None):
    """After the sections: --compare and --json (compare/record.py's judged()), the lines on what could not run;
    status 1 when a section could not run or --json could not be written."""
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
    return status


def closing_lines(could_not_run):
    """A script's last lines when a section could not run: each reason once, then the command to run next."""
    reasons = dict.fromkeys(reason for _, problem in could_not_run for reason in problem.args)
    lines = [f"\n{len(could_not_run)} section(s) could not run ({', '.join(title for title, _ in could_not_run)}):",
             *(f"  {why}" for why in reasons)]
    if os.environ.get(IN_JOB) != "1":  # the job's own command, not the script's, continues a job
        lines.append(f"next: do what each line above says, then {same_command()}, with any flag those lines name, "
                     "runs every section")  # "pass --model ...": the command as typed lacks it
    return lines


def same_command():
    """The command this process was started with, as typed: python and the script's path as given, then its flags."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "the same torchrun command"
    if not Path(sys.argv[0]).name.startswith("vit_"):  # main() called from Python, not from the shell
        return "the same command"
    return shlex.join(["python", *sys.argv])


def check_output(path, flag, folder=False, reads=None):
    """Refuse, before any work, an output file (folder=True: a folder) that cannot be written: make the folder it
    needs and write a probe file there, the one sure test whatever the permissions say; or one inside a folder the
    run reads (reads: {flag: folder})."""
    try:  # inside a folder the run reads, a file could replace an input, a figure be read as a picture
        target, real = Path(path), Path(path).resolve()
        if inside := [f"{name} {place}" for name, place in (reads or {}).items() if place and Path(place).expanduser()
                      .is_dir() and Path(place).expanduser().resolve() in (real, *real.parents)]:
            raise UserError(f"{flag} {path} is inside {inside[0]}, which the run reads: choose a place outside it")
        if folder and target.exists() and not target.is_dir():
            raise UserError(f"{flag} {path} is a file, not a folder: pass a folder, which is created if needed")
        if not folder and target.is_dir():
            raise UserError(f"{flag} {path} is a folder: give a file name, such as {target / 'results.json'}")
        if not folder and path.endswith(("/", os.sep)):  # a folder's name, never the file written (pathlib drops it)
            raise UserError(f"{flag} {path} ends with {path[-1]}, as a folder's name does: give a file name")
        if not folder and (target.exists() and not target.is_file() or path == "-"):  # the write replaces a device
            raise UserError(f"{flag} {path} is not a regular file (a device, a pipe or stdout): give a file name")
        if above := next((parent for parent in target.parents if parent.is_file()), None):
            raise UserError(f"{flag} {path}: {above} is a file, not a folder: choose a place in a folder")
        where = target if folder else target.parent
        where.mkdir(parents=True, exist_ok=True)
        probe = where / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UserError(f"{flag} {path} cannot be written ({error.strerror or error}): "
                        f"choose a place you can write to") from error


class ScriptParser(argparse.ArgumentParser):
    """A bad flag ends in one line that names it, not a usage block."""

    def error(self, message):
        self.exit(2, f"error: {message} (--help lists every flag)\n")


def script_parser(docstring):
    """argparse with the script's docstring as its help text, as written; a flag's help names its default itself."""
    return ScriptParser(description=docstring, formatter_class=argparse.RawDescriptionHelpFormatter)


def whole_number(text, low, high, refusal):
    """argparse type: a whole number from low to high, refused in one line otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r} {refusal}")
    return value


positive_int = functools.partial(whole_number, low=1, high=math.inf, refusal="is not a whole number of at least 1")
seed_number = functools.partial(whole_number, low=0, high=2**32 - 1,  # what numpy and torch both take
                                refusal=f"is not a seed: a whole number from 0 to {2**32 - 1}")
MOST_PICTURES = 65_536  # a batch larger than any device holds, refused before its memory is asked for
batch_pictures = functools.partial(whole_number, low=1, high=MOST_PICTURES,
                               refusal=f"is not a number of pictures a batch from 1 to {MOST_PICTURES:,}")


MOST_PIXELS = 1024  # 4,096 patches of 16; attention's memory grows with their square: 0.8 GB a picture and layer


def side_pixels(text):
    """argparse type: pixels on a side, from 32 (two patches of 16) to MOST_PIXELS."""
    value = positive_int(text)
    if value < 32:
        raise argparse.ArgumentTypeError(f"{text!r} pixels is too small: a ViT needs at least 2 patches on a side")
    if value > MOST_PIXELS:
        raise argparse.ArgumentTypeError(f"{text!r} pixels is too large: at most {MOST_PIXELS} (the attention of "
                                         f"one picture grows with the square of its patches)")
    return value


def nonempty_path(text):
    """argparse type: a path, ~ expanded; an empty one is refused (it would quietly mean the default, or nothing), and
    one the file system cannot name (a part longer than it allows)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or folder name")
    path = os.path.expanduser(text)
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise argparse.ArgumentTypeError(f"{reprlib.repr(text)}: a name longer than the file system "
                                             f"allows") from None
    return path


def finite_float(text, low, allow_low, high=math.inf, why=""):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (value == low and not allow_low) or value > high:
        bound = (f"at least {low:g}" if allow_low else f"above {low:g}") + (f" and at most {high:.3g}{why}"
                                                                          if high < math.inf else "")
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {bound}")
    return value


positive_float = functools.partial(finite_float, low=0.0, allow_low=False,  # argparse type: a learning rate
                                   high=float(torch.finfo(torch.float32).max), why=" (float32's largest)")
nonnegative_float = functools.partial(finite_float, low=0.0, allow_low=True)  # argparse type: a ridge penalty


def experiment_parser(docstring, device=True, model=None, **helps):
    """script_parser's, with the flags the scripts share: with model (the article's checkpoint), model_flags(); then
    --device unless device=False; --compare and --json."""
    parser = script_parser(docstring)
    if model:
        model_flags(parser, model, **helps)
    if device:
        parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                            help="auto picks cuda, then mps, then cpu (default: %(default)s)")
    parser.add_argument("--compare", action="store_true",
                        help="after the output, put this run's numbers beside the article's, with a verdict each")
    parser.add_argument("--json", type=nonempty_path, metavar="PATH",
                        help="also write this run's numbers, flags and environment to PATH")
    return parser


def model_flags(parser, model, model_help="", batch_help="",
                per_class_help="keep the first N pictures of each class in each split used (default: all)"):
    """--model (default: model), --data-dir, --per-class, --batch-size and --precision."""
    parser.add_argument("--model", default=model, type=check_model_flag,
                        help=f"checkpoint id or local directory ({model_help}) (default: %(default)s)")
    parser.add_argument("--data-dir", type=nonempty_path,
                        help="an imagenette2-160 folder; by default data/imagenette2-160, downloaded when missing")
    parser.add_argument("--per-class", type=positive_int, help=per_class_help)
    parser.add_argument("--batch-size", type=batch_pictures, default=32, help=f"{batch_help} (default: %(default)s)")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="fp32 gives the article's numbers; bf16 is faster on recent GPUs and Apple silicon; "
                             "tf32 exists on NVIDIA GPUs only (default: %(default)s)")


class EachOnce(argparse.Action):
    """argparse action of a flag of several values (nargs="+"): a value given twice (as printed, with :g:) refused."""

    def __call__(self, parser, namespace, values, option_string=None):
        printed = [f"{value:g}" if isinstance(value, float) else str(value) for value in values]
        twice = sorted({text for text in printed if printed.count(text) > 1})
        if twice:
            parser.error(f"{self.option_strings[0]}: {', '.join(twice)} given twice; give each value once")
        setattr(namespace, self.dest, values)


def short(x):
    """A float as Python prints it after rounding to 4 places: 0.1875, -0.7, 1.0 (+ 0.0 turns -0.0 into 0.0)."""
    return repr(round(float(x), 4) + 0.0)


def listed(values, spec=None):
    """A (nested) list, tuple or array as the article prints one, '[[7.0, 5.0], [5.0, 15.0]]' or '(197, 768)', each
    entry in the format spec (default: short)."""
    values = values.tolist() if hasattr(values, "tolist") else values
    if not isinstance(values, (list, tuple)):
        return short(values) if spec is None else format(values, spec)
    brackets = "()" if isinstance(values, tuple) else "[]"
    return brackets[0] + ", ".join(listed(value, spec) for value in values) + brackets[1]


def pass_text(timing):
    """A pass over pictures (NEW_PASS's keys) as its line prints it: '[12 s, 0.2 s waiting for pictures]'."""
    return f"[{timing['seconds']:.0f} s, {timing['waiting seconds']:.1f} s waiting for pictures]"


@dataclass
class Report:
    """A script's printed lines and the numbers on them (compare/record.py names them; docs/layout.md)."""

    script: str
    quiet: bool = False  # torchrun's other processes print nothing
    given: list = field(default_factory=list)  # (numbers, counts) of each printed line, copied as they were then
    could_not_run: list = field(default_factory=list)  # (section title, its UserError)
    lines: list = field(default_factory=list)  # every printed line, in order
    series: dict = field(default_factory=dict)  # what a figure needs beyond the printed numbers (maps, curves)

    def print(self, text="", numbers=None, counts=None):
        """The text printed ("  " a logged line, "\n== ... ==" a section's title), then the numbers on it kept."""
        self.lines += text.split("\n")
        if not self.quiet:
            print(text, flush=True)
        self.given.append(({name: value.tolist() if hasattr(value, "tolist") else copy.deepcopy(value)  # as now
                            for name, value in (numbers or {}).items()}, counts or {}))


def values(report):
    """{name: value} of the numbers given to a Report's lines, lists and passes unflattened: what a figure reads."""
    return {name: value for numbers, _ in report.given for name, value in numbers.items()}


DEVICE_CHOICES = ("auto", "cuda", "mps", "cpu")
DEVICE_MISSING = {"cuda": "--device cuda: no CUDA GPU is visible to torch here; use --device auto or cpu",
                  "mps": "--device mps: Apple's Metal backend is not available here; use --device auto or cpu"}


def keep_freed_memory():
    """glibc keeps freed blocks over 32 MB for the next batch, not page-faulted in anew (docs/performance.md)."""
    try:
        mallopt, largest = ctypes.CDLL("libc.so.6").mallopt, ctypes.c_int(2**31 - 1)  # glibc's, on Linux
    except OSError:  # another system, or another C library
        return False
    return mallopt(-3, largest) == 1 and mallopt(-1, largest) == 1  # M_MMAP_THRESHOLD, then M_TRIM_THRESHOLD


def pick_device(name="auto"):
    """auto takes cuda, then mps, then cpu; a named device must exist."""
    here = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available(), "cpu": True}
    if name == "auto":
        return torch.device(next(device for device, available in here.items() if available))
    if not here.get(name):
        raise UserError(DEVICE_MISSING.get(name, f"--device {name}: unknown device; choose one of "
                                                 f"{', '.join(DEVICE_CHOICES)}"))
    return torch.device(name)


PRECISIONS = ("fp32", "tf32", "bf16")
# each rule float32 can follow on NVIDIA GPUs with TF32: whether (matrix multiplies, cuDNN convolutions) use TF32
FP32_RULES = {"strict": (False, False), "torch defaults": (False, True), "tf32": (True, True)}


def set_precision(device, precision="fp32", fp32_rule="strict"):
    """The arithmetic of matrix multiplies and convolutions (docs/layout.md); returns the forward passes' context."""
    if precision != "fp32":
        check_precision(device, precision)
    # these flags' defaults are the rule "torch defaults"; torch's newer fp32_precision API raises when mixed with
    # them, and the Trainer's tf32=None leaves them as set here
    rule = "tf32" if precision == "tf32" else "strict" if precision == "fp32-strict" else fp32_rule  # the article's
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = FP32_RULES[rule]
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def check_precision(device, precision):
    """Refuse a --precision this device cannot run, in one line."""
    if precision not in PRECISIONS + ("fp32-strict",):
        raise UserError(f"--precision {precision}: choose one of {', '.join(PRECISIONS + ('fp32-strict',))}")
    if precision == "tf32" and device.type != "cuda":
        raise UserError(f"--precision tf32 exists on NVIDIA GPUs only, not on {device.type}: use fp32 or bf16")
    if precision == "bf16" and device.type == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device=device)
        except (RuntimeError, TypeError) as error:
            raise UserError("--precision bf16: this Mac's Metal backend has no bfloat16 (it needs macOS 14 or "
                            "later): use fp32") from error


def float32_arithmetic(device, precision, fp32_rule):
    """What the run record says of float32: the rule, and whether TF32 was allowed and could act on this device."""
    rule = "tf32" if precision == "tf32" else "strict" if precision == "fp32-strict" else fp32_rule
    tf32_hardware = device is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
    return {"rule": rule, "TF32 matrix multiplies": torch.backends.cuda.matmul.allow_tf32,
            "TF32 cuDNN convolutions": torch.backends.cudnn.allow_tf32, "TF32 on this device": tf32_hardware}
