"""ViT as a backbone: the split into backbone and head, the table of configurations, the article's
fine-tuning on beans with transformers.Trainer, and three ways to adapt the same backbone side by side.

Reproduces the companion article "ViT as a backbone":
  1. patch_tokens_to_feature_map: (B, N, D) -> (B, D, H_p, W_p) on (2, 16, 64) tokens, and its refusal
     of a grid that does not match;
  2. the article's table of common ViT configurations, each row counted on torch's meta device;
  3. google/vit-base-patch16-224: its configuration as the article prints it, the output tokens split
     into the class token and the patch tokens, one picture's patch tokens as a (1, 768, 14, 14) map,
     the parameters of the backbone and of the head;
  4. the article's fine-tuning on AI-Lab-Makerere/beans with transformers.Trainer (the recipe below):
     trainer.evaluate() before and after;
  5. beyond the article, on the same pictures: the random new head, a linear probe on frozen features
     (DINO's linear evaluation), Part 3's closed-form probe on the same features, full fine-tuning.

    python vit_backbone.py                   # downloads the checkpoint and beans once
    python vit_backbone.py --compare --json results/backbone.json --plots figures/
    python vit_backbone.py --data-dir beans/ # a local copy of the dataset's files (README.md, data/*.parquet)
    python vit_backbone.py --per-class 20 --epochs 1    # a quick look: not the article's setup
    python vit_backbone.py --no-cache        # section 5's features neither read from nor kept in data/features/
"""
from common.start_and_end import BACKBONE, UserError, before_torch_loads, guarded, say

if __name__ == "__main__":  # before torch loads: a Ctrl-C then is one line, as a later one
    before_torch_loads(BACKBONE)

import functools
import hashlib
import io
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader

from common.data import NEW_PASS, PREFETCH, WORKER_START, loader_workers, record_event, timed, worker_setup
from common.features import cache_key, cached, closed_form

# transformers and datasets are imported in the functions that use them: a DataLoader worker (spawn) runs this file's
# top lines again, where they would add about 3 s to every worker's start (docs/performance.md; tests/test_loader.py)
from common.paths import BEANS, BEANS_MB, BEANS_SPLITS, FEATURE_CACHE_DIR
from common.pretrained import ask_hub, checkpoint_config, hub_download, load_pretrained, save_loadable, table1_config
from common.run import (
    PRECISIONS,
    EachOnce,
    batch_pictures,
    begin,
    conclude,
    experiment_parser,
    float32_arithmetic,
    nonempty_path,
    nonnegative_float,
    pass_text,
    positive_float,
    positive_int,
    section,
    seed_number,
    tried,
    whole_number,
)
from compare.data_set import subset_differences
from compare.marks import made_here
from compare.published_files import unlike_the_published
from figures import origin_of
from figures.backbone import CURVES_FILE, MAPS_FILE, backbone_curves, backbone_feature_maps

# ---------------------------------------------------------------- the recipe, where the article states it
MODEL = "google/vit-base-patch16-224"  # model_id: an ImageNet-1k classifier whose head is replaced by a 3-class one
SEED = 42               # dnnlpy.set_seed(42), after the imports
BATCH = 16              # TrainingArguments(per_device_train_batch_size=16, per_device_eval_batch_size=16)
EPOCHS = 5              # num_train_epochs=5
LR = 2e-5               # learning_rate=2e-5 (AdamW, linear decay: the Trainer's defaults)
LOGGING_STEPS = 10      # logging_steps=10 with eval_strategy='steps': the training loss and an evaluation every 10
SAVED_MODEL, TRAINER_DIR = "model", "trainer"  # --save-dir's folders: the fine-tuned model, the Trainer's output
RELEASED = {"training pictures": 1034, "validation pictures": 133}
# ds['train'].features['labels'].names  # ds['train'], ds['validation'] as released
BEANS_CLASSES = ("angular_leaf_spot", "bean_rust", "healthy")
ARTICLE_FLAGS = {item: (item, value) for item, value in (("seed", SEED), ("batch_size", BATCH), ("epochs", EPOCHS),
                                                          ("lr", LR), ("precision", "fp32"))}
ARTICLE_FP32_RULE = "torch defaults"  # "Using device: cuda": TF32 convolutions on Ampere+ GPUs, as --precision fp32
# The article's table "Common ViT configurations": model name, then its Parameters column in millions.
TABLE = [("google/vit-base-patch16-224", 86), ("google/vit-base-patch32-224", 86),
         ("google/vit-large-patch16-224", 307), ("google/vit-large-patch32-384", 307)]
TABLE_COLUMNS = {"patch size": "patch_size", "input resolution": "image_size", "embedding dimension": "hidden_size",
                 "layers": "num_hidden_layers", "heads": "num_attention_heads"}  # number name -> config field
CONFIG_LINES = {"Image size": "image_size", "Patch size": "patch_size", "Hidden size": "hidden_size",
                "Number of hidden layers": "num_hidden_layers", "Number of attention heads": "num_attention_heads",
                "Intermediate size": "intermediate_size"}  # the article's print()s of model.config
# Beyond the article: DINO's linear evaluation (Caron et al. 2021, eval_linear.py; docs/scripts.md), on frozen features.
PROBE = {"std": 0.01, "momentum": 0.9, "base_lr": 0.001, "batch_size": 128}
PROBE_EPOCHS = 100
probe_epochs = functools.partial(whole_number, low=1, high=10_000,  # argparse type: 100 x DINO's 100
                                 refusal="is not a number of epochs from 1 to 10,000")
LAMBDAS = [0.01, 1.0, 100.0]  # Part 3's closed-form probe: the ridge penalties it tries
MAP_PICTURES = 4  # validation pictures in the feature-map figure


# ---------------------------------------------------------------- the article's functions, pure

def patch_tokens_to_feature_map(patch_tokens, grid_size):
    """(B, N, D) -> (B, H_p, W_p, D) -> (B, D, H_p, W_p), as the article defines it."""
    batch_size, num_patches, embed_dim = patch_tokens.size()
    grid_h, grid_w = grid_size
    if num_patches != grid_h * grid_w:
        raise AssertionError("`num_patches` must be equal to `grid_h * grid_w`.")
    x = patch_tokens.reshape(batch_size, grid_h, grid_w, embed_dim)
    return x.permute(0, 3, 1, 2)


def split_tokens(last_hidden_state):
    """Z_L (B, N+1, D) -> the class token z_cls (B, D) and the patch tokens z_1..z_N (B, N, D)."""
    return last_hidden_state[:, 0], last_hidden_state[:, 1:]


def accuracy_metrics(eval_pred):
    """The article's compute_metrics, with the accuracy computed directly (evaluate.load downloads a script)."""
    logits, labels = eval_pred
    return {"accuracy": float(np.mean(np.argmax(logits, axis=-1) == labels))}


def collate_fn(images):
    """The article's collate function."""
    pixel_values = torch.stack([image["pixel_values"] for image in images])
    labels = torch.tensor([image["labels"] for image in images])
    return {"pixel_values": pixel_values, "labels": labels}


def article_transform(processor, batch):
    """The article's transform (its `transform`), a module-level function so that spawned workers can unpickle it."""
    inputs = processor([image.convert("RGB") for image in batch["image"]], return_tensors="pt")
    inputs["labels"] = batch["labels"]
    return inputs


def table_row_config(name):
    """The ViTConfig a model name stands for: vit-<size>-patch<P>-<resolution>, the size from Table 1."""
    found = re.fullmatch(r"(?:.*/)?vit-(base|large|huge)-patch(\d+)-(\d+)", name)
    if found is None:
        raise ValueError(f"{name} is not a vit-<size>-patch<P>-<resolution> name")
    return table1_config({"base": "B", "large": "L", "huge": "H"}[found[1]], int(found[2]), image_size=int(found[3]),
                         num_labels=1000)  # the released checkpoints are ImageNet-1k classifiers


def counted_parameters(config):
    """(the whole classifier, its backbone) parameters of a ViTForImageClassification built on the meta device."""
    from transformers import ViTForImageClassification

    with torch.device("meta"):
        model = ViTForImageClassification(config)
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.vit.parameters())


def pca_rgb(tokens, grid):
    """Patch tokens (n, N, D) -> (n, H_p, W_p, 3) in [0, 1]: their first three principal components, one basis for
    all n pictures, each scaled to [0, 1] over all, its sign so that its largest loading is positive (fixed colours)."""
    x = np.asarray(tokens, dtype=np.float64).reshape(-1, tokens.shape[-1])
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    basis = vt[:3] * np.sign(vt[:3][np.arange(3), np.abs(vt[:3]).argmax(1)])[:, None]
    projected = x @ basis.T
    low, high = projected.min(0), projected.max(0)
    scaled = (projected - low) / np.where(high > low, high - low, 1.0)
    return scaled.reshape(tokens.shape[0], *grid, 3)


def one_per_class(labels, count):
    """Indices of up to count pictures: the first of each class in turn, then the second of each, and so on."""
    labels = np.asarray(labels)
    order = np.argsort([np.sum(labels[:i] == label) for i, label in enumerate(labels)], kind="stable")
    return [int(i) for i in order[:count]]


def linear_probe(features, labels, classes, epochs, seed, batch_size=PROBE["batch_size"]):
    """DINO's linear evaluation on fixed features (PROBE), a new order each epoch from the seed: the trained Linear."""
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.as_tensor(features, dtype=torch.float32), torch.as_tensor(labels)
    layer = torch.nn.Linear(x.shape[1], classes)
    with torch.no_grad():
        layer.weight.normal_(0.0, PROBE["std"], generator=generator)
        layer.bias.zero_()
    optimizer = torch.optim.SGD(layer.parameters(), lr=PROBE["base_lr"] * batch_size / 256,
                                momentum=PROBE["momentum"], weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs, eta_min=0.0)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            batch = order[start:start + batch_size]
            loss = F.cross_entropy(layer(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        schedule.step()
    return layer


def scores_accuracy_loss(logits, labels):
    """(accuracy, mean cross-entropy) of logits (n, K) against labels."""
    logits, labels = torch.as_tensor(logits, dtype=torch.float32), torch.as_tensor(labels)
    return float((logits.argmax(1) == labels).float().mean()), float(F.cross_entropy(logits, labels))


def closed_form_probe(train_x, train_labels, val_x, classes, lam):
    """Part 3's closed form on the same features: (W with its bias row, validation scores)."""
    w = closed_form(train_x.astype(np.float64), train_labels, classes, lam)
    return w, val_x.astype(np.float64) @ w[:-1] + w[-1]


def probe_ways(features, labels, classes, epochs, seed, lambdas):
    """[(way, accuracy, loss or None, trained parameters, seconds of fit and score)]: the linear probe, the closed
    form at each lambda."""
    train_x, val_x, train_y, val_y = features["train"], features["validation"], labels["train"], labels["validation"]

    def linear():
        layer = linear_probe(train_x, train_y, classes, epochs, seed)
        with torch.no_grad():
            scores = layer(torch.as_tensor(val_x, dtype=torch.float32))
        return (*scores_accuracy_loss(scores, val_y), sum(p.numel() for p in layer.parameters()))

    def ridge(lam):
        w, scores = closed_form_probe(train_x, train_y, val_x, classes, lam)
        return float(np.mean(scores.argmax(1) == val_y)), None, w.size

    ways = [("linear probe", linear)] + [(f"closed form, lambda {lam:g}", functools.partial(ridge, lam))
                                         for lam in lambdas]
    rows = []
    for way, fit in ways:
        begun = time.perf_counter()
        result = fit()
        rows.append((way, *result, time.perf_counter() - begun))
    return rows


# ---------------------------------------------------------------- the --model check, and the Trainer, its passes timed

def check_classifier_files(name, example):
    """A local --model must be a ViT saved with its image processor; a cached one must be a ViT: the name (argparse's
    type of --model, with example, the article's checkpoint)."""
    if Path(name).expanduser().is_dir():
        for file, what in (("config.json", "save_pretrained"), ("preprocessor_config.json", "its image processor")):
            if not (Path(name).expanduser() / file).exists():
                raise UserError(f"--model {name} has no {file}: pass a checkpoint saved with {what}")
    config = checkpoint_config(name)
    if config is not None and config.model_type != "vit":
        raise UserError(f"--model {name} is a {config.model_type} checkpoint, not a ViT: the article's backbone is "
                        f"ViTModel (pass e.g. {example})")
    return name


def callbacks(model, device):
    """The Trainer's callbacks: (the timing of its passes, a progress bar on stderr, the watch for a training loss
    that is not finite: its `found`)."""
    from tqdm import tqdm
    from transformers import TrainerCallback

    class PassTimes(TrainerCallback):
        """The Trainer's passes over pictures, timed from its events (docs/data.md#the-wait-for-pictures): a batch's
        wait for pictures runs from the event before it (an epoch's start, a step's end, a log, an evaluation's step)
        to the model's forward pass on it (a forward pre-hook); on a CUDA GPU, the GPU's idle time between two CUDA
        events. An evaluation runs from the event before its first batch to its end; the training pass is train()
        less the evaluations it ran. `passes`: {"training", "evaluations": NEW_PASS's keys}."""

        def __init__(self):
            self.passes = {"training": dict(NEW_PASS), "evaluations": dict(NEW_PASS)}
            self.waits = {"training": [], "evaluations": []}  # (asked, arrived) CUDA events, summed at a pass's end
            self.training_began = self.evaluation_began = None
            self.event()
            model.register_forward_pre_hook(self.forward_begins, with_kwargs=True)

        def event(self, *args, **kwargs):  # an event that a loader's next() may follow
            self.since, self.asked = time.perf_counter(), record_event() if device.type == "cuda" else None

        on_init_end = on_epoch_begin = on_step_end = on_log = on_prediction_step = event

        def forward_begins(self, module, args, kwargs):
            what = "training" if module.training else "evaluations"
            if what == "evaluations" and self.evaluation_began is None:
                self.evaluation_began = self.since
            if self.asked is not None:
                self.waits[what].append((self.asked, record_event()))
            else:
                self.passes[what]["waiting seconds"] += time.perf_counter() - self.since
            self.passes[what]["pictures"] += len(kwargs["pixel_values"])

        def add_waits(self, what):  # the GPU's idle times are known once it gets to the last event
            if self.waits[what]:
                self.waits[what][-1][1].synchronize()
                self.passes[what]["waiting seconds"] += sum(a.elapsed_time(b) for a, b in self.waits[what]) / 1000
                self.waits[what].clear()

        def on_evaluate(self, args, state, control, **kwargs):
            if self.evaluation_began is not None:  # None: an evaluation of no pictures
                self.passes["evaluations"]["seconds"] += time.perf_counter() - self.evaluation_began
            self.evaluation_began = None
            self.add_waits("evaluations")
            self.event()

        def on_train_begin(self, args, state, control, **kwargs):
            self.training_began = time.perf_counter(), self.passes["evaluations"]["seconds"]
            self.event()

        def on_train_end(self, args, state, control, **kwargs):
            began, evaluating = self.training_began
            evaluations = self.passes["evaluations"]["seconds"] - evaluating
            self.passes["training"]["seconds"] += time.perf_counter() - began - evaluations
            self.add_waits("training")
            self.event()

    class Progress(TrainerCallback):  # a bar on stderr: the Trainer's own writes its log lines on stdout
        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=state.max_steps, desc="fine-tuning", unit="step", file=sys.stderr, leave=False)

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update(1)

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

    class Divergence(TrainerCallback):  # a loss that is nan or inf: every later step and evaluation is of a wreck
        def __init__(self):
            self.logged, self.found = 0, None  # the last step logged; (loss, first step, last step) not finite

        def on_log(self, args, state, control, logs=None, **kwargs):
            loss = (logs or {}).get("loss")  # the mean of the steps since the last log
            if loss is not None and not math.isfinite(loss) and self.found is None:
                self.found, control.should_training_stop = (loss, self.logged + 1, state.global_step), True
            self.logged = state.global_step if loss is not None else self.logged

    return PassTimes(), Progress(), Divergence()


def steps_text(first, last):
    """The steps a logged training loss is the mean of, in words."""
    return f"at step {last}" if first == last else f"over steps {first} to {last}"


def dataset_loader(dataset, collate_fn, device, pin_memory=False, batch_size=32):
    """A DataLoader for one pass, in order, over a dataset that makes its own items, with loader_workers(device)."""
    workers = loader_workers(device)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=workers, pin_memory=pin_memory,
                      prefetch_factor=PREFETCH if workers else None, worker_init_fn=worker_setup,
                      multiprocessing_context=WORKER_START if workers else None)


# ---------------------------------------------------------------- what the sections load

def image_processor(name):
    """The checkpoint's image processor, its PIL backend (PIL's resize, which common/data.py reproduces: left to
    itself, transformers picks its torchvision backend wherever torchvision is installed); one line when it was saved
    without one."""
    from transformers import AutoImageProcessor

    try:
        return load_pretrained(AutoImageProcessor, name, backend="pil")
    except (ValueError, KeyError) as error:
        raise UserError(f"{name} has no image processor (preprocessor_config.json): pass a checkpoint "
                        f"saved with one") from error


def image_classifier(name):
    """AutoModelForImageClassification with the checkpoint's own head; one line when it has none."""
    from transformers import AutoModelForImageClassification

    model, info = load_pretrained(AutoModelForImageClassification, name, output_loading_info=True)
    if any(key.startswith("classifier.") for key in info.get("missing_keys", ())):
        raise UserError(f"{name} has no classification head (the library would draw one at random): "
                        f"pass an image classifier such as {MODEL}")
    return model


# ---------------------------------------------------------------- the beans dataset

def local_copy(path):
    """A local copy must be a folder holding the parquet files of the train and validation splits: the path, ~ expanded
    (argparse's type of --data-dir)."""
    path = nonempty_path(path)
    folder = Path(path)
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise UserError(f"--data-dir {path} {what}: pass a local copy of {BEANS}'s files "
                        f"(README.md and data/train-*.parquet, data/validation-*.parquet)")
    places = {split: sorted({file.parent for file in folder.rglob(f"{split}*.parquet")}) for split in BEANS_SPLITS}
    missing = [split for split, found in places.items() if not found]
    if missing:
        raise UserError(f"--data-dir {path} has no parquet file for the split(s) {', '.join(missing)}: pass a local "
                        f"copy of {BEANS}'s files (data/train-*.parquet, data/validation-*.parquet)")
    if twice := next((split for split, found in places.items() if len(found) > 1), None):  # each would be read
        raise UserError(f"--data-dir {path} holds parquet files of the {twice} split in {len(places[twice])} folders "
                        f"({', '.join(str(place) for place in places[twice][:3])}): keep one copy of {BEANS}'s files")
    return path


def from_hub(name):
    """The folder of the dataset's files of the train and validation splits (and its card), downloaded from the Hub,
    or the mirror HF_ENDPOINT names, into the Hugging Face cache, each with a bar; when it cannot be reached, the
    cache's snapshot of them (snapshot_download(local_files_only=True)). Not cached, one line with the fixes."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    info, why = ask_hub(name, "dataset")
    if info is not None:
        for file in sorted(sibling.rfilename for sibling in info.siblings or []):
            if file == "README.md" or (file.endswith(".parquet") and Path(file).name.startswith(BEANS_SPLITS)):
                hub_download(name, file, "dataset")
    try:
        snapshot = Path(snapshot_download(name, repo_type="dataset", local_files_only=True))
    except LocalEntryNotFoundError:
        snapshot = None
    if snapshot is None or not all(any(snapshot.rglob(f"{split}*.parquet")) for split in BEANS_SPLITS):
        why = why or "the Hub's copy has no parquet file of the train or the validation split"
        raise UserError(f"dataset {name} is not in the local Hugging Face cache and {why}: connect to the internet "
                        f"once to download it (about {BEANS_MB} MB) into the Hugging Face cache, or pass --data-dir "
                        f"with a local copy of its files")
    return snapshot


def split_files(folder):
    """{split: [its parquet files]} in folder (a local copy, or the cache's snapshot)."""
    return {split: sorted(str(path) for path in Path(folder).expanduser().rglob(f"{split}*.parquet"))
            for split in BEANS_SPLITS}


def from_folder(folder, where):
    """The dataset's parquet files in folder (a local copy, or the cache's snapshot), read as its splits. The library
    keys its Arrow cache of them by their paths and modification times alone, so it is kept in a folder of its cache
    named by each file's size, times and inode too: a file replaced with its time kept is read anew."""
    from datasets import config, load_dataset
    from datasets.exceptions import DatasetGenerationError

    folder = Path(folder).expanduser()
    files = split_files(folder)  # the files named, not the folder: the library keys its Arrow cache by them
    stamp = hashlib.sha256()
    for path in (path for split in BEANS_SPLITS for path in files[split]):
        found = os.stat(path)
        stamp.update(f"{os.path.realpath(path)} {found.st_size} {found.st_mtime_ns} {found.st_ctime_ns} "
                     f"{found.st_ino}\n".encode())
    try:
        return load_dataset("parquet", data_files=files,  # the files' own schema: no README.md card read
                            cache_dir=str(Path(config.HF_DATASETS_CACHE) / "beans-copies" / stamp.hexdigest()[:16]))
    except (OSError, ValueError, DatasetGenerationError) as error:
        raise UserError(f"{where}: cannot read it as {BEANS} ({str(error).splitlines()[0][:160]})") from error


def first_per_class(split, per_class):
    """The first per_class pictures of each class, in the split's order."""
    labels = np.array(split["labels"])
    keep = np.sort(np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in np.unique(labels)]))
    return split.select(keep.tolist(), keep_in_memory=True)


def read_beans(data_dir=None, per_class=None):
    """{"train", "validation": datasets.Dataset as stored (not shuffled), "names": the class names, "folder": the
    copy's or the cache's snapshot of the Hub's files}."""
    folder = Path(data_dir).expanduser() if data_dir else from_hub(BEANS)
    dataset = from_folder(folder, f"--data-dir {data_dir}" if data_dir else BEANS)
    where = data_dir or BEANS
    for split in BEANS_SPLITS:
        if split not in dataset:
            raise UserError(f"{where} has no {split} split: pass a complete copy of {BEANS}")
        if not {"image", "labels"} <= set(dataset[split].column_names):
            raise UserError(f"{where}: the {split} split lacks the columns image and labels of {BEANS}")
    names = getattr(dataset["train"].features["labels"], "names", None)
    if not names:
        raise UserError(f"{where}: its labels column has no class names (a ClassLabel), unlike {BEANS}")
    splits = {split: dataset[split] for split in BEANS_SPLITS}
    if per_class:
        splits = {split: first_per_class(data, per_class) for split, data in splits.items()}
    for split, data in splits.items():  # found now, not as a traceback in the Trainer's loop
        problem = unreadable_row(data, len(names))
        if problem:
            raise UserError(f"{where}: row {problem[0]} of its {split} split {problem[1]}: pass a complete copy of "
                            f"{BEANS}")
    return {**splits, "names": list(names), "folder": folder}


def unreadable_row(data, classes):
    """(row, why) of the first row whose label is not one of the classes, or whose bytes are no picture that decodes
    (a JPEG decoded at an eighth of its side, which reads all its bytes), else None."""
    from datasets import Image as ImageColumn

    for row, item in enumerate(data.cast_column("image", ImageColumn(decode=False))):
        if not isinstance(item["labels"], int) or not 0 <= item["labels"] < classes:  # None: a row without one
            return row, f"has the label {item['labels']}, not one of its {classes} classes"
        if not item["image"] or not (item["image"]["bytes"] or item["image"]["path"]):
            return row, "holds no picture"
        try:
            image = Image.open(io.BytesIO(item["image"]["bytes"]) if item["image"]["bytes"] else item["image"]["path"])
        except Image.DecompressionBombError:
            return row, "holds a picture too large to decode safely"
        except (OSError, ValueError):  # PIL's UnidentifiedImageError is an OSError
            return row, "holds bytes that are not a picture"
        try:
            with image:
                image.draft("RGB", (1, 1))  # a JPEG decoded at an eighth of its side: every byte read, a cut one found
                image.load()
        except (OSError, ValueError, SyntaxError) as error:  # "image file is truncated", a broken stream
            return row, f"holds a picture that cannot be decoded ({str(error).splitlines()[0][:120]})"
    return None


def unlike_the_published_beans(folder, what):
    """Why the folder's parquet files of the train and validation splits are not the ones huggingface.co publishes
    for the dataset, by their bytes (compare/published_files.py), or None when they are."""
    files = [str(Path(path).relative_to(folder)) for paths in split_files(folder).values() for path in paths]
    return unlike_the_published(folder, BEANS, files, what, "dataset")


def data_digests(splits):
    """{split: a digest of its pictures' bytes and labels, in order}: what decides its features in the cache's key."""
    from datasets import Image

    digests = {}
    for split, dataset in splits.items():
        digest = hashlib.blake2b(digest_size=16)
        for row in dataset.cast_column("image", Image(decode=False)):
            digest.update(row["image"]["bytes"] or Path(row["image"]["path"]).read_bytes())
            digest.update(str(row["labels"]).encode())
        digests[split] = digest.hexdigest()
    return digests


def finetune(beans, processor, run):
    """The article's run in the article's order of random draws: seed, shuffle train, shuffle validation, the new
    head, then evaluate, train, evaluate; and its figure, the patch tokens of a few validation pictures before and
    after as RGB maps. Run by section 4, which prints it; section 5 sets the same run beside the probes."""
    from transformers import (
        AutoModelForImageClassification,
        ProgressCallback,
        Trainer,
        TrainingArguments,
        ViTModel,
        set_seed,
    )

    args = run.args
    set_seed(args.seed)  # dnnlpy.set_seed(42): random, numpy and torch
    # The article's CPU draws before its shuffles: the (2, 16, 64) test, the pooler from_pretrained adds at random.
    torch.randn(2, 16, 64)
    load_pretrained(ViTModel, args.model)
    # Dataset.shuffle() without a seed draws its seed from numpy's global state; in memory, the same order.
    train_ds, val_ds = (beans[split].shuffle(keep_in_memory=True) for split in ("train", "validation"))
    id2label = dict(enumerate(beans["names"]))
    model = load_pretrained(AutoModelForImageClassification, args.model, num_labels=len(id2label),
                            id2label=id2label, label2id={label: i for i, label in id2label.items()},
                            ignore_mismatched_sizes=True, device_map=run.device)
    transform = functools.partial(article_transform, processor)
    map_indices = one_per_class(beans["validation"]["labels"], MAP_PICTURES)
    map_pixels = article_transform(processor, beans["validation"][map_indices])["pixel_values"]

    def patch_tokens():  # of the figure's pictures
        with torch.inference_mode(), run.autocast:
            return model.vit(pixel_values=map_pixels.to(run.device)).last_hidden_state[:, 1:].float().cpu()

    begun = time.perf_counter()
    val_items = preprocessed_once(val_ds.with_transform(transform), run.device)
    preprocessing = time.perf_counter() - begun
    workers = loader_workers(run.device)  # decoding and preprocessing the training pictures (docs/performance.md)
    timer, progress, divergence = callbacks(model, run.device)
    with tempfile.TemporaryDirectory(prefix="vit-trainer-") as scratch:
        training_args = TrainingArguments(
            output_dir=str(Path(args.save_dir) / TRAINER_DIR) if args.save_dir else scratch,  # its logs, if any
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=args.batch_size,
            num_train_epochs=args.epochs,
            learning_rate=args.lr,
            logging_steps=LOGGING_STEPS,
            save_strategy="no",
            eval_strategy="steps",
            remove_unused_columns=False,
            seed=args.seed,
            report_to=args.report_to,
            # beyond the article's: the device, the arithmetic, the loader's workers, every loss as it is
            use_cpu=run.device.type == "cpu",
            bf16=args.precision == "bf16",
            logging_nan_inf_filter=False,  # it hides a nan loss (a step's as the others' mean, an evaluation's dropped)
            dataloader_num_workers=workers,
            dataloader_persistent_workers=workers > 0,
            dataloader_pin_memory=run.device.type == "cuda",
            dataloader_multiprocessing_context=WORKER_START if workers and sys.platform.startswith("linux") else None,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train_ds.with_transform(transform),
            eval_dataset=val_items,
            data_collator=collate_fn,
            compute_metrics=accuracy_metrics,
            processing_class=processor,
            callbacks=[timer, progress, divergence],
        )
        trainer.remove_callback(ProgressCallback)  # the bar above instead, on stderr
        before = trainer.evaluate()  # the article's: evaluate, train, evaluate
        tokens_before = patch_tokens()
        begun = time.perf_counter()
        trained = trainer.train()
        seconds = time.perf_counter() - begun
        loss, first, last = divergence.found or (trained.training_loss, 1, trained.global_step)
        if not math.isfinite(loss):  # the mean of steps first to last: the model it trained diverged
            raise UserError(f"the training loss is {loss} {steps_text(first, last)} (lr {args.lr:g}): the model "
                            "diverged, fine-tuning stopped there; lower --lr")
        after = trainer.evaluate()
    if not math.isfinite(after["eval_loss"]):  # a loss grown huge but finite can leave weights that give nan
        raise UserError(f"the evaluation loss after fine-tuning is {after['eval_loss']}, the training loss "
                        f"{trained.training_loss:.4g} {steps_text(1, trained.global_step)} "
                        f"(lr {args.lr:g}): the model diverged; lower --lr")
    model.eval()
    if args.save_dir:
        save_model(Path(args.save_dir) / SAVED_MODEL, model, beans["names"], processor)
    grid = (model.config.image_size // model.config.patch_size,) * 2  # patches on a side
    feature_maps = figure_maps(tokens_before, patch_tokens(), map_pixels, processor, grid,
                               [beans["names"][beans["validation"][i]["labels"]] for i in map_indices])
    return {"before": before, "after": after, "seconds": seconds, "passes": timer.passes,
            "history": trainer.state.log_history, "workers": workers, "preprocessing seconds": preprocessing,
            "steps": trainer.state.max_steps, "hidden size": model.config.hidden_size, "feature maps": feature_maps,
            "trained parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def save_model(folder, model, names, processor):
    """The model saved in folder as from_pretrained and pipeline("image-classification") load it; one that cannot be
    written costs the saved copy, not the run's numbers."""
    try:
        saved = save_loadable(folder, model, names, processor, what="fine-tuned model")
        say(f"saved the fine-tuned model in {saved}: from_pretrained and pipeline(\"image-classification\") load it")
    except UserError as problem:
        say(f"warning: {problem}; the run's numbers are printed as usual")


def preprocessed_once(dataset, device):
    """The dataset's items through its transform once, kept in memory (80 MB for beans' validation pictures), for
    every evaluation to read; its loader's workers beside a GPU."""
    return [item for batch in dataset_loader(dataset, list, device) for item in batch]


def figure_maps(before, after, pixels, processor, grid, labels):
    """The figure's patch tokens before and after as RGB maps, one PCA basis for both so that a colour means the same
    direction in each, beside the pictures as the model saw them (56 px) and their labels."""
    maps = pca_rgb(torch.cat([before, after]).numpy(), grid).round(3)
    mean, std = np.array(processor.image_mean), np.array(processor.image_std)
    small = F.interpolate(pixels.float(), size=(56, 56), mode="area").permute(0, 2, 3, 1).numpy()
    return {"before": maps[:len(before)].tolist(), "after": maps[len(before):].tolist(),
            "pictures": np.clip((small * std + mean) * 255, 0, 255).round().astype(np.uint8).tolist(),
            "labels": labels}


def load_features(run, beans, processor):
    """{"features", "labels": {split: array}, "source", "seconds", "pass"}: the frozen features of both splits'
    pictures, from data/features/ when they match exactly (the weight file, the arithmetic, the pictures' bytes),
    else computed in one pass, the loader's workers started first and timed apart, building batches while the
    backbone loads."""
    from datasets import concatenate_datasets
    from tqdm import tqdm
    from transformers import ViTModel

    splits, timing = BEANS_SPLITS, None  # timing: the pass's, when the features are computed

    def compute():
        nonlocal timing
        timing = dict(NEW_PASS)
        both = concatenate_datasets([beans[split] for split in splits])
        loader = dataset_loader(both.with_transform(functools.partial(article_transform, processor)),
                                collate_fn, run.device, pin_memory=run.device.type == "cuda")
        begun = time.perf_counter()
        batches = iter(loader)  # starts the workers
        timing["start-up seconds"] = time.perf_counter() - begun
        model = load_pretrained(ViTModel, run.args.model, add_pooling_layer=False).to(run.device).eval()
        timing["workers"], outputs = loader.num_workers, []
        begun = time.perf_counter()
        with torch.inference_mode(), run.autocast:
            for batch in tqdm(timed(batches, timing, lambda batch: len(batch["labels"]), run.device),
                              desc="frozen features", unit="batch", file=sys.stderr, leave=False, total=len(loader)):
                pixels = batch["pixel_values"].to(run.device, non_blocking=True)  # pinned beside a CUDA GPU
                # DINO's features of a ViT-B: the class token after the last LayerNorm beside the patch tokens' mean
                class_token, patch_tokens = split_tokens(model(pixel_values=pixels).last_hidden_state.float())
                outputs.append(torch.cat([class_token, patch_tokens.mean(1)], 1))
            features = torch.cat(outputs).cpu().numpy()
        timing["seconds"] = time.perf_counter() - begun
        return dict(zip(splits, np.split(features, [len(beans["train"])]), strict=True))

    begun, precision = time.perf_counter(), run.args.precision
    rule = float32_arithmetic(run.device, precision, run.fp32_rule)["rule"]
    key = None if run.args.no_cache else cache_key(
        "backbone", run.args.model, precision=precision, float32=rule,
        features="class token + mean of the patch tokens", data=data_digests({split: beans[split] for split in splits}))
    features, source = cached(compute, key, {split: len(beans[split]) for split in splits}, FEATURE_CACHE_DIR)
    return {"features": features, "labels": {split: np.array(beans[split]["labels"]) for split in splits},
            "source": "read from the cache" if source == "cache" else source, "seconds": time.perf_counter() - begun,
            "pass": timing}


# ---------------------------------------------------------------- sections

@section
def section_feature_map(report, seed):
    """1. patch tokens to a feature map"""
    report.print("\n== 1. patch tokens to a feature map: (B, N, D) -> (B, H_p, W_p, D) -> (B, D, H_p, W_p) ==")
    embed_dim, (grid_h, grid_w) = 64, (4, 4)
    generator = torch.Generator().manual_seed(seed)
    patch_tokens = torch.randn(2, grid_h * grid_w, embed_dim, generator=generator)
    feature_map = patch_tokens_to_feature_map(patch_tokens, (grid_h, grid_w))
    agree = sum(bool(torch.equal(feature_map[b, :, i, j], patch_tokens[b, i * grid_w + j]))  # place by place
                for b in range(2) for i in range(grid_h) for j in range(grid_w))
    report.print(f"  Patch tokens shape: {patch_tokens.shape}")
    report.print(f"  Feature map shape: {feature_map.shape}")
    report.print(f"  feature_map[b, :, i, j] == patch_tokens[b, i * W_p + j, :] at {agree} of {2 * grid_h * grid_w} "
                 "(b, i, j): each patch token lands at its own place in the grid",
                 {"patch tokens shape": list(patch_tokens.shape), "feature map shape": list(feature_map.shape),
                  "positions that agree": agree})
    try:
        patch_tokens_to_feature_map(patch_tokens, (4, 5))
        refused = "accepted (wrong)"
    except AssertionError as error:
        refused = f"AssertionError: {error}"
    report.print(f"  grid (4, 5) for 16 patch tokens: {refused}")


@section
def section_table(report):
    """2. the table of configurations"""
    report.print("\n== 2. the table of common ViT configurations, counted on torch's meta device (no download) ==")
    report.print("  model name                     patch input   dim layers heads  table  counted: with its 1000-class "
                 "head (backbone alone)")
    for name, table_millions in TABLE:
        config = table_row_config(name)
        whole, backbone = counted_parameters(config)
        widths = {"patch size": ">5", "input resolution": ">5", "embedding dimension": ">5", "layers": ">6",
                  "heads": ">5"}
        columns = {what: getattr(config, key) for what, key in TABLE_COLUMNS.items()}
        report.print(f"  {name:<30} {' '.join(f'{value:{widths[what]}}' for what, value in columns.items())}  "
                     f"{table_millions:>4}M  {whole:,} = {whole / 1e6:.0f}M ({backbone:,} = {backbone / 1e6:.0f}M)  "
                     f"{'same' if f'{whole / 1e6:.0f}' == str(table_millions) else 'differs'}",
                     {**{f"{name} {what}": value for what, value in columns.items()}, f"{name} parameters": whole,
                      f"{name} parameters (M)": whole / 1e6, f"{name} backbone parameters": backbone,
                      f"{name} backbone parameters (M)": backbone / 1e6})
    report.print("  same / differs: the table's Parameters column read as the whole classifier its row names (with its "
                 "1000-class head), the number --compare compares. A row is the architecture its name stands for "
                 "(vit-<size>-patch<P>-<resolution>), counted, not a released checkpoint: the Hub need not hold one "
                 "of that exact name (ViT-B/32 was released as google/vit-base-patch32-224-in21k and -384)")
    report.print("  the table's 86M and 307M are the ViT paper's Table 1 figures for ViT-Base and ViT-Large, given "
                 "there for every patch size and resolution; the position table (N+1 rows) and the patch embedding "
                 "(3 P^2 D) make the counts differ by patch and resolution")


@section
def section_checkpoint(report, beans, processor, classifier, args, run):
    """3. the checkpoint as backbone + head"""
    model = classifier.to(run.device).eval()
    report.print(f"\n== 3. {args.model}: backbone + head ==")
    config = {label: getattr(model.config, key) for label, key in CONFIG_LINES.items()}
    for label, value in config.items():
        report.print(f"  {label}: {value}", {label: value})
    backbone = sum(p.numel() for p in model.vit.parameters())
    head = sum(p.numel() for p in model.classifier.parameters())
    in_features, out_features = model.classifier.in_features, model.classifier.out_features
    share = 100 * backbone / (backbone + head)
    report.print("  parameters: backbone (patch embedding, class token, position embedding, encoder, final LayerNorm) "
                 f"{backbone:,}; head Linear({in_features}, {out_features}) {head:,} ({share:.2f}% in the backbone)",
                 {"backbone parameters": backbone, "head in features": in_features, "head out features": out_features,
                  "head parameters": head, "backbone share (%)": share})
    picture = beans["validation"][0]
    pixels = article_transform(processor, beans["validation"][:1])["pixel_values"]
    with torch.inference_mode(), run.autocast:
        # Z_L: the encoder's output after its final LayerNorm
        tokens = model.vit(pixel_values=pixels.to(run.device)).last_hidden_state.float().cpu()
        logits = model(pixel_values=pixels.to(run.device)).logits.float().cpu()
        by_hand = model.classifier(tokens[:, 0].to(run.device)).float().cpu()  # logits = h_cls W + b
    class_token, patch_tokens = split_tokens(tokens)
    feature_map = patch_tokens_to_feature_map(patch_tokens, (model.config.image_size // model.config.patch_size,) * 2)
    difference = (by_hand - logits).abs().max().item()
    report.print(f"  one validation picture ({beans['names'][picture['labels']]}, {picture['image'].size[0]}x"
                 f"{picture['image'].size[1]} px) -> pixel_values {pixels.shape} -> Z_L {tokens.shape}")
    report.print(f"  class token Z_L[:, 0, :] {class_token.shape}; patch tokens Z_L[:, 1:, :] {patch_tokens.shape} "
                 f"-> feature map {feature_map.shape}")
    report.print(f"  the head on the class token, h_cls W + b, gives the model's logits within {difference:.1e}",
                 {"pixel values shape": list(pixels.shape), "Z_L shape": list(tokens.shape),
                  "class token shape": list(class_token.shape),
                  "patch tokens shape (picture)": list(patch_tokens.shape),
                  "feature map shape (picture)": list(feature_map.shape),
                  "head on the class token vs logits": difference})


def print_history(report, history):
    """Every 10 steps: the training loss of the last 10 steps and the evaluation loss and accuracy."""
    rows = {}
    for entry in history:  # the Trainer's log entries, those of a step merged
        if "loss" in entry or "eval_loss" in entry:
            rows.setdefault(entry["step"], {}).update(entry)
    for step, row in sorted(rows.items()):  # a step's training loss, its evaluation, or both
        numbers = {f"step {step} {name}": row[key] for name, key in (
            ("training loss", "loss"), ("eval_loss", "eval_loss"), ("eval_accuracy", "eval_accuracy")) if key in row}
        if "loss" in row and "eval_loss" in row:
            report.print(f"  step {step:>3}  training loss {row['loss']:.4f}  eval_loss {row['eval_loss']:.4f}  "
                         f"eval_accuracy {row['eval_accuracy']:.4f}", numbers)
        elif "loss" in row:
            report.print(f"  step {step:>3}  training loss {row['loss']:.4f}", numbers)
        else:
            report.print(f"  step {step:>3}  eval_loss {row['eval_loss']:.4f}  eval_accuracy "
                         f"{row['eval_accuracy']:.4f}", numbers)
    report.series.update({  # for the figures and the page
        "training loss": [[step, row["loss"]] for step, row in sorted(rows.items()) if "loss" in row],
        "evaluation accuracy": [[step, row["eval_accuracy"]] for step, row in sorted(rows.items())
                                if "eval_accuracy" in row]})


FLOAT32 = {"torch defaults": "torch's defaults, as the article ran: convolutions (the patch embedding) in TF32 on "
                             "NVIDIA GPUs since Ampere, matrix multiplies in IEEE float32",
           "strict": "strict, no TF32 anywhere (--precision fp32-strict; the article's run allowed TF32 convolutions)",
           "tf32": "TF32 in matrix multiplies and convolutions (--precision tf32)"}


@section
def section_finetune(report, beans, processor, args, run):
    """4. the article's fine-tuning"""
    recipe = any(getattr(args, dest) != ARTICLE_FLAGS[dest][1] for dest in ("batch_size", "epochs", "lr"))
    report.print(f"\n== 4. fine-tuning on beans with transformers.Trainer, {'not ' * recipe}as the article: "
                 f"batch {args.batch_size}, {args.epochs} epoch{'s' * (args.epochs != 1)}, learning rate {args.lr:g}, "
                 f"evaluation every {LOGGING_STEPS} steps ==")
    report.print(f"  PyTorch version: {torch.__version__}")
    report.print(f"  Using device: {run.device.type}")
    arithmetic = float32_arithmetic(run.device, args.precision, run.fp32_rule)
    report.print(f"  float32: {FLOAT32[arithmetic['rule']]}; TF32 on this device: "
                 f"{'yes' if arithmetic['TF32 on this device'] else 'no (all IEEE float32)'}")
    names, train_count, val_count = beans["names"], len(beans["train"]), len(beans["validation"])
    report.print(f"  beans: {train_count:,} training and {val_count} validation pictures, {len(names)} classes "
                 f"({', '.join(names)})",
                 {"training pictures": train_count, "validation pictures": val_count, "classes": len(names)})
    report.print(f"  seed {args.seed}: random, numpy and torch, as dnnlpy.set_seed does in its releases 2026.6.11 and "
                 "2026.7.21 (2026.8.24 and later seed torch alone; the article's release is unknown). The shuffles "
                 "draw from numpy: if the article's numpy was not seeded, its training order, and so its after "
                 "numbers, cannot be reproduced by anyone")
    result = finetune(beans, processor, run)
    steps_per_epoch = math.ceil(train_count / args.batch_size)
    report.print(f"  new head Linear({result['hidden size']}, {len(names)}), random; {result['steps']} steps "
                 f"({steps_per_epoch} per epoch)",
                 {"training steps": result["steps"], "steps per epoch": steps_per_epoch})
    for what in ("before", "after"):  # the article's dicts of loss and accuracy, an empty line between
        report.print(f"  {what.capitalize()} fine-tuning:")
        loss, accuracy = result[what]["eval_loss"], result[what]["eval_accuracy"]
        report.print(f"  {{'eval_loss': {loss!r}, 'eval_accuracy': {accuracy!r}}}",
                     {f"{what} eval_loss": loss, f"{what} eval_accuracy": accuracy})
        if what == "before":
            report.print("  ")
    passes = result["passes"]
    right = {what: round(result[what]["eval_accuracy"] * val_count) for what in ("before", "after")}
    report.print(f"  ({right['before']} of {val_count} validation pictures right before, {right['after']} of "
                 f"{val_count} after; training, with its evaluations every {LOGGING_STEPS} steps, took "
                 f"{result['seconds']:,.0f} s)")
    report.print(f"  passes over pictures: the training steps {pass_text(passes['training'])}, their pictures decoded "
                 f"and preprocessed by {result['workers']} worker processes (none on a CPU: the main process); the "
                 f"{passes['evaluations']['pictures'] // max(1, val_count)} evaluations "
                 f"{pass_text(passes['evaluations'])}, their {val_count} pictures preprocessed once, before the "
                 f"Trainer, in {result['preprocessing seconds']:.1f} s. The Trainer's loop hides its wait, so every "
                 "next() of its data loaders is timed from outside (on a CUDA GPU, the GPU's idle time, with CUDA "
                 "events)",
                 {"before right": right["before"], "after right": right["after"],
                  "training seconds": result["seconds"], "training steps": passes["training"],
                  "evaluations": passes["evaluations"],
                  "validation preprocessing seconds": result["preprocessing seconds"]})
    print_history(report, result["history"])
    report.series["feature maps"] = result["feature maps"]
    if args.plots:
        origin = origin_of(args, BEANS)
        backbone_curves(report.series, args.plots, say, origin)
        backbone_feature_maps(result["feature maps"], args.plots, say, origin)
    return result


@section
def section_three_ways(report, beans, processor, result, args, run):
    """5. three ways to adapt the same backbone"""
    report.print(f"\n== 5. beyond the article: three ways to adapt the same backbone, on the same "
                 f"{len(beans['train']):,} training and {len(beans['validation'])} validation pictures ==")
    frozen = load_features(run, beans, processor)
    timing = frozen["pass"]  # None when read from the cache
    pass_words = "" if not timing else (f" {pass_text(timing)}, the loader's {timing['workers']} worker processes "
                                        f"(none on a CPU) started in {timing['start-up seconds']:.1f} s, outside the "
                                        "pass")
    width = frozen["features"]["train"].shape[1]
    report.print(f"  frozen features: the last layer's class token beside the mean of its patch tokens, {width:,} "
                 f"numbers per picture, {frozen['source']} in {frozen['seconds']:.1f} s (--no-cache recomputes)"
                 f"{pass_words}",
                 ({"frozen features": timing} if timing else {})  # no pass when read from the cache
                 | {"feature width": width, "features seconds": frozen["seconds"]})
    size = getattr(processor, "size", None) or {}  # the processor's resize and normalisation, in words
    side = f"{size['height']}x{size['width']}" if "height" in size else str(size.get("shortest_edge", "?"))
    mean, std = (", ".join(f"{v:g}" for v in dict.fromkeys(values)) for values in (processor.image_mean,
                                                                                    processor.image_std))
    report.print(f"  linear probe: DINO's linear evaluation (Caron et al. 2021): normal(0, {PROBE['std']}) weights, "
                 f"SGD momentum {PROBE['momentum']}, no weight decay, learning rate {PROBE['base_lr']} x batch "
                 f"{PROBE['batch_size']}/256, cosine to 0 over {args.probe_epochs} epochs. Unlike DINO: no random "
                 f"crops and flips (the features are computed once); the pictures preprocessed as the checkpoint's "
                 f"processor does (resized to {side}, mean {mean} and std {std}), not Resize 256 + CenterCrop 224 "
                 f"with ImageNet's mean and std; and the accuracy is the last epoch's, where DINO reports the best "
                 f"over its epochs (chosen on the validation pictures)")
    report.print("  closed form: Part 3's W = (X^T X + lambda I)^-1 X^T Y on the same features with a bias column, "
                 "targets in {-1, +1}")
    rows = [("random new head (the article's before)", result["before"]["eval_accuracy"],
             result["before"]["eval_loss"], 0, None),
            *probe_ways(frozen["features"], frozen["labels"], len(beans["names"]), args.probe_epochs, args.seed,
                        args.lambdas),
            ("full fine-tuning (the article's after)", result["after"]["eval_accuracy"], result["after"]["eval_loss"],
             result["trained parameters"], result["seconds"])]
    report.print("  way                                      accuracy     loss  trained parameters  time (s)")
    for way, accuracy, loss, parameters, seconds in rows:
        percent = 100 * accuracy
        numbers = {"accuracy (%)": percent, "loss": loss, "trained parameters": parameters, "seconds": seconds}
        report.print(f"  {way:<40} {percent:7.2f}%  {'-' if loss is None else f'{loss:7.4f}':>7}  "
                     f"{parameters:18,}  {'-' if seconds is None else f'{seconds:8.2f}':>8}",
                     {f"{way}: {what}": value for what, value in numbers.items() if value is not None})  # not a '-'
    report.print("  accuracy and loss (cross-entropy) on the validation pictures; the closed form fits squared error "
                 "to targets in {-1, +1} and gives no probabilities, so it has no cross-entropy; fine-tuning's "
                 "time is its training with its evaluations, the probes' their fit on the features")


def setup_differences(beans, run, known):
    """How this run's setup differs from the article's: the checkpoint, the pictures (beans: a UserError when they
    could not be loaded), the flags. Not --probe-epochs or --lambdas (section 5 goes beyond the article)."""
    beans = None if isinstance(beans, UserError) else beans
    counts = {f"{word} pictures": len(beans[split]) if beans else None
              for split, word in (("train", "training"), ("validation", "validation"))}
    made = made_here(run.args.data_dir) if run.args.data_dir else None
    unlike = beans and made  # beans as far as can be checked: not generated,
    if not unlike and beans and tuple(beans["names"]) != BEANS_CLASSES:  # its class names
        unlike = f"classes {', '.join(beans['names'])}, not those of beans ({', '.join(BEANS_CLASSES)})"
    if not unlike and beans:  # its files' bytes
        unlike = unlike_the_published_beans(beans["folder"], "a copy" if run.args.data_dir else "the cache's copy")
    flag = f"--data-dir {run.args.data_dir}" if run.args.data_dir else BEANS
    data = ({"data set": {"flag": flag, "why": f"{flag}: {unlike}"}}
            if unlike else subset_differences(run.args, counts, RELEASED))  # another data set is no sample of beans
    return data


def parse_args(argv):
    parser = experiment_parser(__doc__)
    parser.add_argument("--model", default=MODEL,
                        type=functools.partial(check_classifier_files, example=MODEL),
                        help="checkpoint id or local directory (an image classifier saved with its image processor)"
                             " (default: %(default)s)")
    parser.add_argument("--data-dir", type=local_copy,
                        help=f"a local copy of {BEANS}'s files (README.md, data/*.parquet); by default "
                             f"the dataset through the Hugging Face cache, downloaded once")
    parser.add_argument("--per-class", type=positive_int, help="keep the first N pictures of each class in each "
                                                              "split (default: all; not the article's setup)")
    parser.add_argument("--epochs", type=positive_int, default=EPOCHS,
                        help="fine-tuning epochs (default: %(default)s)")
    parser.add_argument("--batch-size", type=batch_pictures, default=BATCH,
                        help="pictures per step (default: %(default)s)")
    parser.add_argument("--lr", type=positive_float, default=LR,
                        help="fine-tuning learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=seed_number, default=SEED,
                        help="every random draw (the article: 42) (default: %(default)s)")
    parser.add_argument("--probe-epochs", type=probe_epochs, default=PROBE_EPOCHS,
                        help="epochs of the linear probe (DINO: 100) (default: %(default)s)")
    parser.add_argument("--lambdas", type=nonnegative_float, nargs="+", action=EachOnce, default=LAMBDAS,
                        help="ridge penalties of the closed-form probe, finite and >= 0 (default: %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write data/features/")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS + ("fp32-strict",),
                        help="fp32 is torch's defaults, as the article ran (on NVIDIA GPUs since Ampere, convolutions "
                             "in TF32); fp32-strict allows no TF32; tf32 allows it in matrix multiplies too; bf16 is "
                             "faster on recent GPUs (default: %(default)s)")
    parser.add_argument("--plots", type=nonempty_path, metavar="DIR",
                        help="save the training curves and the feature maps as PNG (needs matplotlib)")
    parser.add_argument("--save-dir", type=nonempty_path, metavar="DIR",
                        help=f"save the fine-tuned model in DIR/{SAVED_MODEL}, as from_pretrained and pipeline() load "
                             f"it; the Trainer's own output (its logs) in DIR/{TRAINER_DIR}")
    parser.add_argument("--report-to", nargs="+", default="none", metavar="NAME",
                        help="the Trainer's report_to: where it logs the run, e.g. tensorboard (its logs in "
                             "--save-dir), wandb, mlflow, or all installed (default: %(default)s)")
    args = parser.parse_args(argv)
    args.report_to = [args.report_to] if isinstance(args.report_to, str) else args.report_to
    why = reporting_problem(args.report_to, args.save_dir)
    if why:
        parser.error(f"--report-to {' '.join(args.report_to)}: {why}")
    model = Path(args.model).expanduser().resolve()  # a local one inside what the run saves: replaced, then read
    for folder in (SAVED_MODEL, TRAINER_DIR) if args.save_dir else ():  # the Trainer would stop on a file there
        kept = (Path(args.save_dir) / folder).resolve()
        if kept.exists() and not kept.is_dir():
            parser.error(f"--save-dir {args.save_dir}: its {folder} is a file, not a folder; remove it, or pass "
                         f"another --save-dir")
        for flag, value in (("--json", args.json), ("--plots", args.plots)):  # its write would find a folder there
            if value and kept in (Path(value).resolve(), *Path(value).resolve().parents):
                parser.error(f"{flag} {value} is where --save-dir {args.save_dir} keeps its {folder}: give another "
                             f"place")
        if model.is_dir() and kept in (model, *model.parents):
            parser.error(f"--model {args.model} is where --save-dir {args.save_dir} saves this run's {folder}, which "
                         f"would replace it: copy it elsewhere and pass that, or pass another --save-dir")
    return args


# what an integration needs where its name is no pip package's (transformers' integration_utils checks these)
REPORTER_NEEDS = {"azure_ml": "pip install azureml-core", "flyte": "pip install flytekit flytekitplugins-deck-standard",
                  "dagshub": "pip install dagshub mlflow",
                  "kubeflow": "no package makes it: it reports only inside a Kubeflow trainer, which sets "
                              "KUBEFLOW_TRAINER_SERVER_URL"}


def reporting_problem(names, save_dir):
    """Why the Trainer could not report to `names` (its report_to), in a line, or None; said before any work."""
    if names == ["none"]:  # before the integrations load: the job's flag check then loads none of them
        return None
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        is_azureml_available,
        is_flytekit_available,
    )

    if len(names) > 1 and {"none", "all"} & set(names):
        return "none and all each stand alone: give one of them, or the names of integrations"
    available = get_available_reporting_integrations()
    unknown = [name for name in names if name not in INTEGRATION_TO_CALLBACK and name != "all"]
    if unknown:
        known = ", ".join(INTEGRATION_TO_CALLBACK)
        return f"{unknown[0]} is not one the Trainer knows; choose none, all, or of {known}"
    available += [name for name, here in (("azure_ml", is_azureml_available), ("flyte", is_flytekit_available))
                  if here()]  # the library's list has azure_ml only without mlflow, and never flyte
    missing = [name for name in names if name not in available and name != "all"]
    if missing:
        return f"{missing[0]} is not installed here: {REPORTER_NEEDS.get(missing[0], f'pip install {missing[0]}')}"
    names = available if names == ["all"] else names
    if "tensorboard" in names and not save_dir and not os.environ.get("TENSORBOARD_LOGGING_DIR"):
        return "its logs go to the Trainer's output folder, which without --save-dir is deleted: add --save-dir DIR"
    return None


def main(argv=None):
    args = parse_args(argv)
    run, report = begin("backbone", args, fp32_rule=ARTICLE_FP32_RULE, figures=(CURVES_FILE, MAPS_FILE))
    section_feature_map(report, args.seed)
    section_table(report)
    beans, processor = tried(read_beans, args.data_dir, args.per_class), tried(image_processor, args.model)
    section_checkpoint(report, beans, processor, tried(image_classifier, args.model), args, run)  # freed after it
    result = section_finetune(report, beans, processor, args, run)
    section_three_ways(report, beans, processor, result, args, run)  # section 4's run beside the probes
    return conclude(run, report, functools.partial(setup_differences, beans), MODEL, ARTICLE_FLAGS)


if __name__ == "__main__":
    sys.exit(guarded(main))
