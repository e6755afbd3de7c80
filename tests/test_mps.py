"""Apple's mps rules, held without a Mac: no float64 tensor anywhere, no forked loader, precisions that exist.

On mps, .double() raises "Cannot convert a MPS Tensor to float64 dtype"; a torch dispatch mode that
refuses every float64 result plays that part here, on the CPU. numpy's float64 is allowed.
"""
import argparse
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import vit_part3_fewshot
import vit_part3_finetune
import vit_part3_posemb
from common.data import picture_loader, start_loader
from common.run import begin, conclude, section, set_precision
from common.start_and_end import UserError
from job.standins import vit_classifier


class NoFloat64(TorchDispatchMode):
    """Every torch operation that returns a float64 tensor fails, as on Apple's mps backend."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_leaves(result)):
            raise TypeError(f"Cannot convert a MPS Tensor to float64 dtype ({func})")
        return result


def test_the_mode_refuses_float64():
    with NoFloat64(), pytest.raises(TypeError, match="float64"):
        torch.ones(2).double()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return vit_classifier(tmp_path_factory.mktemp("classifier"))


def printed_lines(main, argv, tmp_path, name):
    """Every line a run printed, its seconds masked."""
    import json
    import re

    path = tmp_path / f"{name}.json"
    assert main(argv + ["--json", str(path)]) == 0
    return [re.sub(r"[\d.]+ s\b", "<seconds>", line) for line in json.loads(path.read_text())["printed"]]


@pytest.mark.parametrize("script", ["posemb", "fewshot", "finetune"])
def test_the_weight_dependent_scripts_use_no_float64_tensor(script, classifier, tiny_in21k, pictures, tmp_path,
                                                            monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    data = ["--data-dir", str(pictures), "--device", "cpu"]
    main, argv = {
        "posemb": (vit_part3_posemb.main, ["--model", str(classifier), "--per-class", "2", "--batch-size", "8"]),
        "fewshot": (vit_part3_fewshot.main, ["--model", str(tiny_in21k), "--pool", "3", "--shots", "1", "3",
                                             "--draws", "2", "--no-cache"]),
        "finetune": (vit_part3_finetune.main, ["--model", str(tiny_in21k), "--steps", "3", "--batch-size", "4",
                                               "--resolution", "256"]),  # 256: the table is stretched too
    }[script]
    as_usual = printed_lines(main, argv + data, tmp_path, "usual")
    with NoFloat64():
        as_on_a_mac = printed_lines(main, argv + data, tmp_path, "no-float64")
    assert len(as_usual) > 20 and as_on_a_mac == as_usual


@pytest.mark.parametrize("platform", ["darwin", "linux", "win32"])
def test_the_loader_never_forks(platform, monkeypatch):
    monkeypatch.setattr(sys, "platform", platform)
    loader = picture_loader([], 32, 4, torch.device("cpu"), workers=2)
    assert loader.multiprocessing_context.get_start_method() == "spawn"


def test_spawned_workers_build_the_same_batches(pictures):
    """What macOS runs: the dataset, its collation and the workers' set-up must survive pickling into a new process."""
    import numpy as np

    from common.data import list_split, load_rgb

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]
    flips, decoded = np.arange(10) % 2 == 0, [load_rgb(path) for path in paths]
    inline = list(start_loader(picture_loader(decoded, 32, 4, torch.device("cpu"), flips, workers=0))[0])
    strategy = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")  # macOS's: shared pictures travel by file name there
    try:
        spawned = list(start_loader(picture_loader(decoded, 32, 4, torch.device("cpu"), flips, workers=1))[0])
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)
    assert all(torch.equal(a, b) for a, b in zip(inline, spawned, strict=True))


@pytest.mark.parametrize("device,precision,refused", [
    ("cpu", "tf32", "NVIDIA GPUs only"), ("mps", "tf32", "NVIDIA GPUs only"), ("cpu", "fp16", "choose one of"),
])
def test_precisions_that_do_not_exist_are_refused(device, precision, refused):
    with pytest.raises(UserError, match=refused):
        set_precision(torch.device(device), precision)


def test_an_operation_missing_on_mps_names_the_fallback(capsys):
    @section
    def section_with_a_missing_operation(report):
        """2. a section"""
        raise NotImplementedError("The operator 'aten::upsample_bicubic2d.out' is not currently implemented for MPS")

    args = argparse.Namespace(compare=False, json=None, precision="fp32")
    run, report = begin("posemb", args, device=torch.device("mps"))
    section_with_a_missing_operation(report)
    status = conclude(run, report)
    out = capsys.readouterr().out
    assert status == 1 and 'cannot run section "2. a section"' in out and "PYTORCH_ENABLE_MPS_FALLBACK=1" in out
