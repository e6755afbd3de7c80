"""Both articles reproduced in one command: the five scripts one after another, then the page.

    python reproduce.py --quick               # the README's quick checks: minutes on a GPU, about 29 min on 2 cores
    python reproduce.py                       # the articles' full setup into results/ (hours on a CPU)
    python reproduce.py OUT --models M --imagenette I --beans B    # offline, from local copies
    python reproduce.py --device cuda --precision bf16             # every script on the GPU, in bfloat16

Each script runs in a process of its own with `--json OUT/<script>.json --plots OUT/figures --compare`;
what it prints reaches this terminal as it comes (its progress bar included) and is kept in
OUT/logs/<script>.log. Then common/reproduction_page.py writes OUT/report.md, and one table says,
for each script, how many of its sections ran and the count of each verdict.

Resumable. A script whose JSON in OUT is complete (every section ran) and was made by the same
command and the same code (the script, the modules of common/ it imports, its reference numbers,
the library versions) is skipped; --force runs everything again. Fine-tuning saves its checkpoint in
OUT/finetune-run/ and goes on from it (--resume) when the checkpoint was made by the same command and
code, --pause-at aside: so a full run after --quick continues the quick check's step. Ctrl-C or
SIGTERM reach the running script, which stops as it would on its own (fine-tuning saves its step);
the job then ends with one line saying that the same command continues it. What was run is
recorded in OUT/reproduce.json.

Before any work: the downloads the job needs that are not in the caches, with their sizes, and
whether the disk has room for them and for fine-tuning's checkpoint. Offline, a script that lacks a
checkpoint or a dataset is named once with what it lacks, and the others run.

The estimate of the time left is the README's times for a 2-core CPU (the Quick check table with
--quick, "How long will it take" without), scaled by this machine's matrix-multiply speed measured
at the start, then by how long each finished script took against its estimate.

Exit status: 0 when every script ran every section; 1 when one could not (--strict: also when a
number differs from the article's); 2 for a bad flag or path (one line, before any work); 130 and
143 after Ctrl-C and SIGTERM.
"""
import ast
import functools
import hashlib
import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub.constants import ENDPOINT as HF_ENDPOINT

from common.checkpoints import hub_offline
from common.cli import script_parser
from common.device import DEVICE_CHOICES, PRECISIONS
from common.errors import UserError
from common.files import reason, write_atomic, write_text
from common.imagenette import ARCHIVE_MB, check_layout
from common.imagenette import URL as IMAGENETTE_URL
from common.reference import VERDICTS, compare, counts_text, load_reference, verdict_counts
from common.reproduction_page import SCRIPTS, script_file
from common.reproduction_page import read_record as page_record
from common.run import CHECK_ONLY, check_output_dir, guarded

ROOT = Path(__file__).resolve().parent
MANIFEST = "reproduce.json"    # what this job ran, for the next one to skip
FINETUNE_RUN = "finetune-run"  # fine-tuning's --save-dir inside OUT
CHECKPOINT = "checkpoint.pt"   # the file vit_part3_finetune.py writes there
KEPT_ASIDE = "checkpoint.previous.pt"  # a checkpoint of another command or code, kept there, not deleted
LOG_EVERY = 30                 # seconds between snapshots of a running script's log

# The sections of each script (len(SECTIONS) in it; a test holds them equal), for "sections run of all".
SECTION_COUNTS = {"setup": 9, "posemb": 4, "fewshot": 3, "finetune": 3, "backbone": 5}

# The flags each script accepts (a test holds them equal to its parser), so that a misspelt --extra
# flag is refused now, not when its script starts hours later.
SHARED = {"--model", "--data-dir", "--per-class", "--batch-size", "--precision", "--device", "--compare", "--json",
          "--plots"}
SCRIPT_FLAGS = {
    "setup": {"--compare", "--json"},
    "posemb": SHARED | {"--resolution"},
    "fewshot": SHARED | {"--shots", "--lambdas", "--draws", "--pool", "--seed", "--resolution", "--no-cache"},
    "finetune": SHARED | {"--steps", "--lr", "--seed", "--resolution", "--accum-steps", "--save-dir", "--save-every",
                          "--resume", "--pause-at"},
    "backbone": SHARED | {"--epochs", "--lr", "--seed", "--probe-epochs", "--lambdas", "--no-cache"},
}
SET_BY_THE_JOB = ("--json", "--plots", "--compare", "--save-dir", "--resume")

# --quick: the flags of the README's Quick check table (a test reads both). Fine-tuning's --save-dir
# there is the job's own OUT/finetune-run here.
QUICK_FLAGS = {"setup": [], "posemb": ["--per-class", "20"], "fewshot": ["--per-class", "20"],
               "finetune": ["--pause-at", "1"], "backbone": ["--per-class", "10", "--epochs", "1", "--probe-epochs", "10"]}

# What the estimate starts from: the README's times of each script on a 2-core CPU (a test holds
# them equal to its tables) and that CPU's matrix-multiply speed, measured as probe_gflops does.
# The quick checks were timed on this project's 2-core AMD EPYC while its ViT-B/16 forward pass ran
# 3.3 pictures/s of 17.6 GFLOP, 58 GFLOP/s, which at the 0.74 to 0.86 of the roofline that the
# benchmark measures is about 80 GFLOP/s (the probe reads 50 to 205 there, as other sessions' work
# beside it comes and goes); the full runs were extrapolated for the 2-core Xeon of "How long will it
# take", whose roofline is 264 to 334 GFLOP/s (benchmarks/throughput.py, the same 2048 x 2048 products).
MINUTE, HOUR = 60, 3600
REFERENCE = {
    "quick": {"machine": "the Quick check table's 2-core CPU", "gflops": 80,
              "seconds": {"setup": 11, "posemb": 15 * MINUTE, "fewshot": 4.2 * MINUTE, "finetune": 7.8 * MINUTE,
                          "backbone": 1.7 * MINUTE}},
    "full": {"machine": "the 2-core Xeon of \"How long will it take\"", "gflops": 300,
             "seconds": {"setup": 5, "posemb": 2.3 * HOUR, "fewshot": 10 * MINUTE, "finetune": 1.9 * HOUR,
                         "backbone": 2 * HOUR}},
}
NO_MODEL = {"setup"}  # its time is start-up and arithmetic: it says nothing of the device's speed

# What the scripts download when it is not here: (size in MB, MB on disk at most, where it comes from).
VIT, IN21K, RESNET = "google/vit-base-patch16-224", "google/vit-base-patch16-224-in21k", "microsoft/resnet-50"
IMAGENETTE, BEANS = "Imagenette", "AI-Lab-Makerere/beans"
HUB = urlparse(HF_ENDPOINT).hostname  # huggingface.co, or the mirror HF_ENDPOINT names
PIECES = {VIT: (346, 346, HUB), IN21K: (346, 346, HUB),
          IMAGENETTE: (ARCHIVE_MB, 2 * ARCHIVE_MB, urlparse(IMAGENETTE_URL).hostname),  # the archive and its extraction
          BEANS: (180, 2 * 180, HUB),             # the parquet files and the library's Arrow copy
          RESNET: (100, 100, HUB)}
NEEDS = {"setup": [], "posemb": [VIT, IMAGENETTE], "fewshot": [IN21K, IMAGENETTE],
         "finetune": [IN21K, IMAGENETTE], "backbone": [VIT, BEANS]}
OPTIONAL = {"setup": [RESNET]}  # setup uses the architecture with random weights without it
MODEL_OF = {script: pieces[0] for script, pieces in NEEDS.items() if pieces}  # each script's checkpoint
LIBRARIES = ("torch", "transformers", "datasets", "accelerate", "safetensors", "huggingface_hub", "numpy", "scipy",
             "pillow", "tqdm")


def say(text=""):
    """Progress and plans for the person at the terminal: stderr. Results go to stdout."""
    print(text, file=sys.stderr, flush=True)


def duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / MINUTE:.1f} min" if seconds < 90 * MINUTE else f"{seconds / HOUR:.1f} h"


# ---------------------------------------------------------------- the flags

def is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def extra_flags(texts):
    """{script: [flags]} from --extra SCRIPT=FLAGS; a script or flag that does not exist is refused now."""
    extra = {script: [] for script in SCRIPTS}
    for text in texts or []:
        script, equals, flags = text.partition("=")
        if not equals or script not in SCRIPTS:
            raise UserError(f"--extra {text!r}: write SCRIPT=FLAGS with SCRIPT one of {', '.join(SCRIPTS)}, e.g. "
                            f"--extra 'finetune=--steps 30'")
        try:
            tokens = shlex.split(flags)
        except ValueError as error:
            raise UserError(f"--extra {text!r}: {error}") from error
        for token in tokens:
            flag = token.partition("=")[0]
            if not token.startswith("-") or is_number(token):
                continue  # a value of the flag before it; the script checks values when it starts
            if flag in SET_BY_THE_JOB:
                raise UserError(f"--extra {text!r}: {flag} is set by reproduce.py itself")
            if flag not in SCRIPT_FLAGS[script]:
                raise UserError(f"--extra {text!r}: {script_file(script)} has no flag {flag} (it has "
                                f"{', '.join(sorted(SCRIPT_FLAGS[script] - set(SET_BY_THE_JOB)))})")
        extra[script] += tokens
    return extra


def check_extra_values(args, out, scripts):
    """Each script to run with --extra flags checks its whole command now (values and paths too), in a process of
    its own that stops before its sections (common/run.py's CHECK_ONLY), all at once: a typo costs seconds, not a
    job that has run for hours and then moved fine-tuning's checkpoint aside for a command that cannot start."""
    checks = {script: subprocess.Popen(script_command(script, args, out), cwd=ROOT, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True, env={**os.environ, CHECK_ONLY: "1"})
              for script in scripts if args.extra[script]}
    try:
        for script, check in checks.items():
            _, err = check.communicate()
            if check.returncode != 0:
                last = [line for line in err.splitlines() if line.strip()][-1:] or [f"exit status {check.returncode}"]
                raise UserError(f"--extra for {script_file(script)}: {last[0].removeprefix('error: ')}")
    finally:
        for check in checks.values():
            if check.poll() is None:
                check.kill()
                check.wait()


def check_folders(args):
    """--models, --imagenette and --beans must be what they say, before any work."""
    if args.models:
        models = Path(args.models)
        if not models.is_dir():
            raise UserError(f"--models {args.models} is not a folder: pass a folder of checkpoints laid out by their "
                            f"Hub ids ({Path(args.models) / VIT}/, {Path(args.models) / IN21K}/)")
        present = [name for name in (VIT, IN21K) if (models / name).exists()]
        if not present:
            raise UserError(f"--models {args.models} holds neither {VIT}/ nor {IN21K}/: lay the checkpoints out by "
                            f"their Hub ids, e.g. {models / VIT}/config.json")
        for name in present:
            if not (models / name / "config.json").is_file():
                raise UserError(f"--models {args.models}: {models / name} has no config.json: pass checkpoints "
                                f"saved with save_pretrained (or a snapshot from the Hub)")
    if args.imagenette and not all((Path(args.imagenette) / split).is_dir() for split in ("train", "val")):
        raise UserError(f"--imagenette {args.imagenette} has no train/ and val/ folders: pass a folder in "
                        f"Imagenette's layout, {{train,val}}/<class>/*.JPEG (e.g. imagenette2-160/)")
    if args.imagenette:
        try:
            check_layout(args.imagenette)
        except UserError as problem:
            raise UserError(f"--imagenette {args.imagenette}: {problem}") from problem
    if args.beans:
        names = [path.name for path in Path(args.beans).rglob("*.parquet")] if Path(args.beans).is_dir() else []
        if not all(any(name.startswith(split) for name in names) for split in ("train", "validation")):
            raise UserError(f"--beans {args.beans} has no parquet files of the train and validation splits: pass a "
                            f"copy of {BEANS}'s files (README.md, data/train-*.parquet, data/validation-*.parquet)")


def parse_flags(argv):
    parser = script_parser(__doc__)
    parser.add_argument("out", nargs="?", default="results", metavar="OUT",
                        help="the folder for the JSON files, figures, logs, fine-tuning's checkpoint and report.md")
    parser.add_argument("--quick", action="store_true",
                        help="the README's quick checks (its Quick check table's flags), not the articles' full setup")
    parser.add_argument("--device", choices=DEVICE_CHOICES, help="passed to every script that has it (default: each "
                                                                 "script's own, auto)")
    parser.add_argument("--precision", choices=PRECISIONS, help="passed to every script that has it (default: fp32, "
                                                                "the articles')")
    parser.add_argument("--models", metavar="DIR", help="local copies of the checkpoints laid out by Hub id: "
                                                        f"DIR/{VIT}/, DIR/{IN21K}/; a script gets --model "
                                                        "DIR/<its id> where that folder exists")
    parser.add_argument("--imagenette", metavar="DIR", help="a local copy of imagenette2-160 (the Part 3 scripts' "
                                                            "--data-dir)")
    parser.add_argument("--beans", metavar="DIR", help=f"a local copy of {BEANS}'s files (vit_backbone.py's "
                                                       "--data-dir)")
    parser.add_argument("--force", action="store_true", help="run every script again, fine-tuning from step 0")
    parser.add_argument("--strict", action="store_true", help="exit status 1 also when a number differs from the "
                                                              "article's (for CI)")
    parser.add_argument("--extra", action="append", metavar="SCRIPT=FLAGS",
                        help="more flags for one script, repeatable, e.g. --extra 'finetune=--steps 30'; they are "
                             "part of its command, so a change runs it again")
    args = parser.parse_args(argv)
    args.extra = extra_flags(args.extra)
    check_folders(args)
    return args


# ---------------------------------------------------------------- each script's command

def script_command(script, args, out, resume=False):
    """The script's command line: quick flags, local copies, device, precision, checkpoint, extras, outputs."""
    command = [sys.executable, script_file(script)] + (QUICK_FLAGS[script] if args.quick else [])
    takes = SCRIPT_FLAGS[script]
    if script in MODEL_OF and args.models and (Path(args.models) / MODEL_OF[script]).is_dir():
        command += ["--model", str(Path(args.models).resolve() / MODEL_OF[script])]
    data = args.beans if script == "backbone" else args.imagenette
    if data and "--data-dir" in takes:
        command += ["--data-dir", str(Path(data).resolve())]
    for flag, value in (("--device", args.device), ("--precision", args.precision)):
        if value and flag in takes:
            command += [flag, value]
    if script == "finetune":
        command += ["--save-dir", str(out / FINETUNE_RUN)] + (["--resume"] if resume else [])
    command += args.extra[script] + ["--json", str(out / f"{script}.json")]
    if "--plots" in takes:
        command += ["--plots", str(out / "figures")]
    return command + ["--compare"]


def command_key(command, out):
    """The command as the resume rule compares it: this interpreter, OUT's place and --resume left out."""
    return ["python"] + [token.replace(str(out), "OUT") for token in command[1:] if token != "--resume"]


def checkpoint_key(command, out):
    """What fine-tuning's checkpoint must have been made by to be continued: the command, --pause-at aside."""
    key, kept = command_key(command, out), []
    for token in key:
        if kept and kept[-1] == "--pause-at":  # its value
            kept.pop()
        elif not token.startswith("--pause-at="):
            kept.append(token)
    return kept


@functools.cache
def common_imports(path):
    """The files of the common/ modules that one file imports, anywhere in it (lazy imports too). Parsed once."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "common":  # from common import figures
            names = [f"common.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [ROOT / f"{name.replace('.', '/')}.py" for name in names if name.startswith("common.")]
    return tuple(found)


def code_files(script):
    """The script and every module of common/ it imports, directly or through another one."""
    found, todo = set(), [ROOT / script_file(script)]
    while todo:
        path = todo.pop()
        if path not in found and path.is_file():
            found.add(path)
            todo += common_imports(path)
    return sorted(found)


def code_digest(script):
    """One digest of the code a script's numbers come from: its files, its reference numbers, the libraries."""
    digest = hashlib.sha256()
    for path in code_files(script) + [ROOT / "data" / f"reference_{script}.json"]:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for library in LIBRARIES:
        try:
            digest.update(f"{library} {version(library)}\0".encode())
        except PackageNotFoundError:
            digest.update(f"{library} -\0".encode())
    return digest.hexdigest()


# ---------------------------------------------------------------- what is done already

def file_digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_manifest(out):
    """{script: what ran, "finetune checkpoint": key} from OUT/reproduce.json; empty when there is none."""
    path = out / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        say(f"warning: {path} cannot be read ({error}); every script runs again")
        return {}
    return manifest if isinstance(manifest, dict) else {}


def write_manifest(out, manifest):
    """Whole or not at all; a failure costs the next job's skipping, not this job: a warning."""
    try:
        write_text(out / MANIFEST, json.dumps(manifest, indent=2), what="record of the job")
    except UserError as problem:
        say(f"warning: {problem}; the next job will run these scripts again")


def read_record(path):
    """A script's --json record, or None when it is missing or not one (the page's reading of it)."""
    try:
        return page_record(Path(path))
    except UserError:
        return None


def is_complete(out, script, key, manifest):
    """True when OUT/<script>.json is the one this key made and every section of it ran."""
    entry, path = manifest.get(script), out / f"{script}.json"
    if not isinstance(entry, dict) or entry.get("key") != key or not path.is_file():
        return False
    if entry.get("json") != file_digest(path):  # another run wrote over it since
        return False
    record = read_record(path)
    return record is not None and not record.get("could_not_run")


# ---------------------------------------------------------------- what the job needs

def hf_home():
    from huggingface_hub import constants

    return Path(constants.HF_HOME)


def beans_cached():
    """The dataset's files in the Hub cache, or the library's Arrow copy of them (what load_dataset reads offline)."""
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / f"datasets--{BEANS.replace('/', '--')}" / "snapshots"
    arrow = Path(os.environ.get("HF_DATASETS_CACHE", hf_home() / "datasets")) / BEANS.replace("/", "___")
    return any(snapshots.rglob("*.parquet")) if snapshots.is_dir() else arrow.is_dir()


def piece_is_here(piece, args):
    """A checkpoint or dataset in a local copy the job was given, or in the caches the scripts read."""
    from common.checkpoints import cached_weight_file
    from common.imagenette import DEFAULT_DIR

    if piece == IMAGENETTE:
        return bool(args.imagenette) or DEFAULT_DIR.is_dir()
    if piece == BEANS:
        return bool(args.beans) or beans_cached()
    if args.models and (Path(args.models) / piece).is_dir():
        return True
    return cached_weight_file(piece) is not None


def reachable(host):
    """Does host answer over HTTPS, through the proxies the environment names as the downloads do? A few seconds at
    most without a network; any HTTP answer, an error status too, means it is there."""
    try:
        urllib.request.urlopen(urllib.request.Request(f"https://{host}/", method="HEAD"), timeout=5).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def plan_pieces(to_run, here, can_download):
    """(downloads: [piece], cannot: {script: [missing piece]}) for the scripts that will run.

    here: {piece: bool}; can_download: {piece: bool}. A script lacking a piece it needs that cannot be
    downloaded cannot run; an optional piece (setup's ResNet-50) is downloaded when it can be, or done without.
    """
    downloads, cannot = [], {}
    for script in to_run:
        missing = [piece for piece in NEEDS[script] if not here[piece]]
        lacking = [piece for piece in missing if not can_download[piece]]
        if lacking:
            cannot[script] = lacking
            continue
        optional = [piece for piece in OPTIONAL.get(script, []) if not here[piece] and can_download[piece]]
        downloads += [piece for piece in missing + optional if piece not in downloads]
    return downloads, cannot


def fix_for(piece):
    if piece == IMAGENETTE:
        return "--imagenette DIR"
    if piece == BEANS:
        return "--beans DIR"
    return f"--models DIR (with DIR/{piece}/)"


def missing_line(script, pieces, why):
    named = " and ".join(f"{piece} ({PIECES[piece][0]} MB)" for piece in pieces)
    return (f"cannot run {script_file(script)}: {named} {'is' if len(pieces) == 1 else 'are'} not here and {why}: "
            f"pass {' and '.join(fix_for(piece) for piece in pieces)}, or run once online")


def mb_text(mb):
    return f"{mb / 1000:.1f} GB" if mb >= 1000 else f"{mb:.0f} MB"


def existing_ancestor(path):
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return path


def room_needed(downloads, out, finetune_runs, args, resumes):
    """{folder: MB} the job will write there: downloads into the caches and data/, the checkpoint into OUT.

    resumes: whether fine-tuning continues from OUT's checkpoint (finetune_resumes()); if not, a checkpoint
    there is kept aside by prepare(), in the place of an earlier one kept aside (if both exist), and the run
    writes a new one beside it.
    """
    from common.checkpoints import cached_weight_file

    need = {}
    for piece in downloads:
        folder = ROOT / "data" if piece == IMAGENETTE else hf_home()
        need[folder] = need.get(folder, 0) + PIECES[piece][1]
    if finetune_runs:
        local = Path(args.models) / IN21K / "model.safetensors" if args.models else None
        weights = local if local and local.is_file() else cached_weight_file(IN21K)
        weights_mb = Path(weights).stat().st_size / 1e6 if weights else PIECES[IN21K][0]
        checkpoint, kept = out / FINETUNE_RUN / CHECKPOINT, out / FINETUNE_RUN / KEPT_ASIDE
        if resumes:
            freed = file_mb(checkpoint)  # the run's saves overwrite it
        else:  # prepare() moves the checkpoint, if any, over the one kept before: the checkpoint's room stays taken
            freed = file_mb(kept) if checkpoint.is_file() else 0
        # the weights, their average and the momentum; a new file is written whole beside the old one
        need[out] = need.get(out, 0) + max(0.0, 2 * 3 * weights_mb - freed)
    return need


def file_mb(path):
    return path.stat().st_size / 1e6 if path.is_file() else 0


def disk_lines(need):
    """One line on the room the job needs and has; UserError when a disk has too little."""
    by_disk = {}
    for folder, mb in need.items():
        place = existing_ancestor(folder)
        entry = by_disk.setdefault(place.stat().st_dev, {"folders": [], "mb": 0, "free": shutil.disk_usage(place).free})
        entry["folders"].append(str(folder))
        entry["mb"] += mb
    parts = []
    for entry in by_disk.values():
        free_mb = entry["free"] / 1e6
        where = ", ".join(entry["folders"][:-1]) + " and " * (len(entry["folders"]) > 1) + entry["folders"][-1]
        if entry["mb"] > free_mb:
            raise UserError(f"not enough room on the disk of {where}: the job needs about {mb_text(entry['mb'])} "
                            f"there and {mb_text(free_mb)} is free; free space, or set HF_HOME (the caches) or OUT "
                            f"to another disk")
        parts.append(f"about {mb_text(entry['mb'])} needed in {where}, {mb_text(free_mb)} free")
    return f"disk: {'; '.join(parts)}: room enough" if parts else "disk: nothing to download or save"


# ---------------------------------------------------------------- the estimate

def probe_gflops(device_name):
    """GFLOP/s of a 2048 x 2048 float32 matrix product on the device (8192 on a GPU), the better of two after a
    warm-up: the benchmark's roofline, whose figures the reference machines have. float32 as the README's times
    are; what bf16 gains on whole scripts the first finished one tells (a CPU without bf16 units would crawl here)."""
    import torch

    device = torch.device(device_name)
    n = 2048 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
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


PROBE = "import sys, reproduce; print(reproduce.probe_gflops(sys.argv[1]))"


def measure_speed(device):
    """This machine's GFLOP/s on the scripts' device, or None. A GPU is measured in a process of its own, so that
    this job holds no GPU memory while the scripts run."""
    if device.type == "cpu":
        return probe_gflops("cpu")
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, str(device)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, check=False)
        return float(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def estimate_seconds(scripts, reference, gflops, finished):
    """Seconds the scripts will take: the reference times scaled by the speed probe, then by finished scripts.

    finished: {script: measured seconds} of the scripts this job has run so far; those with a model
    say how far the probe's scaling is off on this machine (a GPU is rarely as much faster on whole
    scripts as on matrix products), and the rest of the estimate is corrected by that ratio.
    """
    scale = reference["gflops"] / gflops if gflops else 1.0

    def predicted(script):
        return reference["seconds"][script] * scale

    measured = {script: seconds for script, seconds in finished.items() if script not in NO_MODEL}
    correction = (sum(measured.values()) / sum(predicted(script) for script in measured)) if measured else 1.0
    return correction * sum(predicted(script) for script in scripts)


def how_estimated(reference, gflops, device):
    speed = (f"this machine's matrix-multiply speed, {gflops:,.0f} GFLOP/s measured now on {device}" if gflops
             else "no speed measured on this machine")
    return (f"an estimate: the README's times on {reference['machine']} ({reference['gflops']} GFLOP/s), scaled by "
            f"{speed}, then by each finished script's time against its estimate")


# ---------------------------------------------------------------- running one script

class StopRequests:
    """Ctrl-C and SIGTERM while the job runs: remembered, and passed on once each to the running script.

    The script runs in a process group of its own, so a Ctrl-C at the terminal reaches it only through
    here, once; fine-tuning reads a second one as "stop at once". Its loader's workers are not signalled:
    the script ends them, as it does when it runs alone.
    """

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


def save_log(path, log, warned):
    """The log so far, whole (common/files.py); a log that cannot be written is said once, the run goes on."""
    try:
        write_atomic(path, lambda f: f.write(bytes(log)), what="log")
    except UserError as problem:
        if not warned:
            say(f"warning: {problem}")
        return True
    return warned


def run_logged(command, log_path, stop):
    """Run one script, its stdout and stderr passed through to ours as they come and kept in log_path.

    Returns (exit status, seconds). The log is rewritten whole every LOG_EVERY seconds and at the end.
    """
    started = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if sys.stderr.isatty():  # progress bars as wide as the terminal, which the script's pipe cannot tell it
        columns, lines = shutil.get_terminal_size()
        env.update(COLUMNS=str(columns), LINES=str(lines))
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, process_group=0)
    stop.child = child
    stop.forward()  # a signal that came while it started
    passes_to = {child.stdout: sys.stdout.buffer, child.stderr: sys.stderr.buffer}
    log, saved_at, warned = bytearray(), time.perf_counter(), False
    with selectors.DefaultSelector() as selector:
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
                warned, saved_at = save_log(log_path, log, warned), time.perf_counter()
    status = child.wait()
    stop.child = None
    save_log(log_path, log, warned)
    return status, time.perf_counter() - started


# ---------------------------------------------------------------- the results

def page_is_stale(page, out):
    """No page, or a JSON newer than it (a job whose page could not be written, or that a signal stopped after it)."""
    if not page.is_file():
        return True
    made = page.stat().st_mtime_ns
    return any(path.stat().st_mtime_ns > made for path in (out / f"{script}.json" for script in SCRIPTS)
               if path.is_file())


def result_row(script, record):
    """{sections: (run, of all), counts: {verdict: n}} of one script from its JSON (None: no JSON)."""
    reference, total = load_reference(script), SECTION_COUNTS[script]
    if record is None:
        return {"sections": (0, total), "counts": verdict_counts(compare({}, reference))}
    rows = compare(record["numbers"], reference, record.get("setup differences", {}))
    return {"sections": (total - len(record.get("could_not_run", [])), total), "counts": verdict_counts(rows)}


def row_text(row):
    done, total = row["sections"]
    return f"{done} of {total} sections; " + counts_text(row["counts"])


def paused(record):
    """What a paused fine-tuning run's "not run" rows mean (--quick pauses it after step 1)."""
    line = next((text for text in record.get("printed", []) if text.strip().startswith("paused after step")), None)
    return (f" ({line.strip().split(';')[0]}: its later rows are not run until `python reproduce.py` without --quick "
            f"continues it)") if line else ""


def final_table(rows):
    """The job's table, a line a script: script | sections run of all | each verdict's count | time."""
    header = ["script", "sections run", *VERDICTS, "time"]
    body = [[script_file(script), f"{row['sections'][0]} of {row['sections'][1]}",
             *(str(row["counts"][word]) for word in VERDICTS), row["time"]] for script, row in rows.items()]
    widths = [max(len(line[k]) for line in [header, *body]) for k in range(len(header))]
    return [" | ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *body]]


def exit_status(rows, strict):
    """0 when every script ran every section; 1 when one did not, and with --strict when a number differs."""
    if any(row["sections"][0] < row["sections"][1] for row in rows.values()):
        return 1
    return 1 if strict and any(row["counts"]["differs"] for row in rows.values()) else 0


# ---------------------------------------------------------------- the job

def plan(args, out, manifest):
    """(done, cannot, runnable, downloads): what is complete, what lacks a piece, what runs; said before any work."""
    keys = {script: {"command": command_key(script_command(script, args, out), out), "code": code_digest(script)}
            for script in SCRIPTS}
    done = [script for script in SCRIPTS if not args.force and is_complete(out, script, keys[script], manifest)]
    to_run = [script for script in SCRIPTS if script not in done]
    pieces = {piece for script in to_run for piece in NEEDS[script] + OPTIONAL.get(script, [])}
    here = {piece: piece in pieces and piece_is_here(piece, args) for piece in PIECES}
    offline = hub_offline()
    online = {host: not offline and reachable(host) for host in {PIECES[p][2] for p in pieces if not here[p]}}
    downloads, cannot = plan_pieces(to_run, here, {piece: online.get(PIECES[piece][2], False) for piece in PIECES})
    runnable = [script for script in to_run if script not in cannot]
    say(f"reproduce.py: {'the quick checks' if args.quick else 'the full setup'} of the five scripts into {out}: "
        f"{len(done)} done already, {len(runnable)} to run")
    if downloads:
        say("to download, once (the scripts keep them in the caches): "
            + ", ".join(f"{piece} ({PIECES[piece][0]} MB)" for piece in downloads)
            + f"; {mb_text(sum(PIECES[piece][0] for piece in downloads))} in all")
    elif runnable and not cannot:
        say("to download: nothing, the checkpoints and datasets the job needs are here")
    for script, lacking in cannot.items():
        hosts = " and ".join(sorted({PIECES[piece][2] for piece in lacking}))
        say(missing_line(script, lacking, "HF_HUB_OFFLINE=1 forbids downloads" if offline else f"{hosts} cannot be "
                                                                                             f"reached"))
    resumes = finetune_resumes(args, out, keys["finetune"], manifest)
    say(disk_lines(room_needed(downloads, out, "finetune" in runnable, args, resumes)))
    return keys, done, cannot, runnable


def prepare(script, args, out, keys, manifest):
    """The script's command. Fine-tuning: --resume from OUT/finetune-run when its checkpoint was made by the same
    command and code, else a fresh start, the old checkpoint kept as checkpoint.previous.pt. A stale JSON is moved to
    OUT/logs/."""
    resume = False
    if script == "finetune":
        checkpoint = out / FINETUNE_RUN / CHECKPOINT
        resume = finetune_resumes(args, out, keys[script], manifest)
        if not resume and checkpoint.is_file():  # hours of training may be in it: kept aside, not deleted
            kept = checkpoint.with_name(KEPT_ASIDE)
            move(checkpoint, kept)
            say(f"{script_file(script)} starts afresh: its checkpoint was made by another command or code (or "
                f"--force); the old one is kept as {kept}")
        manifest["finetune checkpoint"] = checkpoint_maker(args, out, keys[script])  # every checkpoint from now on
    move_stale(out, script, manifest)
    return script_command(script, args, out, resume)


def checkpoint_maker(args, out, key):
    return {"command": checkpoint_key(script_command("finetune", args, out), out), "code": key["code"]}


def finetune_resumes(args, out, key, manifest):
    """Whether fine-tuning continues from OUT's checkpoint: it is there and was made by the same command and code."""
    return (not args.force and (out / FINETUNE_RUN / CHECKPOINT).is_file()
            and manifest.get("finetune checkpoint") == checkpoint_maker(args, out, key))


def only_job_on(out):
    """An exclusive lock on OUT/.reproduce.lock, or one line: two jobs on one OUT would move each other's JSON aside
    and write one fine-tuning folder. The open file is returned: the lock lasts while it is open (where the
    system has flock; elsewhere nothing is locked)."""
    try:
        import fcntl
    except ImportError:
        return None
    handle = open(out / ".reproduce.lock", "a")  # noqa: SIM115 - held open for the whole job
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        handle.close()
        raise UserError(f"another reproduce.py is running on {out}: wait for it, or give this one another OUT") \
            from error
    return handle


def move(source, target):
    """os.replace, its failure (a read-only disk) one line naming both."""
    try:
        os.replace(source, target)
    except OSError as error:
        raise UserError(f"cannot move {source} to {target} ({reason(error)}): make OUT writable") from error


def move_stale(out, script, manifest):
    """OUT keeps only the JSON of this job's commands, so the page never mixes two setups; the old one is kept aside."""
    stale = out / f"{script}.json"
    if stale.is_file():
        move(stale, out / "logs" / f"{script}.previous.json")
    manifest.pop(script, None)
    write_manifest(out, manifest)


def stopped_line(signum, script, argv):
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    during = f" during {script_file(script)}, after it saved what it could" if script else ""
    return f"stopped by {name}{during}; the same command continues the job: {shlex.join(['python', 'reproduce.py', *argv])}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_flags(argv)
    check_output_dir(args.out, "OUT")
    out = Path(args.out).resolve()
    check_output_dir(out / "logs", "OUT")
    _lock = only_job_on(out)  # held while main() runs: a local keeps the file open
    manifest = read_manifest(out)
    keys, done, cannot, runnable = plan(args, out, manifest)
    check_extra_values(args, out, runnable)

    gflops, reference = None, REFERENCE["quick" if args.quick else "full"]
    if runnable:  # the device is checked, and measured for the estimate, only when a script will use it
        from common.device import pick_device, set_precision

        device = pick_device(args.device or "auto")
        set_precision(device, args.precision or "fp32")  # tf32 off an NVIDIA GPU is refused now, not in a script
        gflops = measure_speed(device)
        say(f"time: about {duration(estimate_seconds(runnable, reference, gflops, {}))} for {len(runnable)} "
            f"script(s), {how_estimated(reference, gflops, device)}")

    times, finished = {}, {}
    with StopRequests() as stop:
        for index, script in enumerate(SCRIPTS, 1):
            if stop.asked:
                break
            name = script_file(script)
            if script in done:
                times[script] = f"skipped ({duration(manifest[script].get('seconds', 0))} before)"
                say(f"[{index}/5] {name}: skipped, its JSON in OUT is complete and was made by the same command and "
                    f"code (--force runs it again)")
                continue
            times[script] = "-"
            if script in cannot:
                move_stale(out, script, manifest)
                continue
            command = prepare(script, args, out, keys, manifest)
            if stop.asked:  # it came while the command was prepared: not passed to a script that has just started
                break
            left = estimate_seconds([s for s in runnable if s not in finished], reference, gflops, finished)
            say(f"\n[{index}/5] {name} ... about {duration(left)} left in the job (estimate)")
            status, seconds = run_logged(command, out / "logs" / f"{script}.log", stop)
            record = read_record(out / f"{script}.json")
            if record is not None:  # written by this run: move_stale took any older one away
                manifest[script] = {"key": keys[script], "json": file_digest(out / f"{script}.json"),
                                    "seconds": round(seconds, 1)}
                write_manifest(out, manifest)
            if stop.asked:
                say(stopped_line(stop.asked[0], script, argv))
                return 128 + stop.asked[0]
            finished[script], times[script] = seconds, duration(seconds)
            print(f"{name}: {duration(seconds)}, " + (row_text(result_row(script, record)) + paused(record) if record
                  else f"exit status {status} and no JSON: see the lines above, kept in OUT/logs/{script}.log"),
                  flush=True)
    if stop.asked:
        say(stopped_line(stop.asked[0], None, argv))
        return 128 + stop.asked[0]

    rows = {script: {**result_row(script, read_record(out / f"{script}.json")), "time": times[script]}
            for script in SCRIPTS}
    print("\n" + "\n".join(final_table(rows)), flush=True)  # the results first: the page can still fail
    page = out / "report.md"
    if finished or cannot or page_is_stale(page, out):
        from common.reproduction_page import build

        try:
            build(out, say=lambda text: None)
        except UserError as problem:
            say(f"error: {problem}; the table above holds the counts")
            return 1
    print(f"page: {page}", flush=True)
    return exit_status(rows, args.strict)


if __name__ == "__main__":
    sys.exit(guarded(main))
