"""Picking the device (--device auto|cuda|mps|cpu), its arithmetic (--precision), copying batches to it."""
import contextlib
import ctypes
import sys

import torch

from common.errors import UserError

DEVICE_CHOICES = ("auto", "cuda", "mps", "cpu")


def _mps_available():
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def keep_freed_memory():
    """Let glibc keep freed memory for the next batch instead of handing it back to the system.

    By default every block over 32 MB is a fresh mmap, so each batch's activations are page-faulted
    in again (the README's performance section has the cost). mallopt(M_MMAP_THRESHOLD) and
    (M_TRIM_THRESHOLD) at 2^31 - 1 keep such blocks in the heap. Elsewhere than glibc this does nothing.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold, largest = -1, -3, ctypes.c_int(2**31 - 1)
    return libc.mallopt(m_mmap_threshold, largest) == 1 and libc.mallopt(m_trim_threshold, largest) == 1


def pick_device(name="auto"):
    """auto takes cuda, then mps, then cpu; a named device must exist. Large host blocks are kept."""
    keep_freed_memory()
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
    if precision == "tf32" and device.type != "cuda":
        raise UserError(f"--precision tf32 exists on NVIDIA GPUs only, not on {device.type}: use fp32 or bf16")
    if precision == "bf16" and device.type == "mps" and not mps_has_bfloat16(device):
        raise UserError("--precision bf16: this Mac's Metal backend has no bfloat16 (it needs macOS 14 or later): "
                        "use fp32")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def mps_has_bfloat16(device):
    try:
        torch.ones(1, dtype=torch.bfloat16, device=device)
    except (RuntimeError, TypeError):
        return False
    return True


def to_device(array, device):
    """A batch (numpy or torch) on the device; on a GPU through pinned memory, so the copy does not block.

    A batch the loader has pinned already is not copied again (pin_memory() of a pinned tensor is itself).
    """
    tensor = torch.as_tensor(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
