"""Fine-tuning's checkpoint file: written whole or not at all, with torch's RNG states and a digest, and read back
only when it is whole and of this version; the names of what fine-tuning saves beside it."""
import hashlib

import torch

from common.files import write_atomic
from common.start_and_end import UserError

CHECKPOINT = "checkpoint.pt"  # in fine-tuning's --save-dir (and the job's OUT/finetune-run)
SAVED_AVERAGE, SAVED_LAST = "model", "model-last"  # its folders of the end's weights, save_pretrained's
CHECKPOINT_FORMAT = "vit_part3_finetune checkpoint, v5"  # v5: the log keeps each check's counts, right of checked


def state_digest(state):
    """blake2b over every value in a fixed order, tensors by dtype, shape and bytes (uint8, for bfloat16), the rest by
    repr: the same after torch.load as before torch.save."""
    digest = hashlib.blake2b(digest_size=16)

    def feed(value):
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                digest.update(repr(key).encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(b"[")
            for item in value:
                feed(item)
            digest.update(b"]")
        elif isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())

    feed(state)
    return digest.hexdigest()


def save_checkpoint(path, state, version):
    """The state and torch's RNG states (the CPU's, each GPU's: a resumed run draws what the uninterrupted one drew),
    its format `version` and its digest, written whole or not at all; returns the path."""
    cuda = {"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}
    state = {**state, "rng": {"torch": torch.get_rng_state(), **cuda}}
    checked = {"format": version, "digest": state_digest(state), "state": state}
    return write_atomic(path, lambda f: torch.save(checked, f), what="checkpoint")


def read_checkpoint(path, version, program):
    """The state saved at path, refused in one line when it is not a `version` file of `program` or has changed."""
    try:
        checked = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a truncated or foreign file
        raise UserError(f"--resume: {path} is truncated or not a checkpoint of this script ({type(error).__name__}); "
                        f"start again without --resume, or pass another --save-dir") from error
    if not isinstance(checked, dict) or checked.get("format") != version:
        raise UserError(f"--resume: {path} is a torch file but not a checkpoint of this version of {program}: start "
                        f"again without --resume, or pass another --save-dir")
    if state_digest(checked["state"]) != checked["digest"]:
        raise UserError(f"--resume: {path} has changed since it was written (its contents no longer match their "
                        f"digest): the file is damaged; start again without --resume, or restore a copy of it")
    return checked["state"]


def set_rng_states(rng):
    """torch's RNG states as a checkpoint saved them: a resumed run draws what the uninterrupted one drew next."""
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
