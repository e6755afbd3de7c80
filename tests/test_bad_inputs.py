"""Bad input never ends in a traceback, a silent wrong number or a lost run: one line, a non-zero exit, no output.

Each case runs a script's main() in this process, as the shell would, and checks: the exit status, the
one line that names the flag or path (on stderr before any work, or a 'cannot run section' line
when only a section is refused), no traceback, and no output file left behind.
"""
import itertools
import json
import os
import shutil
import sys

import pytest
import torch
from conftest import ROOT, script_output

import reproduce
import vit_backbone
import vit_part3_fewshot
import vit_part3_finetune
import vit_part3_posemb
import vit_part3_setup
from common.start_and_end import guarded
from job import miniature, standins
from job.standins import beans_folder, imagenette_folder, vit_classifier, vit_in21k

sys.path.insert(0, str(ROOT / "benchmarks"))
import throughput

SCRIPTS = {"setup": vit_part3_setup.main, "posemb": vit_part3_posemb.main, "fewshot": vit_part3_fewshot.main,
           "finetune": vit_part3_finetune.main, "benchmark": throughput.main, "backbone": vit_backbone.main,
           "reproduce": reproduce.main, "standins": standins.main, "miniature": miniature.main}


def not_utf8(checkpoint):
    """A copy of the checkpoint in a folder whose name has a byte that is not UTF-8, or None where the file system
    refuses such a name (macOS's APFS)."""
    try:
        return shutil.copytree(checkpoint, checkpoint.parent / os.fsdecode(b"vit-\xff")).as_posix()
    except OSError:
        return None


@pytest.fixture(scope="module")
def places(tmp_path_factory, tiny_in21k):
    """Checkpoints, data folders and paths that the cases name by key."""
    root = tmp_path_factory.mktemp("bad")
    good = imagenette_folder(root / "nette", per_class=2)
    empty_class = imagenette_folder(root / "empty", per_class=2)
    for picture in (empty_class / "val" / "n03888257").iterdir():
        picture.unlink()
    one_split = imagenette_folder(root / "one-split", per_class=2)
    shutil.rmtree(one_split / "val" / "n01440764")
    (root / "a-file").write_text("not a folder")
    (root / "run" / "checkpoint.pt").mkdir(parents=True)
    bad_beans = root / "bad-beans" / "data"
    bad_beans.mkdir(parents=True)
    for split in ("train", "validation"):
        (bad_beans / f"{split}-00000-of-00001.parquet").write_bytes(b"not parquet")
    (root / "trainer-file" / "trainer").parent.mkdir()
    (root / "trainer-file" / "trainer").write_text("where the Trainer's folder goes")
    os.mkfifo(root / "fifo")
    piped = imagenette_folder(root / "piped", per_class=2)
    os.mkfifo(piped / "val" / "n01440764" / "zz_pipe.JPEG")
    dangling = imagenette_folder(root / "dangling", per_class=2)
    (dangling / "val" / "n01440764" / "zz_gone.JPEG").symlink_to(root / "no-such-picture.JPEG")
    return {"{classifier}": str(vit_classifier(root / "classifier")),
            "{truncated}": str(cut_short(vit_classifier(root / "truncated"))),
            "{garbage bin}": str(garbage_weights(vit_classifier(root / "garbage"))),
            "{no config}": str(without_config(vit_classifier(root / "no-config"))),
            "{beans bad picture}": str(beans_row(beans_folder(root / "beans-bad-picture"), image=b"not a picture")),
            "{beans bad label}": str(beans_row(beans_folder(root / "beans-bad-label"), labels=7)),
            "{beans no picture}": str(beans_row(beans_folder(root / "beans-no-picture"), image=None)),
            "{beans no label}": str(beans_row(beans_folder(root / "beans-no-label"), labels=None)),
            "{trainer file}": str(root / "trainer-file"), "{fifo}": str(root / "fifo"),
            "{long}": str(root / ("x" * 300)),
            "{small}": str(vit_classifier(root / "small", image_size=32)),
            "{in21k}": str(tiny_in21k), "{data}": str(good), "{empty class}": str(empty_class),
            "{one split}": str(one_split), "{dangling}": str(dangling), "{piped}": str(piped),
            "{file}": str(root / "a-file"),
            "{out}": str(root / "out"),
            "{folder}": str(root), "{run}": str(root / "run"), "{beans}": str(beans_folder(root / "beans")),
            "{bad beans}": str(root / "bad-beans"),
            "{classifier+processor}": str(vit_classifier(root / "cp", processor=True)),
            "{resnet}": str(resnet_classifier(root / "resnet")),
            "{headless}": str(with_processor(vit_in21k(root / "headless"))),
            "{cropping}": str(cropping(vit_classifier(root / "crop", processor=True))),
            "{deep processor}": str(hostile(vit_classifier(root / "deep"), "preprocessor_config.json",
                                            "[" * 100_000 + "]" * 100_000)),
            "{long mean}": str(hostile(vit_classifier(root / "mean"), "preprocessor_config.json",
                                       json.dumps({"image_mean": [0.5] * 10**6}))),
            "{misfit}": str(hostile(vit_classifier(root / "misfit"), "config.json", lambda config: json.dumps(
                {**json.loads(config), "intermediate_size": 2 * json.loads(config)["intermediate_size"]}))),
            "{patch 0}": str(edited(vit_classifier(root / "patch0", processor=True), patch_size=0)),
            "{sides}": str(edited(vit_classifier(root / "sides", processor=True), image_size=[48, 48])),
            "{bad act}": str(edited(vit_classifier(root / "act", processor=True), hidden_act="nope")),
            "{null config}": str(hostile(vit_classifier(root / "null", processor=True), "config.json", "null")),
            "{float filter}": str(edited(vit_classifier(root / "filter", processor=True), "preprocessor_config.json",
                                         resample=2.0)),
            "{beans cut picture}": str(beans_row(beans_folder(root / "beans-cut"), image=picture_bytes((64, 64),
                                                                                                    keep=0.5))),
            "{beans bomb}": str(beans_row(beans_folder(root / "beans-bomb"), image=picture_bytes((14000, 14000), "1",
                                                                                                 "PNG"))),
            "{beans twice}": str(twice_copied(beans_folder(root / "beans-twice"))),
            "{saved run}": str(saved_run(root / "saved-run")),
            "{not utf-8}": not_utf8(root / "cp")}  # a copy of {classifier+processor}, made above


def cut_short(directory):
    """A checkpoint whose weight file lost all but its first 3,000 bytes."""
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:3000])
    return directory


def garbage_weights(directory):
    """A checkpoint whose only weight file is a pytorch_model.bin that is no pickle."""
    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_bytes(b"not a weight file")
    return directory


def without_config(directory):
    (directory / "config.json").unlink()
    return directory


def beans_row(folder, **changes):
    """A beans copy whose first training row has changes: image (its bytes) or labels."""
    import pyarrow.parquet as pq

    path = folder / "data" / "train-00000-of-00001.parquet"
    rows = pq.read_table(path).to_pylist()
    if "image" in changes:  # None: a row without one
        rows[0]["image"] = changes["image"] and {**rows[0]["image"], "bytes": changes["image"]}
    rows[0]["labels"] = changes.get("labels", rows[0]["labels"])
    table = pq.read_table(path)
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)
    return folder


def picture_bytes(size, mode="RGB", form="JPEG", keep=1.0):
    """A picture of noise (mode "1": a blank one) of size, as a file's bytes: the first `keep` of them."""
    import io

    import numpy as np
    from PIL import Image

    if mode == "1":  # a blank one: a large one costs little memory
        picture = Image.new("1", size)
    else:
        picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buffer = io.BytesIO()
    picture.save(buffer, form)
    return buffer.getvalue()[:int(len(buffer.getvalue()) * keep)]


def saved_run(root):
    """A --save-dir of an earlier run: the classifier it saved in model/."""
    vit_classifier(root / "model", processor=True)
    return root


def twice_copied(folder):
    """A beans copy whose data/ was copied again into old/data/: every split's files in two folders."""
    shutil.copytree(folder / "data", folder / "old" / "data")
    return folder


def hostile(directory, file, content):
    """A checkpoint whose file is replaced by content (a function of its text: what it becomes)."""
    path = directory / file
    path.write_text(content(path.read_text()) if callable(content) else content)
    return directory


def edited(directory, file="config.json", **changes):
    """A checkpoint whose JSON file has these fields changed, as a mirror could serve it."""
    return hostile(directory, file, lambda text: json.dumps({**json.loads(text), **changes}))


def cropping(directory):
    """A checkpoint whose image processor crops the picture, as the scripts do not."""
    config = json.loads((directory / "preprocessor_config.json").read_text())
    (directory / "preprocessor_config.json").write_text(json.dumps({**config, "do_center_crop": True}))
    return directory


def with_processor(directory):
    from transformers import ViTImageProcessor

    ViTImageProcessor().save_pretrained(directory)
    return directory


def resnet_classifier(directory):
    """A tiny image classifier that is not a ViT, saved with its image processor."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 8], depths=[1, 1], num_labels=3)
    ResNetForImageClassification(config).save_pretrained(directory)
    return with_processor(directory)


# (script, flags, exit status, what the one line must name); {key} is a place from the fixture.
CASES = [
    ("setup", ["--json", "{folder}"], 2, "--json"),
    ("setup", ["--json", "{file}/x.json"], 2, "--json"),
    ("setup", ["--no-such-flag"], 2, "--no-such-flag"),
    ("posemb", ["--model", "{classifier}", "--resolution", "64", "--json", "{out}/p.json"], 2, "--resolution 64"),
    ("posemb", ["--model", "{classifier}", "--resolution", "96"], 2, "--resolution 96"),
    ("posemb", ["--model", "{classifier}", "--resolution", "160"], 2, "--resolution 160"),
    ("posemb", ["--model", "{classifier}", "--resolution", "16"], 2, "--resolution"),
    ("posemb", ["--model", "{classifier}", "--resolution", "big"], 2, "--resolution"),
    ("posemb", ["--model", "{small}", "--resolution", "64"], 2, "position grid is 2x2"),
    ("posemb", ["--model", "./no-such-checkpoint"], 2, "--model ./no-such-checkpoint: the directory does not exist"),
    ("posemb", ["--model", "{file}"], 2, "is a file, not a checkpoint directory"),
    ("posemb", ["--model", "google/vit base"], 2, "--model google/vit base: the directory does not exist"),  # no Hub id
    ("posemb", ["--model", ""], 2, "--model is empty"),
    ("posemb", ["--batch-size", "0"], 2, "--batch-size"),
    ("posemb", ["--per-class", "-3"], 2, "--per-class"),
    ("posemb", ["--precision", "fp16"], 2, "--precision"),
    ("posemb", ["--device", "tpu"], 2, "--device"),
    ("posemb", ["--model", "{classifier}", "--data-dir", "{folder}/nowhere"], 1, "--data-dir"),
    ("posemb", ["--model", "{classifier}", "--data-dir", "{file}"], 1, "is a file"),
    ("posemb", ["--model", "{classifier}", "--plots", "{file}/figures"], 2, "--plots"),
    ("posemb", ["--model", "{in21k}", "--data-dir", "{data}"], 1, "has 2 labels, not the 1,000 of ImageNet"),
    ("posemb", ["--model", "{cropping}"], 2, "its image processor crops the picture (do_center_crop)"),
    ("finetune", ["--model", "{cropping}"], 2, "its image processor crops the picture (do_center_crop)"),
    # hostile files from a mirror: one line, never a traceback or megabytes of it
    ("posemb", ["--model", "{deep processor}"], 2, "its preprocessor_config.json is not a JSON object (RecursionError"),
    ("posemb", ["--model", "{long mean}"], 2, "image_mean of 1,000,000 values and image_std [0.5, 0.5, 0.5]"),
    ("posemb", ["--model", "{misfit}", "--data-dir", "{data}"], 1, "is not a saved checkpoint directory: You set"),
    ("fewshot", ["--lambdas", "-1"], 2, "--lambdas"),
    ("fewshot", ["--lambdas", "nan"], 2, "--lambdas"),
    ("fewshot", ["--lambdas", "1", "inf"], 2, "--lambdas"),
    ("fewshot", ["--shots", "0"], 2, "--shots"),
    ("fewshot", ["--shots", "60"], 2, "--shots 60"),
    ("fewshot", ["--draws", "0"], 2, "--draws"),
    ("fewshot", ["--pool", "many"], 2, "--pool"),
    ("fewshot", ["--json", "{file}/f.json"], 2, "--json"),
    ("fewshot", ["--plots", "{file}"], 2, "--plots"),
    ("fewshot", ["--model", "{in21k}", "--data-dir", "{empty class}", "--no-cache", "--pool", "2", "--shots", "1"], 1,
     "n03888257"),
    ("fewshot", ["--model", "{in21k}", "--data-dir", "{one split}", "--no-cache", "--pool", "2", "--shots", "1"], 1,
     "n01440764"),
    ("fewshot", ["--model", "{in21k}", "--data-dir", "{file}", "--no-cache"], 1, "is a file, not a folder"),
    # a picture the feature cache's key cannot read (a link to nowhere, a file without read permission)
    ("fewshot", ["--model", "{in21k}", "--data-dir", "{dangling}", "--pool", "2", "--shots", "1"], 1,
     "n01440764/zz_gone.JPEG: [Errno 2] No such file or directory"),
    ("fewshot", ["--json", "{out}/new/"], 2, "/new/ ends with /, as a folder's name does: give a file name"),
    ("setup", ["--json", "{file}/"], 2, "a-file/ ends with /"),  # it replaced the file
    ("finetune", ["--lr", "-1"], 2, "--lr"),
    ("finetune", ["--lr", "nan"], 2, "--lr"),
    ("finetune", ["--lr", "0"], 2, "--lr"),
    ("finetune", ["--steps", "0"], 2, "--steps"),
    ("finetune", ["--save-every", "0"], 2, "--save-every"),
    ("finetune", ["--resume"], 2, "--save-dir"),
    ("finetune", ["--save-dir", "{out}/late", "--steps", "5", "--pause-at", "5"], 2, "--pause-at 5 is not before"),
    ("finetune", ["--save-dir", "{out}/late", "--pause-at", "301"], 2, "from 1 to 299"),
    ("finetune", ["--save-dir", "{file}"], 2, "--save-dir"),
    ("finetune", ["--save-dir", "{file}/run"], 2, "--save-dir"),
    ("finetune", ["--json", "{folder}"], 2, "--json"),
    ("finetune", ["--plots", "{file}/figures"], 2, "--plots"),
    ("finetune", ["--batch-size", "10", "--accum-steps", "4"], 2, "--batch-size 10"),
    ("finetune", ["--model", "{small}", "--resolution", "32"], 0, None),  # the smallest grid it can serve: runs
    ("finetune", ["--model", "./typo"], 2, "--model ./typo"),
    ("finetune", ["--model", "{in21k}", "--data-dir", "{data}", "--save-dir", "{out}/empty", "--resume"], 1,
     "--resume"),
    ("finetune", ["--model", "{in21k}", "--data-dir", "{empty class}", "--steps", "1"], 1, "n03888257"),
    ("finetune", ["--model", "{in21k}", "--data-dir", "{file}", "--steps", "1"], 1, "is a file, not a folder"),
    ("finetune", ["--model", "{in21k}", "--data-dir", "{dangling}", "--save-dir", "{out}/dangling", "--steps", "1"],
     1, "n01440764/zz_gone.JPEG: [Errno 2] No such file or directory"),  # read_inputs, for --resume
    ("backbone", ["--data-dir", "{folder}/nowhere"], 2, "/nowhere does not exist"),
    ("backbone", ["--data-dir", ""], 2, "--data-dir: an empty path"),  # would mean the Hub's copy: a download
    ("backbone", ["--plots", ""], 2, "--plots: an empty path"),
    ("backbone", ["--data-dir", "{file}"], 2, "is a file, not a folder"),
    ("backbone", ["--data-dir", "{data}"], 2, "no parquet file for the split(s) train, validation"),
    ("backbone", ["--model", "./no-such-checkpoint"], 2, "--model ./no-such-checkpoint"),
    ("backbone", ["--model", "{folder}"], 2, "has no config.json"),
    ("backbone", ["--epochs", "0"], 2, "--epochs"),
    ("backbone", ["--lr", "nan"], 2, "--lr"),
    ("backbone", ["--lambdas", "-1"], 2, "--lambdas"),
    ("backbone", ["--probe-epochs", "many"], 2, "--probe-epochs"),
    ("backbone", ["--json", "{folder}"], 2, "--json"),
    ("backbone", ["--plots", "{file}/figures"], 2, "--plots"),
    ("backbone", ["--model", "{classifier+processor}", "--data-dir", "{bad beans}"], 1,
     "cannot read it as AI-Lab-Makerere/beans"),
    ("backbone", ["--model", "{in21k}", "--data-dir", "{beans}"], 2, "has no preprocessor_config.json"),
    ("backbone", ["--model", "{resnet}"], 2, "is a resnet checkpoint, not a ViT"),
    ("backbone", ["--model", "{headless}", "--data-dir", "{beans}", "--epochs", "1"], 1,
     "has no classification head"),
    ("backbone", ["--seed", "-1"], 2, "--seed"),
    ("backbone", ["--save-dir", "{file}"], 2, "--save-dir"),
    ("backbone", ["--report-to", "nosuch"], 2, "--report-to nosuch: nosuch is not one the Trainer knows"),
    ("backbone", ["--report-to", "comet_ml"], 2, "--report-to comet_ml: comet_ml is not installed here"),
    ("backbone", ["--seed", "4294967296"], 2, "--seed"),
    ("backbone", ["--lambdas", "1", "1.0"], 2, "--lambdas: 1 given twice"),
    ("fewshot", ["--lambdas", "0.01", "1e-2"], 2, "--lambdas: 0.01 given twice"),
    ("fewshot", ["--seed", "x"], 2, "--seed"),
    ("finetune", ["--seed", "-1"], 2, "--seed"),
    # absurd sizes are refused before any work, not found by the kernel's out-of-memory killer
    ("posemb", ["--resolution", "100000"], 2, "--resolution: '100000' pixels is too large: at most 1024"),
    ("fewshot", ["--resolution", "20000"], 2, "--resolution"),
    ("finetune", ["--resolution", "1040"], 2, "--resolution"),
    ("finetune", ["--steps", "1000000000000"], 2,
     "--steps: '1000000000000' is not a number of steps from 1 to 100,000"),
    # an empty path would quietly mean the default (a download) or nothing written
    ("setup", ["--json", ""], 2, "--json: an empty path"),
    ("posemb", ["--plots", " "], 2, "--plots: an empty path"),
    ("fewshot", ["--data-dir", ""], 2, "--data-dir: an empty path"),
    ("finetune", ["--save-dir", ""], 2, "--save-dir: an empty path"),
    ("finetune", ["--save-dir", "{run}"], 2, "its checkpoint.pt is a folder"),
    ("benchmark", ["--batch-size", "0"], 2, "--batch-size"),
    ("benchmark", ["--json", "{folder}"], 2, "--json"),
    ("benchmark", ["--size", "huge"], 2, "--size"),
    ("benchmark", ["--repeats", "-1"], 2, "--repeats"),
    ("benchmark", ["--loader-only", "--workers", "0"], 2, "--workers"),
    ("benchmark", ["--loader-only", "--loader-pictures", "many"], 2, "--loader-pictures"),
    # the job: refused before its plan, offline too (the tests run offline), whatever scripts cannot run
    ("reproduce", ["{out}/job", "--extra", "finetune=--steps -5"], 2,
     "--extra for vit_part3_finetune.py: argument --steps"),
    ("reproduce", ["{out}/job", "--extra", "finetune=--resu"], 2, "--resu is set by reproduce.py itself"),
    ("reproduce", ["{out}/job", "--extra", "posemb=--resolution 100000"], 2, "--resolution"),
    ("reproduce", ["{out}/job", "--extra", "finetune=--data-dir ''"], 2, "--data-dir: an empty path"),
    ("reproduce", ["{out}/job", "--device", "cuda"], 2, "cuda"),  # where torch sees no CUDA GPU
    ("reproduce", ["{out}/job", "--imagenette", "{file}"], 2, "is a file, not a folder"),
    # found by an independent hunt: each was a traceback, a file replaced or a run in the wrong place
    ("setup", ["--json", "{fifo}"], 2, "is not a regular file (a device, a pipe or stdout)"),  # /dev/null replaced
    ("posemb", ["--json", "-"], 2, "--json - is not a regular file (a device, a pipe or stdout)"),  # wrote "-"
    ("setup", ["--json", "{long}.json"], 2, "--json: "),
    ("posemb", ["--data-dir", "{long}"], 2, "a name longer than the file system allows"),
    ("finetune", ["--save-dir", "{long}"], 2, "--save-dir"),
    ("reproduce", ["{long}"], 2, "a name longer than the file system allows"),
    ("reproduce", [""], 2, "OUT: an empty path"),  # the job ran into the current folder
    ("reproduce", ["{out}/job", "--imagenette", ""], 2, "--imagenette: an empty path"),
    ("posemb", ["--model", "{truncated}", "--data-dir", "{data}"], 1,
     "its weight file cannot be read (Error while deserializing header"),
    ("posemb", ["--model", "{garbage bin}", "--data-dir", "{data}"], 1, "its weight file cannot be read (Unpickling"),
    ("posemb", ["--model", "{no config}", "--data-dir", "{data}"], 1, "it has no config.json"),
    ("posemb", ["--batch-size", "1000000000000000000000000000000"], 2, "--batch-size"),
    ("finetune", ["--batch-size", "9223372036854775807"], 2, "from 1 to 65,536"),
    ("backbone", ["--batch-size", "100000"], 2, "--batch-size"),
    ("finetune", ["--lr", "1e39"], 2, "at most 3.4e+38 (float32's largest)"),
    ("backbone", ["--lr", "1e308"], 2, "--lr"),
    ("finetune", ["--save-dir", "{out}/ft", "--json", "{out}/ft/checkpoint.pt"], 2, "is where --save-dir"),
    ("backbone", ["--save-dir", "{trainer file}"], 2, "its trainer is a file, not a folder"),
    ("backbone", ["--model", "{classifier+processor}", "--data-dir", "{beans bad picture}", "--epochs", "1"], 1,
     "row 0 of its train split holds bytes that are not a picture"),
    ("backbone", ["--model", "{classifier+processor}", "--data-dir", "{beans bad label}", "--epochs", "1"], 1,
     "row 0 of its train split has the label 7, not one of its 3 classes"),
    # found by a second hunt: each lost the run's end (a folder where its file goes) or replaced one of its inputs
    ("posemb", ["--json", "{out}/same", "--plots", "{out}/same"], 2, "/same is a folder: give a file name"),
    ("finetune", ["--save-dir", "{out}/ft2", "--plots", "{out}/ft2/checkpoint.pt"], 2, "is where --save-dir"),
    ("backbone", ["--save-dir", "{out}/bb", "--json", "{out}/bb/model"], 2, "keeps its model: give another place"),
    ("backbone", ["--save-dir", "{out}/bb", "--plots", "{out}/bb/trainer"], 2, "keeps its trainer"),
    ("fewshot", ["--model", "{in21k}", "--json", "{in21k}/record.json"], 2, "is inside --model"),
    ("posemb", ["--data-dir", "{data}", "--json", "{data}/val/record.json"], 2, "is inside --data-dir"),
    ("posemb", ["--model", "{classifier}", "--data-dir", "{piped}"], 1, "zz_pipe.JPEG is not a picture file"),  # hung
    ("fewshot", ["--model", "{in21k}", "--data-dir", "{piped}", "--pool", "2", "--shots", "1"], 1,
     "zz_pipe.JPEG is not a picture file"),
    ("posemb", ["--model", "{patch 0}"], 2, "patch_size 0: each must be a whole number of pixels, at least 1"),
    ("finetune", ["--model", "{patch 0}"], 2, "patch_size 0: each must be a whole number of pixels, at least 1"),
    ("backbone", ["--model", "{patch 0}"], 2, "patch_size 0: each must be a whole number of pixels, at least 1"),
    ("fewshot", ["--model", "{patch 0}", "--data-dir", "{data}", "--no-cache", "--pool", "2", "--shots", "1"], 1,
     "its config.json describes no model the library can build (ZeroDivisionError"),
    ("posemb", ["--model", "{sides}"], 2, "image_size [48, 48] and patch_size 16: each must be a whole number"),
    ("posemb", ["--model", "{bad act}", "--data-dir", "{data}"], 1,
     "its config.json describes no model the library can build (KeyError: 'nope')"),
    ("posemb", ["--model", "{null config}"], 2, "its config.json describes no model the library can build (TypeError"),
    ("backbone", ["--model", "{null config}"], 2, "describes no model the library can build (TypeError"),
    ("posemb", ["--model", "{float filter}"], 2, "its image processor resamples with filter 2.0, not one of PIL's"),
    ("backbone", ["--model", "{classifier+processor}", "--data-dir", "{beans no picture}", "--epochs", "1"], 1,
     "row 0 of its train split holds no picture"),
    ("backbone", ["--model", "{classifier+processor}", "--data-dir", "{beans no label}", "--epochs", "1"], 1,
     "row 0 of its train split has the label None, not one of its 3 classes"),
    ("posemb", ["--model", "{not utf-8}"], 2, "its path has a byte that is not UTF-8 text"),  # blamed its weights
    ("backbone", ["--model", "{not utf-8}"], 2, "its path has a byte that is not UTF-8 text"),
    ("standins", ["{file}"], 2, "is a file, not a folder"),  # a traceback
    ("standins", [""], 2, "an empty path"),  # built in the current folder
    ("miniature", ["{long}"], 2, "a name longer than the file system allows"),
    ("miniature", ["{file}/mini"], 2, "is a file, not a folder"),
    # found by a third hunt: the record written over a figure said to be saved, a figure read as a picture, no end
    ("fewshot", ["--plots", "{out}/f", "--json", "{out}/f/fewshot_accuracy.png"], 2, "is where --plots"),
    ("posemb", ["--plots", "{out}/p", "--json", "{out}/p/posemb_accuracy.png"], 2, "saves a figure"),
    ("posemb", ["--data-dir", "{data}", "--plots", "{data}/val"], 2, "is inside --data-dir"),
    ("finetune", ["--model", "{in21k}", "--save-dir", "{in21k}/run"], 2, "is inside --model"),
    ("fewshot", ["--draws", "1001"], 2, "is not a number of draws from 1 to 1,000"),
    ("backbone", ["--probe-epochs", "100000000"], 2, "is not a number of epochs from 1 to 10,000"),
    ("backbone", ["--model", "{saved run}/model", "--save-dir", "{saved run}"], 2, "would replace it"),  # then read
    ("finetune", ["--model", "{saved run}/model", "--save-dir", "{saved run}"], 2, "would replace it"),
    ("backbone", ["--model", "{classifier+processor}", "--data-dir", "{beans cut picture}", "--epochs", "1"], 1,
     "row 0 of its train split holds a picture that cannot be decoded (image file is truncated"),  # a traceback
    ("backbone", ["--model", "{classifier+processor}", "--data-dir", "{beans bomb}", "--epochs", "1"], 1,
     "row 0 of its train split holds a picture too large to decode safely"),
    ("backbone", ["--data-dir", "{beans twice}"], 2, "holds parquet files of the train split in 2 folders"),
    ("backbone", ["--report-to", "kubeflow"], 2, "only inside a Kubeflow trainer"),  # "pip install kubeflow"
]


def fill(flags, places):
    filled = []
    for flag in flags:
        for key, place in places.items():
            flag = flag.replace(key, place)
        filled.append(flag)
    return filled


@pytest.mark.parametrize("script,flags,status,names", CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_a_bad_input_is_one_line_and_a_non_zero_exit(script, flags, status, names, places, capsys, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    if flags[-2:] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    if any(places.get(flag, "") is None for flag in flags):
        pytest.skip("this file system refuses a name that is not UTF-8")
    argv = fill(flags, places)
    if script == "finetune" and status == 0:
        argv += ["--data-dir", places["{data}"], "--steps", "1", "--batch-size", "4", "--device", "cpu"]
    code, out, err = script_output(lambda a: guarded(lambda: SCRIPTS[script](a)), argv, capsys)
    assert code == status, out[-1500:] + err[-1500:]
    assert "Traceback" not in out + err
    assert all(len(text) < 1000 for text in (out + err).splitlines())  # no value of a hostile file printed whole
    if status == 2:
        lines = [text for text in err.splitlines() if text.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], err
    elif status == 1:
        refused = [text for text in out.splitlines() if "cannot run section" in text]
        assert refused and all(names in text for text in refused), out
    for flag, value in itertools.pairwise(argv):
        if flag == "--json" and status and value.endswith(".json"):
            assert not os.path.exists(value), value  # a refused run leaves no output file behind


def test_there_are_at_least_thirty_cases_over_every_script():
    assert len(CASES) >= 30 and {script for script, *_ in CASES} == set(SCRIPTS)
