"""common/run.py: the device a flag names, a missing or unknown one as one line, the precision flags and the fp32
rule, freed memory kept on Linux."""
import subprocess
import sys

import pytest
import torch
from conftest import without_a_gpu

from common.run import pick_device
from common.start_and_end import UserError


def test_auto_device_is_one_that_exists():
    assert pick_device("auto").type in ("cuda", "mps", "cpu")
    assert pick_device("cpu") == torch.device("cpu")


def test_missing_gpu_is_a_one_line_error():
    code = "import torch\nfrom common.run import pick_device\nprint(torch.cuda.is_available())\npick_device('cuda')"
    run = without_a_gpu([sys.executable, "-c", code])
    assert run.stdout == "False\n" and run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1].startswith("common.start_and_end.UserError: --device cuda: ")


def test_unknown_device_is_a_one_line_error():
    with pytest.raises(UserError, match="unknown device"):
        pick_device("tpu")


def test_precision_flags():
    from common.run import set_precision

    cpu = torch.device("cpu")
    with set_precision(cpu, "bf16"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with set_precision(cpu, "fp32"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(UserError, match="--precision fp16"):
        set_precision(cpu, "fp16")


def test_the_fp32_rule_torch_defaults_is_what_a_fresh_torch_has_and_strict_allows_no_tf32():
    from common.run import FP32_RULES, set_precision

    read = "import torch; print(torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)"
    fresh = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, check=True)
    assert fresh.stdout.split() == [str(flag) for flag in FP32_RULES["torch defaults"]]
    cpu = torch.device("cpu")
    # given back by hand, not by monkeypatch: torch's cuBLAS module answers allow_tf32 through __getattr__, and
    # pytest 9.2's undo deletes an attribute it did not find in the object's __dict__ (AttributeError at teardown)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for precision, rule, expected in (("fp32", "strict", (False, False)), ("fp32", "torch defaults", (False, True)),
                                          ("fp32-strict", "torch defaults", (False, False)),
                                          ("bf16", "strict", (False, False))):
            set_precision(cpu, precision, rule)
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == expected, (precision,
                                                                                                         rule)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_kept_on_linux():
    from common.run import keep_freed_memory

    assert keep_freed_memory()
