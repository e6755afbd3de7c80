"""Picking the device: --device auto|cuda|mps|cpu."""
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
