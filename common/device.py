"""Picking the device (--device auto|cuda|mps|cpu), its arithmetic (--precision), copying batches to it."""
import contextlib

import torch

from common.errors import UserError

DEVICE_CHOICES = ("auto", "cuda", "mps", "cpu")


def _mps_available():
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def pick_device(name="auto"):
    """auto takes cuda, then mps, then cpu; a named device must exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is visible to torch here; use --device auto or cpu")
    if name == "mps" and not _mps_available():
        raise UserError("--device mps: Apple's Metal backend is not available here; use --device auto or cpu")
    if name not in DEVICE_CHOICES:
        raise UserError(f"--device {name}: unknown device; choose one of {', '.join(DEVICE_CHOICES)}")
    return torch.device(name)


PRECISIONS = ("fp32", "tf32", "bf16")


def set_precision(device, precision="fp32"):
    """The arithmetic of matrix multiplies; returns the context to run forward passes in.

    fp32 gives the article's numbers. tf32 keeps float32 weights but lets Ampere and later GPUs
    multiply with 10-bit mantissas. bf16 runs the forward pass under autocast in bfloat16.
    """
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def to_device(array, device):
    """A numpy batch on the device; on a GPU through pinned memory, so the copy does not block."""
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
