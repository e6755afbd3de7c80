"""vit_part3_posemb.py and the Imagenette layer, on stand-ins built here (a tiny ViT, generated JPEGs)."""
import io
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import scipy.ndimage
import torch
from conftest import ARTICLE, ROOT, article_block
from PIL import Image
from standins import imagenette_folder, tiny_vit_classifier
from transformers import ViTForImageClassification

import vit_part3_posemb as posemb
from common.device import set_precision
from common.errors import UserError
from common.imagenette import check_counts, download_and_extract, imagenet_indices, list_split, load_rgb, preprocess


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    return tiny_vit_classifier(tmp_path_factory.mktemp("vit"))


# ---------------------------------------------------------------- the stretch rules

def test_tiny_grid_of_the_article():
    assert posemb.section_tiny_grid() == {"2x2 top middle": 0.5, "2x2 middle left": 1.0, "2x2 centre": 1.5}


@pytest.mark.parametrize("n_old,n_new", [(2, 3), (7, 12), (14, 24), (5, 5), (6, 4)])
def test_bilinear_loop_equals_scipy_zoom(n_old, n_new):
    grid = np.random.default_rng(n_old).normal(size=(n_old, n_old, 3))
    expected = scipy.ndimage.zoom(grid, (n_new / n_old, n_new / n_old, 1), order=1)
    assert np.abs(posemb.bilinear_resize_loop(grid, n_new) - expected).max() < 1e-12


def test_new_row_5_of_the_article():
    lower, delta = posemb.stretch_positions(14, 24)[5]
    assert lower == 2 and delta == pytest.approx(5 * 13 / 23 - 2)  # 0.8261 of old row 3


def test_bicubic_gives_the_library_logits(tiny_classifier):
    from transformers import ViTForImageClassification

    model = ViTForImageClassification.from_pretrained(tiny_classifier).eval()
    pixels = torch.randn(2, 3, 384, 384)
    with torch.no_grad():
        library = model(pixel_values=pixels, interpolate_pos_encoding=True).logits
        table = model.vit.embeddings.position_embeddings[0]
        stretched = posemb.bicubic_resize(table[1:].reshape(14, 14, -1).numpy(), 24).reshape(576, -1)
        model.vit.embeddings.position_embeddings.data = torch.cat([table[:1], stretched])[None]
        ours = model(pixel_values=pixels, interpolate_pos_encoding=True).logits
    assert torch.equal(ours, library)


def test_1d_and_zero_tables():
    table = np.random.default_rng(0).normal(size=(1 + 14 * 14, 8))
    tables = posemb.position_tables(table, 24)
    assert tables["2D bilinear"].shape == tables["1D"].shape == tables["zeros"].shape == (577, 8)
    one_d = tables["1D"]
    assert np.array_equal(one_d[0], table[0])  # the [class] row is kept
    assert np.allclose(one_d[[1, -1]], table[[1, -1]])  # the list's ends stay
    assert np.allclose(one_d[2], table[1] + (table[2] - table[1]) * 195 / 575)  # one step of 195/575 along the list
    assert not tables["zeros"].any()


def test_accuracy_of_10_and_of_1000_by_hand():
    imagenet_classes = [0, 217, 482]  # three classes of the head of 1000
    logits = torch.full((3, 1000), -5.0)
    logits[0, 0] = 1.0                       # right of 10 and of 1000
    logits[1, 217], logits[1, 5] = 1.0, 2.0  # right of 10 (217 beats 0, 482), wrong of 1000 (class 5 wins)
    logits[2, 0] = 1.0                       # wrong: label 2 is 482
    assert posemb.accuracy_counts(logits, torch.tensor([0, 1, 2]), imagenet_classes) == (2, 1)


# ---------------------------------------------------------------- Imagenette

def test_preprocessing_equals_the_library_processor(pictures):
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    for path, _ in list_split(pictures, "val")[:3]:
        image = load_rgb(path)
        for resolution in (224, 384):
            processor = ViTImageProcessorPil(size={"height": resolution, "width": resolution})
            expected = processor(images=image, return_tensors="np")["pixel_values"][0]
            assert np.abs(preprocess(image, resolution) - expected).max() < 1e-6


def test_grayscale_and_cmyk_become_rgb(pictures):
    modes = {Image.open(path).mode for path, _ in list_split(pictures, "train")}
    assert {"L", "CMYK", "RGB"} <= modes
    assert {load_rgb(path).mode for path, _ in list_split(pictures, "train")} == {"RGB"}


def test_unreadable_picture_names_its_path(tmp_path):
    bad = tmp_path / "broken.JPEG"
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(UserError, match="broken.JPEG"):
        load_rgb(bad)


def test_per_class_subsets_are_the_first_files(pictures):
    subset = list_split(pictures, "val", per_class=2)
    assert len(subset) == 20 and [p.name for p, _ in subset[:2]] == ["n01440764_0000.JPEG", "n01440764_0001.JPEG"]
    assert imagenet_indices(pictures)[-1] == 701  # parachute


def test_incomplete_imagenette_is_reported(tmp_path):
    root = imagenette_folder(tmp_path / "imagenette2-160", per_class=1)
    with pytest.raises(UserError, match="found 10 of 9,469 training pictures"):
        check_counts(root)


def test_own_classes_work_without_imagenette_counts(tmp_path):
    root = imagenette_folder(tmp_path / "imagenette2-160", per_class=1, classes=["cats", "dogs"])
    check_counts(root)
    assert [label for _, label in list_split(root, "val")] == [0, 1]


def archive_of(folder, broken=False):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    data = buffer.getvalue()
    return data[: len(data) // 2] if broken else data


def test_download_is_all_or_nothing(tmp_path):
    source = imagenette_folder(tmp_path / "src" / "mine", per_class=1, classes=["a", "b"])
    target = tmp_path / "data" / "mine"
    archive = tmp_path / "mine.tgz"
    archive.write_bytes(archive_of(source, broken=True))
    with pytest.raises(UserError, match="could not extract"):
        download_and_extract(archive.as_uri(), target, progress=False)
    assert not target.exists() and list((tmp_path / "data").iterdir()) == []  # no half folder, no leftovers
    archive.write_bytes(archive_of(source))
    download_and_extract(archive.as_uri(), target, progress=False)
    assert len(list_split(target, "val")) == 2 and list((tmp_path / "data").iterdir()) == [target]


# ---------------------------------------------------------------- the script

def test_script_end_to_end_on_stand_ins(tiny_classifier, pictures, tmp_path):
    run = subprocess.run([sys.executable, "vit_part3_posemb.py", "--model", str(tiny_classifier), "--data-dir",
                          str(pictures), "--per-class", "2", "--batch-size", "8", "--compare",
                          "--json", str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr
    for start in ("== 1.", "== 2.", "== 3.", "== 4."):
        assert start in run.stdout
    assert run.stdout.count("(of 1000)") == 5 and "20 pictures" in run.stdout
    assert "max |difference| 0.0e+00" in run.stdout
    assert "Traceback" not in run.stderr


def test_bf16_changes_the_accuracies_by_at_most_a_tenth_of_a_point(tiny_classifier, pictures):
    model = ViTForImageClassification.from_pretrained(tiny_classifier).eval()
    items = list_split(pictures, "val", per_class=4)
    images, labels = posemb.decode_pictures(items), torch.tensor([label for _, label in items])
    classes = imagenet_indices(pictures)
    cpu = torch.device("cpu")
    for resolution in (224, 384):
        fp32 = posemb.evaluate(model, images, labels, resolution, cpu, 8, classes, "", set_precision(cpu, "fp32"))
        bf16 = posemb.evaluate(model, images, labels, resolution, cpu, 8, classes, "", set_precision(cpu, "bf16"))
        assert all(abs(b - f) / len(items) * 100 <= 0.1 for f, b in zip(fp32, bf16)), (resolution, fp32, bf16)


def test_script_offline_without_weights_says_what_is_missing():
    run = subprocess.run([sys.executable, "vit_part3_posemb.py"], cwd=ROOT, capture_output=True, text=True, check=False,
                         timeout=120)
    assert run.returncode == 1
    if ARTICLE.exists():
        block = article_block("== 1. resize a 2x2 grid")
        assert len(block) == 6 and all(text_line in run.stdout.splitlines() for text_line in block)
    assert "cannot run this section: checkpoint google/vit-base-patch16-224 is not in the local" in run.stdout
    assert "Traceback" not in run.stderr
