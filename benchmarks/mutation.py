"""Mutation testing of the articles' maths: does the suite fail when one term of a formula changes?

Each mutant changes one thing in one function that holds the articles' maths: an arithmetic operator (+ -, * /,
// %, **), a comparison (< <=, == !=), and/or, a unary minus or `not` removed, a number (k -> k + 1, k - 1; x -> x + 1),
True/False, a slice bound dropped, a function swapped for its twin (min max, floor ceil, argmax argmin, zeros ones,
sum mean, any all, cos sin), or a call whose result is unused deleted. The fast tests of that module run on it:
a mutant is killed when a test fails (or errors, or runs past the time limit), and survives when all pass.

    python benchmarks/mutation.py                          # every module below: the score and the survivors
    python benchmarks/mutation.py common/features.py      # one module (several may be named)
    python benchmarks/mutation.py --function lr_at vit_part3_finetune.py
    python benchmarks/mutation.py --list                   # the mutants, without running them

The mutants are written into a copy of the checkout in a temporary folder, never into the working tree, and the
copy is removed at the end, on Ctrl-C too. One process imports torch and the test libraries once and forks a child
per mutant, which imports the project from the copy and runs pytest there. "Fast tests" are the tests of the
module's test files that took under --fast-seconds in the unmutated run (the stand-in runs and the scripts run as
subprocesses are left out). About 2 to 3 s per mutant on 2 cores: a run of all 741 mutants takes 25 to 35 minutes,
so it stays out of CI. docs/mutation.md holds the command, the modules, the score and the equivalent mutants.
"""
import ast
import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the repository root, for common/
from common.run import script_parser

# module: (the functions mutated, None for every top-level function; the test files whose fast tests guard them).
# MATHS: the files of the maths tests, each named by the module it tests. A test of one module may hold another's
# formula (fine-tuning's stretch is held to posemb's loop, few-shot's accuracy the closed form's), so each module's
# mutants run its own files first, then the rest of MATHS.
MATHS = ["tests/test_closed_form.py", "tests/test_setup.py",
         "tests/test_finetune_maths.py", "tests/test_backbone_maths.py", "tests/test_fewshot.py",
         "tests/test_posemb.py",
         "tests/test_verdicts.py"]


def guarded_by(*own):
    """The module's own test files, then the other files of MATHS."""
    return [*own, *(path for path in MATHS if path not in own)]


TARGETS = {
    "common/features.py": (["ridge", "closed_form"], guarded_by("tests/test_closed_form.py", "tests/test_fewshot.py",
                                                                "tests/test_backbone.py")),
    "vit_part3_setup.py": (["sequence_shape", "token_flops", "attention_flops", "encoder_flops",
                            "patch_embedding_flops", "batch_norm", "group_norm",
                            "weight_standardize", "adam_by_hand", "sgd_momentum_by_hand",
                            "polyak_average", "clip_by_global_norm", "pretraining_steps", "warmup_linear_lr",
                            "cosine_lr", "torch_optimizer_weight", "torch_clip"],
                           guarded_by("tests/test_setup.py")),
    "vit_part3_finetune.py": (["scaled", "warmup_steps", "lr_at", "report_steps", "stretched_table",
                               "head_gradient_by_hand", "update_average", "run_statistics", "body_gradient_norm",
                               "zero_head", "random_head", "setup_differences", "train",
                               "micro_batches", "step_pictures", "process_share"],
                              guarded_by("tests/test_finetune_maths.py", "tests/test_finetune.py")),
    "compare/verdicts.py": (["accuracy_interval", "first_k", "number_interval", "scaled", "number_row", "verdict",
                            "conclusion_row", "decide"],
                           guarded_by("tests/test_verdicts.py")),
    "vit_backbone.py": (["patch_tokens_to_feature_map", "split_tokens", "accuracy_metrics", "pca_rgb",
                         "one_per_class", "linear_probe", "scores_accuracy_loss", "closed_form_probe",
                         "feature_grid"], guarded_by("tests/test_backbone_maths.py", "tests/test_backbone.py")),
    "vit_part3_fewshot.py": (["draw_shots", "draw_pool", "few_shot_accuracies"], guarded_by("tests/test_fewshot.py")),
    "vit_part3_posemb.py": (["accuracy_counts", "grids", "check_resolution", "example_places", "stretch_positions",
                             "bilinear_resize_loop", "scipy_resize", "bicubic_resize", "linear_resize_1d",
                             "split_table", "position_tables", "cosine_similarities"],
                            guarded_by("tests/test_posemb.py", "tests/test_finetune_maths.py")),
}

EQUIVALENTS = ROOT / "docs" / "mutation.md"  # its table of the mutants that change no observable result, and why

BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mod,
          ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.MatMult: ast.Mult}
COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
           ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
TWINS = {"min": "max", "max": "min", "floor": "ceil", "ceil": "floor", "argmax": "argmin", "argmin": "argmax",
         "zeros_": "ones_", "zeros": "ones", "ones": "zeros", "sum": "mean", "mean": "sum", "any": "all",
         "all": "any", "cos": "sin", "sin": "cos"}
SLOW_FIXTURES = {"tiny_in21k", "tiny_classifier", "pictures", "standins", "weight_runs", "beans_standins",
                 "backbone_runs", "four_runs", "script_runs"}


# ---------------------------------------------------------------- the mutants

def alternatives(node):
    """(what, replacement node) for each mutation of this one node; the replacement None deletes a statement."""
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINARY:
        yield "operator", rebuilt(node, op=BINARY[type(node.op)]())
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in COMPARE:
                ops = list(node.ops)
                ops[i] = COMPARE[type(op)]()
                yield "comparison", rebuilt(node, ops=ops)
    elif isinstance(node, ast.BoolOp):
        yield "and/or", rebuilt(node, op=ast.Or() if isinstance(node.op, ast.And) else ast.And())
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        yield "sign/not dropped", copy.deepcopy(node.operand)
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield "boolean", ast.Constant(not node.value)
    elif isinstance(node, ast.Constant) and isinstance(node.value, int):
        yield "number", ast.Constant(node.value + 1)
        yield "number", ast.Constant(node.value - 1)
    elif isinstance(node, ast.Constant) and isinstance(node.value, float):
        yield "number", ast.Constant(node.value + 1.0)
    elif isinstance(node, ast.Slice):
        if node.lower is not None:
            yield "slice", rebuilt(node, lower=None)
        if node.upper is not None:
            yield "slice", rebuilt(node, upper=None)
    elif isinstance(node, ast.Attribute) and node.attr in TWINS:
        yield "twin", rebuilt(node, attr=TWINS[node.attr])
    elif isinstance(node, ast.Name) and node.id in TWINS and isinstance(node.ctx, ast.Load):
        yield "twin", rebuilt(node, id=TWINS[node.id])
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        yield "call deleted", None


def rebuilt(node, **fields):
    new = copy.deepcopy(node)
    for key, value in fields.items():
        setattr(new, key, value)
    return new


TIMING = {"perf_counter", "tqdm", "seconds", "waiting seconds", "clock"}  # names of keeping time


def times(node):
    """Does the statement time the run or show its progress (no maths: fine-tuning's loop does both)?"""
    return any(isinstance(n, ast.Attribute) and n.attr in TIMING or isinstance(n, ast.Name) and n.id in TIMING
               or isinstance(n, ast.Constant) and n.value in TIMING for n in ast.walk(node))


def left_alone(function):
    """ids of the nodes no mutant touches: the docstring, f-strings (messages), raise statements, annotations, and
    the statements that time the run or show its progress."""
    skip = set()
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip.update(id(n) for n in ast.walk(body[0]))
    for node in ast.walk(function):
        if isinstance(node, (ast.JoinedStr, ast.Raise)) or isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)) and \
                times(node):
            skip.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.arg) and node.annotation is not None:
            skip.update(id(n) for n in ast.walk(node.annotation))
    return skip


def target_functions(tree, names):
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = sorted(set(names or ()) - set(functions))
    if missing:
        raise SystemExit(f"mutation.py: no top-level function {', '.join(missing)}: update TARGETS")
    return [functions[name] for name in (names or functions)]


def mutants(path, names, root=ROOT):
    """Every mutant of the module under root (a run's: its copy, so that an edit of the working tree while it runs
    changes nothing): a dict with its function, line, description and the mutated module's source."""
    source = (root / path).read_text()
    lines = source.splitlines()
    found = []
    for function in target_functions(ast.parse(source), names):
        skip = left_alone(function)
        for index, node in enumerate(ast.walk(function)):
            if id(node) in skip:
                continue
            for k, (what, _) in enumerate(alternatives(node)):
                mutated_function = mutated(source, function.name, index, k)
                before, after = described(lines, node, list(alternatives(node))[k][1])
                found.append({"module": path, "function": function.name, "line": node.lineno, "what": what,
                              "before": before, "after": after,
                              "source": spliced(lines, function, mutated_function)})
    return found


def mutated(source, name, index, k):
    """The source of function `name` with the k-th alternative of its index-th node (in ast.walk order) applied."""
    function = target_functions(ast.parse(source), [name])[0]
    node = list(ast.walk(function))[index]
    replacement = list(alternatives(node))[k][1]
    for parent in ast.walk(function):
        for field, value in ast.iter_fields(parent):
            if value is node:
                setattr(parent, field, replacement)
            elif isinstance(value, list) and any(item is node for item in value):
                items = [item for item in value if item is not node] if replacement is None else [
                    replacement if item is node else item for item in value]
                setattr(parent, field, items or [ast.Pass()])
    return ast.unparse(ast.fix_missing_locations(function))


def spliced(lines, function, new_function):
    """The module's source with the function's lines (from its first decorator) replaced by new_function."""
    first = min([function.lineno] + [d.lineno for d in function.decorator_list]) - 1
    return "\n".join(lines[:first] + new_function.splitlines() + lines[function.end_lineno:]) + "\n"


def described(lines, node, replacement):
    """(the source line before, the same line after the change): what docs/mutation.md and the survivors show."""
    line = lines[node.lineno - 1]
    if replacement is None:
        return line.strip(), "(deleted)"
    if node.end_lineno == node.lineno:
        return line.strip(), (line[:node.col_offset] + ast.unparse(replacement) + line[node.end_col_offset:]).strip()
    return ast.unparse(node), ast.unparse(replacement)


# ---------------------------------------------------------------- running the tests on a mutant

def copy_checkout(destination):
    """The tracked and untracked-but-not-ignored files of the checkout, and the articles beside it (a link)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    shared = (ROOT.parent / "shared").resolve()
    if shared.is_dir():
        (destination.parent / "shared").symlink_to(shared)


class FastTests:
    """A pytest plugin: leaves out the tests that use a stand-in run, then those not in `keep` (when given), and
    records each test's time and outcome."""

    def __init__(self, keep=None):
        self.keep, self.seconds, self.failed = keep, {}, []

    def pytest_collection_modifyitems(self, config, items):
        chosen = [item for item in items if not SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
                  and (self.keep is None or item.nodeid in self.keep)]
        config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
        items[:] = chosen

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.failed:
            self.failed.append(report.nodeid)


def run_tests(copy_root, tests, keep, log, timeout, record=None):
    """pytest in a forked child on the copy: 'passed', 'failed' or 'timeout'. record(plugin) runs in the child and
    may write what the parent needs into a file (the child's memory is gone when it exits)."""
    pid = os.fork()
    if pid == 0:  # the child: its own stdout, the project imported from the copy
        code = 3
        try:
            with open(log, "w") as out:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
            import pytest

            for name, module in list(sys.modules.items()):  # the parent's own imports (common.run): the copy's instead
                where = str(getattr(module, "__file__", None) or "")  # not a virtual environment's inside the checkout
                if where.startswith(str(ROOT) + os.sep) and not where.startswith(sys.prefix + os.sep):
                    del sys.modules[name]
            os.chdir(copy_root)
            tempfile.tempdir = str(copy_root.parent / "tmp")  # conftest's cache folders go with the copy
            plugin = FastTests(keep)
            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *tests], plugins=[plugin])
            if record:
                record(plugin)
        finally:
            os._exit(int(code))
    deadline = time.monotonic() + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return "passed" if os.waitstatus_to_exitcode(status) == 0 else "failed"
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "timeout"
            time.sleep(0.02)
    except BaseException:  # Ctrl-C: the child goes too
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        raise


def fast_tests(copy_root, tests, fast_seconds, work):
    """(the node ids of the module's tests that pass unmutated in under fast_seconds each, their total seconds)."""
    found = work / "baseline.txt"

    def record(plugin):
        found.write_text("".join(f"{seconds} {node}\n" for node, seconds in plugin.seconds.items()
                                 if node not in plugin.failed))

    outcome = run_tests(copy_root, tests, None, work / "baseline.log", 1800, record)
    if outcome != "passed":
        log = (work / "baseline.log").read_text().splitlines()
        raise SystemExit("\n".join(log[-40:]) + f"\nmutation.py: the unmutated tests do not pass ({outcome}): fix them "
                                                 "first (the lines above are the end of pytest's output)")
    timed = [line.split(" ", 1) for line in found.read_text().splitlines()]
    keep = {node for seconds, node in timed if float(seconds) < fast_seconds}
    return keep, sum(float(seconds) for seconds, node in timed if node in keep)


def score_module(path, names, tests, args, copy_root, work):
    """Run every mutant of one module; returns (mutants, survivors)."""
    found = mutants(path, names, copy_root)
    keep, seconds = fast_tests(copy_root, tests, args.fast_seconds, work)
    print(f"\n{path}: {len(found)} mutants, each against {len(keep)} fast tests ({seconds:.1f} s of tests unmutated)",
          flush=True)
    target, original = copy_root / path, (copy_root / path).read_text()
    timeout = max(60.0, 10 * seconds + 30)
    survivors = []
    try:
        for i, mutant in enumerate(found, 1):
            target.write_text(mutant["source"])
            outcome = run_tests(copy_root, tests, keep, work / "mutant.log", timeout)
            mutant["outcome"] = "survived" if outcome == "passed" else outcome
            if outcome == "passed":
                survivors.append(mutant)
            if args.verbose:
                print(f"  [{i}/{len(found)}] {mutant['outcome']:8} {label(mutant)}", flush=True)
    finally:
        target.write_text(original)
    return found, survivors


def label(mutant):
    return f"{mutant['module']}:{mutant['line']} {mutant['function']}: {mutant['before']}  ->  {mutant['after']}"


def known_equivalents(path=EQUIVALENTS):
    """{(module, function, line before, line after): why} from the rows of docs/mutation.md's table
    | `module` | `function` | `line before` | `line after` | why |; they survive and are left out of the score."""
    rows = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and all(cell.startswith("`") for cell in cells[:4]):
            rows[tuple(cell.strip("`") for cell in cells[:4])] = cells[4]
    return rows


def key(mutant):
    return mutant["module"], mutant["function"], mutant["before"], mutant["after"]


def stop(signum, frame):
    raise KeyboardInterrupt


def parse_args(argv):
    parser = script_parser(__doc__)
    parser.add_argument("modules", nargs="*", help=f"modules to mutate (default: all {len(TARGETS)})")
    parser.add_argument("--function", action="append", help="only this function (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--fast-seconds", type=float, default=2.0, help="the longest a test may take to be run on "
                                                                        "each mutant (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="one line per mutant as it runs")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        parser.error(f"not a mutated module: {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    return args


def planned(modules, functions):
    """{module: (the functions mutated, its test files)} for the modules asked for (all when none), narrowed to
    --function's names; a module left with none of them is dropped."""
    plan = {}
    for module in modules or TARGETS:
        names, tests = TARGETS[module]
        if functions:  # None (every function) becomes the ones asked for
            names = functions if names is None else [name for name in names if name in functions]
        if names != []:
            plan[module] = (names, tests)
    return plan


def import_once():
    """One thread per test process (the cores are shared), offline, no bytecode (a mutant of the same size within
    the same second must not load a stale .pyc), and the heavy imports in the parent: each forked child has them."""
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.dont_write_bytecode = True
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import scipy.linalg
    import scipy.ndimage  # noqa: F401
    import torch

    torch.set_num_threads(1)
    try:
        import datasets  # noqa: F401
        import transformers.models.vit.modeling_vit  # noqa: F401
    except ImportError:
        pass


def report_module(module, names, tests, args, copy_root, work, equivalents):
    """Score one module and print its line, its survivors and its equivalent mutants; returns its row of the score:
    (module, killed, mutants, equivalent)."""
    found, survivors = score_module(module, names, tests, args, copy_root, work)
    equivalent = [m for m in survivors if key(m) in equivalents]
    real = [m for m in survivors if key(m) not in equivalents]
    killed = len(found) - len(survivors)
    timeouts = sum(m["outcome"] == "timeout" for m in found)
    print(f"{module}: killed {killed} of {len(found)} ({timeouts} by the time limit); {len(equivalent)} "
          f"equivalent; {len(real)} survived", flush=True)
    for mutant in real:
        print(f"  SURVIVED {label(mutant)}", flush=True)
    for mutant in equivalent:
        print(f"  equivalent {label(mutant)}\n      why: {equivalents[key(mutant)]}", flush=True)
    return module, killed, len(found), len(equivalent)


def print_score(rows, seconds):
    """The score of each module and of all; 0 when every mutant that can change a result is killed, else 1."""
    print(f"\nscore (killed / mutants that change a result: all mutants less the equivalent ones), {seconds:.0f} s:")
    rows = [*rows, ("all", *(sum(row[i] for row in rows) for i in (1, 2, 3)))]
    for module, killed, count, equivalent in rows:
        print(f"  {module:28} {killed:4} / {count - equivalent:4} = {100 * killed / max(1, count - equivalent):5.1f}%"
              f"   ({count} mutants, {equivalent} equivalent)")
    _, killed, count, equivalent = rows[-1]
    return 0 if killed == count - equivalent else 1


def main(argv=None):
    args = parse_args(argv)
    plan = planned(args.modules, args.function)
    if args.list:
        for module, (names, _) in plan.items():
            for mutant in mutants(module, names):
                print(label(mutant))
        return 0
    import_once()
    signal.signal(signal.SIGTERM, stop)  # SIGTERM as Ctrl-C: the temporary copy is removed either way
    equivalents = known_equivalents()
    work = Path(tempfile.mkdtemp(prefix="vit-part3-mutation-"))
    rows, started = [], time.monotonic()
    try:
        copy_root = work / "checkout"
        copy_checkout(copy_root)
        (work / "tmp").mkdir()
        for module, (names, tests) in plan.items():
            rows.append(report_module(module, names, tests, args, copy_root, work, equivalents))
    except KeyboardInterrupt:
        print("\nmutation.py: stopped; the working tree was never changed, the copy is removed", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return print_score(rows, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main())
