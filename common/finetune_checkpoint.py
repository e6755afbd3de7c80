"""Fine-tuning's checkpoint file: one dict with torch's RNG states, written whole or not at all, and read back only
when it is whole and of this version; the names of what fine-tuning saves beside it."""
import io
import zipfile
from pathlib import Path

import torch

from common.files import write_atomic
from common.start_and_end import UserError

CHECKPOINT = "checkpoint.pt"  # in fine-tuning's --save-dir (and the job's OUT/finetune-run)
SAVED_AVERAGE, SAVED_LAST = "model", "model-last"  # its folders of the end's weights, save_pretrained's
CHECKPOINT_FORMAT = "vit_part3_finetune checkpoint, v6"  # v6: one dict, its records' CRC-32 checked on reading


def save_checkpoint(path, state, version):
    """The state, torch's RNG states (the CPU's, each GPU's: a resumed run draws what the uninterrupted one drew) and
    its format `version`, one dict written whole or not at all; returns the path. torch.save's zip file keeps each
    record's CRC-32, which read_checkpoint checks."""
    cuda = {"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}
    checkpoint = {**state, "rng": {"torch": torch.get_rng_state(), **cuda}, "format": version}
    return write_atomic(path, lambda f: torch.save(checkpoint, f), what="checkpoint")


def read_checkpoint(path, version, program):
    """The state saved at path (with its RNG states), its file read once; refused in one line when it is not a
    `version` file of `program`, or a record's bytes no longer match their CRC-32."""
    try:
        raw = Path(path).read_bytes()
        changed = zipfile.ZipFile(io.BytesIO(raw)).testzip()  # the first record whose CRC-32 fails, or None
        checkpoint = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
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


def set_rng_states(rng):
    """torch's RNG states as a checkpoint saved them: a resumed run draws what the uninterrupted one drew next."""
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
