"""vit_part3_posemb.py and the Imagenette layer, on stand-ins built here (a tiny ViT, generated JPEGs); the position
table's layout, its stretches to a bigger grid and the cosine map, against values worked out by hand and against SciPy,
torch and the library's interpolate_pos_encoding."""
import math
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.ndimage
import torch
import torch.nn.functional as F
from conftest import ARTICLE, ROOT, article_block, script_output, tiny_vit
from PIL import Image
from transformers import ViTForImageClassification

import vit_part3_posemb as posemb
from common.data import class_folders, list_split, load_rgb, run_model
from common.pretrained import ARTICLE_PIXELS
from common.run import Report, set_precision
from common.start_and_end import UserError
from compare.record import named
from job.standins import vit_classifier


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    return vit_classifier(tmp_path_factory.mktemp("vit"))


# ---------------------------------------------------------------- the table: the [class] row, then the grid row-major

def test_table_row_1_plus_r_n_plus_c_is_grid_place_r_c():
    n = 3
    table = np.array([[-1.0, -1.0]] + [[r, c] for r in range(n) for c in range(n)], dtype=np.float64)
    class_row, grid = posemb.split_table(table)
    assert class_row.tolist() == [[-1.0, -1.0]]
    assert grid.shape == (n, n, 2)
    assert [[grid[r, c].tolist() for c in range(n)] for r in range(n)] == [
        [[0, 0], [0, 1], [0, 2]], [[1, 0], [1, 1], [1, 2]], [[2, 0], [2, 1], [2, 2]]]


def test_the_stretched_table_keeps_row_major_order():
    """Rows (r, c) = [r, c, 1] on 3x3: bilinear interpolation keeps a linear function exactly, so on 5x5 table row
    1 + R 5 + C is [R (3-1)/(5-1), C (3-1)/(5-1), 1] = [R/2, C/2, 1], and the [class] row is kept."""
    table = np.array([[7.0, 7.0, 7.0]] + [[r, c, 1.0] for r in range(3) for c in range(3)])
    stretched = posemb.position_tables(table, 5)["2D bilinear"]
    assert stretched.shape == (26, 3)
    assert stretched[0].tolist() == [7.0, 7.0, 7.0]
    expected = [[R / 2, C / 2, 1.0] for R in range(5) for C in range(5)]
    np.testing.assert_allclose(stretched[1:], expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- where each new row reads the old grid

def test_a_stretch_needs_two_places_on_each_side():
    assert posemb.stretch_positions(2, 2) == [(0, 0.0), (0, 1.0)]
    assert posemb.stretch_positions(2, 3) == [(0, 0.0), (0, 0.5), (0, 1.0)]  # the last row: (n_old - 2, 1.0)
    for n_old, n_new in ((1, 5), (5, 1), (1, 1)):
        with pytest.raises(UserError, match="cannot be stretched"):
            posemb.stretch_positions(n_old, n_new)


def test_new_row_5_of_the_article():
    lower, delta = posemb.stretch_positions(14, 24)[5]
    assert lower == 2 and delta == pytest.approx(5 * 13 / 23 - 2)  # 0.8261 of old row 3


# ---------------------------------------------------------------- the bilinear stretches

# A 3x3 grid of 0 but a 1 in its last corner, stretched to 5x5: the new places sit at old 0, 0.5, 1, 1.5, 2 on each
# axis, where linear interpolation reads the ramp t = 0, 0, 0, 0.5, 1, so cell (R, C) is t[R] t[C]. (Not symmetric:
# a bump in the centre comes out the same from a quadratic spline.)
BUMP = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
RAMP = [0.0, 0.0, 0.0, 0.5, 1.0]
BUMP_5X5 = [[a * b for b in RAMP] for a in RAMP]
ARTICLE_2X2, ARTICLE_3X3 = [[0.0, 1.0], [2.0, 3.0]], [[0.0, 0.5, 1.0], [1.0, 1.5, 2.0], [2.0, 2.5, 3.0]]


@pytest.mark.parametrize("stretch", [posemb.bilinear_resize_loop, posemb.scipy_resize])
def test_both_bilinear_stretches_by_hand(stretch):
    """The article's 2x2 -> 3x3 and the bump, each as a grid of 1-number rows and of 2-number rows."""
    for grid, n_new, expected in ((ARTICLE_2X2, 3, ARTICLE_3X3), (BUMP, 5, BUMP_5X5)):
        two = np.stack([np.array(grid), -np.array(grid)], axis=2)  # rows [v, -v]
        np.testing.assert_allclose(stretch(two, n_new), np.stack([expected, -np.array(expected)], axis=2), atol=1e-12)


def test_the_scipy_stretch_of_a_grid_of_plain_numbers():
    np.testing.assert_allclose(posemb.scipy_resize(np.array(BUMP), 5), BUMP_5X5, atol=1e-12)


@pytest.mark.parametrize("n_old,n_new", [(2, 3), (7, 12), (14, 24), (5, 5), (6, 4)])
def test_bilinear_loop_equals_scipy_zoom(n_old, n_new):
    grid = np.random.default_rng(n_old).normal(size=(n_old, n_old, 3))
    expected = scipy.ndimage.zoom(grid, (n_new / n_old, n_new / n_old, 1), order=1)
    assert np.abs(posemb.bilinear_resize_loop(grid, n_new) - expected).max() < 1e-12


# ---------------------------------------------------------------- the library's bicubic stretch, the 1D and zero tables

def test_the_bicubic_stretch_is_the_librarys_interpolate_pos_encoding():
    """posemb.bicubic_resize() against transformers' ViTEmbeddings.interpolate_pos_encoding on a 3x3 grid of
    4-number rows, stretched to 5x5 (20 px of 4-px patches)."""
    model = tiny_vit(image_size=12, patch_size=4)
    table = model.vit.embeddings.position_embeddings.detach()[0]
    with torch.no_grad():
        library = model.vit.embeddings.interpolate_pos_encoding(torch.zeros(1, 26, 4), 20, 20)[0]
    _, grid = posemb.split_table(table.numpy().astype(np.float64))
    assert torch.equal(posemb.bicubic_resize(grid, 5).reshape(25, 4), library[1:])
    assert torch.equal(library[0], table[0])


def test_1d_and_zero_tables():
    table = np.random.default_rng(0).normal(size=(1 + 14 * 14, 8))
    tables = posemb.position_tables(table, 24)
    assert tables["2D bilinear"].shape == tables["1D"].shape == tables["zeros"].shape == (577, 8)
    one_d = tables["1D"]
    assert np.array_equal(one_d[0], table[0])  # the [class] row is kept
    assert np.allclose(one_d[[1, -1]], table[[1, -1]])  # the list's ends stay
    assert np.allclose(one_d[2], table[1] + (table[2] - table[1]) * 195 / 575)  # one step of 195/575 along the list
    assert not tables["zeros"].any()


# ---------------------------------------------------------------- the cosine-similarity map

def test_cosine_map_by_hand():
    """Grid rows [1, 0], [0, 1] / [1, 1], [-1, 0] against place (0, 0) = [1, 0]: 1, 0, 1/sqrt(2), -1."""
    grid = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [-1.0, 0.0]]])
    np.testing.assert_allclose(posemb.cosine_similarities(grid, (0, 0)), [[1, 0], [1 / math.sqrt(2), -1]], atol=1e-15)
    # against place (1, 0) = [1, 1]: 1/sqrt(2), 1/sqrt(2) / 1, -1/sqrt(2)
    np.testing.assert_allclose(posemb.cosine_similarities(grid * 3.0, (1, 0)),
                               [[1 / math.sqrt(2), 1 / math.sqrt(2)], [1, -1 / math.sqrt(2)]], atol=1e-15)


@pytest.mark.parametrize("place", [(1, 2), (3, 0), (0, 3)])
def test_cosine_map_is_torchs_cosine_similarity_with_table_row_1_plus_r_n_plus_c(place):
    n, d = 4, 6
    table = np.random.default_rng(3).normal(size=(1 + n * n, d)) + 0.5
    _, grid = posemb.split_table(table)
    rows = torch.from_numpy(table[1:])
    expected = F.cosine_similarity(rows, rows[place[0] * n + place[1]][None], dim=1).reshape(n, n)
    np.testing.assert_allclose(posemb.cosine_similarities(grid, place), expected.numpy(), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- the stretch rules

def test_tiny_grid_of_the_article():
    report = Report("posemb")
    posemb.section_tiny_grid(report)
    numbers = {name: number["value"] for name, number in named(report.script, report.given)[0].items()}
    assert (numbers["2x2 top middle"], numbers["2x2 middle left"], numbers["2x2 centre"]) == (0.5, 1.0, 1.5)
    assert [numbers[f"3x3 grid[2,{j}]"] for j in (1, 2, 3)] == [1.0, 1.5, 2.0]  # (0+2)/2, the centre, (1+3)/2


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


# ---------------------------------------------------------------- the sections' grids, places and counts

def test_accuracy_of_10_and_of_1000_by_hand():
    """The head read at 3 classes (0, 217, 482 of 1000): 3 pictures, then 4 (more pictures than classes)."""
    imagenet_classes = [0, 217, 482]  # three classes of the head of 1000
    logits = torch.full((3, 1000), -5.0)
    logits[0, 0] = 1.0                       # right of 10 and of 1000
    logits[1, 217], logits[1, 5] = 1.0, 2.0  # right of 10 (217 beats 0, 482), wrong of 1000 (class 5 wins)
    logits[2, 0] = 1.0                       # wrong: label 2 is 482
    assert posemb.accuracy_counts(logits, torch.tensor([0, 1, 2]), imagenet_classes) == (2, 1)
    logits = torch.full((4, 1000), -5.0)
    logits[0, 0] = 1.0                        # label 0: right of 10 and of 1000
    logits[1, 217] = 1.0                      # label 1: right of both
    logits[2, 482], logits[2, 7] = 1.0, 3.0   # label 2: right of 10, wrong of 1000 (class 7 wins)
    logits[3, 217] = 1.0                      # label 0: wrong of both
    assert posemb.accuracy_counts(logits, torch.tensor([0, 1, 2, 0]), imagenet_classes) == (3, 2)


def test_each_class_folder_reads_its_imagenet_1k_index(pictures, tmp_path):
    """The indices of ImageNet-1k's class list (tench 0 ... parachute 701); a class outside Imagenette is refused."""
    folders = class_folders(pictures, "val")
    assert posemb.imagenet_indices(pictures, folders) == [0, 217, 482, 491, 497, 566, 569, 571, 574, 701]
    with pytest.raises(UserError, match="classes outside Imagenette \\(n99999999\\)"):
        posemb.imagenet_indices(tmp_path, ["n99999999"])


def test_grids_are_whole_patches_per_side():
    config = SimpleNamespace(image_size=224, patch_size=16)
    assert posemb.grids(config, 384) == (14, 24)
    assert posemb.grids(config, 390) == (14, 24)  # 390 / 16 = 24.4: the last 6 pixels make no patch


def test_the_cosine_section_needs_a_3x3_grid_and_a_bigger_one():
    """A row with four neighbours needs 3 places a side; the stretch needs more places than the checkpoint has."""
    posemb.check_resolution(SimpleNamespace(image_size=48, patch_size=16), 64)  # 3x3 -> 4x4: fine
    for image_size, resolution in ((32, 64), (48, 48), (48, 32)):  # 2x2 -> 4x4; 3x3 -> 3x3; 3x3 -> 2x2
        with pytest.raises(UserError):
            posemb.check_resolution(SimpleNamespace(image_size=image_size, patch_size=16), resolution)


@pytest.mark.parametrize("n_old,n_new,expected", [
    (14, 24, ((3, 10), (5, 18))),  # the article's: 3 x 23/13 = 5.31 -> 5, 10 x 23/13 = 17.7 -> 18
    (3, 5, ((1, 1), (2, 2))),      # 3 x 2/13 = 0.46 -> 0, raised to 1; 10 x 2/13 = 1.54 -> 2, lowered to n - 2 = 1
    (5, 9, ((1, 3), (2, 6))),      # 3 x 4/13 = 0.92 -> 1; 10 x 4/13 = 3.08 -> 3; then x 8/4
])
def test_the_cosine_sections_place_on_both_grids_by_hand(n_old, n_new, expected):
    assert posemb.example_places(n_old, n_new) == expected


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


def test_the_first_row_names_the_checkpoints_own_resolution_and_section_4_the_pictures_sides(pictures, tmp_path,
                                                                                             capsys):
    """A 48-px checkpoint (the job's stand-in's size) is read at 48 in the first row, which says so; section 4's title
    gives the pictures' short sides as they are (one class's 120x90 here, the others' 160), not imagenette2-160's."""
    model = vit_classifier(tmp_path / "vit-48", image_size=48)
    data = shutil.copytree(pictures, tmp_path / "nette")
    for path in (data / "val" / "n01440764").iterdir():
        Image.new("RGB", (120, 90), "olive").save(path, "JPEG")
    status, out, _ = script_output(posemb.main, ["--model", str(model), "--data-dir", str(data), "--per-class",
                                                 "1", "--device", "cpu"], capsys)
    assert status == 0 and "\n  48, the training resolution (9 patches)   " in out
    assert "== 4. accuracy on the Imagenette validation set: 10 pictures (90 to 160 px on the short side), " in out


def test_a_folder_of_fewer_classes_reads_the_head_at_those(pictures, tmp_path, capsys):
    """Three of Imagenette's classes: the head is read at 3 of them, each accuracy of 3 (chance 33%), not "of 10"."""
    model = vit_classifier(tmp_path / "vit-48", image_size=48)
    data = shutil.copytree(pictures, tmp_path / "three")
    for split in ("train", "val"):
        for folder in sorted((data / split).iterdir())[3:]:
            shutil.rmtree(folder)
    status, out, _ = script_output(posemb.main, ["--model", str(model), "--data-dir", str(data), "--device", "cpu"],
                                   capsys)
    rows = [line for line in out.splitlines() if "% (of " in line]
    assert status == 0 and "  the ImageNet head of the checkpoint is read at the 3 Imagenette classes; " in out
    assert len(rows) == 5 and all("% (of 3)   " in line for line in rows), rows


@pytest.mark.parametrize(("resolution", "note"), [
    (64, None),  # 4 patches of 16: every pixel in one
    (72, ("  --resolution 72 is not a multiple of the patch size 16: the last 8 pixels of each side fall outside the "
         "patches")),
])
def test_a_resolution_that_is_not_a_multiple_of_the_patch_says_which_pixels_no_patch_holds(resolution, note, pictures,
                                                                                           tmp_path, capsys):
    model = vit_classifier(tmp_path / "vit-48", image_size=48)  # 3x3 patches of 16
    status, out, _ = script_output(posemb.main, ["--model", str(model), "--data-dir", str(pictures), "--per-class",
                                                 "1", "--device", "cpu", "--resolution", str(resolution)], capsys)
    lines = out.splitlines()
    assert status == 0 and f"  at {resolution} pixels: {resolution}/16 = 4 patches per side, N = 16, so 17 rows are " \
                           "needed: 7 rows do not exist" in lines
    assert [line for line in lines if "not a multiple of the patch size" in line] == ([note] if note else [])


def test_bf16_changes_the_accuracies_by_at_most_a_tenth_of_a_point(tiny_classifier, pictures):
    model = ViTForImageClassification.from_pretrained(tiny_classifier).eval()
    items = list_split(pictures, "val", per_class=4)
    images, labels = [load_rgb(path) for path, _ in items], torch.tensor([label for _, label in items])
    classes = posemb.imagenet_indices(pictures, class_folders(pictures, "val"))
    cpu = torch.device("cpu")

    def counts(resolution, precision):  # section 4's pass: (right of 10, right of 1000)
        logits, _ = run_model(model, images, resolution, cpu, 8, lambda out: out.logits.float(), "",
                              set_precision(cpu, precision), pixels=ARTICLE_PIXELS)
        return posemb.accuracy_counts(torch.cat(logits), labels, classes)

    for resolution in (224, 384):
        fp32, bf16 = counts(resolution, "fp32"), counts(resolution, "bf16")
        assert all(abs(b - f) / len(items) * 100 <= 0.1 for f, b in zip(fp32, bf16, strict=True)), \
            (resolution, fp32, bf16)


def test_script_offline_without_weights_says_what_is_missing():
    run = subprocess.run([sys.executable, "vit_part3_posemb.py"], cwd=ROOT, capture_output=True, text=True, check=False,
                         timeout=120)
    assert run.returncode == 1
    if ARTICLE.exists():
        block = article_block("== 1. resize a 2x2 grid")
        assert len(block) == 6 and all(text_line in run.stdout.splitlines() for text_line in block)
    assert 'cannot run section "2. the position table": checkpoint google/vit-base-patch16-224 is not' in run.stdout
    assert "Traceback" not in run.stderr


def test_another_resolution_makes_the_stretched_grids_numbers_not_comparable(tmp_path):
    """At --resolution 512 a 14x14 checkpoint is stretched to 32x32, not 24x24: the stretched grid's numbers, and the
    conclusion that reads them, are not comparable (the flag named); the checkpoint's own grid's are as the
    article's."""
    from argparse import Namespace

    from common.run import begin
    from compare.verdicts import flag_differences, judge, load_reference

    args = Namespace(model=posemb.DEFAULT_MODEL, resolution=512, precision="fp32", per_class=None,
                     data_dir=str(tmp_path / "missing"))
    known = flag_differences(args, posemb.ARTICLE_FLAGS)  # as judged(): the flags', then the script's own
    pictures = UserError(f"{args.data_dir} does not exist")  # as tried(load_pictures, ...) gives it
    run, _ = begin("posemb", args, device=torch.device("cpu"))
    differences = {**known, **posemb.setup_differences(pictures, run, known)}
    assert list(differences) == ["resolution"]
    numbers = {name: {"value": float(entry["article"].replace(",", ""))} for name, entry
               in load_reference("posemb").items()}
    rows, conclusions = judge("posemb", numbers, differences)
    rows = {row["name"]: row for row in rows}
    assert rows["stretched grid neighbours min"]["verdict"] == "not comparable"
    assert rows["own grid neighbours min"]["verdict"] == "same"
    stretched = next(row for row in conclusions if row["says"].startswith("after the stretch"))
    assert (stretched["verdict"], stretched["flags"]) == ("not comparable", ["--resolution 512"])


def test_a_script_that_could_not_run_a_section_ends_on_each_reason_once_and_the_command_to_run(tmp_path):
    """Run from another folder, offline, without the checkpoint or the pictures: the last lines name each missing
    thing once (three sections lack the checkpoint, one also the pictures) and the command as typed, which works
    from that folder."""
    script = str(ROOT / "vit_part3_posemb.py")
    done = subprocess.run([sys.executable, script, "--per-class", "5"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    last = done.stderr.strip().splitlines()[-4:]
    assert done.returncode == 1 and last[0] == ("3 section(s) could not run (2. the position table, 3. cosine "
                                                "similarity, 4. accuracy at both resolutions):"), done.stderr
    assert last[1].startswith("  checkpoint google/vit-base-patch16-224 is not in the local Hugging Face cache")
    assert last[2].startswith(f"  Imagenette is not in {os.environ['VIT_PART3_DATA']}/imagenette2-160")
    assert last[3] == (f"next: do what each line above says, then python {script} --per-class 5, with any flag those "
                       "lines name, runs every section")  # "or pass --model": the command as typed lacks it
