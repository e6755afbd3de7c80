"""Picking the device (--device auto|cuda|mps|cpu), its arithmetic (--precision), copying batches to it."""
import contextlib
import ctypes
import sys

import torch

from common.errors import UserError

DEVICE_CHOICES = ("auto", "cuda", "mps", "cpu")


def keep_freed_memory():
    """glibc keeps freed blocks over 32 MB for the next batch, not page-faulted in anew (docs/performance.md)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold, largest = -1, -3, ctypes.c_int(2**31 - 1)
    return libc.mallopt(m_mmap_threshold, largest) == 1 and libc.mallopt(m_trim_threshold, largest) == 1


def pick_device(name="auto"):
    """auto takes cuda, then mps, then cpu; a named device must exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if torch.backends.mps.is_available() else torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is visible to torch here; use --device auto or cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device mps: Apple's Metal backend is not available here; use --device auto or cpu")
    if name not in DEVICE_CHOICES:
        raise UserError(f"--device {name}: unknown device; choose one of {', '.join(DEVICE_CHOICES)}")
    return torch.device(name)


PRECISIONS = ("fp32", "tf32", "bf16")
# each rule float32 can follow on NVIDIA GPUs that have TF32: (matrix multiplies, cuDNN convolutions) in TF32
# (docs/layout.md)
FP32_RULES = {"strict": (False, False), "torch defaults": (False, True), "tf32": (True, True)}


def float32_rule(precision, fp32_rule):
    """The rule float32 follows under --precision: tf32's own, strict for fp32-strict, else the article's."""
    return "tf32" if precision == "tf32" else "strict" if precision == "fp32-strict" else fp32_rule


def set_precision(device, precision="fp32", fp32_rule="strict"):
    """The arithmetic of matrix multiplies and convolutions (docs/layout.md); returns the forward passes' context."""
    if precision not in PRECISIONS + ("fp32-strict",):
        raise UserError(f"--precision {precision}: choose one of {', '.join(PRECISIONS + ('fp32-strict',))}")
    if precision == "tf32" and device.type != "cuda":
        raise UserError(f"--precision tf32 exists on NVIDIA GPUs only, not on {device.type}: use fp32 or bf16")
    if precision == "bf16" and device.type == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device=device)
        except (RuntimeError, TypeError) as error:
            raise UserError("--precision bf16: this Mac's Metal backend has no bfloat16 (it needs macOS 14 or "
                            "later): use fp32") from error
    rule = float32_rule(precision, fp32_rule)
    # The flags whose defaults are the rule "torch defaults"; torch's newer fp32_precision API is left alone, since
    # reading these after mixing the two raises. The Trainer's tf32=None leaves them as set here.
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = FP32_RULES[rule]
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def float32_arithmetic(device, precision, fp32_rule):
    """What the run record says of float32: the rule, and whether TF32 was allowed and could act on this device."""
    rule = float32_rule(precision, fp32_rule)
    tf32_hardware = device is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
    return {"rule": rule, "TF32 matrix multiplies": torch.backends.cuda.matmul.allow_tf32,
            "TF32 cuDNN convolutions": torch.backends.cudnn.allow_tf32, "TF32 on this device": tf32_hardware}


def to_device(array, device):
    """A batch (numpy or torch) on the device; on a GPU through pinned memory, so that the copy does not block."""
    tensor = torch.as_tensor(array)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
