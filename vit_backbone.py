"""ViT as a backbone: the split into backbone and head, the table of configurations, the article's
fine-tuning on beans with transformers.Trainer, and three ways to adapt the same backbone side by side.

Reproduces the companion article "ViT as a backbone":
  1. patch_tokens_to_feature_map: (B, N, D) -> (B, D, H_p, W_p) on (2, 16, 64) tokens, and its refusal
     of a grid that does not match;
  2. the article's table of common ViT configurations, each row counted on torch's meta device;
  3. google/vit-base-patch16-224: its configuration as the article prints it, the output tokens split
     into the class token and the patch tokens, one picture's patch tokens as a (1, 768, 14, 14) map,
     the parameters of the backbone and of the head;
  4. the article's fine-tuning on AI-Lab-Makerere/beans with transformers.Trainer (batch 16, 5 epochs,
     learning rate 2e-5, evaluation every 10 steps): trainer.evaluate() before and after;
  5. beyond the article, on the same pictures: the random new head, a linear probe on frozen features
     (DINO's linear evaluation), Part 3's closed-form probe on the same features, full fine-tuning.

    python vit_backbone.py                   # downloads the checkpoint (346 MB) and beans (180 MB) once
    python vit_backbone.py --compare --json results/backbone.json --plots figures/
    python vit_backbone.py --data-dir beans/ # a local copy of the dataset's files (README.md, data/*.parquet)
    python vit_backbone.py --per-class 20 --epochs 1    # a quick look: not the article's setup

The frozen features of section 5 are cached in data/features/, keyed by the checkpoint's weight file,
the pictures' bytes and the precision; --no-cache neither reads nor writes the cache.
"""
import contextlib
import functools
import math
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common import figures
from common.checkpoints import check_model_flag, checkpoint_config, hub_offline, load_pretrained, looks_like_a_path
from common.cli import (
    add_common_arguments,
    distinct,
    nonnegative_float,
    positive_float,
    positive_int,
    script_parser,
    seed,
)
from common.closed_form import closed_form, targets, with_bias
from common.device import PRECISIONS, float32_arithmetic, float32_rule, to_device
from common.errors import UserError
from common.feature_cache import cache_key, cached, dataset_digest
from common.loader import TimedLoader, dataset_loader, end_workers, loader_workers, pass_timing, timed
from common.reference import flag_differences, subset_differences, verdict
from common.run import Run, guarded, run_sections

DEFAULT_MODEL = "google/vit-base-patch16-224"
DATASET = "AI-Lab-Makerere/beans"
DATASET_SIZE = "about 180 MB"
CACHE_DIR = Path(__file__).resolve().parent / "data" / "features"
# The article's setup: dnnlpy.set_seed(42) and its TrainingArguments.
ARTICLE = {"seed": 42, "batch_size": 16, "epochs": 5, "lr": 2e-5, "logging_steps": 10,
           "train pictures": 1034, "validation pictures": 133}
ARTICLE_FLAGS = {item: (item, ARTICLE[item]) for item in ("seed", "batch_size", "epochs", "lr")}
ARTICLE_FLAGS["precision"] = ("precision", "fp32")
# The article ran on a CUDA GPU ("Using device: cuda") with torch's defaults: float32 with TF32 convolutions
# (its patch embedding) on Ampere and later GPUs. So --precision fp32 means that here (common/device.py).
ARTICLE_FP32_RULE = "torch defaults"
# The article's table: model name, then its Parameters column in millions.
TABLE = [("google/vit-base-patch16-224", 86), ("google/vit-base-patch32-224", 86),
         ("google/vit-large-patch16-224", 307), ("google/vit-large-patch32-384", 307)]
SIZES = {"base": "B", "large": "L", "huge": "H"}
TABLE_COLUMNS = [("patch size", "patch_size", 5), ("input resolution", "image_size", 5),
                 ("embedding dimension", "hidden_size", 5), ("layers", "num_hidden_layers", 6),
                 ("heads", "num_attention_heads", 5)]  # (number name, config field, printed width)
CONFIG_LINES = [("Image size", "image_size"), ("Patch size", "patch_size"), ("Hidden size", "hidden_size"),
                ("Number of hidden layers", "num_hidden_layers"), ("Number of attention heads", "num_attention_heads"),
                ("Intermediate size", "intermediate_size")]
# DINO's linear evaluation (Caron et al. 2021, eval_linear.py): a linear layer from normal(0, 0.01) and a zero
# bias, SGD with momentum 0.9 and no weight decay, learning rate 0.001 x batch / 256, cosine decay to 0 over
# 100 epochs, batch 128 per GPU; for ViT-B the features are the last layer's class token beside the mean of
# its patch tokens. The random crops and flips are left out: the features are computed once, frozen.
PROBE = {"std": 0.01, "momentum": 0.9, "base_lr": 0.001, "batch_size": 128}
MAP_PICTURES = 4  # validation pictures in the feature-map figure
CURVES_FIGURE, MAPS_FIGURE = "backbone_curves.png", "backbone_feature_maps.png"


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


def shape_text(report, name, shape):
    """torch.Size([2, 16, 64]) as torch prints it, each entry a named number."""
    return f"torch.Size({report.nums(name, list(shape), 'd')})"


def accuracy_metrics(eval_pred):
    """The article's compute_metrics, with the accuracy computed directly (evaluate.load downloads a script)."""
    logits, labels = eval_pred
    return {"accuracy": float(np.mean(np.argmax(logits, axis=-1) == labels))}


def collate_fn(images):
    """The article's collate function."""
    pixel_values = torch.stack([image["pixel_values"] for image in images])
    labels = torch.tensor([image["labels"] for image in images])
    return {"pixel_values": pixel_values, "labels": labels}


def table_row_config(name):
    """The ViTConfig a model name stands for: vit-<size>-patch<P>-<resolution>, the size from Table 1."""
    from common.compute import table1_config

    found = re.fullmatch(r"(?:.*/)?vit-(base|large|huge)-patch(\d+)-(\d+)", name)
    if found is None:
        raise ValueError(f"{name} is not a vit-<size>-patch<P>-<resolution> name")
    config = table1_config(SIZES[found[1]], int(found[2]), image_size=int(found[3]))
    config.num_labels = 1000  # the released checkpoints are ImageNet-1k classifiers
    return config


def counted_parameters(config):
    """(the whole classifier, its backbone) parameters of a ViTForImageClassification built on the meta device."""
    from transformers import ViTForImageClassification

    with torch.device("meta"):
        model = ViTForImageClassification(config)
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.vit.parameters())


def pca_rgb(tokens, grid):
    """Patch tokens (n, N, D) of n pictures -> (n, H_p, W_p, 3) in [0, 1]: their first three principal components.

    One basis for all n pictures (so colours compare across pictures); each component is scaled to [0, 1]
    over all of them, and its sign set so that its largest loading is positive (a fixed colour per run).
    """
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


def setup_differences(run):
    """How this run's setup differs from the article's: its flags and the pictures it used.

    --model is no difference (a local folder may hold the released checkpoint; the numbers judge it),
    nor are --probe-epochs and --lambdas (section 5 goes beyond the article).
    """
    args, beans = run.args, run.loaded.get("beans")
    loaded = isinstance(beans, dict)
    counts = {f"{word} pictures": len(beans[split]) if loaded else None
              for split, word in (("train", "training"), ("validation", "validation"))}
    released = {"training pictures": ARTICLE["train pictures"], "validation pictures": ARTICLE["validation pictures"]}
    return {**subset_differences(args, counts, released), **flag_differences(args, ARTICLE_FLAGS)}


# ---------------------------------------------------------------- the probes on frozen features

def linear_probe(features, labels, classes, epochs, seed, batch_size=PROBE["batch_size"]):
    """DINO's linear evaluation on fixed features: returns the trained torch.nn.Linear.

    SGD (momentum 0.9, no weight decay) at 0.001 x batch / 256, the learning rate decayed per epoch by a
    cosine to 0 (CosineAnnealingLR), a new order of the pictures each epoch from the seed.
    """
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
    w = closed_form(with_bias(train_x.astype(np.float64)), targets(train_labels, classes), lam)
    return w, with_bias(val_x.astype(np.float64)) @ w


# ---------------------------------------------------------------- data

def check_data_dir(path):
    """--data-dir: a folder holding the dataset's parquet files, train and validation at least; checked first."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise UserError(f"--data-dir {path} {what}: pass a local copy of {DATASET}'s files "
                        f"(README.md and data/train-*.parquet, data/validation-*.parquet)")
    names = [file.name for file in folder.rglob("*.parquet")]
    missing = [split for split in ("train", "validation") if not any(name.startswith(split) for name in names)]
    if missing:
        raise UserError(f"--data-dir {path} has no parquet file for the split(s) {', '.join(missing)}: pass a local "
                        f"copy of {DATASET}'s files (data/train-*.parquet, data/validation-*.parquet)")


def hub_dataset(name):
    """load_dataset(name) from the Hub or the local cache; offline and not cached, one line with the fixes."""
    from datasets import load_dataset

    fix = (f"connect to the internet once to download it ({DATASET_SIZE}) into the Hugging Face cache, or pass "
           f"--data-dir with a local copy of its files")
    if hub_offline():
        return cached_dataset(name, "HF_HUB_OFFLINE=1 forbids downloads", fix)
    from huggingface_hub import HfApi

    try:
        HfApi().dataset_info(name, timeout=10)
    except Exception:  # noqa: BLE001 - unreachable: read the cache only, without the library's minute of retries
        return cached_dataset(name, "the Hugging Face Hub cannot be reached", fix)
    return load_dataset(name)


def cached_dataset(name, why, fix):
    """The dataset from the cache with downloads switched off for this one call; else one line with the fixes."""
    import datasets
    from datasets import load_dataset
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        return load_dataset(name)
    except (OSError, ValueError) as error:
        raise UserError(f"dataset {name} is not in the local Hugging Face cache and {why}: {fix}") from error
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def first_per_class(split, per_class):
    """The first per_class pictures of each class, in the split's order."""
    labels = np.array(split["labels"])
    keep = np.sort(np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in np.unique(labels)]))
    return split.select(keep.tolist(), keep_in_memory=True)


def load_beans(run):
    """{"train", "validation": datasets.Dataset, "names": class names}, as stored (not shuffled)."""
    args = run.args
    if args.data_dir:
        from datasets import load_dataset
        from datasets.exceptions import DatasetGenerationError

        try:
            dataset = load_dataset(str(Path(args.data_dir).expanduser()))
        except (OSError, ValueError, DatasetGenerationError) as error:
            raise UserError(f"--data-dir {args.data_dir}: cannot read it as {DATASET} "
                            f"({str(error).splitlines()[0][:160]})") from error
    else:
        dataset = hub_dataset(DATASET)
    where = args.data_dir or DATASET
    for split in ("train", "validation"):
        if split not in dataset:
            raise UserError(f"{where} has no {split} split: pass a complete copy of {DATASET}")
        if not {"image", "labels"} <= set(dataset[split].column_names):
            raise UserError(f"{where}: the {split} split lacks the columns image and labels of {DATASET}")
    names = getattr(dataset["train"].features["labels"], "names", None)
    if not names:
        raise UserError(f"{where}: its labels column has no class names (a ClassLabel), unlike {DATASET}")
    splits = {split: dataset[split] for split in ("train", "validation")}
    if args.per_class:
        splits = {split: first_per_class(data, args.per_class) for split, data in splits.items()}
    return {**splits, "names": list(names)}


# ---------------------------------------------------------------- checkpoints

@contextlib.contextmanager
def quiet_loading():
    """The library's notes on a replaced head ('newly initialized') are what section 3 prints in its own words."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def load_processor(run):
    from transformers import AutoImageProcessor

    try:
        with quiet_loading():
            return load_pretrained(AutoImageProcessor, run.args.model)
    except (ValueError, KeyError) as error:
        raise UserError(f"{run.args.model} has no image processor (preprocessor_config.json): pass a checkpoint "
                        f"saved with one") from error


def load_checkpoint(run):
    """The checkpoint as the article's first load: AutoModelForImageClassification with its own head."""
    from transformers import AutoModelForImageClassification

    run.need("processor")
    with quiet_loading():
        model, info = load_pretrained(AutoModelForImageClassification, run.args.model, output_loading_info=True)
    if any(key.startswith("classifier.") for key in info.get("missing_keys", ())):
        raise UserError(f"{run.args.model} has no classification head (the library would draw one at random): "
                        f"pass an image classifier such as {DEFAULT_MODEL}")
    return model.to(run.device).eval()


def load_backbone(run):
    from transformers import ViTModel

    with quiet_loading():
        return load_pretrained(ViTModel, run.args.model, add_pooling_layer=False).to(run.device).eval()


def pixels_of(processor, images):
    return processor([image.convert("RGB") for image in images], return_tensors="pt")["pixel_values"]


def last_hidden_states(backbone, pixels, run):
    with torch.inference_mode(), run.autocast:
        return backbone(pixel_values=pixels.to(run.device)).last_hidden_state.float().cpu()


# ---------------------------------------------------------------- the article's fine-tuning

def stderr_progress():
    """A tqdm bar on stderr in place of the Trainer's own, whose log lines would land on stdout."""
    from tqdm import tqdm
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        bar = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=state.max_steps, desc="fine-tuning", unit="step", file=sys.stderr, leave=False)

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update(1)

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

    return Progress()


def article_trainer(run, model, train_ds, val_ds, processor, output_dir, workers):
    """The article's TrainingArguments and Trainer; nothing saved, nothing reported, progress on stderr.

    Beyond the article: `workers` processes decode and preprocess the training pictures ahead of the
    model (the library's default, none, does it in the main process while a GPU waits); they persist
    over the epochs, and their batches are pinned for the copy to a GPU (the evaluations' loaders get
    neither: time_the_trainers_passes). They change no number: the order comes from the sampler's own
    seed, the pictures from the same processor.
    """
    from transformers import ProgressCallback, Trainer, TrainingArguments

    args = run.args
    training_args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size,
        num_train_epochs=args.epochs, learning_rate=args.lr, logging_steps=ARTICLE["logging_steps"],
        save_strategy="no", eval_strategy="steps", remove_unused_columns=False, seed=args.seed, report_to="none",
        use_cpu=run.device.type == "cpu", bf16=args.precision == "bf16",  # tf32 left unset: Run set float32's rule
        dataloader_num_workers=workers, dataloader_persistent_workers=workers > 0,
        dataloader_pin_memory=run.device.type == "cuda")
    trainer = Trainer(model=model, args=training_args, train_dataset=train_ds, eval_dataset=val_ds,
                      processing_class=processor, data_collator=collate_fn, compute_metrics=accuracy_metrics)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(stderr_progress())
    return trainer


def time_the_trainers_passes(trainer, device):
    """({"training", "evaluations": pass timings}, filled as the Trainer runs; [the data loaders it made]).

    Its loop hides the wait for pictures, so it is measured from outside: every next() of the data
    loaders it makes is timed (common/loader.py's timed: on a CUDA GPU the GPU's own idle time), and
    every evaluate(). Its evaluation loaders get no worker processes and no pinning: their pictures are
    preprocessed already, on the model's device (finetune()), and an evaluation is a few batches, which
    workers started afresh for each would keep a GPU waiting for; so only the training loader has them.
    """
    timings, made = {"training": pass_timing(), "evaluations": pass_timing()}, []
    make_train, make_eval = trainer.get_train_dataloader, trainer.get_eval_dataloader

    def train_loader(*a, **k):
        made.append(make_train(*a, **k))
        return TimedLoader(made[-1], timings["training"], count=labels_in, device=device)

    def eval_loader(*a, **k):
        args = trainer.args
        kept = args.dataloader_num_workers, args.dataloader_persistent_workers, args.dataloader_pin_memory
        args.dataloader_num_workers, args.dataloader_persistent_workers, args.dataloader_pin_memory = 0, False, False
        try:
            made.append(make_eval(*a, **k))
        finally:
            args.dataloader_num_workers, args.dataloader_persistent_workers, args.dataloader_pin_memory = kept
        return TimedLoader(made[-1], timings["evaluations"], count=labels_in, device=device)

    trainer.get_train_dataloader, trainer.get_eval_dataloader = train_loader, eval_loader
    evaluate = trainer.evaluate

    def timed_evaluate(*a, **k):
        begun = time.perf_counter()
        try:
            return evaluate(*a, **k)
        finally:
            timings["evaluations"]["seconds"] += time.perf_counter() - begun

    trainer.evaluate = timed_evaluate
    return timings, made


def labels_in(batch):
    return len(batch["labels"])


def article_transform(processor, batch):
    """The article's transform (its `transform`), a module-level function so that spawned workers can unpickle it."""
    inputs = processor([image.convert("RGB") for image in batch["image"]], return_tensors="pt")
    inputs["labels"] = batch["labels"]
    return inputs


def preprocessed(dataset, workers):
    """([every item of a dataset with a transform], the seconds it took): the transform computed once, in order.

    Items are the transform's own output ({"pixel_values", "labels"}), so a Trainer fed with them sees
    exactly what it sees through the dataset; `workers` processes share the work (the Trainer's rule).
    """
    begun = time.perf_counter()
    items = [item for batch in dataset_loader(dataset, list, workers) for item in batch]
    return items, time.perf_counter() - begun


def trainer_workers(device):
    """The Trainer's data-loader workers: the scripts' rule (common/loader.py), none on a CPU."""
    return loader_workers(device)


def replay_the_articles_first_draws(run):
    """The draws the article makes on the CPU between set_seed(42) and the shuffles: torch.randn for the (2, 16, 64)
    test, and the pre-logits layer (pooler) that ViTModel.from_pretrained adds at random to a classifier's weights.

    They move torch's CPU generator, from which the new head is drawn on a CPU; a GPU's head comes from the GPU's
    own generator, which they leave as set_seed left it. numpy's generator, which the shuffles use, is not touched.
    """
    from transformers import ViTModel

    torch.randn(2, 16, 64)
    with quiet_loading():
        load_pretrained(ViTModel, run.args.model)


def finetune(run):
    """The article's run in the article's order of random draws: seed, shuffle train, shuffle validation, the new
    head, then evaluate, train, evaluate. The patch tokens of a few validation pictures are kept before and after."""
    from transformers import AutoModelForImageClassification, set_seed

    beans, processor = run.need("beans", "processor")
    names = beans["names"]
    set_seed(run.args.seed)  # dnnlpy.set_seed(42): random, numpy and torch
    replay_the_articles_first_draws(run)
    # Dataset.shuffle() without a seed draws its seed from numpy's global state; in memory, the same order.
    train_ds, val_ds = (beans[split].shuffle(keep_in_memory=True) for split in ("train", "validation"))
    id2label = dict(enumerate(names))
    with quiet_loading():
        model = load_pretrained(AutoModelForImageClassification, run.args.model, num_labels=len(names),
                                id2label=id2label, label2id={label: i for i, label in id2label.items()},
                                ignore_mismatched_sizes=True, device_map=run.device)

    transform = functools.partial(article_transform, processor)
    map_indices = one_per_class(beans["validation"]["labels"], MAP_PICTURES)
    map_pixels = pixels_of(processor, [beans["validation"][i]["image"] for i in map_indices])
    workers = trainer_workers(run.device)
    # The validation pictures through the article's transform once, not at each of the evaluations: an evaluation
    # is a few batches, and a loader that starts afresh for each keeps a GPU waiting for its first batch.
    val_items, preprocessing = preprocessed(val_ds.with_transform(transform), workers)
    val_items = [{**item, "pixel_values": item["pixel_values"].to(run.device)} for item in val_items]  # 80 MB
    with tempfile.TemporaryDirectory(prefix="vit-backbone-trainer-") as output_dir:
        trainer = article_trainer(run, model, train_ds.with_transform(transform), val_items, processor, output_dir,
                                  workers)
        timings, loaders = time_the_trainers_passes(trainer, run.device)
        try:
            before = trainer.evaluate()
            tokens_before = last_hidden_states(model.vit, map_pixels, run)[:, 1:]
            start, evaluating = time.perf_counter(), timings["evaluations"]["seconds"]
            trainer.train()
            seconds = time.perf_counter() - start
            timings["training"]["seconds"] = seconds - (timings["evaluations"]["seconds"] - evaluating)
            after = trainer.evaluate()
        finally:  # on an error or a signal too: the workers would otherwise hold the process at its exit
            end_workers(*loaders)
    model.eval()
    return {"before": before, "after": after, "seconds": seconds, "history": trainer.state.log_history,
            "passes": timings, "workers": workers, "preprocessing seconds": preprocessing,
            "steps": trainer.state.max_steps, "model": model, "map pixels": map_pixels, "map indices": map_indices,
            "tokens before": tokens_before, "tokens after": last_hidden_states(model.vit, map_pixels, run)[:, 1:],
            "trained parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}


# ---------------------------------------------------------------- frozen features and their cache

def stack_pixel_values(items):
    return torch.stack([item["pixel_values"] for item in items])


def compute_features(run, beans, timing):
    """[class token, mean of the patch tokens] of the last layer (after its LayerNorm), for both splits.

    One pass over both splits, the pictures preprocessed by the article's transform in worker processes
    beside a GPU (the Trainer's rule); its time and wait go to timing. The workers (none on a CPU) start
    before the backbone is loaded, so that their first batches are built while it loads. The features
    stay on the model's device until the pass ends (common/inference.py's run_model says why).
    """
    from datasets import concatenate_datasets
    from tqdm import tqdm

    both = concatenate_datasets([beans["train"], beans["validation"]]).with_transform(
        functools.partial(article_transform, run.need("processor")))
    workers = trainer_workers(run.device)
    loader = dataset_loader(both, stack_pixel_values, workers, pin_memory=run.device.type == "cuda")
    started = time.perf_counter()
    batches = iter(loader)  # starts the worker processes, outside the pass, as the scripts' own loaders do
    timing["start-up seconds"], timing["workers"] = time.perf_counter() - started, workers
    backbone = load_backbone(run)
    begun, parts = time.perf_counter(), []
    with torch.inference_mode(), run.autocast:
        for pixels in tqdm(timed(batches, timing, device=run.device), desc="frozen features", unit="batch",
                           file=sys.stderr, leave=False, total=len(loader)):
            tokens = backbone(pixel_values=to_device(pixels, run.device)).last_hidden_state.float()
            class_token, patch_tokens = split_tokens(tokens)
            parts.append(torch.cat([class_token, patch_tokens.mean(1)], 1))
        features = torch.cat(parts).cpu().numpy()
    timing["seconds"] = time.perf_counter() - begun
    return {"train": features[:len(beans["train"])], "validation": features[len(beans["train"]):]}


def load_features(run):
    """The frozen features of both splits, from data/features/ when they match exactly, else computed and saved."""
    beans = run.need("beans")
    start, timing = time.perf_counter(), pass_timing()
    precision = run.args.precision
    key = None if run.args.no_cache else cache_key(
        "backbone", run.args.model, precision=precision, float32=float32_rule(precision, run.fp32_rule),
        features="class token + mean of the patch tokens",
        data={split: dataset_digest(beans[split]) for split in ("train", "validation")})
    rows = {split: len(beans[split]) for split in ("train", "validation")}
    features, source = cached(lambda: compute_features(run, beans, timing), key, rows, CACHE_DIR)
    source = "read from the cache" if source == "cache" else source
    labels = {split: np.array(beans[split]["labels"]) for split in ("train", "validation")}
    return {"features": features, "labels": labels, "source": source, "seconds": time.perf_counter() - start,
            "pass": timing if source == "computed" else None}


# ---------------------------------------------------------------- sections

def section_feature_map(run, report):
    """1. patch tokens to a feature map"""
    report.header("1. patch tokens to a feature map: (B, N, D) -> (B, H_p, W_p, D) -> (B, D, H_p, W_p)")
    embed_dim, grid_size = 64, (4, 4)
    generator = torch.Generator().manual_seed(run.args.seed)
    patch_tokens = torch.randn(2, math.prod(grid_size), embed_dim, generator=generator)
    feature_map = patch_tokens_to_feature_map(patch_tokens, grid_size)
    report.line(f"Patch tokens shape: {shape_text(report, 'patch tokens shape', patch_tokens.shape)}")
    report.line(f"Feature map shape: {shape_text(report, 'feature map shape', feature_map.shape)}")
    agree = sum(bool(torch.equal(feature_map[b, :, i, j], patch_tokens[b, i * grid_size[1] + j]))
                for b in range(2) for i in range(grid_size[0]) for j in range(grid_size[1]))
    report.line(f"feature_map[b, :, i, j] == patch_tokens[b, i * W_p + j, :] at "
                f"{report.num('positions that agree', agree)} of {2 * math.prod(grid_size)} (b, i, j): each patch "
                f"token lands at its own place in the grid")
    try:
        patch_tokens_to_feature_map(patch_tokens, (4, 5))
        refused = "accepted (wrong)"
    except AssertionError as error:
        refused = f"AssertionError: {error}"
    report.line(f"grid (4, 5) for 16 patch tokens: {refused}")


def table_verdict(table_millions, whole):
    """The table's Parameters column against the whole classifier's count, by --compare's rule (its reference entry
    is the column's number, kind nothing): same when the count in millions prints as the column does, else differs."""
    return verdict({"article": str(table_millions), "kind": "nothing"}, whole / 1e6)


def section_table(run, report):
    """2. the table of configurations"""
    report.header("2. the table of common ViT configurations, counted on torch's meta device (no download)")
    n = report.num
    report.line(f"{'model name':<30} {'patch':>5} {'input':>5} {'dim':>5} {'layers':>6} {'heads':>5}  "
                f"{'table':>5}  counted: with its 1000-class head (backbone alone)")
    for name, table_millions in TABLE:
        config = table_row_config(name)
        whole, backbone = counted_parameters(config)
        columns = " ".join(n(f"{name} {what}", getattr(config, key), f">{width}") for what, key, width in TABLE_COLUMNS)
        report.line(f"{name:<30} {columns}  {table_millions:>4}M  {n(f'{name} parameters', whole, ',')} = "
                    f"{n(f'{name} parameters (M)', whole / 1e6, '.0f')}M "
                    f"({n(f'{name} backbone parameters', backbone, ',')} = "
                    f"{n(f'{name} backbone parameters (M)', backbone / 1e6, '.0f')}M)  "
                    f"{table_verdict(table_millions, whole)}")
    report.line("same / differs: the table's Parameters column read as the whole classifier its row names (with its "
                "1000-class head), the number --compare compares. A row is the architecture its name stands for "
                "(vit-<size>-patch<P>-<resolution>), counted, not a released checkpoint: the Hub need not hold one of "
                "that exact name (ViT-B/32 was released as google/vit-base-patch32-224-in21k and -384)")
    report.line("the table's 86M and 307M are the ViT paper's Table 1 figures for ViT-Base and ViT-Large, given "
                "there for every patch size and resolution; the position table (N+1 rows) and the patch embedding "
                "(3 P^2 D) make the counts differ by patch and resolution")


def section_checkpoint(run, report):
    """3. the checkpoint as backbone + head"""
    try:  # the configuration and the counts need no data; the one picture does
        processor, model = run.need("processor", "checkpoint")
    except UserError:
        run.need("beans", "processor", "checkpoint")  # one line that names the data too, when it is missing as well
        raise
    report.header(f"3. {run.args.model}: backbone + head")
    for label, key in CONFIG_LINES:
        report.line(f"{label}: {report.num(label, getattr(model.config, key))}")
    backbone = sum(p.numel() for p in model.vit.parameters())
    head = sum(p.numel() for p in model.classifier.parameters())
    report.line(f"parameters: backbone (patch embedding, class token, position embedding, encoder, final "
                f"LayerNorm) {report.num('backbone parameters', backbone, ',')}; head Linear("
                f"{report.num('head in features', model.classifier.in_features)}, "
                f"{report.num('head out features', model.classifier.out_features)}) "
                f"{report.num('head parameters', head, ',')} "
                f"({report.num('backbone share (%)', 100 * backbone / (backbone + head), '.2f')}% in the backbone)")
    beans = run.need("beans")
    picture = beans["validation"][0]
    pixels = pixels_of(processor, [picture["image"]])
    tokens = last_hidden_states(model.vit, pixels, run)  # Z_L: the encoder's output after its final LayerNorm
    with torch.inference_mode(), run.autocast:
        logits = model(pixel_values=pixels.to(run.device)).logits.float().cpu()
        by_hand = model.classifier(tokens[:, 0].to(run.device)).float().cpu()  # logits = h_cls W + b
    class_token, patch_tokens = split_tokens(tokens)
    feature_map = patch_tokens_to_feature_map(patch_tokens, feature_grid(model))
    report.line(f"one validation picture ({beans['names'][picture['labels']]}, {picture['image'].size[0]}x"
                f"{picture['image'].size[1]} px) -> pixel_values {shape_text(report, 'pixel values shape', pixels.shape)}"
                f" -> Z_L {shape_text(report, 'Z_L shape', tokens.shape)}")
    report.line(f"class token Z_L[:, 0, :] {shape_text(report, 'class token shape', class_token.shape)}; patch tokens "
                f"Z_L[:, 1:, :] {shape_text(report, 'patch tokens shape (picture)', patch_tokens.shape)} -> feature "
                f"map {shape_text(report, 'feature map shape (picture)', feature_map.shape)}")
    report.line(f"the head on the class token, h_cls W + b, gives the model's logits within "
                f"{report.num('head on the class token vs logits', (by_hand - logits).abs().max().item(), '.1e')}")
    run.loaded.pop("checkpoint")  # its memory back: the fine-tuning loads the checkpoint with a new head


def print_eval(report, what, metrics, pictures):
    """The article's dict of loss and accuracy, then the count it stands for."""
    report.line("{What} fine-tuning:", What=what.capitalize())
    report.line("{{'eval_loss': {eval_loss:repr}, 'eval_accuracy': {eval_accuracy:repr}}}", metrics, prefix=f"{what} ")
    right = round(metrics["eval_accuracy"] * pictures)
    return f"{report.num(f'{what} right', right)} of {pictures}"


def print_history(report, history):
    """Every 10 steps: the training loss of the last 10 steps and the evaluation loss and accuracy."""
    rows = {}
    for entry in history:
        if "loss" in entry or "eval_loss" in entry:
            rows.setdefault(entry["step"], {}).update(entry)
    n = report.num
    for step, row in sorted(rows.items()):
        parts = [f"step {step:>3}"]
        if "loss" in row:
            parts.append(f"training loss {n(f'step {step} training loss', row['loss'], '.4f')}")
        if "eval_loss" in row:
            parts.append(f"eval_loss {n(f'step {step} eval_loss', row['eval_loss'], '.4f')}  eval_accuracy "
                         f"{n(f'step {step} eval_accuracy', row['eval_accuracy'], '.4f')}")
        report.line("  ".join(parts))
    report.keep("training loss", [[step, row["loss"]] for step, row in sorted(rows.items()) if "loss" in row])
    report.keep("evaluation accuracy", [[step, row["eval_accuracy"]] for step, row in sorted(rows.items())
                                        if "eval_accuracy" in row])


def section_finetune(run, report):
    """4. the article's fine-tuning"""
    args = run.args
    beans = run.need("beans", "processor")[0]
    recipe = {"batch_size", "epochs", "lr"} & set(flag_differences(args, ARTICLE_FLAGS))
    report.header(f"4. fine-tuning on beans with transformers.Trainer, {'not ' * bool(recipe)}as the article: batch "
                  f"{args.batch_size}, {args.epochs} epoch{'s' * (args.epochs != 1)}, learning rate {args.lr:g}, "
                  f"evaluation every {ARTICLE['logging_steps']} steps")
    report.line(f"PyTorch version: {torch.__version__}")
    report.line(f"Using device: {run.device.type}")
    report.line(float32_text(float32_arithmetic(run.device, args.precision, run.fp32_rule)))
    n, names = report.num, beans["names"]
    train_count, val_count = len(beans["train"]), len(beans["validation"])
    report.line(f"beans: {n('training pictures', train_count, ',')} training and {n('validation pictures', val_count)}"
                f" validation pictures, {n('classes', len(names))} classes ({', '.join(names)})")
    report.line(f"seed {args.seed}: random, numpy and torch, as dnnlpy.set_seed does in its releases 2026.6.11 and "
                f"2026.7.21 (2026.8.24 and later seed torch alone; the article's release is unknown). The shuffles "
                f"draw from numpy: if the article's numpy was not seeded, its training order, and so its after "
                f"numbers, cannot be reproduced by anyone")
    result = run.need("finetune")
    report.line(f"new head Linear({result['model'].config.hidden_size}, {len(names)}), random; "
                f"{n('training steps', result['steps'])} steps "
                f"({n('steps per epoch', math.ceil(train_count / args.batch_size))} per epoch)")
    before = print_eval(report, "before", result["before"], val_count)
    report.line()
    after = print_eval(report, "after", result["after"], val_count)
    report.line(f"({before} validation pictures right before, {after} after; training, with its evaluations every "
                f"{ARTICLE['logging_steps']} steps, took {n('training seconds', result['seconds'], ',.0f')} s)")
    passes = result["passes"]
    evaluations = passes["evaluations"]["pictures"] // max(1, val_count)
    report.line(f"passes over pictures: the training steps {report.pass_text('training steps', passes['training'])}, "
                f"their pictures decoded and preprocessed by {result['workers']} worker processes (none on a CPU: the "
                f"main process); the {evaluations} evaluations "
                f"{report.pass_text('evaluations', passes['evaluations'])}, their {val_count} pictures preprocessed "
                f"once, before the Trainer, in "
                f"{n('validation preprocessing seconds', result['preprocessing seconds'], '.1f')} s. The Trainer's loop "
                f"hides its wait, so every next() of its data loaders is timed from outside (on a CUDA GPU, the GPU's "
                f"idle time, with CUDA events)")
    print_history(report, result["history"])
    # one basis for both, so that a colour means the same direction before and after
    both = pca_rgb(torch.cat([result["tokens before"], result["tokens after"]]).numpy(), feature_grid(result["model"]))
    maps = {"before": both[:len(both) // 2], "after": both[len(both) // 2:]}
    report.keep("feature maps", {**{key: value.round(3).tolist() for key, value in maps.items()},
                                 "pictures": thumbnails(result["map pixels"], processor_stats(run)),
                                 "labels": [names[beans["validation"][i]["labels"]] for i in result["map indices"]]})
    if args.plots:
        figures.backbone_curves(report.series, Path(args.plots) / CURVES_FIGURE, report.say)
        figures.backbone_feature_maps(report.series["feature maps"], Path(args.plots) / MAPS_FIGURE, report.say)


def float32_text(arithmetic):
    """One line on how float32 was computed: the rule, and whether TF32 could act here."""
    if arithmetic["rule"] == "torch defaults":
        text = ("float32: torch's defaults, as the article ran: convolutions (the patch embedding) in TF32 on NVIDIA "
                "GPUs since Ampere, matrix multiplies in IEEE float32")
    elif arithmetic["rule"] == "strict":
        text = "float32: strict, no TF32 anywhere (--precision fp32-strict; the article's run allowed TF32 convolutions)"
    else:
        text = "float32: TF32 in matrix multiplies and convolutions (--precision tf32)"
    return text + f"; TF32 on this device: {'yes' if arithmetic['TF32 on this device'] else 'no (all IEEE float32)'}"


def feature_grid(model):
    side = model.config.image_size // model.config.patch_size
    return side, side


def processor_stats(run):
    processor = run.need("processor")
    return np.array(processor.image_mean), np.array(processor.image_std)


def thumbnails(pixels, stats, side=56):
    """The pictures as the model saw them, un-normalised, side x side, as uint8 lists (for the figure)."""
    mean, std = stats
    small = F.interpolate(pixels.float(), size=(side, side), mode="area").permute(0, 2, 3, 1).numpy()
    return np.clip((small * std + mean) * 255, 0, 255).round().astype(np.uint8).tolist()


def section_three_ways(run, report):
    """5. three ways to adapt the same backbone"""
    args = run.args
    beans = run.need("beans", "processor")[0]
    classes, n = len(beans["names"]), report.num
    report.header(f"5. beyond the article: three ways to adapt the same backbone, on the same "
                  f"{len(beans['train']):,} training and {len(beans['validation'])} validation pictures")
    frozen, result = run.need("features", "finetune")
    x_train, x_val = frozen["features"]["train"], frozen["features"]["validation"]
    y_train, y_val = frozen["labels"]["train"], frozen["labels"]["validation"]
    report.line(f"frozen features: the last layer's class token beside the mean of its patch tokens, "
                f"{n('feature width', x_train.shape[1], ',')} numbers per picture, {frozen['source']} in "
                f"{n('features seconds', frozen['seconds'], '.1f')} s (--no-cache recomputes)"
                + (f" {report.pass_text('frozen features', frozen['pass'])}, the loader's {frozen['pass']['workers']} "
                   f"worker processes (none on a CPU) started in {frozen['pass']['start-up seconds']:.1f} s, outside the "
                   f"pass" if frozen["pass"] else ""))
    report.line(f"linear probe: DINO's linear evaluation (Caron et al. 2021): normal(0, {PROBE['std']}) weights, SGD "
                f"momentum {PROBE['momentum']}, no weight decay, learning rate {PROBE['base_lr']} x batch "
                f"{PROBE['batch_size']}/256, cosine to 0 over {args.probe_epochs} epochs. Unlike DINO: no random crops "
                f"and flips (the features are computed once); the pictures preprocessed as the checkpoint's processor "
                f"does ({preprocessing_text(run.need('processor'))}), not Resize 256 + CenterCrop 224 with ImageNet's "
                f"mean and std; and the accuracy is the last epoch's, where DINO reports the best over its epochs "
                f"(chosen on the validation pictures)")
    report.line("closed form: Part 3's W = (X^T X + lambda I)^-1 X^T Y on the same features with a bias column, "
                "targets in {{-1, +1}}")
    rows = [("random new head (the article's before)", result["before"]["eval_accuracy"],
             result["before"]["eval_loss"], 0, None)]
    start = time.perf_counter()
    layer = linear_probe(x_train, y_train, classes, args.probe_epochs, args.seed)
    with torch.no_grad():
        accuracy, loss = scores_accuracy_loss(layer(torch.as_tensor(x_val, dtype=torch.float32)), y_val)
    rows.append(("linear probe", accuracy, loss, sum(p.numel() for p in layer.parameters()),
                 time.perf_counter() - start))
    for lam in args.lambdas:
        start = time.perf_counter()
        w, scores = closed_form_probe(x_train, y_train, x_val, classes, lam)
        rows.append((f"closed form, lambda {lam:g}", float(np.mean(scores.argmax(1) == y_val)), None, w.size,
                     time.perf_counter() - start))
    rows.append(("full fine-tuning (the article's after)", result["after"]["eval_accuracy"],
                 result["after"]["eval_loss"], result["trained parameters"], result["seconds"]))
    print_ways(report, rows)


def preprocessing_text(processor):
    """The image processor's resize and normalisation in words: 'resized to 224x224, mean 0.5 and std 0.5'."""
    size = getattr(processor, "size", None) or {}
    side = f"{size['height']}x{size['width']}" if "height" in size else str(size.get("shortest_edge", "?"))
    mean, std = (", ".join(f"{v:g}" for v in dict.fromkeys(values)) for values in (processor.image_mean,
                                                                                    processor.image_std))
    return f"resized to {side}, mean {mean} and std {std}"


def print_ways(report, rows):
    n = report.num
    report.line(f"{'way':<40} {'accuracy':>8}  {'loss':>7}  {'trained parameters':>18}  {'time (s)':>8}")
    for way, accuracy, loss, parameters, seconds in rows:
        loss_text = "-" if loss is None else n(f"{way}: loss", loss, "7.4f")
        seconds_text = "-" if seconds is None else n(f"{way}: seconds", seconds, "8.2f")
        report.line(f"{way:<40} {n(f'{way}: accuracy (%)', 100 * accuracy, '7.2f')}%  {loss_text:>7}  "
                    f"{n(f'{way}: trained parameters', parameters, '18,')}  {seconds_text:>8}")
    report.line("accuracy and loss (cross-entropy) on the validation pictures; the closed form fits squared error to "
                "targets in {{-1, +1}} and gives no probabilities, so it has no cross-entropy; fine-tuning's time is its "
                "training with its evaluations, the probes' their fit on the features")


SECTIONS = [section_feature_map, section_table, section_checkpoint, section_finetune, section_three_ways]


def parse_args(argv):
    parser = script_parser(__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint id or local directory (an image "
                                                                "classifier saved with its image processor)")
    parser.add_argument("--data-dir", help=f"a local copy of {DATASET}'s files (README.md, data/*.parquet); by "
                                           f"default the dataset through the Hugging Face cache, downloaded once")
    parser.add_argument("--per-class", type=positive_int, help="keep the first N pictures of each class in each split "
                                                               "(default: all; not the article's setup)")
    parser.add_argument("--epochs", type=positive_int, default=ARTICLE["epochs"], help="fine-tuning epochs")
    parser.add_argument("--batch-size", type=positive_int, default=ARTICLE["batch_size"], help="pictures per step")
    parser.add_argument("--lr", type=positive_float, default=ARTICLE["lr"], help="fine-tuning learning rate")
    parser.add_argument("--seed", type=seed, default=ARTICLE["seed"], help="every random draw (the article: 42)")
    parser.add_argument("--probe-epochs", type=positive_int, default=100, help="epochs of the linear probe (DINO: 100)")
    parser.add_argument("--lambdas", type=nonnegative_float, nargs="+", default=[0.01, 1.0, 100.0],
                        help="ridge penalties of the closed-form probe, finite and >= 0")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write data/features/")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS + ("fp32-strict",),
                        help="fp32 is torch's defaults, as the article ran (on NVIDIA GPUs since Ampere, convolutions "
                             "in TF32); fp32-strict allows no TF32; tf32 allows it in matrix multiplies too; bf16 is "
                             "faster on recent GPUs")
    parser.add_argument("--plots", metavar="DIR", help="save the training curves and the feature maps as PNG "
                                                       "(needs matplotlib)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    distinct(parser, "--lambdas", args.lambdas)
    return args


def check_checkpoint_files(name):
    """A local --model must be a ViT saved with its image processor; a cached one must be a ViT. Before any work."""
    folder = Path(name).expanduser()
    if looks_like_a_path(name):
        for file, what in (("config.json", "save_pretrained"), ("preprocessor_config.json", "its image processor")):
            if not (folder / file).exists():
                raise UserError(f"--model {name} has no {file}: pass a checkpoint saved with {what}")
    config = checkpoint_config(name)
    if config is not None and config.model_type != "vit":
        raise UserError(f"--model {name} is a {config.model_type} checkpoint, not a ViT: the article's backbone is "
                        f"ViTModel (pass e.g. {DEFAULT_MODEL})")


def main(argv=None):
    args = parse_args(argv)
    check_model_flag(args.model)
    if args.data_dir:
        check_data_dir(args.data_dir)
    check_checkpoint_files(args.model)
    loaders = {"beans": load_beans, "processor": load_processor, "checkpoint": load_checkpoint,
               "finetune": finetune, "features": load_features}
    run = Run(args, loaders, fp32_rule=ARTICLE_FP32_RULE)
    return run_sections("backbone", run, SECTIONS, setup_differences)


if __name__ == "__main__":
    sys.exit(guarded(main))
