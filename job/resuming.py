"""What a job has done already, and what it must have been made by to count: the key of each script's JSON in OUT
(its command, its code and the stamp of what it read) and of fine-tuning's checkpoint, and OUT/reproduce.json, the
job's record of them (docs/reproduce.md, Resuming)."""
import hashlib
import json
import os
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

from common.files import write_text
from common.paths import BEANS, BEANS_SPLITS, IMAGENETTE_DIR
from common.pretrained import ARTICLE_PROCESSORS, NESTED_PROCESSOR_FILE, PROCESSOR_FILE
from common.start_and_end import UserError, say
from compare.data_set import picture_files
from compare.record import RECORD_FORMAT, library_versions
from job.commands import flag_value, names
from job.downloads import IMAGENETTE, RESNET, beans_snapshot
from job.page import JOB_RECORD, read_record
from job.scripts import SCRIPTS, script_file

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT_ENTRY = "finetune checkpoint"  # the job's record of what made fine-tuning's checkpoint


def command_key(command, out):
    """The command as the resume rule compares it: this interpreter, OUT's place and --resume left out."""
    return ["python"] + [token.replace(str(out), "OUT") for token in command[1:] if token != "--resume"]


def checkpoint_key(command, out):
    """What fine-tuning's checkpoint must have been made by to be continued: the command, --pause-at aside."""
    key, kept = command_key(command, out), []
    for token in key:
        if kept and names(kept[-1], "--pause-at") and "=" not in kept[-1]:  # its value
            kept.pop()
        elif not (names(token, "--pause-at") and "=" in token):
            kept.append(token)
    return kept


def pause_step(command):
    """The step a fine-tuning command pauses after (its last --pause-at, as argparse takes it), or None."""
    step = flag_value(command, "--pause-at")
    return None if step is None else int(step)


WEIGHTS = ("model*.safetensors", "pytorch_model*.bin", "*.index.json")  # a checkpoint's weights, whole or in shards


def inputs_stamp(script, command):
    """What a script's results depend on beside its command and code, told cheaply: the files of the pieces it reads
    (SCRIPTS' "needs" and "optional"), each by its real path, size, modification and change times and inode.
    Imagenette is every picture under the command's --data-dir, else the default folder; beans the README.md and
    the splits' parquet files of its --data-dir, else of the Hugging Face cache's snapshot; a checkpoint (its --model
    in place of the script's ViT) its weights, config.json and image processor files, those of the article's Hub
    checkpoints aside but for the backbone (the Part 3 scripts make their pixels without reading them). None where they
    cannot be listed (the script says why). A place is read as the scripts do, from the checkout."""
    data, model = flag_value(command, "--data-dir"), flag_value(command, "--model")
    files = []
    try:
        for piece in SCRIPTS[script]["needs"] + SCRIPTS[script]["optional"]:
            if piece == IMAGENETTE:
                root = ROOT / os.path.expanduser(data) if data else IMAGENETTE_DIR
                files += picture_files(root).values() if root.is_dir() else []
            elif piece == BEANS:
                root = ROOT / os.path.expanduser(data) if data else beans_snapshot()
                if root and root.is_dir():
                    files += [root / "README.md", *(path for split in BEANS_SPLITS
                                                    for path in sorted(root.rglob(f"{split}*.parquet")))]
            else:
                name = model if model and piece != RESNET else piece  # --model is the script's ViT
                local = ROOT / os.path.expanduser(name)
                config = local / "config.json" if local.is_dir() else try_to_load_from_cache(name, "config.json")
                if isinstance(config, (str, Path)):  # a name the Hub refuses: its ValueError
                    folder = Path(config).parent
                    read = script == "backbone" or local.is_dir() or name not in ARTICLE_PROCESSORS
                    processor = [folder / file for file in (PROCESSOR_FILE, NESTED_PROCESSOR_FILE) if read]
                    files += [folder / "config.json", *processor, *sorted(p for w in WEIGHTS for p in folder.glob(w))]
    except (OSError, ValueError):
        return None
    digest = hashlib.sha256()
    for path in files:
        try:
            stat = path.stat()
        except OSError:  # not there (a checkpoint without an image processor), or not readable
            continue
        digest.update(f"{os.path.realpath(path)} {stat.st_size} {stat.st_mtime_ns} {stat.st_ctime_ns} "
                      f"{stat.st_ino}\n".encode())
    return digest.hexdigest()


def code_digest(script):
    """One digest of the code a script's numbers, verdicts and figures come from: the script, every module of
    common/, compare/ and figures/, its reference numbers and the articles' conclusions it decides, the libraries'
    versions."""
    digest = hashlib.sha256()
    code = [path for folder in ("common", "compare", "figures") for path in sorted((ROOT / folder).rglob("*.py"))]
    for path in [ROOT / script_file(script), *code,
                 ROOT / "data" / f"reference_{script}.json", ROOT / "data" / f"conclusions_{script}.json"]:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(json.dumps(library_versions(), sort_keys=True).encode())
    return digest.hexdigest()


def file_digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_manifest(out, force=False):
    """{script: what ran, "finetune checkpoint": key, "command", "not run": {script: why}} from OUT/reproduce.json;
    one that cannot be read is refused (it alone says which of OUT's results are this command's), --force aside."""
    path = out / JOB_RECORD
    try:
        manifest = json.loads(path.read_text()) if path.is_file() else {}  # a pipe's reading would wait (in_the_way)
        odd = written_by_no_job(manifest)
        if odd:
            raise ValueError(f"{odd} is not what the job writes")
    except (OSError, ValueError) as error:
        if force:
            return {}
        raise UserError(f"{path} cannot be read ({error}): restore it, or add --force to run every script again "
                        f"(their results and fine-tuning's checkpoint are kept aside)") from error
    # another version's record (another format) tells nothing of what this version made: every script runs again
    return manifest if manifest.get("format") == RECORD_FORMAT else {}


def written_by_no_job(manifest):
    """What no job's record holds, of any version (a record edited by hand), or None: a record that is not an
    object, a script's entry that is not one or whose key is not one or whose seconds are not a number, or a
    checkpoint's entry that is not one or whose seconds are not a number."""
    if not isinstance(manifest, dict):
        return "the record"
    if not (isinstance(manifest.get(CHECKPOINT_ENTRY, {}), dict)
            and isinstance(manifest.get(CHECKPOINT_ENTRY, {}).get("seconds", 0), (int, float))):
        return CHECKPOINT_ENTRY
    return next((script for script in SCRIPTS if script in manifest and not (
        isinstance(manifest[script], dict) and isinstance(manifest[script].get("key", {}), dict)
        and isinstance(manifest[script].get("seconds", 0), (int, float)))), None)


def write_manifest(out, manifest):
    """Whole or not at all; a failure costs the next job's skipping, not this job: a warning."""
    try:
        write_text(out / JOB_RECORD, json.dumps({**manifest, "format": RECORD_FORMAT}, indent=2),
                   what="record of the job")
    except UserError as problem:
        say(f"warning: {problem}; the next job will run these scripts again")


def readable_record(path):
    """A script's --json record, or None when it is missing or not one (read_record, the page's reading, refuses)."""
    try:
        return read_record(Path(path))
    except UserError:
        return None


RUNS_AGAIN = {"command": "its command changed", "code": "its code or the libraries changed",
              "inputs": "a file it reads (a picture, its data set or its checkpoint) changed"}


def why_again(entry, key, path):
    """Why a script whose JSON at path the job wrote (its entry in the job's record) runs again: what changed since
    (RUNS_AGAIN), its JSON edited since, a section of it that could not run, or a JSON that cannot be read."""
    if "inputs" not in entry.get("key", {}):  # a record of the job before it stamped what a script reads
        return "its JSON was made by an earlier version of the job"
    changed = [part for part in RUNS_AGAIN if entry["key"].get(part) != key[part]]
    if changed:
        return f"{RUNS_AGAIN[changed[0]]} since its JSON was made"
    if entry.get("json") != file_digest(path):
        return "its JSON was changed since it was written"
    return "a section of it could not run" if readable_record(path) else "its JSON cannot be read"


def is_complete(out, script, key, manifest):
    """True when OUT/<script>.json is the one this key made and every section of it ran."""
    entry, path = manifest.get(script), out / f"{script}.json"
    if not isinstance(entry, dict) or entry.get("key") != key or not path.is_file():
        return False
    record = readable_record(path) if entry.get("json") == file_digest(path) else None  # not rewritten since
    return record is not None and not record.get("could_not_run")
