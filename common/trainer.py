"""The backbone article's plumbing around transformers: its --model check, a Trainer whose passes are timed
through its own overrides; a loader for one pass over a dataset."""
import contextlib
import math
import sys
import tempfile
import time
from pathlib import Path

from torch.utils.data import DataLoader

from common.errors import UserError
from common.loader import NEW_PASS, PREFETCH, WORKER_START, loader_workers, timed, worker_setup
from common.pretrained import checkpoint_config


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


@contextlib.contextmanager
def timed_trainer(recipe, device, precision, output_dir=None, **parts):
    """Yields (a Trainer of `parts` and TrainingArguments(**recipe; report_to "none" unless it says), writing to
    output_dir (a temporary folder without one), its progress on stderr; its passes {"training", "evaluations": pass
    timings, "train() seconds", "workers"}, filled as it runs), its training pictures prepared by
    loader_workers(device) processes (docs/performance.md). The passes are timed through the Trainer's own
    overrides: its training steps' next() in get_batch_samples, its evaluations' in their loader, evaluate() whole.
    A non-finite training loss stops the training at the step it is logged, and train() raises a UserError."""
    from transformers import ProgressCallback, TrainingArguments

    workers = loader_workers(device)
    passes = {**{what: dict(NEW_PASS) for what in ("training", "evaluations")}, "workers": workers}
    progress, divergence = callbacks()
    kept = contextlib.nullcontext(output_dir) if output_dir else tempfile.TemporaryDirectory(prefix="vit-trainer-")
    with kept as folder:
        # no logging_nan_inf_filter: it hides a nan loss (a step's as the others' mean, an evaluation's dropped)
        args = TrainingArguments(**{"report_to": "none", **recipe}, output_dir=str(folder),
                                 use_cpu=device.type == "cpu",
                                 logging_nan_inf_filter=False,
                                 bf16=precision == "bf16", dataloader_num_workers=workers,
                                 dataloader_persistent_workers=workers > 0, dataloader_pin_memory=device.type == "cuda",
                                 dataloader_multiprocessing_context=(  # on macOS the library's own choice
                                     WORKER_START if workers and sys.platform.startswith("linux") else None))
        trainer = timed_trainer_class(passes, divergence)(args=args, callbacks=[progress, divergence], **parts)
        trainer.remove_callback(ProgressCallback)
        yield trainer, passes


def callbacks():
    """(a progress bar on stderr, the watch for a training loss that is not finite: its `found`)."""
    from tqdm import tqdm
    from transformers import TrainerCallback

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

    return Progress(), Divergence()


def timed_trainer_class(passes, divergence):
    """A Trainer that times its passes into `passes` through its own overrides, and raises a UserError at the end of
    a training whose loss `divergence` found not finite."""
    from transformers import Trainer

    def labels_in(batch):
        return len(batch["labels"])

    class TimedTrainer(Trainer):
        def get_batch_samples(self, epoch_iterator, num_batches, device):
            with contextlib.closing(timed(epoch_iterator, passes["training"], labels_in, device)) as batches:
                return super().get_batch_samples(batches, num_batches, device)

        def get_eval_dataloader(self, eval_dataset=None):  # no workers, no pinning: its pictures are on the device
            # prepared as the Trainer's own, so that its last batch's loss counts for its pictures alone
            dataset = self.eval_dataset if eval_dataset is None else eval_dataset
            loader = self.accelerator.prepare(DataLoader(dataset, self.args.eval_batch_size,
                                                         collate_fn=self.data_collator))
            return timed(loader, passes["evaluations"], labels_in, self.args.device)

        def evaluate(self, *args, **kwargs):
            begun = time.perf_counter()
            metrics = super().evaluate(*args, **kwargs)
            passes["evaluations"]["seconds"] += time.perf_counter() - begun
            return metrics

        def train(self, *args, **kwargs):  # the training pass: train() less the evaluations it ran
            evaluating = passes["evaluations"]["seconds"]
            begun = time.perf_counter()
            output = super().train(*args, **kwargs)
            passes["train() seconds"] = time.perf_counter() - begun
            passes["training"]["seconds"] = passes["train() seconds"] - (passes["evaluations"]["seconds"] - evaluating)
            loss, first, last = divergence.found or (output.training_loss, 1, output.global_step)
            if not math.isfinite(loss):  # the mean of steps first to last: the model it trained diverged
                raise UserError(f"the training loss is {loss} {steps_text(first, last)} (lr "
                                f"{self.args.learning_rate:g}): the model diverged, fine-tuning stopped there; "
                                "lower --lr")
            return output

    return TimedTrainer


def steps_text(first, last):
    """The steps a logged training loss is the mean of, in words."""
    return f"at step {last}" if first == last else f"over steps {first} to {last}"


def dataset_loader(dataset, collate_fn, device, pin_memory=False, batch_size=32):
    """A DataLoader for one pass, in order, over a dataset that makes its own items, with loader_workers(device)."""
    workers = loader_workers(device)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=workers, pin_memory=pin_memory,
                      prefetch_factor=PREFETCH if workers else None, worker_init_fn=worker_setup,
                      multiprocessing_context=WORKER_START if workers else None)
