"""The command line every script shares: its parser, argument types that refuse bad numbers, common flags."""
import argparse
import functools
import math
import os

from common.device import DEVICE_CHOICES, PRECISIONS
from common.pretrained import check_model_flag


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
seed = functools.partial(whole_number, low=0, high=2**32 - 1,  # what numpy and torch both take
                         refusal=f"is not a seed: a whole number from 0 to {2**32 - 1}")
# 5 x the paper's longest; each step's pictures drawn first
steps = functools.partial(whole_number, low=1, high=100_000,
                          refusal="is not a number of steps from 1 to 100,000")


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
    """argparse type: a path, ~ expanded; an empty one is refused (it would quietly mean the default, or nothing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or folder name")
    return os.path.expanduser(text)


def finite_float(text, low, allow_low):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (value == low and not allow_low):
        bound = f"at least {low:g}" if allow_low else f"above {low:g}"
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {bound}")
    return value


positive_float = functools.partial(finite_float, low=0.0, allow_low=False)  # argparse type: a learning rate
nonnegative_float = functools.partial(finite_float, low=0.0, allow_low=True)  # argparse type: a ridge penalty


def experiment_parser(docstring, device=True, model=None, model_help="", batch_help="",
                      per_class_help="keep the first N pictures of each class in each split used (default: all)"):
    """A script's parser (as script_parser's), its action "distinct" for a flag of several values each given once:
    --device (device=False: a script that runs on the CPU alone),
    --compare and --json; with model (the article's checkpoint, model_help: what it must hold), first --model,
    --data-dir, --per-class, --batch-size (batch_help: what a batch is in the script's own work) and --precision."""
    parser = ScriptParser(description=docstring, formatter_class=argparse.RawDescriptionHelpFormatter)

    class Distinct(argparse.Action):  # action="distinct": a value given twice (as printed, with :g) is refused
        def __call__(self, parser, namespace, values, option_string=None):
            printed = [f"{value:g}" if isinstance(value, float) else str(value) for value in values]
            twice = sorted({text for text in printed if printed.count(text) > 1})
            if twice:  # each names the numbers it prints
                parser.error(f"{option_string}: {', '.join(twice)} given twice; give each value once")
            setattr(namespace, self.dest, values)

    parser.register("action", "distinct", Distinct)
    if model:
        parser.add_argument("--model", default=model, type=check_model_flag,
                            help=f"checkpoint id or local directory ({model_help}) (default: %(default)s)")
        parser.add_argument("--data-dir", type=nonempty_path,
                            help="an imagenette2-160 folder; by default data/imagenette2-160, downloaded when missing")
        parser.add_argument("--per-class", type=positive_int, help=per_class_help)
        parser.add_argument("--batch-size", type=positive_int, default=32, help=f"{batch_help} (default: %(default)s)")
        parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                            help="fp32 gives the article's numbers; bf16 is faster on recent GPUs and Apple silicon; "
                                 "tf32 exists on NVIDIA GPUs only (default: %(default)s)")
    if device:
        parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                            help="auto picks cuda, then mps, then cpu (default: %(default)s)")
    parser.add_argument("--compare", action="store_true",
                        help="after the output, put this run's numbers beside the article's, with a verdict each")
    parser.add_argument("--json", type=nonempty_path, metavar="PATH",
                        help="also write this run's numbers, flags and environment to PATH")
    return parser
