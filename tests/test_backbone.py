"""vit_backbone.py: the article's function and lines, the counts, the probes against independent solves, and the
whole script on stand-ins (a beans-shaped dataset in the Hub's layout and tiny classifiers)."""
import argparse
import re
from unittest import mock

import numpy as np
import psutil
import pytest
import scipy.linalg
import torch
from conftest import BACKBONE_ARTICLE, BACKBONE_FLAGS, compare, script_output
from PIL import Image

import figures.backbone
import vit_backbone as backbone
from common.run import Report, begin, tried, values
from common.start_and_end import UserError, guarded
from compare import published_files
from compare.marks import STANDIN_MARK
from compare.published_files import checkpoint_difference
from compare.record import named
from compare.verdicts import flag_differences, load_reference


def article_output(pattern):
    """The article's logged text that matches pattern (its output follows the code on the same line)."""
    return re.findall(pattern, BACKBONE_ARTICLE.read_text())


# ---------------------------------------------------------------- the article's function

def test_feature_map_on_a_hand_built_example():
    """Token k of picture b is [100 b + k, -(100 b + k)]: on a 2x3 grid it sits at row k // 3, column k % 3."""
    tokens = torch.tensor([[[100.0 * b + k, -(100.0 * b + k)] for k in range(6)] for b in range(2)])
    expected = [[[[0, 1, 2], [3, 4, 5]], [[0, -1, -2], [-3, -4, -5]]],
                [[[100, 101, 102], [103, 104, 105]], [[-100, -101, -102], [-103, -104, -105]]]]
    assert backbone.patch_tokens_to_feature_map(tokens, (2, 3)).tolist() == expected


def test_a_grid_that_does_not_match_is_refused():
    with pytest.raises(AssertionError, match=r"`num_patches` must be equal to `grid_h \* grid_w`"):
        backbone.patch_tokens_to_feature_map(torch.zeros(1, 6, 2), (2, 2))


@pytest.mark.skipif(not BACKBONE_ARTICLE.exists(), reason="the article is not beside the checkout")
def test_section_1_prints_the_article_lines(capsys):
    report = Report("backbone")
    backbone.section_feature_map(report, seed=42)
    printed = [text.strip() for text in capsys.readouterr().out.splitlines()]
    logged = article_output(r"(?:Patch tokens|Feature map) shape: torch\.Size\(\[[\d, ]+\]\)")
    assert len(logged) == 2 and all(text in printed for text in logged)
    assert values(report)["positions that agree"] == 32


# ---------------------------------------------------------------- the table, counted

def vit_parameters_by_hand(patch, resolution, width, layers, mlp, classes=1000):
    """A ViT classifier's parameters from its shapes: embedding, [class], positions, layers, final norm, head."""
    tokens = (resolution // patch) ** 2 + 1
    embedding = 3 * patch * patch * width + width
    layer = 4 * (width * width + width) + (width * mlp + mlp) + (mlp * width + width) + 2 * 2 * width
    backbone_count = embedding + width + tokens * width + layers * layer + 2 * width
    return backbone_count + width * classes + classes, backbone_count


@pytest.mark.parametrize("name,shape", [("google/vit-base-patch16-224", (16, 224, 768, 12, 3072)),
                                        ("google/vit-base-patch32-224", (32, 224, 768, 12, 3072)),
                                        ("google/vit-large-patch16-224", (16, 224, 1024, 24, 4096)),
                                        ("google/vit-large-patch32-384", (32, 384, 1024, 24, 4096))])
def test_table_rows_are_counted_as_by_hand(name, shape):
    assert backbone.counted_parameters(backbone.table_row_config(name)) == vit_parameters_by_hand(*shape)


def test_the_well_known_count_of_vit_base_16():
    assert vit_parameters_by_hand(16, 224, 768, 12, 3072) == (86_567_656, 85_798_656)


TABLE_SHAPES = {"google/vit-base-patch16-224": (16, 224, 768, 12, 3072),
                "google/vit-base-patch32-224": (32, 224, 768, 12, 3072),
                "google/vit-large-patch16-224": (16, 224, 1024, 24, 4096),
                "google/vit-large-patch32-384": (32, 384, 1024, 24, 4096)}


def test_the_tables_printed_word_and_the_comparisons_verdict_are_one_rule(capsys):
    """Each row's word is --compare's verdict for its count, and both are the whole classifier's count by hand,
    rounded to millions, against the article's column: 87 against 86 differs, 307 against 307 is the same."""
    report = Report("backbone")
    backbone.section_table(report)
    printed = capsys.readouterr().out.splitlines()
    numbers = named(report.script, report.given)[0]
    verdicts = {row["name"]: row["verdict"] for row in compare(numbers, load_reference("backbone"))}
    for name, table_millions in backbone.TABLE:
        word = next(text for text in printed if text.strip().startswith(name + " ")).split()[-1]
        by_hand = "same" if round(vit_parameters_by_hand(*TABLE_SHAPES[name])[0] / 1e6) == table_millions else "differs"
        assert word == verdicts[f"{name} parameters (M)"] == by_hand, name
    assert [verdicts[f"{name} parameters (M)"] for name, _ in backbone.TABLE] == ["differs"] * 3 + ["same"]
    assert any("the architecture its name stands for" in text for text in printed)


# ---------------------------------------------------------------- the probes

@pytest.mark.parametrize("lam", [0.01, 1.0, 100.0])
def test_closed_form_probe_equals_an_independent_solve(lam):
    """Ridge as least squares on [X; sqrt(lambda) I] W = [Y; 0], solved by SciPy."""
    rng = np.random.default_rng(3)
    train, labels, val = rng.normal(size=(40, 8)), rng.integers(0, 3, 40), rng.normal(size=(7, 8))
    x = np.hstack([train, np.ones((40, 1))])
    y = np.where(np.arange(3) == labels[:, None], 1.0, -1.0)
    expected = scipy.linalg.lstsq(np.vstack([x, np.sqrt(lam) * np.eye(9)]), np.vstack([y, np.zeros((9, 3))]))[0]
    w, scores = backbone.closed_form_probe(train, labels, val, 3, lam)
    assert np.allclose(w, expected, atol=1e-9)
    assert np.allclose(scores, np.hstack([val, np.ones((7, 1))]) @ expected, atol=1e-9)


def test_linear_probe_first_step_by_hand():
    """One epoch, one batch: W1 = W0 - lr (softmax(X W0^T + b0) - Y)^T X / n, lr = 0.001 x batch / 256."""
    rng = np.random.default_rng(4)
    x, labels = rng.normal(size=(10, 5)).astype(np.float32), rng.integers(0, 3, 10)
    generator = torch.Generator().manual_seed(7)
    w0 = torch.empty(3, 5).normal_(0.0, 0.01, generator=generator).double().numpy()  # the probe's first draw
    layer = backbone.linear_probe(x, labels, 3, epochs=1, seed=7, batch_size=16)
    logits = x @ w0.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    error = p - np.eye(3)[labels]
    lr = 0.001 * 16 / 256
    assert np.allclose(layer.weight.detach().numpy(), w0 - lr * error.T @ x / 10, atol=1e-7)
    assert np.allclose(layer.bias.detach().numpy(), -lr * error.mean(0), atol=1e-7)


def test_linear_probe_learns_separable_features():
    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(3), 30)
    x = (np.eye(3)[labels] * 3 + rng.normal(scale=0.3, size=(90, 3))).astype(np.float32)
    layer = backbone.linear_probe(x, labels, 3, epochs=100, seed=0, batch_size=16)
    accuracy, loss = backbone.scores_accuracy_loss(layer(torch.from_numpy(x)).detach(), labels)
    assert accuracy == 1.0 and loss < np.log(3) - 0.2  # below the loss of a zero head, ln 3


def test_pca_rgb_against_numpy_eigh():
    rng = np.random.default_rng(6)
    tokens = rng.normal(size=(2, 6, 5)) * np.array([5.0, 3.0, 2.0, 0.5, 0.1])
    x = tokens.reshape(-1, 5) - tokens.reshape(-1, 5).mean(0)
    _, vectors = np.linalg.eigh(x.T @ x)  # eigenvalues in ascending order
    top = vectors[:, ::-1][:, :3].T
    top *= np.sign(top[np.arange(3), np.abs(top).argmax(1)])[:, None]
    projected = x @ top.T
    expected = (projected - projected.min(0)) / (projected.max(0) - projected.min(0))
    assert np.allclose(backbone.pca_rgb(tokens, (2, 3)), expected.reshape(2, 2, 3, 3), atol=1e-9)


def differences(argv, counts=None, names=backbone.BEANS_CLASSES, published=True):
    """setup_differences of a run with these flags, its data loaded with (training, validation) pictures of these
    classes, or missing; its files' bytes the ones huggingface.co publishes, or not."""
    def load_beans(data_dir, per_class):
        if counts is None:
            raise UserError("dataset AI-Lab-Makerere/beans is not here")
        return {"train": range(counts[0]), "validation": range(counts[1]), "names": list(names),
                "folder": "beans"}  # as read_beans says

    with mock.patch.object(backbone, "local_copy", str), \
            mock.patch.object(backbone, "check_classifier_files", lambda name, example: name):
        args = backbone.parse_args(argv)  # folders that need not exist: their checks are the parser's (test_bad_inputs)
    with mock.patch.object(published_files, "cached_snapshot", lambda name: "cache"), \
            mock.patch.object(published_files, "unlike_the_hubs", lambda folder, repo, what: None):  # the Hub's bytes
        checkpoint = checkpoint_difference(args.model, backbone.MODEL)
    known = {**checkpoint, **flag_differences(args, backbone.ARTICLE_FLAGS)}
    unlike = None if published else "a copy whose data/train-00000-of-00001.parquet is not the one huggingface.co " \
                                     "publishes for AI-Lab-Makerere/beans"
    beans = tried(load_beans, args.data_dir, args.per_class)  # as main() loads them
    with mock.patch.object(backbone, "unlike_the_published_beans", lambda folder, what: unlike):
        return {**known, **backbone.setup_differences(beans, argparse.Namespace(args=args), known)}


def test_setup_differences_name_the_flags():
    assert differences([]) == {} and differences([], (1034, 133)) == {}
    changed = differences(["--epochs", "1", "--per-class", "20", "--lr", "1e-4"])
    assert set(changed) == {"epochs", "lr", "training pictures", "validation pictures"}
    assert changed["epochs"]["why"] == "--epochs 1: the article's is 5"
    assert changed["lr"]["why"] == "--lr 0.0001: the article's is 2e-05"
    partial = differences(["--data-dir", "x"], (100, 133))
    assert list(partial) == ["training pictures"]
    assert partial["training pictures"]["why"] == ("--data-dir x: 100 of 1,034 training pictures (a partial copy, not "
                                                   "a draw)")


def test_pictures_that_are_not_beans_are_another_data_set_and_no_sample_of_it(tmp_path):
    """A folder job/standins.py made, or other class names: the data set differs, named; its counts are no sample."""
    other = differences(["--data-dir", "x"], (100, 133), names=("cats", "dogs", "birds"))
    assert other == {"data set": {"flag": "--data-dir x", "why": "--data-dir x: classes cats, dogs, birds, not those "
                                                                 "of beans (angular_leaf_spot, bean_rust, healthy)"}}
    (tmp_path / STANDIN_MARK).write_text("made by job/standins.py")
    made = differences(["--data-dir", str(tmp_path)], (100, 133))
    assert list(made) == ["data set"] and "a stand-in generated by job/standins.py" in made["data set"]["why"]
    assert differences(["--model", str(tmp_path)], (1034, 133))["checkpoint"]["flag"] == f"--model {tmp_path}"


def test_beans_whose_files_are_not_the_published_ones_is_another_data_set():
    assert differences(["--data-dir", "x"], (1034, 133), published=False) == {"data set": {
        "flag": "--data-dir x", "why": "--data-dir x: a copy whose data/train-00000-of-00001.parquet is not the one "
                                       "huggingface.co publishes for AI-Lab-Makerere/beans"}}


def test_accuracy_metric_is_the_share_of_argmax_hits():
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 5.0], [4.0, 0.0, 0.0]])
    assert backbone.accuracy_metrics((logits, np.array([0, 1, 1, 2]))) == {"accuracy": 0.5}


# ---------------------------------------------------------------- the script on stand-ins

def numbers(record):
    return {name: number["value"] for name, number in record["numbers"].items() if "seconds" not in name}


def test_a_rerun_gives_the_same_numbers_and_reads_the_cache(backbone_runs):
    first, again, _ = backbone_runs["records"]
    assert numbers(first) == numbers(again)
    texts = [" ".join(record["printed"]) for record in (first, again)]
    assert "computed in" in texts[0] and "read from the cache in" in texts[1]
    assert len(list(backbone_runs["cache"].glob("backbone-*.npz"))) == 2  # one per checkpoint


def test_the_run_prints_the_article_dicts_and_the_four_ways(backbone_runs):
    printed = backbone_runs["records"][0]["printed"]
    dicts = [text.strip() for text in printed if text.strip().startswith("{'eval_loss': ")]
    assert len(dicts) == 2 and all(re.fullmatch(r"\{'eval_loss': [\d.e-]+, 'eval_accuracy': [\d.e-]+\}", d)
                                   for d in dicts)
    table = printed[next(i for i, text in enumerate(printed) if text.strip().startswith("way ")):
                    printed.index("== comparison with the article ==")]
    ways = [text.split()[0] for text in table if re.search(r"%\s", text)]
    assert ways == ["random", "linear", "closed", "closed", "closed", "full"]
    values = numbers(backbone_runs["records"][0])
    assert values["full fine-tuning (the article's after): accuracy (%)"] == pytest.approx(
        100 * values["after eval_accuracy"])
    assert values["linear probe: trained parameters"] == 3 * 64 + 3  # class token + mean patch token, width 32


def test_the_run_record_says_float32_is_torch_defaults_as_the_article_ran(backbone_runs):
    """The backbone article ran on CUDA with torch's defaults (TF32 convolutions); Part 3 on mps (strict)."""
    arithmetic = backbone_runs["records"][0]["environment"]["float32"]
    assert arithmetic["rule"] == "torch defaults"
    assert (arithmetic["TF32 matrix multiplies"], arithmetic["TF32 cuDNN convolutions"]) == (False, True)
    assert arithmetic["TF32 on this device"] is False  # --device cpu
    printed = " ".join(backbone_runs["records"][0]["printed"])
    assert "float32: torch's defaults, as the article ran" in printed and "seed 42: random, numpy and torch" in printed


def test_the_probe_line_says_how_it_differs_from_dinos_protocol(backbone_runs):
    line = next(text for text in backbone_runs["records"][0]["printed"] if "linear probe: DINO's" in text)
    assert "Resize 256 + CenterCrop 224" in line and "the last epoch's" in line
    assert "resized to 32x32, mean 0.5 and std 0.5" in line  # the stand-in's processor (job/standins.py)


def test_the_trainer_with_2_workers_gives_the_numbers_it_gives_with_none(beans_standins, backbone_runs, monkeypatch):
    """Worker processes beside a GPU must not move the article's numbers: the same evaluation dicts to the last
    digit and the same training losses as the main process alone (the session's first run of the same flags)."""
    alone = backbone_runs["records"][0]
    assert any("preprocessed by 0 worker processes" in line for line in alone["printed"])  # a CPU: none
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr(backbone, "loader_workers", lambda device: 2)
    args = backbone.parse_args(["--model", str(beans_standins["models"][0]), "--data-dir", str(beans_standins["data"]),
                                *BACKBONE_FLAGS])
    beans, processor = backbone.read_beans(args.data_dir, args.per_class), backbone.image_processor(args.model)
    result = backbone.finetune(beans, processor, begin("backbone", args, fp32_rule=backbone.ARTICLE_FP32_RULE)[0])
    assert result["workers"] == 2 and result["passes"]["training"]["pictures"] == 15 * 4  # 15 steps of 4
    assert result["passes"]["evaluations"]["pictures"] == 4 * 6  # before, at steps 10 and 15, after: 6 pictures
    # the training loader's persistent workers ended with the Trainer: none is left to hold the process at its exit
    spawned = [child for child in psutil.Process().children(recursive=True)
               if "multiprocessing.spawn" in " ".join(child.cmdline())]
    assert spawned == []
    with_workers = {f"step {entry['step']} {name}": entry[key] for entry in result["history"]
                    for name, key in (("training loss", "loss"), ("eval_loss", "eval_loss"),
                                      ("eval_accuracy", "eval_accuracy")) if key in entry}
    with_workers |= {f"{when} {key}": result[when][key] for when in ("before", "after")
                     for key in ("eval_loss", "eval_accuracy")}
    assert "step 10 training loss" in with_workers
    assert with_workers == {name: alone["numbers"][name]["value"] for name in with_workers}


def test_the_validation_pictures_preprocessed_once_are_what_the_processor_makes(beans_standins):
    """The evaluations read the validation pictures preprocessed once (by 2 worker processes here): each is the
    image processor's own output for that picture, with its label, in the dataset's order."""
    import functools

    from datasets import load_dataset
    from transformers import AutoImageProcessor

    split = load_dataset(str(beans_standins["data"]))["validation"]
    processor = AutoImageProcessor.from_pretrained(beans_standins["models"][0])
    transformed = split.with_transform(functools.partial(backbone.article_transform, processor))
    # a GPU's device type, which loader_workers gives worker processes: the transform pickled into them (no GPU used)
    loader = backbone.dataset_loader(transformed, list, torch.device("cuda"))
    assert loader.num_workers >= 1
    items = [item for batch in loader for item in batch]
    assert len(items) == len(split) == 6
    for item, row in zip(items, split, strict=True):
        expected = processor(row["image"].convert("RGB"), return_tensors="pt")["pixel_values"][0]
        assert torch.equal(item["pixel_values"], expected) and item["labels"] == row["labels"]


def test_the_saved_model_loads_in_a_pipeline_that_predicts_as_the_run_counted(backbone_runs, beans_standins):
    """--save-dir DIR: DIR/model, which from_pretrained and pipeline("image-classification") load, its classes named,
    the pipeline right on as many validation pictures as the run's accuracy after fine-tuning."""
    from transformers import pipeline

    beans = backbone.read_beans(beans_standins["data"])
    classify = pipeline("image-classification", model=str(backbone_runs["saved"] / "model"), device="cpu")
    guesses = classify(list(beans["validation"]["image"]), top_k=1)
    right = sum(guess[0]["label"] == beans["names"][label]
                for guess, label in zip(guesses, beans["validation"]["labels"], strict=True))
    assert right == backbone_runs["records"][0]["numbers"]["after right"]["value"]


@pytest.mark.parametrize("names,save_dir,said", [
    (["none"], None, None), (["wandb"], None, None), (["tensorboard"], "runs", None),
    (["tensorboard"], None, "its logs go to the Trainer's output folder, which without --save-dir is deleted"),
    (["tensorboard", "nosuch"], "runs", "nosuch is not one the Trainer knows"),
    (["mlflow"], None, "mlflow is not installed here: pip install mlflow"),
    (["all"], None, "its logs go to the Trainer's output folder"),  # all installed: tensorboard among them
    (["all"], "runs", None), (["none", "wandb"], None, "none and all each stand alone"),
])
def test_report_to_is_refused_before_any_work_where_the_trainer_could_not_report(names, save_dir, said, monkeypatch):
    import transformers.integrations

    monkeypatch.setattr(transformers.integrations, "get_available_reporting_integrations",
                        lambda: ["tensorboard", "wandb"])
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    why = backbone.reporting_problem(names, save_dir)
    assert why == said if said is None else why.startswith(said), why


def test_figures_are_pngs_that_open(backbone_runs):
    pytest.importorskip("matplotlib")
    for name in (figures.backbone.CURVES_FILE, figures.backbone.MAPS_FILE):
        with Image.open(backbone_runs["figures"] / name) as picture:
            picture.verify()
            assert picture.format == "PNG"


def test_offline_without_data_or_checkpoint_runs_sections_1_and_2(capsys, monkeypatch):
    """In the tests' own empty Hugging Face cache, offline (conftest): nothing of the article's data is there."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    status, out, err = script_output(lambda argv: guarded(lambda: backbone.main(argv)), [], capsys)
    assert status == 1 and "Traceback" not in out + err
    assert "Feature map shape: torch.Size([2, 64, 4, 4])" in out and "google/vit-large-patch32-384" in out
    refused = [text for text in out.splitlines() if "cannot run section" in text]
    assert len(refused) == 3
    for text in refused:
        assert "dataset AI-Lab-Makerere/beans" in text and "checkpoint google/vit-base-patch16-224" in text
        assert "--data-dir" in text


# A run that diverges: its training loss logged as nan or inf, or huge but finite with the last step's weights nan
# (which of the two a --lr gives may depend on the CPU's float32 arithmetic; --lr 1e5 diverged on one CPU here and
# only reached a loss of 3e11 on another, so the cases sit four orders of magnitude above that)
DIVERGED = (r"(the training loss is (nan|inf) over steps 1 to 2 \(lr {lr}\): the model diverged, fine-tuning stopped "
            r"there|the evaluation loss after fine-tuning is nan, the training loss [\d.e+]+ over steps 1 to 2 "
            r"\(lr {lr}\): the model diverged); lower --lr")


@pytest.mark.parametrize("lr,printed", [("1e30", r"1e\+30"), ("1e9", r"1e\+09")])
def test_a_learning_rate_that_diverges_is_one_line_for_each_section_that_needs_the_model(beans_standins, capsys,
                                                                                         monkeypatch, lr, printed):
    """Fine-tuning that diverges is refused in one line: section 4 says so, and section 5, which sets the same run
    beside the probes, says the same line; no feature map of nan, no traceback."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    argv = ["--model", str(beans_standins["models"][0]), "--data-dir", str(beans_standins["data"]), "--per-class", "2",
            "--epochs", "1", "--batch-size", "4", "--probe-epochs", "1", "--lr", lr, "--no-cache", "--device", "cpu"]
    status, out, err = script_output(lambda argv: guarded(lambda: backbone.main(argv)), argv, capsys)
    assert status == 1 and "Traceback" not in out + err
    refused = [text.strip() for text in out.splitlines() if "cannot run section" in text]
    assert len(refused) == 2
    titles = ("4. the article's fine-tuning", "5. three ways to adapt the same backbone")
    for title, text in zip(titles, refused, strict=True):
        assert re.fullmatch(f'cannot run section "{title}": ' + DIVERGED.format(lr=printed), text), text


def test_a_model_directory_without_its_files_is_refused_however_it_is_written(tmp_path, monkeypatch):
    """A directory named like a Hub id ("mymodel", "runs/mymodel") is a local checkpoint too: checked for its files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "mymodel").mkdir(parents=True)
    for name in ("runs", "runs/mymodel", str(tmp_path / "runs")):
        with pytest.raises(UserError, match=f"^--model {name} has no config.json: pass a checkpoint saved with "
                                            f"save_pretrained$"):
            backbone.check_classifier_files(name, "google/vit-base-patch16-224")
