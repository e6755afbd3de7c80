"""What every script's main() shares: the common flags, running sections, exit status, JSON."""
import argparse
import json
import sys

from common.device import DEVICE_CHOICES, PRECISIONS
from common.errors import UserError
from common.printing import line
from common.reference import load_reference, print_comparison


def script_parser(docstring):
    """argparse with the script's docstring as its help text."""
    return argparse.ArgumentParser(description=docstring, formatter_class=argparse.RawDescriptionHelpFormatter)


def positive_int(text):
    """argparse type: a whole number of at least 1, refused in one line otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def side_pixels(text):
    """argparse type: pixels on a side, at least 32 (two patches of 16)."""
    value = positive_int(text)
    if value < 32:
        raise argparse.ArgumentTypeError(f"{text!r} pixels is too small: a ViT needs at least 2 patches on a side")
    return value


def add_data_arguments(parser, model_default, model_help):
    parser.add_argument("--model", default=model_default, help=f"checkpoint id or local directory ({model_help})")
    parser.add_argument("--data-dir", help="imagenette2-160 folder (default: data/imagenette2-160, downloaded)")
    parser.add_argument("--per-class", type=positive_int,
                        help="keep the first N pictures of each class in each split used")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="fp32 gives the article's numbers; tf32 and bf16 are faster on recent GPUs (default fp32)")


def add_common_arguments(parser, device=True):
    if device:
        parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                            help="auto picks cuda, then mps, then cpu (default: auto)")
    parser.add_argument("--compare", action="store_true",
                        help="after the output, put this run's numbers beside the article's")
    parser.add_argument("--json", metavar="PATH", help="also write this run's numbers to PATH as JSON")


def run_sections(sections):
    """Run each section; one that cannot run says why in one line and the others still run.

    Returns this run's numbers {name: value} and the messages of the sections that could not run.
    """
    results, problems = {}, []
    for section in sections:
        try:
            results.update(section() or {})
        except UserError as problem:
            repeated = str(problem) in problems
            line("cannot run this section either, for the same reason" if repeated
                 else f"cannot run this section: {problem}")
            problems.append(str(problem))
    return results, problems


def finish(script, args, results, problems):
    """--compare and --json, then the exit status: 1 when a section could not run."""
    if args.compare:
        print_comparison(results, load_reference(script))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"script": script, "results": results, "could_not_run": problems}, f, indent=2)
    if problems:
        print(f"\n{len(problems)} section(s) could not run; see the lines starting 'cannot run'", file=sys.stderr)
    return 1 if problems else 0


def guarded(main):
    """Run main(); a UserError outside the sections ends in one line and exit status 2."""
    try:
        return main()
    except UserError as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
