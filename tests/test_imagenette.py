"""common/data.py: finding, checking, downloading, decoding and preprocessing the pictures."""
import hashlib
import io
import re
import tarfile

import numpy as np
import pytest
import torch
from conftest import library_pixels
from PIL import Image

from common import data as imagenette
from common.data import check_counts, list_split, load_rgb, resized_rgb, to_pixels
from common.pretrained import ARTICLE_PIXELS
from common.start_and_end import UserError
from job.imagenette_archive import URL, download_and_extract
from job.standins import imagenette_folder


def test_the_batched_path_equals_the_library_processor(pictures):
    """resized_rgb on the workers, then to_pixels on the device: the checkpoints' image processor's numbers."""
    paths = [path for path, _ in list_split(pictures, "val")[:3]]
    for resolution in (224, 384):
        batch = torch.from_numpy(np.stack([resized_rgb(load_rgb(path), resolution) for path in paths]))
        pixels = to_pixels(batch, torch.device("cpu"), ARTICLE_PIXELS).numpy()
        assert pixels.dtype == np.float32 and np.abs(pixels - library_pixels(paths, resolution)).max() < 1e-6


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
    subset = list_split(pictures, "train", per_class=2)
    assert len(subset) == 20 and [p.name for p, _ in subset[:2]] == ["n01440764_0000.JPEG", "n01440764_0001.JPEG"]


def test_load_splits_lists_each_split_with_its_own_count_and_names_the_folder(pictures, tmp_path):
    """Each split's pictures as list_split gives them, its own per-class count; Imagenette's ten WordNet ids in order;
    a folder named otherwise is named by its own name."""
    data = imagenette.load_splits(pictures, {"train": None, "val": 2})
    assert data["root"] == pictures and data["folders"] == imagenette.IMAGENETTE_WNIDS and data["name"] == "nette"
    assert len(data["train"]) == 40 and data["val"] == list_split(pictures, "val", 2) and len(data["val"]) == 20
    drawn = imagenette.load_splits(pictures, {"val": 2}, drawn=True)["val"]
    assert drawn == list_split(pictures, "val", 2, drawn=True) and "train" not in imagenette.load_splits(pictures, {})
    named = imagenette_folder(tmp_path / "imagenette2-160", per_class=1)
    assert imagenette.load_splits(named, {})["name"] == "Imagenette"


def test_a_drawn_per_class_is_a_simple_random_sample_of_the_whole_split(tmp_path, monkeypatch):
    """drawn: N times the classes from every picture of the split, not N of each class: classes of 1, 3 and 40
    pictures give 6 of the 44 at N = 2 (N of each could give 5), and over 300 seeds the one-picture class is in about
    6 / 44 of the draws (N of each: in all of them); a draw as large as the split keeps it whole."""
    for wnid, count in (("n01", 1), ("n02", 3), ("n03", 40)):
        (tmp_path / "val" / wnid).mkdir(parents=True)
        for i in range(count):
            (tmp_path / "val" / wnid / f"{i:02d}.JPEG").touch()
    whole = list_split(tmp_path, "val")
    drawn = list_split(tmp_path, "val", per_class=2, drawn=True)
    assert len(drawn) == 6 and len(set(drawn)) == 6 and drawn == [item for item in whole if item in drawn]
    assert list_split(tmp_path, "val", per_class=15, drawn=True) == whole
    seen = 0
    for seed in range(300):
        monkeypatch.setattr(imagenette, "SAMPLE_SEED", seed)
        seen += any(label == 0 for _, label in list_split(tmp_path, "val", per_class=2, drawn=True))
    assert 0.05 < seen / 300 < 0.25


def test_per_class_takes_imagenets_validation_pictures_first(tmp_path):
    """docs/data.md: in Imagenette's val/, the ILSVRC2012_val_* names sort before the <wnid>_* ones (capital I before
    n), so --per-class N up to their count takes them alone, in their number's order; then the others by name, as
    strings ('_10' before '_9')."""
    names = ["n01440764_9.JPEG", "ILSVRC2012_val_00009111.JPEG", "n01440764_10.JPEG", "ILSVRC2012_val_00000293.JPEG"]
    for split in ("train", "val"):
        (tmp_path / split / "n01440764").mkdir(parents=True)
    for name in names:
        Image.new("RGB", (4, 4)).save(tmp_path / "val" / "n01440764" / name)
    firsts = [[path.name for path, _ in list_split(tmp_path, "val", per_class=n)] for n in (1, 2, 3, None)]
    assert firsts == [["ILSVRC2012_val_00000293.JPEG"],
                      ["ILSVRC2012_val_00000293.JPEG", "ILSVRC2012_val_00009111.JPEG"],
                      ["ILSVRC2012_val_00000293.JPEG", "ILSVRC2012_val_00009111.JPEG", "n01440764_10.JPEG"],
                      ["ILSVRC2012_val_00000293.JPEG", "ILSVRC2012_val_00009111.JPEG", "n01440764_10.JPEG",
                       "n01440764_9.JPEG"]]


def test_the_standins_have_imagenettes_validation_names_and_portraits(pictures):
    """As imagenette2-160: 160 px on the short side, some pictures taller than wide; in val/ some named
    ILSVRC2012_val_<8 digits>.JPEG, which --per-class takes first."""
    sizes = {path: Image.open(path).size for split in ("train", "val") for path, _ in list_split(pictures, split)}
    assert all(min(size) == 160 for size in sizes.values())
    assert any(height > width for width, height in sizes.values())
    assert any(width > height for width, height in sizes.values())
    first = list_split(pictures, "val", per_class=1)
    assert len(first) == 10 and all(re.fullmatch(r"ILSVRC2012_val_\d{8}\.JPEG", path.name) for path, _ in first)
    assert not [path for path, _ in list_split(pictures, "train") if path.name.startswith("ILSVRC")]


def test_incomplete_imagenette_is_refused_where_we_download_it_and_a_warning_elsewhere(tmp_path):
    root = imagenette_folder(tmp_path / "imagenette2-160", per_class=1)
    with pytest.raises(UserError, match="found 10 of 9,469 training, 10 of 3,925 validation pictures"):
        check_counts(root, strict=True)
    assert "a partial copy, so its numbers cannot match" in check_counts(root, strict=False)


@pytest.mark.parametrize("offline,url,why", [
    (True, URL, "offline mode is on (HF_HUB_OFFLINE=1)"),
    (False, "http://127.0.0.1:9/imagenette2-160.tgz", "could not be downloaded (127.0.0.1:9: Connection refused)"),
])
def test_imagenette_that_cannot_be_had_names_where_to_download_it(tmp_path, monkeypatch, offline, url, why):
    from huggingface_hub import constants

    from job import imagenette_archive

    monkeypatch.setattr(imagenette, "DEFAULT_DIR", tmp_path / "imagenette2-160")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", url)
    with pytest.raises(UserError) as error:
        imagenette_archive.download_imagenette()
    assert str(error.value).startswith(f"Imagenette is not in {tmp_path / 'imagenette2-160'} and {why}")
    # imagenette2-160.tgz is 99,003,388 bytes: 99 MB of 10^6 bytes (94 MiB)
    assert str(error.value).endswith(f": download {url} (99 MB) and extract it into {tmp_path}, or pass --data-dir")


def test_own_classes_work_without_imagenette_counts(tmp_path):
    root = imagenette_folder(tmp_path / "imagenette2-160", per_class=1, classes=["cats", "dogs"])
    assert check_counts(root, strict=True) is None
    assert [label for _, label in list_split(root, "val")] == [0, 1]


@pytest.mark.parametrize("files,message", [
    ([], "no class folders in {root}/train: expected the layout train/<class>/*.JPEG"),
    (["train/a/1.jpg"], "no class folders in {root}/val: expected the layout val/<class>/*.JPEG"),
    (["train/a/1.jpg", "train/b/1.jpg", "val/a/1.jpg"],
     "class b is in {root}/train but not in the other split: both splits need the same class folders"),
    (["train/a/1.jpg", "val/a/1.jpg"], "one class folder in {root} (a): a classifier needs at least 2 classes"),
    (["train/a/1.jpg", "val/a/1.jpg", "val/c/1.jpg"],
     "class c is in {root}/val but not in the other split: both splits need the same class folders"),
    (["train/a/1.jpg", "train/b/notes.txt", "val/a/1.jpg", "val/b/1.png"],
     "no pictures in {root}/train/b: every class needs pictures (.JPEG, .jpg or .png) in both splits"),
    (["train/a/1.jpg", "train/b/1.JPEG", "val/a/1.jpg", "val/b/notes.txt"],
     "no pictures in {root}/val/b: every class needs pictures (.JPEG, .jpg or .png) in both splits"),
])
def test_a_folder_out_of_layout_is_refused_in_one_line_naming_where(tmp_path, files, message):
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    (root / "val").mkdir()
    for file in files:
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_bytes(b"")
    for strict in (True, False):
        with pytest.raises(UserError) as error:
            check_counts(root, strict=strict)
        assert str(error.value) == message.format(root=root)


def archive_of(folder, broken=False):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    data = buffer.getvalue()
    return data[: len(data) // 2] if broken else data


def md5(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_download_is_all_or_nothing(tmp_path):
    source = imagenette_folder(tmp_path / "src" / "mine", per_class=1, classes=["a", "b"])
    target = tmp_path / "data" / "mine"
    archive = tmp_path / "mine.tgz"
    archive.write_bytes(archive_of(source, broken=True))
    refused = tmp_path / "data" / "mine.tgz.refused"
    with pytest.raises(UserError, match=f"could not extract it .*; moved it to {refused}: run again"):
        download_and_extract(archive.as_uri(), md5(archive), target, progress=False)
    assert not target.exists() and list((tmp_path / "data").iterdir()) == [refused]  # no half folder, no leftovers
    archive.write_bytes(archive_of(source))
    download_and_extract(archive.as_uri(), md5(archive), target, progress=False)
    assert len(list_split(target, "val")) == 2 and sorted((tmp_path / "data").iterdir()) == [target, refused]


def test_two_runs_filling_the_same_data_folder_both_finish(tmp_path, monkeypatch):
    """Two runs download and extract Imagenette into one data/ at once: the second to rename its checked copy finds
    the first's in place and uses it, not blaming the archive (each run's copy passed the same check)."""
    from job import imagenette_archive

    source = imagenette_folder(tmp_path / "src" / "mine", per_class=1, classes=["a", "b"])
    target, archive = tmp_path / "data" / "mine", tmp_path / "mine.tgz"
    archive.write_bytes(archive_of(source))
    check, finished = imagenette_archive.check_counts, []

    def the_other_run_finishes_meanwhile(root, strict, fix):
        monkeypatch.setattr(imagenette_archive, "check_counts", check)
        download_and_extract(archive.as_uri(), md5(archive), target, progress=False)
        finished.append(target.is_dir())
        return check(root, strict, fix)

    monkeypatch.setattr(imagenette_archive, "check_counts", the_other_run_finishes_meanwhile)
    download_and_extract(archive.as_uri(), md5(archive), target, progress=False)
    assert finished == [True]  # the other run put its copy in place before this one renamed its own
    assert len(list_split(target, "val")) == 2 and list((tmp_path / "data").iterdir()) == [target]
