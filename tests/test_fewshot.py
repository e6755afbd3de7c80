"""vit_part3_fewshot.py: the closed form by hand, against numpy, and on a tiny frozen ViT."""
import multiprocessing
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ARTICLE, ROOT, article_block, without_a_gpu
from PIL import Image

import figures.fewshot
import vit_part3_fewshot as fewshot
from common.data import list_split
from common.features import cache_key, cached
from common.run import Report
from compare.record import named
from job.standins import imagenette_folder


def by_hand_numbers():
    report = Report("fewshot")
    fewshot.section_by_hand(report)
    return {name: number["value"] for name, number in named(report.script, report.given)[0].items()}


def test_by_hand_values_of_the_article():
    results = by_hand_numbers()
    assert results["det"] == pytest.approx(80)  # 7 * 15 - 5 * 5
    inverse = [results[f"inverse[{k}]"] for k in ("1,1", "1,2", "2,1", "2,2")]
    assert inverse == pytest.approx([15 / 80, -5 / 80, -5 / 80, 7 / 80])
    assert (results["W[1,1]"], results["W[2,1]"]) == pytest.approx((0.625, -0.475))
    assert results["new picture scores[1]"] == pytest.approx(1.5 * 0.625 + 0.5 * -0.475)


@pytest.mark.skipif(not ARTICLE.exists(), reason="the article is not beside the checkout")
def test_by_hand_lines_are_the_article_lines(capsys):
    by_hand_numbers()
    printed = capsys.readouterr().out.splitlines()
    block = article_block("== 1. the closed form by hand")
    assert len(block) == 9 and [text_line for text_line in block if text_line not in printed] == []


def test_draws_are_reproducible_with_shots_per_class():
    labels = np.repeat(np.arange(10), 50)
    first = fewshot.draw_shots(labels, 5, draw=0, seed=0)
    assert np.array_equal(first, fewshot.draw_shots(labels, 5, draw=0, seed=0))
    assert not np.array_equal(first, fewshot.draw_shots(labels, 5, draw=1, seed=0))
    assert np.bincount(labels[first], minlength=10).tolist() == [5] * 10
    assert len(set(first)) == 50


def test_few_shot_accuracy_on_the_articles_hand_example():
    """The article's 4 pictures are the pool; 2 shots of each of its 2 classes take all of them, in any draw. With the
    bias column, X^T X + I = [[7, 5, 4], [5, 15, 6], [4, 6, 5]] and X^T y = [2, -4, 0] for class A's targets, so
    class A's column of W is [41, -39, 14] / 74 (class B's its negative; lambda 1). Three validation pictures score
    56/74, -64/74 and 55/74 for class A: A, B, A; labelled A, B, B: 2 of 3 right, in each draw."""
    x_pool, labels = np.array(fewshot.HAND_X), np.array(fewshot.HAND_LABELS)
    x_val = np.array([[1.5, 0.5], [0.0, 2.0], [1.0, 0.0]])
    accuracies = fewshot.few_shot_accuracies(x_pool, labels, x_val, np.array([0, 1, 1]), 2, 1.0, 2, 0)
    assert accuracies == [2, 2]


def test_the_pool_is_per_class_pictures_of_each_class_in_a_fixed_order():
    """8 pictures, 5 of class 0 and 3 of class 1; 4 per class: 4 of class 0, all 3 of class 1, none twice."""
    items = [(f"p{i}.jpg", label) for i, label in enumerate([0, 1, 0, 0, 1, 0, 1, 0])]
    pool = fewshot.draw_pool(items, 4, seed=0)
    assert [label for _, label in pool] == [0, 0, 0, 0, 1, 1, 1]
    assert len(set(pool)) == 7 and set(pool) <= set(items)
    class_0 = [int(path[1:-4]) for path, label in pool if label == 0]
    assert class_0 == sorted(class_0)
    assert fewshot.draw_pool(items, 4, seed=0) == pool


def test_pre_logits_is_tanh_of_dense_of_the_class_token(tiny_in21k, pictures):
    model = fewshot.load_frozen_model(str(tiny_in21k), torch.device("cpu"))
    items = list_split(pictures, "val", per_class=1)
    features, timing = fewshot.extract_features(model, [path for path, _ in items], 224, torch.device("cpu"), 4, "test")
    assert timing["pictures"] == len(items) and 0 <= timing["waiting seconds"] <= timing["seconds"]
    assert timing["workers"] == 0 and timing["start-up seconds"] >= 0  # its own pass, on a CPU: the main process
    dense = model.pooler.dense
    with torch.no_grad():
        expected = torch.tanh(dense(torch.from_numpy(features["class token"]))).numpy()
    assert np.allclose(features["pre-logits"], expected, atol=1e-6)


def test_features_are_cached_and_invalidated(tiny_in21k, pictures, tmp_path):
    loads = []

    def loader():
        loads.append(1)
        return fewshot.load_frozen_model(str(tiny_in21k), torch.device("cpu"))

    def features(items, precision="fp32"):
        def compute():
            return fewshot.extract_features(loader(), [path for path, _ in items], 224, torch.device("cpu"), 8,
                                            "val")[0]

        key = cache_key("val", str(tiny_in21k), resolution=224, precision=precision,
                        paths=[path for path, _ in items], root=pictures)
        return cached(compute, key, dict.fromkeys(fewshot.REPRESENTATIONS, len(items)), tmp_path)

    items = list_split(pictures, "val", per_class=2)
    first, source = features(items)
    assert source == "computed" and len(loads) == 1
    again, source = features(items)
    assert source == "cache" and len(loads) == 1 and np.array_equal(first["pre-logits"], again["pre-logits"])
    assert features(items[:-1])[1] == "computed"
    assert features(items, "bf16")[1] == "computed"
    for path in tmp_path.glob("*.npz"):
        path.write_bytes(path.read_bytes()[:100])  # a truncated file
    assert features(items)[1] == "computed"


def few_shot_run(model, data, cache_dir, capsys, *extra):
    """The script on a folder, its cache in cache_dir: (exit status, stdout)."""
    flags = ["--model", str(model), "--data-dir", str(data), "--pool", "2", "--shots", "1", "--draws", "1",
             "--batch-size", "8", "--device", "cpu", *extra]
    status = fewshot.main(flags)
    return status, capsys.readouterr().out


@pytest.mark.parametrize("kept,pool", [(4, "3"), (2, "2 to 3")], ids=["each class holds more", "one holds fewer"])
def test_the_pool_is_said_as_drawn_where_classes_hold_fewer_than_pool(kept, pool, tiny_in21k, tmp_path, capsys):
    """--pool 3 of classes of 4 training pictures, one of which may hold 2: section 2 says the pool it drew, not the
    flag (it said "a pool of 50 per class" of 4 pictures a class)."""
    data = imagenette_folder(tmp_path / "nette", per_class=4)
    for path in sorted((data / "train" / "n01440764").iterdir())[kept:]:
        path.unlink()
    status, out = few_shot_run(tiny_in21k, data, tmp_path / "cache", capsys, "--no-cache", "--pool", "3")
    assert status == 0 and f"training pictures (a pool of {pool} per class) and 40 validation pictures ==" in out


def test_a_picture_changed_under_the_same_name_is_recomputed(tiny_in21k, tmp_path, monkeypatch, capsys):
    """Two folders with the same file names, one picture truncated in the second: its features are not reused."""
    monkeypatch.setattr(fewshot, "FEATURE_CACHE_DIR", tmp_path / "cache")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    first = imagenette_folder(tmp_path / "first", per_class=2)
    second = imagenette_folder(tmp_path / "second", per_class=2)
    loads = []
    load = fewshot.load_frozen_model
    monkeypatch.setattr(fewshot, "load_frozen_model", lambda *args: loads.append(1) or load(*args))
    status, out = few_shot_run(tiny_in21k, first, tmp_path, capsys)
    assert status == 0 and "features computed" in out and len(loads) == 1
    status, out = few_shot_run(tiny_in21k, second, tmp_path, capsys)  # same names, same bytes: same features
    assert status == 0 and "features read from the cache" in out and len(loads) == 1  # the model is not loaded
    picture = min((second / "val" / "n01440764").iterdir())
    Image.open(picture).rotate(90).save(picture)  # same name, other contents
    status, out = few_shot_run(tiny_in21k, second, tmp_path, capsys)
    assert status == 0 and "features computed" in out
    picture.write_bytes(picture.read_bytes()[:-200])  # truncated: never served from the cache, and named
    status, out = few_shot_run(tiny_in21k, second, tmp_path, capsys)
    assert status == 1 and f"cannot read picture {picture}" in out


def test_no_cache_neither_reads_nor_writes(tiny_in21k, pictures, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fewshot, "FEATURE_CACHE_DIR", tmp_path / "cache")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    status, out = few_shot_run(tiny_in21k, pictures, tmp_path, capsys, "--no-cache")
    assert status == 0 and "features computed" in out and not (tmp_path / "cache").exists()


def test_missing_data_names_the_missing_checkpoint_too(tmp_path, capsys):
    """The checkpoint is loaded only for features not cached; an offline run without the data hears of both at once."""
    assert fewshot.main(["--data-dir", str(tmp_path / "nowhere"), "--device", "cpu"]) == 1
    line = next(text for text in capsys.readouterr().out.splitlines() if "cannot run section" in text)
    assert f"--data-dir {tmp_path / 'nowhere'} does not exist; also checkpoint {fewshot.DEFAULT_MODEL}" in line


def test_script_end_to_end_on_stand_ins(tiny_in21k, pictures, tmp_path):
    command = [sys.executable, "vit_part3_fewshot.py", "--model", str(tiny_in21k), "--data-dir", str(pictures),
               "--pool", "3", "--shots", "1", "3", "--draws", "2", "--batch-size", "16", "--compare", "--no-cache",
               "--plots", str(tmp_path)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "features computed" in run.stdout
    table = run.stdout.split("== comparison")[0]
    assert sum(text_line.strip().startswith(("pre-logits  lambda", "class token lambda"))
               for text_line in table.splitlines()) == 6
    assert "per-class accuracy (1-shot, draw 0): tench" in run.stdout and "-> class" in run.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed (pip install matplotlib)" in run.stderr
    else:
        assert (tmp_path / figures.fewshot.FILE).stat().st_size > 0


def test_script_offline_without_weights_runs_section_1():
    run = subprocess.run([sys.executable, "vit_part3_fewshot.py"], cwd=ROOT, capture_output=True, text=True,
                         check=False,
                         timeout=120)
    assert run.returncode == 1 and "det = 80" in run.stdout
    section_2 = next(text for text in run.stdout.splitlines() if 'cannot run section "2. few-shot accuracy"' in text)
    assert "Imagenette is not in" in section_2 and "checkpoint google/vit-base-patch16-224-in21k" in section_2
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(("resolution", "note"), [
    (64, None),  # 4 patches of 16: every pixel in one
    (72, ("  --resolution 72 is not a multiple of the patch size 16: the last 8 pixels of each side fall outside the "
         "patches")),
])
def test_a_resolution_that_is_not_a_multiple_of_the_patch_says_which_pixels_no_patch_holds(resolution, note,
                                                                                           tiny_in21k, pictures,
                                                                                           tmp_path, capsys):
    status, out = few_shot_run(tiny_in21k, pictures, tmp_path, capsys, "--resolution", str(resolution),
                               "--no-cache")
    assert status == 0
    assert [line for line in out.splitlines() if "not a multiple of the patch size" in line] == ([note] if note else [])


def test_another_resolution_never_reads_the_features_cached_at_224(tiny_in21k, pictures, tmp_path, monkeypatch,
                                                                   capsys):
    """Issue 43: the script at 224 fills the cache; the same run at 64 pixels computes its own features (its own pair
    of files), and those it uses are the model's at 64 pixels, computed here by the library's processor and a plain
    forward pass, not those cached at 224."""
    from conftest import library_pixels
    from transformers import ViTModel

    monkeypatch.setattr(fewshot, "FEATURE_CACHE_DIR", tmp_path / "cache")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    used = []  # what each run's features were: the script's own call, recorded, not changed
    features = fewshot.load_features
    monkeypatch.setattr(fewshot, "load_features", lambda *args: used.append(features(*args)) or used[-1])
    status, out = few_shot_run(tiny_in21k, pictures, tmp_path, capsys)
    assert status == 0 and "features computed" in out
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2  # the pool's and the validation pictures'
    status, out = few_shot_run(tiny_in21k, pictures, tmp_path, capsys, "--resolution", "64")
    assert status == 0 and len(used) == 2

    model = ViTModel.from_pretrained(tiny_in21k, add_pooling_layer=True).eval()
    sets = {"pool": fewshot.draw_pool(list_split(pictures, "train"), 2, seed=0), "val": list_split(pictures, "val")}
    for desc, items in sets.items():
        with torch.no_grad():
            out_64 = model(pixel_values=torch.from_numpy(library_pixels([path for path, _ in items], 64)),
                           interpolate_pos_encoding=True)
        direct = {"pre-logits": out_64.pooler_output.numpy(), "class token": out_64.last_hidden_state[:, 0].numpy()}
        for representation in fewshot.REPRESENTATIONS:
            at_224, at_64 = used[0][desc][representation], used[1][desc][representation]
            assert np.abs(direct[representation] - at_224).max() > 1e-2, (desc, representation)  # 224's are others
            assert np.allclose(at_64, direct[representation], atol=1e-5), (desc, representation)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 4  # the cache gained the 64-pixel pair
    assert "features computed" in out and "features read from the cache" not in out


def test_a_partial_copy_of_the_training_pictures_moves_the_pool(tmp_path):
    """The pool is drawn from every training picture of the folder: a copy with 6 of each class is not the article's
    pool, so the means are not comparable (naming --data-dir), never an interval verdict of --per-class's sample."""
    from argparse import Namespace

    from conftest import compare

    from common.run import begin
    from compare.marks import STANDIN_MARK
    from compare.verdicts import flag_differences, load_reference

    root = imagenette_folder(tmp_path / "imagenette2-160", per_class=6)
    (root / STANDIN_MARK).unlink()  # a user's partial copy, not a folder job/standins.py made
    args = Namespace(model=fewshot.DEFAULT_MODEL, data_dir=str(root), per_class=3, pool=5, seed=0, shots=[1, 5],
                     lambdas=[1.0], draws=5, resolution=224, precision="fp32")
    known = flag_differences(args, fewshot.ARTICLE_FLAGS)  # as judged(): the flags', then the script's own
    data = fewshot.load_data(args, torch.device("cpu"))
    run, _ = begin("fewshot", args, device=torch.device("cpu"))
    differences = {**known, **fewshot.setup_differences(data, run, known)}
    assert differences["training pictures"]["flag"] == f"--data-dir {root}"
    assert differences["training pictures"]["why"] == (f"--data-dir {root}: 60 of 9,469 training pictures "
                                                       "(a partial copy, not a draw)")
    assert "n" not in differences["validation pictures"]  # drawn, but from a partial copy: no sample of the release
    numbers = {"pre-logits lambda 1 1-shot mean": {"value": 98.0}, "pool pictures": {"value": 50.0},
               "per-class tench": {"value": 100.0}}
    rows = {row["name"]: row for row in compare(numbers, load_reference("fewshot"), differences)}
    mean = rows["pre-logits lambda 1 1-shot mean"]
    assert mean["verdict"] == "not comparable" and "interval" not in mean and f"--data-dir {root}" in mean["flags"]
    assert rows["pool pictures"]["verdict"] == rows["per-class tench"]["verdict"] == "not comparable"


def test_script_with_a_missing_device_exits_2():
    run = without_a_gpu([sys.executable, "vit_part3_fewshot.py", "--device", "cuda"])
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith("error: --device cuda: ") and run.stderr.count("\n") == 1, run.stderr


def test_a_script_whose_worker_cannot_read_a_picture_says_so_in_one_line(tiny_in21k, tmp_path, monkeypatch, capsys):
    """As beside a GPU: few-shot's pictures are read by two worker processes, and one of them is broken."""
    import vit_part3_fewshot
    from common import data as loader
    from job.standins import imagenette_folder

    monkeypatch.setattr(loader, "loader_workers", lambda device: 2)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    children = set(multiprocessing.active_children())  # an earlier test's, if any
    data = imagenette_folder(tmp_path / "nette", per_class=2)
    picture = min((data / "val" / "n01440764").iterdir())
    picture.write_bytes(picture.read_bytes()[:-200])
    status = vit_part3_fewshot.main(["--model", str(tiny_in21k), "--data-dir", str(data), "--pool", "2", "--shots", "1",
                                     "--draws", "1", "--no-cache", "--device", "cpu"])
    out, err = capsys.readouterr()
    refused = [line for line in out.splitlines() if "cannot run section" in line]
    assert status == 1 and refused, out  # each section that needs the features says it
    assert all(f": cannot read picture {picture}: image file is truncated" in line for line in refused), out
    assert "Traceback" not in out + err and "worker process" not in out + err
    # ended with the failed pass (alive, they slowed later tests)
    assert set(multiprocessing.active_children()) <= children
