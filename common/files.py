"""The scripts' files, written whole or not at all, a failure said in one line (docs/faults.md); and fine-tuning's
checkpoint file, which reproduce.py reads too, and the names of what fine-tuning saves beside it."""
import contextlib
import os
import secrets
import shutil
import zipfile
from pathlib import Path

import torch

from common.start_and_end import UserError

TEMP_PREFIX = ".tmp-"  # every temporary file the writer makes starts so: tests look for leftovers by it


def reason(error):
    """The system's words for an error ('No space left on device'), found through wrapped ones (torch.save's)."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and (seen.strerror or seen.errno):
            return seen.strerror or os.strerror(seen.errno)
        seen = seen.__cause__ or seen.__context__
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:160]


def write_atomic(path, write, text=False, what="file"):
    """write(f) into a temporary file beside path, then rename it over path; any failure removes the temporary
    file, and an OSError (or a library's wrapped one) is a UserError naming the file as `what`."""
    target = Path(path)
    temporary = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        name = target.parent / f"{TEMP_PREFIX}{target.name}-{secrets.token_hex(8)}"  # a new file: the umask's mode
        with open(name, "x" if text else "xb", encoding="utf-8" if text else None) as f:
            temporary = name
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
        temporary = None
        synced(target.parent)  # the rename made durable
    except (OSError, RuntimeError, ValueError) as error:
        raise UserError(f"cannot write the {what} {target}: {reason(error)}") from error
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    return target


def synced(path):
    """fsync a file or folder (a folder: the renames in it made durable), where the system lets it be opened."""
    with contextlib.suppress(OSError):
        handle = os.open(path, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def write_text(path, content, what="file"):
    return write_atomic(path, lambda f: f.write(content), text=True, what=what)


def write_folder_atomic(path, write, what="folder"):
    """write(folder) into a temporary folder beside path, then put in its place; the old one is removed only once the
    new one stands, so that a failure leaves it whole; an OSError is a UserError naming the folder as `what`."""
    target, token = Path(path), secrets.token_hex(8)
    temporary, old = target.parent / f"{TEMP_PREFIX}{target.name}-{token}", target.parent / f"{TEMP_PREFIX}old-{token}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary.mkdir()
        write(temporary)
        probe = temporary / f"{TEMP_PREFIX}mode"  # the mode a new file gets here (the umask's), for every file
        probe.touch(exist_ok=False)
        mode = probe.stat().st_mode & 0o777
        probe.unlink()
        for file in (path for path in temporary.rglob("*") if path.is_file()):
            os.chmod(file, mode)  # a library's writer may make its files 0600
            synced(file)  # on the disk before the old folder goes
        synced(temporary)
        if target.exists():
            os.replace(target, old)
        try:
            os.replace(temporary, target)
        finally:
            if not target.exists() and old.exists():  # a failure or a signal between the renames: the old one back
                os.replace(old, target)
        synced(target.parent)
    except (OSError, RuntimeError, ValueError) as error:
        raise UserError(f"cannot write the {what} {target}: {reason(error)}") from error
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
        if target.exists():  # else the old one is all there is: kept, under its temporary name
            shutil.rmtree(old, ignore_errors=True)
    return target


CHECKPOINT = "checkpoint.pt"  # in fine-tuning's --save-dir (and the job's OUT/finetune-run)
SAVED_AVERAGE, SAVED_LAST = "model", "model-last"  # its folders of the end's weights, save_pretrained's
CHECKPOINT_FORMAT = "vit_part3_finetune checkpoint, v7"  # v7: its settings hold what the run read (its inputs)


def read_checkpoint(path, version, program):
    """The state saved at path (with its RNG states), refused in one line when a record's bytes no longer match their
    CRC-32 or it is not a `version` file of `program`; its records checked, then loaded (the page cache's bytes)."""
    try:
        with open(path, "rb") as file:
            with zipfile.ZipFile(file) as records:
                changed = records.testzip()  # the first record whose CRC-32 fails, or None
            file.seek(0)
            checkpoint = None if changed else torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # torch and zipfile raise several types for a truncated or foreign file
        raise UserError(f"--resume: {path} is truncated or not a checkpoint of this script ({type(error).__name__}); "
                        f"start again without --resume, or pass another --save-dir") from error
    if changed is not None:
        raise UserError(f"--resume: {path} has changed since it was written (its record {changed} no longer matches "
                        f"its CRC-32): the file is damaged; start again without --resume, or restore a copy of it")
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != version:
        raise UserError(f"--resume: {path} is a torch file but not a checkpoint of this version of {program}: start "
                        f"again without --resume, or pass another --save-dir")
    del checkpoint["format"]
    return checkpoint
