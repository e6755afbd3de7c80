"""The backbone article's plumbing around transformers: its checkpoint, its processor, its passes timed from outside."""
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from common.checkpoints import checkpoint_config, load_pretrained, looks_like_a_path
from common.device import to_device
from common.errors import UserError
from common.loader import PREFETCH, end_workers, loader_workers, pass_timing, timed, worker_setup, worker_start


class TimedLoader:
    """A data loader whose every next() is timed into a pass timing, for loops a library runs (the Trainer's)."""

    def __init__(self, loader, timing, count=len, device=None):
        self.loader, self.timing, self.count, self.device = loader, timing, count, device

    def __iter__(self):
        return timed(self.loader, self.timing, self.count, self.device)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def check_classifier_files(name, example):
    """A local --model must be a ViT saved with its image processor; a cached one must be a ViT. Before any work."""
    if looks_like_a_path(name):
        for file, what in (("config.json", "save_pretrained"), ("preprocessor_config.json", "its image processor")):
            if not (Path(name).expanduser() / file).exists():
                raise UserError(f"--model {name} has no {file}: pass a checkpoint saved with {what}")
    config = checkpoint_config(name)
    if config is not None and config.model_type != "vit":
        raise UserError(f"--model {name} is a {config.model_type} checkpoint, not a ViT: the article's backbone is "
                        f"ViTModel (pass e.g. {example})")


def image_processor(name):
    """The checkpoint's image processor, its PIL backend (PIL's resize, which common/pictures.py reproduces: left to
    itself, transformers picks its torchvision backend wherever torchvision is installed); one line when it was saved
    without one."""
    from transformers import AutoImageProcessor

    try:
        return load_pretrained(AutoImageProcessor, name, backend="pil")
    except (ValueError, KeyError) as error:
        raise UserError(f"{name} has no image processor (preprocessor_config.json): pass a checkpoint "
                        f"saved with one") from error


def image_classifier(name, example):
    """AutoModelForImageClassification with the checkpoint's own head; one line when it has none."""
    from transformers import AutoModelForImageClassification

    model, info = load_pretrained(AutoModelForImageClassification, name, output_loading_info=True)
    if any(key.startswith("classifier.") for key in info.get("missing_keys", ())):
        raise UserError(f"{name} has no classification head (the library would draw one at random): "
                        f"pass an image classifier such as {example}")
    return model


def pixels_of(processor, images):
    return processor([image.convert("RGB") for image in images], return_tensors="pt")["pixel_values"]


def last_hidden_states(backbone, pixels, run):
    with torch.inference_mode(), run.autocast:
        return backbone(pixel_values=pixels.to(run.device)).last_hidden_state.float().cpu()


def logged_steps(history):
    """{step: the Trainer's log entries of that step, merged}, for the steps that logged a loss or an evaluation."""
    rows = {}
    for entry in history:
        if "loss" in entry or "eval_loss" in entry:
            rows.setdefault(entry["step"], {}).update(entry)
    return rows


def preprocessing_text(processor):
    """The image processor's resize and normalisation in words: 'resized to 224x224, mean 0.5 and std 0.5'."""
    size = getattr(processor, "size", None) or {}
    side = f"{size['height']}x{size['width']}" if "height" in size else str(size.get("shortest_edge", "?"))
    mean, std = (", ".join(f"{v:g}" for v in dict.fromkeys(values)) for values in (processor.image_mean,
                                                                                    processor.image_std))
    return f"resized to {side}, mean {mean} and std {std}"


def thumbnails(pixels, processor, side=56):
    """The pictures as the model saw them, un-normalised, side x side, as uint8 lists (for the figure)."""
    mean, std = np.array(processor.image_mean), np.array(processor.image_std)
    small = F.interpolate(pixels.float(), size=(side, side), mode="area").permute(0, 2, 3, 1).numpy()
    return np.clip((small * std + mean) * 255, 0, 255).round().astype(np.uint8).tolist()


def clocked(compute, *args, **kwargs):
    """(compute(*args, **kwargs), the seconds it took)."""
    begun = time.perf_counter()
    result = compute(*args, **kwargs)
    return result, time.perf_counter() - begun


def progress_on_stderr():
    """A tqdm bar on stderr in place of the Trainer's own, whose log lines would land on stdout."""
    from tqdm import tqdm
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=state.max_steps, desc="fine-tuning", unit="step", file=sys.stderr, leave=False)

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update(1)

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

    return Progress()


@contextlib.contextmanager
def timed_trainer(recipe, device, precision, workers, **parts):
    """Yields (a Trainer of `parts` and TrainingArguments(**recipe), writing to a temporary folder, its progress on
    stderr; its timed_passes()), its training pictures prepared by `workers` processes (docs/performance.md)."""
    from transformers import ProgressCallback, Trainer, TrainingArguments

    with tempfile.TemporaryDirectory(prefix="vit-backbone-trainer-") as output_dir:
        args = TrainingArguments(**recipe, output_dir=output_dir, report_to="none", use_cpu=device.type == "cpu",
                                 bf16=precision == "bf16", dataloader_num_workers=workers,
                                 dataloader_persistent_workers=workers > 0, dataloader_pin_memory=device.type == "cuda",
                                 dataloader_multiprocessing_context=(  # on macOS the library's own choice
                                     worker_start() if workers and sys.platform.startswith("linux") else None))
        trainer = Trainer(args=args, **parts)
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(progress_on_stderr())
        with timed_passes(trainer, device) as passes:
            yield trainer, passes


def labels_in(batch):
    return len(batch["labels"])


@contextlib.contextmanager
def timed_passes(trainer, device):
    """Yields {"training", "evaluations": pass timings, "train() seconds"}, filled as the Trainer runs in the block, its
    loaders' next() and evaluate() timed from outside; its loaders' workers end with the block."""
    timings, made = {"training": pass_timing(), "evaluations": pass_timing()}, []
    make_train, make_eval, evaluate, train = (trainer.get_train_dataloader, trainer.get_eval_dataloader,
                                              trainer.evaluate, trainer.train)

    def train_loader(*a, **k):
        made.append(make_train(*a, **k))
        return TimedLoader(made[-1], timings["training"], count=labels_in, device=device)

    def eval_loader(*a, **k):  # no workers, no pinning: its pictures are on the model's device already
        names = ("dataloader_num_workers", "dataloader_persistent_workers", "dataloader_pin_memory",
                 "dataloader_multiprocessing_context")
        kept = [getattr(trainer.args, name) for name in names]
        for name, value in zip(names, (0, False, False, None)):
            setattr(trainer.args, name, value)
        try:
            made.append(make_eval(*a, **k))
        finally:
            for name, value in zip(names, kept):
                setattr(trainer.args, name, value)
        return TimedLoader(made[-1], timings["evaluations"], count=labels_in, device=device)

    def timed_evaluate(*a, **k):
        output, seconds = clocked(evaluate, *a, **k)
        timings["evaluations"]["seconds"] += seconds
        return output

    def timed_train(*a, **k):
        evaluating = timings["evaluations"]["seconds"]
        output, timings["train() seconds"] = clocked(train, *a, **k)
        timings["training"]["seconds"] = timings["train() seconds"] - (timings["evaluations"]["seconds"] - evaluating)
        return output

    trainer.get_train_dataloader, trainer.get_eval_dataloader = train_loader, eval_loader
    trainer.evaluate, trainer.train = timed_evaluate, timed_train
    try:
        yield timings
    finally:  # the workers would otherwise hold the process at its exit
        end_workers(*made)


def dataset_loader(dataset, collate_fn, workers, pin_memory=False, batch_size=32):
    """A DataLoader for one pass, in order, over a dataset that makes its own items, with picture_loader()'s workers."""
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=workers, pin_memory=pin_memory,
                      prefetch_factor=PREFETCH if workers else None, worker_init_fn=worker_setup,
                      multiprocessing_context=worker_start() if workers else None)


def model_pass(load_model, dataset, collate_fn, keep, device, autocast, desc):
    """(torch.cat of keep(model(pixel_values=batch)) on the host, the pass's timing): one pass over a dataset, its
    workers started first and timed apart, building batches while load_model() loads the model."""
    from tqdm import tqdm

    workers = loader_workers(device)
    loader = dataset_loader(dataset, collate_fn, workers, pin_memory=device.type == "cuda")
    timing = pass_timing()
    batches, timing["start-up seconds"] = clocked(iter, loader)  # iter() starts the workers
    timing["workers"], model, outputs = workers, load_model(), []
    begun = time.perf_counter()
    with torch.inference_mode(), autocast:
        for pixels in tqdm(timed(batches, timing, device=device), desc=desc, unit="batch", file=sys.stderr,
                           leave=False, total=len(loader)):
            outputs.append(keep(model(pixel_values=to_device(pixels, device))))
        outputs = torch.cat(outputs).cpu()
    timing["seconds"] = time.perf_counter() - begun
    return outputs, timing


def preprocessed(dataset, workers):
    """([every item of a dataset through its transform, in order], the seconds it took), by `workers` processes."""
    return clocked(lambda: [item for batch in dataset_loader(dataset, list, workers) for item in batch])
