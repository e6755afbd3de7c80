"""vit_part3_posemb.py and the Imagenette layer, on stand-ins built here (a tiny ViT, generated JPEGs)."""
import subprocess
import sys

import numpy as np
import pytest
import scipy.ndimage
import torch
from conftest import ARTICLE, ROOT, article_block
from transformers import ViTForImageClassification

import vit_part3_posemb as posemb
from common import position_table
from common.device import set_precision
from common.imagenette import imagenet_indices, list_split, load_all
from common.output import Report
from job.standins import vit_classifier


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    return vit_classifier(tmp_path_factory.mktemp("vit"))


# ---------------------------------------------------------------- the stretch rules

def test_tiny_grid_of_the_article():
    report = Report("posemb")
    posemb.section_tiny_grid(None, report)
    numbers = {name: number["value"] for name, number in report.numbers.items()}
    assert (numbers["2x2 top middle"], numbers["2x2 middle left"], numbers["2x2 centre"]) == (0.5, 1.0, 1.5)
    assert [numbers[f"3x3 grid[2,{j}]"] for j in (1, 2, 3)] == [1.0, 1.5, 2.0]  # (0+2)/2, the centre, (1+3)/2


@pytest.mark.parametrize("n_old,n_new", [(2, 3), (7, 12), (14, 24), (5, 5), (6, 4)])
def test_bilinear_loop_equals_scipy_zoom(n_old, n_new):
    grid = np.random.default_rng(n_old).normal(size=(n_old, n_old, 3))
    expected = scipy.ndimage.zoom(grid, (n_new / n_old, n_new / n_old, 1), order=1)
    assert np.abs(position_table.bilinear_resize_loop(grid, n_new) - expected).max() < 1e-12


def test_new_row_5_of_the_article():
    lower, delta = position_table.stretch_positions(14, 24)[5]
    assert lower == 2 and delta == pytest.approx(5 * 13 / 23 - 2)  # 0.8261 of old row 3


def test_bicubic_gives_the_library_logits(tiny_classifier):
    from transformers import ViTForImageClassification

    model = ViTForImageClassification.from_pretrained(tiny_classifier).eval()
    pixels = torch.randn(2, 3, 384, 384)
    with torch.no_grad():
        library = model(pixel_values=pixels, interpolate_pos_encoding=True).logits
        table = model.vit.embeddings.position_embeddings[0]
        stretched = position_table.bicubic_resize(table[1:].reshape(14, 14, -1).numpy(), 24).reshape(576, -1)
        model.vit.embeddings.position_embeddings.data = torch.cat([table[:1], stretched])[None]
        ours = model(pixel_values=pixels, interpolate_pos_encoding=True).logits
    assert torch.equal(ours, library)


def test_1d_and_zero_tables():
    table = np.random.default_rng(0).normal(size=(1 + 14 * 14, 8))
    tables = position_table.position_tables(table, 24)
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


# ---------------------------------------------------------------- the script

def test_script_end_to_end_on_stand_ins(tiny_classifier, pictures, tmp_path):
    """On the CPU: "max |difference| 0.0e+00" is the CPU's arithmetic (test_gpu.py runs the script on CUDA)."""
    run = subprocess.run([sys.executable, "vit_part3_posemb.py", "--model", str(tiny_classifier), "--data-dir",
                          str(pictures), "--per-class", "2", "--batch-size", "8", "--device", "cpu", "--compare",
                          "--json", str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True, check=False,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    for start in ("== 1.", "== 2.", "== 3.", "== 4."):
        assert start in run.stdout
    assert run.stdout.count("(of 1000)") == 5 and "20 pictures" in run.stdout
    assert "max |difference| 0.0e+00" in run.stdout
    assert "Traceback" not in run.stderr


def test_bf16_changes_the_accuracies_by_at_most_a_tenth_of_a_point(tiny_classifier, pictures):
    model = ViTForImageClassification.from_pretrained(tiny_classifier).eval()
    items = list_split(pictures, "val", per_class=4)
    images, labels = load_all([path for path, _ in items]), torch.tensor([label for _, label in items])
    classes = imagenet_indices(pictures)
    cpu = torch.device("cpu")
    for resolution in (224, 384):
        fp32 = posemb.evaluate(model, images, labels, resolution, cpu, 8, classes, "", set_precision(cpu, "fp32"))[:2]
        bf16 = posemb.evaluate(model, images, labels, resolution, cpu, 8, classes, "", set_precision(cpu, "bf16"))[:2]
        assert all(abs(b - f) / len(items) * 100 <= 0.1 for f, b in zip(fp32, bf16)), (resolution, fp32, bf16)


def test_script_offline_without_weights_says_what_is_missing():
    run = subprocess.run([sys.executable, "vit_part3_posemb.py"], cwd=ROOT, capture_output=True, text=True, check=False,
                         timeout=120)
    assert run.returncode == 1
    if ARTICLE.exists():
        block = article_block("== 1. resize a 2x2 grid")
        assert len(block) == 6 and all(text_line in run.stdout.splitlines() for text_line in block)
    assert 'cannot run section "2. the position table": checkpoint google/vit-base-patch16-224 is not' in run.stdout
    assert "Traceback" not in run.stderr
