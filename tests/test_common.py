"""common/: device picking and precision, batches of pictures, checkpoint errors, the comparison with the article."""
import sys

import numpy as np
import pytest
import torch

from common.checkpoints import load_pretrained
from common.cli import guarded
from common.device import pick_device
from common.errors import UserError
from common.reference import compare_with_article, load_reference


def test_auto_device_is_one_that_exists():
    assert pick_device("auto").type in ("cuda", "mps", "cpu")
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there")
def test_missing_gpu_is_a_one_line_error():
    with pytest.raises(UserError, match="--device cuda"):
        pick_device("cuda")


def test_unknown_device_is_a_one_line_error():
    with pytest.raises(UserError, match="unknown device"):
        pick_device("tpu")


def test_guarded_turns_a_user_error_into_exit_2(capsys):
    def main():
        raise UserError("no such thing; do this instead")

    assert guarded(main) == 2
    assert capsys.readouterr().err.strip() == "error: no such thing; do this instead"


def test_missing_checkpoint_offline_names_it_and_the_fix():
    from transformers import ViTModel

    with pytest.raises(UserError) as problem:
        load_pretrained(ViTModel, "google/vit-not-a-real-checkpoint")
    message = str(problem.value)
    assert "google/vit-not-a-real-checkpoint" in message and "--model" in message and "\n" not in message


def test_a_directory_without_a_checkpoint_is_reported(tmp_path):
    from transformers import ViTModel

    with pytest.raises(UserError, match="not a saved checkpoint directory"):
        load_pretrained(ViTModel, str(tmp_path))


def test_comparison_reports_a_differing_number():
    reference = {"a": {"article": "34.9"}, "b": {"article": "1,035,645"}, "c": {"article": "4.0e-04"},
                 "d": {"article": "99.54", "tolerance": 0.5}, "e": {"article": "1.0"}}
    results = {"a": 34.8911, "b": 1_035_646, "c": 4.04e-4, "d": 99.1}
    rows = {name: (run, same) for name, _, run, same in compare_with_article(results, reference)}
    assert rows["a"] == ("34.9", True)
    assert rows["b"] == ("1,035,646", False)
    assert rows["c"] == ("4.0e-04", True)
    assert rows["d"][1] is True
    assert rows["e"] == (None, False)  # not measured by this run: never counted as reproduced
    assert compare_with_article({"a": 34.96}, {"a": {"article": "34.9"}})[0][3] is False


def test_every_reference_file_is_labelled():
    reference = load_reference("setup")
    assert len(reference) > 100 and all("article" in entry for entry in reference.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there")
def test_script_with_a_missing_device_exits_2(capsys):
    import vit_part3_fewshot

    assert guarded(lambda: vit_part3_fewshot.main(["--device", "cuda"])) == 2
    assert capsys.readouterr().err.startswith("error: --device cuda")


@pytest.mark.parametrize("workers", [0, 1, 2])  # inline; one thread; two worker processes
def test_picture_batches_keep_the_order_and_flip_what_they_are_told(pictures, workers):
    from common.imagenette import list_split, load_rgb, picture_batches, preprocess, to_pixels

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]  # 10 pictures, gray and CMYK among them
    flips = np.arange(10) % 3 == 0
    batches = list(picture_batches(paths, 32, 4, flips, workers))
    assert [len(b) for b in batches] == [4, 4, 2] and batches[0].dtype == np.uint8
    batches = [to_pixels(batch, torch.device("cpu")).numpy() for batch in batches]
    expected = [preprocess(load_rgb(path), 32) for path in paths]
    expected = [np.flip(a, axis=2) if flip else a for a, flip in zip(expected, flips)]  # axis 2: left-right
    assert np.array_equal(np.concatenate(batches), np.stack(expected))


def test_precision_flags():
    from common.device import set_precision

    cpu = torch.device("cpu")
    with set_precision(cpu, "bf16"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with set_precision(cpu, "fp32"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(UserError, match="--precision fp16"):
        set_precision(cpu, "fp16")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_kept_on_linux():
    from common.device import keep_freed_memory

    assert keep_freed_memory()
