"""job/miniature.py's pieces, small: pictures whose class is where the blob is, checkpoints in the Hub's layout that
the scripts' own loaders read, and the job's flags pointing at them. The whole miniature and its time are
benchmarks/miniature.py's, not a test's."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from common.environment import MINIATURE_MARK
from common.imagenette import CLASSES, list_split
from job import miniature

os.environ["HF_HUB_OFFLINE"] = "1"  # conftest sets it too: nothing here may reach the Hub


def blob_at(picture):
    """(x, y) of the blob a picture shows, found from its pixels alone: the centre of its brightest pixels."""
    brightness = np.asarray(picture, dtype=np.float32).min(axis=2)  # the blob is bright in every channel
    y, x = np.nonzero(brightness >= np.percentile(brightness, 99.5))
    return x.mean(), y.mean()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The Imagenette and beans folders, 2 training and 1 validation picture of each class."""
    root = tmp_path_factory.mktemp("miniature")
    miniature.imagenette_folder(root / "imagenette", counts={"train": 2, "val": 1})
    miniature.beans_folder(root / "beans", counts={"train": 2, "validation": 1, "test": 1})
    return root


def test_a_pictures_class_is_where_its_blob_is_and_a_flip_keeps_it():
    rng = np.random.default_rng(7)
    for label in range(len(CLASSES)):
        for _ in range(5):
            picture, centre = miniature.imagenette_picture(rng, label)
            found = blob_at(picture)
            assert miniature.imagenette_class(centre) == label
            assert miniature.imagenette_class(found) == label, (label, centre, found)
            assert miniature.imagenette_class(blob_at(picture[:, ::-1])) == label  # fine-tuning's flips
    for label in range(3):
        picture, centre = miniature.beans_picture(rng, label)
        assert miniature.beans_class(blob_at(picture)) == miniature.beans_class(centre) == label


def test_the_same_blob_elsewhere_is_another_class():
    rng = np.random.default_rng(3)
    centres = {miniature.imagenette_class(miniature.imagenette_picture(rng, label)[1]) for label in range(10)}
    assert centres == set(range(10))
    assert miniature.imagenette_class((80, 10)) == 0 and miniature.imagenette_class((10, 10)) == 1
    assert miniature.imagenette_class((80, 150)) == 8 and miniature.imagenette_class((150, 150)) == 9


def test_the_folders_are_in_imagenettes_and_beans_layouts_and_their_pictures_keep_their_class(folders):
    from common import beans

    items = list_split(folders / "imagenette", "val")
    assert len(items) == 10 and {path.parent.name for path, _ in items} == {wnid for wnid, _, _ in CLASSES}
    for path, label in items:  # the loader's label is the folder's class; the JPEG's blob says the same
        assert path.suffix == ".JPEG" and miniature.imagenette_class(blob_at(Image.open(path).convert("RGB"))) == label
    data = beans.load(str(folders / "beans"))
    assert data["train"].features["labels"].names == list(miniature.BEANS_CLASSES)
    for row in data["validation"]:
        assert miniature.beans_class(blob_at(row["image"].convert("RGB"))) == row["labels"]
    assert all((folders / name / MINIATURE_MARK).is_file() for name in ("imagenette", "beans"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The two checkpoints of a ViT trained for 2 steps on 16 pictures (the layout, not the learning)."""
    models = tmp_path_factory.mktemp("models")
    classifier, pre_logits = miniature.train(*miniature.training_pictures(16, seed=0), steps=2, say=lambda text: None)
    return models, miniature.save_checkpoints(models, classifier, pre_logits), classifier


def test_the_checkpoints_load_as_the_scripts_load_the_hubs(checkpoints):
    import torch
    from transformers import AutoImageProcessor, ViTForImageClassification, ViTModel

    import vit_part3_posemb
    from common.checkpoints import load_pretrained

    models, saved, trained = checkpoints
    assert saved["vit"] == models / miniature.VIT and saved["in21k"] == models / miniature.IN21K
    classifier = load_pretrained(ViTForImageClassification, str(saved["vit"]))
    assert classifier.config.num_labels == 1000 and classifier.config.image_size == miniature.IMAGE_SIZE
    vit_part3_posemb.check_resolution(classifier.config, miniature.HIGHER_RESOLUTION)  # 8 x 8 to 15 x 15
    processor = AutoImageProcessor.from_pretrained(saved["vit"])
    assert processor.size["height"] == miniature.IMAGE_SIZE
    body, info = load_pretrained(ViTModel, str(saved["in21k"]), add_pooling_layer=True, output_loading_info=True)
    assert not info["missing_keys"] and "id2label" not in json.loads((saved["in21k"] / "config.json").read_text())
    for name, value in trained.vit.state_dict().items():  # one body, two releases
        assert torch.equal(body.state_dict()[name], value), name
    assert all((saved[key] / MINIATURE_MARK).is_file() for key in saved)


def test_the_jobs_flags_point_at_the_miniature(folders, checkpoints, tmp_path):
    import reproduce

    root = folders
    (root / "models").symlink_to(checkpoints[0], target_is_directory=True)
    args = reproduce.parse_flags([str(tmp_path / "results"), *miniature.job_flags(root)])
    out = tmp_path / "results"
    commands = {script: reproduce.script_command(script, args, out) for script in ("posemb", "fewshot", "finetune",
                                                                                    "backbone")}
    for script, command in commands.items():
        model = miniature.VIT if script in ("posemb", "backbone") else miniature.IN21K
        data = root / ("beans" if script == "backbone" else "imagenette")
        assert command[command.index("--model") + 1] == str((root / "models").resolve() / model)
        assert command[command.index("--data-dir") + 1] == str(data.resolve())
        assert command[command.index("--device") + 1] == "cpu"
    assert commands["posemb"][commands["posemb"].index("--resolution") + 1] == str(miniature.HIGHER_RESOLUTION)


def test_the_page_says_first_that_a_run_on_the_miniature_has_numbers_of_its_own(tmp_path):
    from job import page

    marked, results = miniature.mark(tmp_path / "imagenette"), tmp_path / "results"
    results.mkdir()
    record = {"script": "posemb", "flags": {"model": "google/vit-base-patch16-224", "data_dir": str(marked)},
              "numbers": {}, "environment": {}, "printed": [], "series": {}, "passes": {}, "could_not_run": []}
    (results / "posemb.json").write_text(json.dumps(record))
    paragraphs = page.build(results, say=lambda text: None).read_text().split("\n\n")
    assert paragraphs[1].startswith("**A miniature, its numbers its own**: vit_part3_posemb.py ran on a ViT trained "
                                    "here on generated pictures")
    (marked / MINIATURE_MARK).unlink()
    assert "miniature" not in page.build(results, say=lambda text: None).read_text()
