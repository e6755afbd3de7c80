"""Verdicts that know the run's setup: a number whose inputs differ from the article's is "not comparable",
with the flag; an accuracy on a subset of the article's pictures is judged by this run's exact interval.

On stand-ins, a full run of a stand-in is taken as if it were the article (its printed numbers in a
temporary reference, its checkpoint and data folder as the release's), so that "same" and "close" can be
earned. Every run is on the CPU, with a GPU or without: the "article" and the runs judged against it share
one arithmetic.
"""
import argparse
import json

import numpy as np
import pytest
import torch
from conftest import compare, library_pixels
from huggingface_hub import constants
from test_published_files import cache, published
from transformers import ResNetConfig, ResNetModel

import vit_part3_fewshot as fewshot
import vit_part3_finetune as finetune
import vit_part3_posemb as posemb
import vit_part3_setup as setup
from common import data as imagenette
from common import paths
from common.data import CLASSES, list_split
from compare import data_set, marks, published_files, verdicts
from compare.verdicts import flag_differences, format_like, load_reference
from job import imagenette_archive
from job.standins import imagenette_folder, vit_classifier

PER_CLASS = 6  # pictures of each class in each split of the stand-in "release"


@pytest.mark.parametrize("entry,differences,expected", [
    ({"article": "0.5", "kind": "nothing"}, {"validation pictures": {"flag": "--per-class 2", "why": "w"}}, "same"),
    ({"article": "0.00296", "kind": "nothing", "inputs": ["steps", "lr"]},
     {"steps": {"flag": "--steps 30", "why": "w"}},
     "not comparable"),
    ({"article": "768", "kind": "weights", "inputs": []}, {"steps": {"flag": "--steps 30", "why": "w"}}, "same"),
    ({"article": "99.54", "kind": "weights"}, {"resolution": {"flag": "--resolution 288", "why": "w"}},
     "not comparable"),
    ({"article": "99.54", "kind": "weights", "sample": "validation pictures"},
     {"validation pictures": {"flag": "--per-class 6", "why": "w"}, "precision": {"flag": "--precision bf16",
                                                                                  "why": "w"}}, "not comparable"),
    ({"article": "65", "kind": "chance"}, {}, "varies"),
], ids=["arithmetic on the article's inputs", "an lr under other steps", "an input that did not change",
        "weights under another resolution", "a subset and another precision", "no difference"])
def test_the_verdict_follows_the_inputs(entry, differences, expected):
    value = {"0.5": 0.5, "0.00296": 0.0029, "768": 768, "99.54": 99.54, "65": 70}[entry["article"]]
    assert compare({"x": {"value": value}}, {"x": entry}, differences)[0]["verdict"] == expected


def test_a_flag_that_is_not_the_articles_is_a_difference_named_as_typed():
    args = argparse.Namespace(base_lr=0.003, steps=300, resolution=288)
    article = {"learning rate": ("base_lr", 0.01), "steps": ("steps", 300), "resolution": ("resolution", 384)}
    assert flag_differences(args, article) == {
        "learning rate": {"flag": "--base-lr 0.003", "why": "--base-lr 0.003: the article's is 0.01"},
        "resolution": {"flag": "--resolution 288", "why": "--resolution 288: the article's is 384"}}


# the hybrid's numbers, each stage's (channels, height, width, tokens), of a ResNet of one bottleneck block a stage,
# stem 16 and stages 32-64-128-256 wide: 17 BatchNorm2d layers (the stem's, then 3 a block and its shortcut's)
TINY_STAGES = [(32, 56, 56, 3136), (64, 28, 28, 784), (128, 14, 14, 196), (256, 7, 7, 49)]
RESNET50_STAGES = [(256, 56, 56, 3136), (512, 28, 28, 784), (1024, 14, 14, 196), (2048, 7, 7, 49)]
NOT_STANDARD = "is not a standard ResNet-50 (its config is another architecture): it has 17 BatchNorm2d layers"
# (what microsoft/resnet-50 is in the cache, the sentence's start, the stages, BatchNorm2d layers, each verdict): a
# ResNet cached under the id is the article's only by its bytes (compare/published_files.py), and its numbers with it
RESNET_CACHED = [
    (None, ("the library's ResNet-50 architecture (random weights; microsoft/resnet-50 is not cached) is a standard "
            "ResNet: it has 53 BatchNorm2d layers"), RESNET50_STAGES, 53, ["same"] * 20),
    ("a tiny ResNet", f"microsoft/resnet-50 {NOT_STANDARD}", TINY_STAGES, 17, ["not comparable"] * 20),
    ("a tiny ResNet, as huggingface.co publishes it", f"microsoft/resnet-50 {NOT_STANDARD}", TINY_STAGES, 17,
     ["differs", "same", "same", "same"] * 4 + ["same", "same", "same", "differs"]),
]


@pytest.mark.parametrize("cached,sentence,stages,batch_norms,expected", RESNET_CACHED,
                         ids=["nothing cached", "a tiny ResNet", "the tiny ResNet published"])
def test_the_hybrids_numbers_are_the_articles_only_from_its_checkpoint(cached, sentence, stages, batch_norms,
                                                                        expected, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(paths, "DATA_DIR", tmp_path / "data")
    if cached:
        torch.manual_seed(0)
        ResNetModel(ResNetConfig(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1])
                    ).save_pretrained(tmp_path / "tiny")
        cache(tmp_path / "tiny", tmp_path / "hub", setup.RESNET)
    if cached and "publishes" in cached:
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "published_hashes.json").write_text(json.dumps(
            {setup.RESNET: {"files": published(tmp_path / "tiny")}}))
    record = run_json(setup.main, [], tmp_path / "setup.json")
    names = [f"stage {stage} {what}" for stage in range(1, 5) for what in ("channels", "height", "width", "tokens")]
    rows = {row["name"]: row for row in record["comparison"]}
    hybrid = [rows[name] for name in [*names, "option (i) tokens", "option (ii) tokens", "stage 3 over stage 4 tokens",
                                      "BatchNorm2d layers"]]
    assert [row["value"] for row in hybrid] == [*(n for stage in stages for n in stage), 49, 196, 4, batch_norms]
    assert [row["verdict"] for row in hybrid] == expected
    assert all(row["flags"] == [setup.RESNET] for row in hybrid if row["verdict"] == "not comparable")
    assert any(line.startswith(f"  {sentence} (BiT replaces each") for line in record["printed"])


B32 = "google/vit-base-patch32-224-in21k"
# section 1's numbers that ViT-B/32's weight file gives (its three, and the two that set it against ViT-B/16's), and
# one it does not
B32_NUMBERS = ["ViT-B/32 backbone", "ViT-B/32 backbone (M)", "ViT-B/32 pre-logits", "B/32 minus B/16",
               "B/32 over B/16 percent", "ViT-B/16 backbone"]
# (what the cache holds under B32, or a mirror serves, the source printed, each verdict): a weight file's counts are
# the article's only by its bytes, a mirror's safetensors header never; Table 1's architecture on the meta device is
# exact
VIT_CACHED = [
    (None, "meta device", ["same"] * 6),
    ("a tiny ViT", "weight file", ["not comparable"] * 5 + ["same"]),
    ("a tiny ViT, as huggingface.co publishes it", "weight file", ["differs"] * 5 + ["same"]),
    ("a tiny ViT's header, from a Hub mirror", "header from the Hub", ["not comparable"] * 5 + ["same"]),
]


@pytest.mark.parametrize("cached,source,expected", VIT_CACHED,
                         ids=["nothing cached", "a tiny ViT", "the tiny ViT published", "a mirror's header"])
def test_a_released_checkpoints_parameters_are_the_articles_only_from_its_published_file(cached, source, expected,
                                                                                         tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(paths, "DATA_DIR", tmp_path / "data")
    if cached:
        folder = vit_classifier(tmp_path / "tiny")
        (folder / marks.STANDIN_MARK).unlink()
    if cached and "mirror" in cached:  # the header a mirror serves: the tiny ViT's shapes
        header = setup.read_weight_shapes(folder / "model.safetensors")
        listing = argparse.Namespace(files_metadata={"model.safetensors": argparse.Namespace(tensors={
            name: argparse.Namespace(shape=shape) for name, shape in header.items()})})
        monkeypatch.setattr(setup, "is_offline_mode", lambda: False)
        monkeypatch.setattr(setup, "get_safetensors_metadata", lambda name: listing if name == B32 else {})
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    elif cached:
        cache(folder, tmp_path / "hub", B32)
    if cached and "publishes" in cached:
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "published_hashes.json").write_text(json.dumps({B32: {"files": published(folder)}}))
    record = run_json(setup.main, [], tmp_path / "setup.json")
    rows = {row["name"]: row for row in record["comparison"]}
    assert [rows[name]["verdict"] for name in B32_NUMBERS] == expected
    assert all(rows[name]["flags"] == [B32] for name in B32_NUMBERS if rows[name]["verdict"] == "not comparable")
    assert any(line.startswith(f"  ViT-B/32 (vit-base-patch32-224-in21k, {source}): ") for line in record["printed"])


STEPS_6 = {"flag": "--steps 6", "why": "--steps 6: the article's is 300", "removes": ["step 10 loss"]}
SHOTS = {"flag": "--shots 1 5", "why": "w", "moves": False, "removes": ["pre-logits lambda 1 10-shot mean"]}


@pytest.mark.parametrize("name,value,differences,expected", [
    ("step 10 loss", None, {"steps": STEPS_6}, ("not comparable", ["--steps 6"])),
    ("step 5 loss", None, {"steps": STEPS_6}, ("not run", None)),
    ("step 10 loss", None, {}, ("not run", None)),
    ("pre-logits lambda 1 10-shot mean", None, {"shots": SHOTS}, ("not comparable", ["--shots 1 5"])),
    ("pre-logits lambda 1 1-shot mean", 97.0, {"shots": SHOTS}, ("varies", None)),
    ("pre-logits lambda 1 1-shot mean", 97.0, {"shots": {**SHOTS, "moves": True}}, ("not comparable", ["--shots 1 5"])),
], ids=["a step a 6-step run never logs", "a step it logs, missing (paused)", "a step missing from the article's setup",
        "a cell --shots leaves out", "a cell it fills moves not", "a difference that moves numbers"])
def test_a_number_the_setup_never_produces_is_not_comparable_and_one_that_could_be_is_not_run(name, value, differences,
                                                                                                expected):
    entry = {"article": "1.0", "kind": "chance"}
    row = compare({} if value is None else {name: {"value": value}}, {name: entry}, differences)[0]
    assert (row["verdict"], row.get("flags")) == expected


def test_a_completed_6_step_run_has_no_number_not_run(tiny_in21k, pictures, tmp_path, capsys):
    """The article logs steps 5, 10, ..., 300; a 6-step run logs steps 1 to 6 (scaled), so the 8 steps from 10 on,
    5 numbers each, are never produced: 40 rows not comparable with --steps 6, and nothing is "not run"."""
    path = tmp_path / "six.json"
    argv = ["--model", str(tiny_in21k), "--data-dir", str(pictures), "--steps", "6", "--batch-size", "8",
            "--resolution", "32", "--device", "cpu", "--compare", "--json", str(path)]
    assert finetune.main(argv) == 0
    rows = json.loads(path.read_text())["comparison"]
    assert [row["name"] for row in rows if row["verdict"] == "not run"] == []
    absent = [row for row in rows if row["value"] is None]
    assert len(absent) == 8 * 5 and all("--steps 6" in row["flags"] for row in absent)
    assert "0 not run (of 86 article numbers)" in capsys.readouterr().out


def test_few_shots_table_differences_leave_out_only_the_cells_not_run():
    args = type("Args", (), {"shots": [1, 5], "lambdas": [0.01, 1.0, 100.0]})()
    differences = fewshot.table_differences(args, load_reference("fewshot"))
    assert list(differences) == ["shots"] and differences["shots"]["moves"] is False
    # 2 representations x 3 lambdas x (mean, std) of the 10-shot column
    assert sorted(differences["shots"]["removes"]) == sorted(
        f"{representation} lambda {lam} 10-shot {what}" for representation in ("pre-logits", "class token")
        for lam in ("0.01", "1", "100") for what in ("mean", "std"))
    args.shots, args.lambdas = [10, 5, 1], [1.0]
    assert sorted(len(d["removes"]) for d in fewshot.table_differences(args, load_reference("fewshot")).values()) == [
        2 * 2 * 3 * 2]


# ---------------------------------------------------------------- the scripts, a stand-in as the article

@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The stand-in's data taken as the release: its own counts in place of Imagenette's."""
    return imagenette_folder(tmp_path_factory.mktemp("release") / "nette", per_class=PER_CLASS)


@pytest.fixture
def as_the_release(monkeypatch, release):
    """The stand-in's data and checkpoints taken as the article's: its counts as Imagenette's, its marks unread, its
    checkpoints' files as the Hub's."""
    counts = {"train": 10 * PER_CLASS, "val": 10 * PER_CLASS}
    monkeypatch.setattr(imagenette, "SPLIT_COUNTS", counts)
    for module in (published_files, data_set):
        monkeypatch.setattr(module, "made_here", lambda path: None)
    monkeypatch.setattr(published_files, "unlike_the_hubs", lambda folder, repo, what: None)
    monkeypatch.setenv("TQDM_DISABLE", "1")


def as_the_article(record, script, monkeypatch, tmp_path):
    """A reference whose numbers are this run's, at the article's digits, with the real entries' kinds, inputs and
    bands; no conclusions (the rules read the article's numbers)."""
    printed = record["numbers"]
    pseudo = {name: {**entry, "article": format_like(entry["article"], printed[name]["value"])}
              for name, entry in load_reference(script).items() if name in printed}
    assert len(pseudo) >= 30  # all but the steps and shots not run
    (tmp_path / f"conclusions_{script}.json").write_text('{"conclusions": []}')
    (tmp_path / f"reference_{script}.json").write_text(json.dumps({"numbers": pseudo}))
    monkeypatch.setattr(verdicts, "REFERENCE_DIR", tmp_path)  # judge() reads them; the scripts read the real names
    return pseudo


def run_json(main, argv, path):
    assert main([*argv, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def check_moved_numbers(base, changed, pseudo, flag):
    """Every number that moved is not comparable (naming the flag), close within a stated band, judged by its
    interval (a sample of the same weights' pictures: close or undecided, never differs), or arithmetic on the
    article's inputs and same."""
    rows = compare(changed["numbers"], pseudo, changed["setup differences"])
    moved = [row for row in rows if row["value"] is not None and row["value"] != base["numbers"][row["name"]]["value"]]
    for row in moved:
        fine = (row["verdict"] == "not comparable" and any(flag in f for f in row["flags"])
                or row["verdict"] == "close" and "band" in row
                or row["verdict"] in ("close", "undecided") and "interval" in row
                or row["kind"] == "nothing" and row["verdict"] == "same")
        assert fine, (flag, row)
    return moved


def with_flag(argv, flag):
    """argv with flag[0] given the values flag[1:], in place of those it had."""
    kept, dropping = [], False
    for word in argv:
        if word.startswith("--"):
            dropping = word == flag[0]
        if not dropping:
            kept.append(word)
    return kept + flag


# The stand-ins' recipe taken as the article's, so that the base run has the article's setup.
TINY_RECIPE = {"steps": ("steps", 4), "batch": ("batch_size", 8), "lr": ("lr", 0.003), "resolution": ("resolution", 32),
               "precision": ("precision", "fp32")}


@pytest.mark.parametrize("main,base_flags,variants", [
    (posemb.main, ["--batch-size", "30", "--device", "cpu"], [["--per-class", "3"], ["--resolution", "288"]]),
    (fewshot.main, ["--shots", "1", "5", "--no-cache", "--device", "cpu"],
     [["--per-class", "3"], ["--pool", "5"], ["--draws", "2"], ["--shots", "1", "2"], ["--lambdas", "0.01", "100"],
      ["--resolution", "256"]]),
    (finetune.main, ["--steps", "4", "--batch-size", "8", "--device", "cpu", "--resolution", "32"],
     [["--per-class", "4"], ["--steps", "3"], ["--batch-size", "4"], ["--lr", "0.01"]]),
], ids=["posemb", "fewshot", "finetune"])
def test_each_setup_flag_makes_what_it_moves_not_comparable(main, base_flags, variants, release, tiny_in21k,
                                                            tiny_classifier, as_the_release, tmp_path, monkeypatch):
    script = main.__module__.removeprefix("vit_part3_")
    monkeypatch.setattr(finetune, "ARTICLE_FLAGS", TINY_RECIPE)
    model = tiny_classifier if script == "posemb" else tiny_in21k
    argv = ["--model", str(model), "--data-dir", str(release), *base_flags]
    base = run_json(main, argv, tmp_path / "base.json")
    # the stand-in's own release, the script's defaults; few-shot's --shots 1 5 only leaves the 10-shot cells out
    assert [item for item, d in base["setup differences"].items() if d.get("moves", True)] == []
    pseudo = as_the_article(base, script, monkeypatch, tmp_path)
    assert {row["verdict"] for row in compare(base["numbers"], pseudo, {})} <= {"same", "varies"}
    for k, flag in enumerate(variants):
        changed = run_json(main, with_flag(argv, flag), tmp_path / f"{k}.json")
        assert changed["setup differences"], flag
        assert check_moved_numbers(base, changed, pseudo, flag[0]), flag


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    return vit_classifier(tmp_path_factory.mktemp("classifier"))


def fitted_classifier(directory, data, seed):
    """A tiny ViT whose head is fitted (least squares) to the stand-in's validation pictures at 224: right on
    most of them, as a trained checkpoint is, so that its accuracies can be told from a random one's."""
    from transformers import ViTForImageClassification

    model = ViTForImageClassification.from_pretrained(vit_classifier(directory, seed=seed)).eval()
    items = list_split(data, "val")
    pixels = torch.from_numpy(library_pixels([path for path, _ in items], 224))
    with torch.no_grad():
        features = model.vit(pixel_values=pixels).last_hidden_state[:, 0].numpy().astype(np.float64)
    x = np.hstack([features, np.ones((len(items), 1))])
    y = -np.ones((len(items), len(CLASSES)))
    y[np.arange(len(items)), [label for _, label in items]] = 1
    w = np.linalg.lstsq(x, y, rcond=None)[0]
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.fill_(-100.0)  # the 990 other classes never win
        index = [i for _, _, i in CLASSES]
        model.classifier.weight[index] = torch.from_numpy(w[:-1].T).float()
        model.classifier.bias[index] = torch.from_numpy(w[-1]).float()
    model.save_pretrained(directory)
    return directory


def test_subset_accuracies_are_undecided_for_the_same_weights_and_differ_for_others(release, as_the_release, tmp_path,
                                                                              monkeypatch):
    good = fitted_classifier(tmp_path / "fitted", release, seed=0)
    other = vit_classifier(tmp_path / "random", seed=1)
    full = run_json(posemb.main, ["--model", str(good), "--data-dir", str(release), "--device", "cpu"],
                    tmp_path / "full.json")
    pseudo = as_the_article(full, "posemb", monkeypatch, tmp_path)
    accuracies = [name for name, entry in pseudo.items() if entry.get("sample")]
    assert len(accuracies) == 10 and full["numbers"]["224 of 10"]["value"] > 80
    subset = ["--data-dir", str(release), "--per-class", "3", "--device", "cpu"]
    same_weights = run_json(posemb.main, ["--model", str(good), *subset], tmp_path / "same.json")
    rows = {row["name"]: row for row in compare(same_weights["numbers"], pseudo, same_weights["setup differences"])}
    # 30 of 60 pictures cannot put an accuracy within the article's band: the same weights are undecided, never differ
    assert all(rows[name]["verdict"] == "undecided" and "interval" in rows[name] for name in accuracies), \
        [(name, rows[name]["run"], rows[name].get("interval")) for name in accuracies]
    other_weights = run_json(posemb.main, ["--model", str(other), *subset], tmp_path / "other.json")
    rows = {row["name"]: row for row in compare(other_weights["numbers"], pseudo, other_weights["setup differences"])}
    far = [name for name in accuracies if abs(rows[name]["value"] - full["numbers"][name]["value"]) > 30]
    assert len(far) >= 4 and all(rows[name]["verdict"] == "differs" for name in far)


def test_the_comparison_names_the_setup_at_the_top(release, tiny_classifier, as_the_release, capsys):
    assert posemb.main(["--model", str(tiny_classifier), "--data-dir", str(release), "--per-class", "2",
                        "--device", "cpu", "--compare"]) == 0
    comparison = capsys.readouterr().out.split("== comparison with the article ==")[1].splitlines()
    assert comparison[1].startswith("  setup: this run differs from the article's")
    assert comparison[2].strip() == ("--per-class 2: 20 of 60 validation pictures (2 a class on average, drawn at "
                                     "random)")
    assert any("not comparable: --per-class 2" in text for text in comparison)
    assert any("(95% interval" in text for text in comparison)


@pytest.mark.parametrize("change,said", [
    ("classes", "another data set than Imagenette"),
    ("size", ("pictures of another size than Imagenette-160's (n01440764_0000.JPEG is 200x100, the release's are "
              "160 px on the short side)")),
    ("mark", "a stand-in generated by job/standins.py (random weights or generated pictures), not Imagenette"),
])
def test_pictures_that_are_not_imagenettes_are_another_data_set(change, said, tmp_path, monkeypatch):
    """What can be checked cheaply: the class folders, each class's first picture's size, a generated folder's mark."""
    from PIL import Image

    monkeypatch.setenv("TQDM_DISABLE", "1")
    other = imagenette_folder(tmp_path / "nette", per_class=2,
                              classes=["cats", "dogs"] if change == "classes" else None)
    if change != "mark":
        (other / marks.STANDIN_MARK).unlink()
    if change == "size":
        Image.new("RGB", (200, 100)).save(other / "train" / CLASSES[0][0] / "n01440764_0000.JPEG")
    differences = data_set.data_differences(type("Args", (), {"data_dir": str(other), "per_class": None})(),
                                              {"val": 4})
    assert list(differences) == ["data set"] and differences["data set"]["why"] == f"--data-dir {other}: {said}"
    (other / marks.STANDIN_MARK).unlink(missing_ok=True)
    if change == "size":  # the same folder with the release's sizes: a partial copy of Imagenette, no sample of it
        Image.new("RGB", (213, 160)).save(other / "train" / CLASSES[0][0] / "n01440764_0000.JPEG")
        assert list(data_set.data_differences(type("Args", (), {"data_dir": str(other), "per_class": None})(),
                                                {"val": 4})) == ["validation pictures", "pictures unchecked"]


# (the archive the manifest names, or None for no manifest; whether --compare notes the pictures as unchecked)
WHOLE_COPIES = [(None, True), ("0" * 32, True), (data_set.MD5, False)]


@pytest.mark.parametrize("md5,noted", WHOLE_COPIES, ids=["a copy", "another archive extracted", "the release"])
def test_a_whole_copy_stays_comparable_and_says_in_one_line_its_pictures_were_not_checked(md5, noted, tmp_path,
                                                                                          monkeypatch):
    """A --data-dir copy with the release's layout and counts is the article's data as far as a run can tell; unless
    the project extracted it from the release's archive (its manifest), one note line says its pictures were not
    checked against the release, and it moves no number."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr(imagenette, "SPLIT_COUNTS", {"train": 10 * 2, "val": 10 * 2})
    copy = imagenette_folder(tmp_path / "nette", per_class=2)
    (copy / marks.STANDIN_MARK).unlink()
    if md5:
        imagenette_archive.write_manifest(copy, "https://mirror.example/imagenette2-160.tgz", md5)
    differences = data_set.data_differences(type("Args", (), {"data_dir": str(copy), "per_class": None})(),
                                              {"val": 20})
    assert [item for item, difference in differences.items() if difference.get("moves", True)] == []
    rows, conclusions = verdicts.judge("posemb", {}, differences)
    lines = verdicts.comparison_lines(rows, conclusions, differences)
    notes = [line for line in lines if line.startswith("  note: ")]
    note = (f"  note: --data-dir {copy}: the release's layout and counts, its pictures not checked against the "
            f"release (the project checks the pictures of its own download, by the archive's MD5)")
    assert notes == ([note] if noted else [])
    assert lines[2] == "  setup: the article's"


def test_a_partial_copy_whose_split_used_is_whole_also_says_its_pictures_were_not_checked(tmp_path, monkeypatch):
    """posemb reads the validation split only: a copy with all of it and part of the training split is judged on the
    release's count, and its pictures were not checked either (the note was only for a whole copy)."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr(imagenette, "SPLIT_COUNTS", {"train": 10 * 2, "val": 10 * 2})
    copy = imagenette_folder(tmp_path / "nette", per_class=2)
    (copy / marks.STANDIN_MARK).unlink()
    next((copy / "train" / CLASSES[0][0]).iterdir()).unlink()
    differences = data_set.data_differences(type("Args", (), {"data_dir": str(copy), "per_class": None})(),
                                              {"val": 20})
    assert list(differences) == ["pictures unchecked"] and not differences["pictures unchecked"]["moves"]
    assert differences["pictures unchecked"]["why"] == (
        f"--data-dir {copy}: the release's layout (a partial copy), its pictures not checked against the release (the "
        f"project checks the pictures of its own download, by the archive's MD5)")


# (script, its flags, the subset's flag, another flag that moves the subset's accuracies too): issue 43
SUBSET_AND_ANOTHER_FLAG = [
    (posemb.main, ["--batch-size", "30", "--device", "cpu"], ["--per-class", "3"], ["--resolution", "288"]),
    (posemb.main, ["--batch-size", "30", "--device", "cpu"], ["--per-class", "3"], ["--precision", "bf16"]),
    (fewshot.main, ["--shots", "1", "5", "--no-cache", "--device", "cpu"], ["--per-class", "3"],
     ["--resolution", "256"]),
    (fewshot.main, ["--shots", "1", "5", "--no-cache", "--device", "cpu"], ["--per-class", "3"], ["--pool", "5"]),
]  # fine-tuning has no sampled accuracy: its step 0 is exact on any check, the later checks not comparable


@pytest.mark.parametrize("main,flags,subset,other", SUBSET_AND_ANOTHER_FLAG,
                         ids=[f"{main.__module__.removeprefix('vit_part3_')} {subset[0]} and {' '.join(other)}"
                              for main, _, subset, other in SUBSET_AND_ANOTHER_FLAG])
def test_a_sampled_accuracy_that_another_flag_moved_is_not_comparable_naming_it(main, flags, subset, other, release,
                                                                                tiny_in21k, tiny_classifier,
                                                                                as_the_release, tmp_path, monkeypatch):
    """An accuracy on a subset is judged by its 95% interval only when the subset is its one difference from the
    article's setup: another flag that it depends on as well (resolution, precision, the pool) makes it "not
    comparable", naming that flag, and it gets no interval verdict."""
    script = main.__module__.removeprefix("vit_part3_")
    monkeypatch.setattr(finetune, "ARTICLE_FLAGS", TINY_RECIPE)  # the stand-in's recipe as the article's
    model = tiny_classifier if script == "posemb" else tiny_in21k
    record = run_json(main, ["--model", str(model), "--data-dir", str(release), *flags, *subset, *other, "--compare"],
                      tmp_path / "run.json")
    entries, differences = load_reference(script), record["setup differences"]
    [sample] = [item for item, difference in differences.items() if difference["flag"] == " ".join(subset)]
    [moved] = [item for item, difference in differences.items() if difference["flag"] == " ".join(other)]
    assert differences[sample]["n"] == 30 and differences[sample]["of"] in (60, 1000)  # a sample, had it been alone
    sampled = [row for row in record["comparison"]
               if entries[row["name"]].get("sample") == sample and row["value"] is not None]
    # those that depend on the other flag too: they name it among their inputs, or name none (numbers of the weights)
    also_moved = [row for row in sampled if moved in entries[row["name"]].get("inputs", [moved])]
    assert also_moved
    for row in also_moved:
        assert row["verdict"] == "not comparable" and "interval" not in row, row
        assert " ".join(other) in row["flags"], row
    # the subset alone: the same numbers are judged by their interval (the case the other flag must override); so are
    # those the other flag does not move (posemb's 224 row runs at the checkpoint's own size)
    alone = {row["name"]: row for row in compare(record["numbers"], entries, {sample: differences[sample]})}
    assert all("interval" in alone[row["name"]] and alone[row["name"]]["verdict"] in ("close", "differs")
               for row in sampled)
    assert all(row["verdict"] == alone[row["name"]]["verdict"] for row in sampled if row not in also_moved)
