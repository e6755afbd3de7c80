"""ViT, explained, Part 3: a new head for a new task, and the paper's fine-tuning recipe on Imagenette.

Reproduces the article's sections "Fine-tuning: a new head for a new task" and "Our fine-tuning run":
  0. the ImageNet-21k checkpoint of ViT-B/16 loaded into a 10-class classifier, its new head set to 0;
  1. step 0 with the zero head: loss ln 10, the head's gradient by hand against autograd, exactly no
     gradient into the body; a random head for comparison;
  2. 300 steps of batch 32: SGD momentum 0.9, no weight decay, base LR 0.003, 30 warm-up steps, cosine
     decay to 0, clipping at global norm 1, a Polyak average of the weights (factor 0.99), random
     horizontal flips; validation along the way, then the averaged and the last weights on all pictures.

    python vit_part3_finetune.py                              # downloads ViT-B/16 in21k (346 MB), Imagenette (94 MB)
    python vit_part3_finetune.py --save-dir runs/ft           # a checkpoint every 50 steps, on Ctrl-C and SIGTERM
    python vit_part3_finetune.py --save-dir runs/ft --resume  # ... and the run continues where it stopped
    python vit_part3_finetune.py --batch-size 512 --accum-steps 16 --resolution 384   # the paper's batch and size
    torchrun --nproc_per_node 4 vit_part3_finetune.py         # the batch split over 4 processes (DDP)
    python vit_part3_finetune.py --steps 30 --per-class 50 --compare --json ft.json --plots figures/

--batch-size is the batch of one optimizer step; it is split over the torchrun processes, and each
process's share over --accum-steps passes, so every setting follows the same mathematics.
"""
import contextlib
import copy
import hashlib
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from common import figures
from common.checkpoints import checkpoint_config, load_pretrained
from common.cli import (
    add_common_arguments,
    add_data_arguments,
    positive_float,
    positive_int,
    script_parser,
    seed,
    side_pixels,
)
from common.device import pick_device, to_device
from common.errors import UserError
from common.files import write_atomic
from common.imagenette import DEFAULT_DIR as DEFAULT_DATA_DIR
from common.imagenette import (
    class_folders,
    data_differences,
    ensure_imagenette,
    is_imagenette,
    list_split,
    to_pixels,
)
from common.inference import run_model
from common.loader import end_workers, pass_timing, picture_batches, picture_loader, start_workers, timed
from common.position_table import as_parameter_rows, bilinear_table, model_table
from common.reference import article_values, flag_differences, load_reference
from common.run import Run, Terminated, check_output_dir, check_output_file, guarded, run_sections
from common.schedules import warmup_cosine_lr

DEFAULT_MODEL = "google/vit-base-patch16-224-in21k"
ARTICLE_STEPS = 300
REPORT_STEPS = (0, 5, 10, 25, 50, 100, 150, 200, 250, 300)  # at 300 steps; other lengths scale them
MOMENTUM, WEIGHT_DECAY, CLIP_NORM, AVERAGE_FACTOR, WARMUP_FRACTION = 0.9, 0.0, 1.0, 0.99, 0.1
MONITOR_PER_CLASS = 100  # the fixed validation subset watched during the run
RANDOM_HEAD_STD = 0.02
CHECKPOINT = "checkpoint.pt"
FIGURE = "finetune_curves.png"


# ---------------------------------------------------------------- the recipe, as pure functions

def scaled(article_step, total_steps):
    """A step count of the 300-step run, scaled to a run of total_steps (at least 1)."""
    return max(1, round(article_step * total_steps / ARTICLE_STEPS))


def warmup_steps(total_steps):
    """The linear warm-up: the first 10% of the steps (30 of the article's 300)."""
    return round(WARMUP_FRACTION * total_steps)


def lr_at(step, base_lr, total_steps):
    """The learning rate of step s = 1 .. T, the one it applies and logs: the schedule after s - 1 finished steps."""
    return warmup_cosine_lr(step - 1, base_lr, total_steps, warmup_steps(total_steps))


def report_steps(total_steps):
    return sorted({0} | {scaled(s, total_steps) for s in REPORT_STEPS[1:]})


def step_pictures(step, batch_size, count, seed):
    """(indices, flips) of the global batch of step s = 1, 2, ...

    The batch is positions (s-1) B ... s B - 1 of an endless sequence of passes over the count
    pictures; pass e has its own order and flips, drawn from the seed [seed, e]. It depends on the
    step alone, so a resumed run, any number of processes and any accumulation see the same pictures.
    """
    positions = np.arange((step - 1) * batch_size, step * batch_size)
    indices, flips = np.empty(batch_size, dtype=np.int64), np.empty(batch_size, dtype=bool)
    for epoch in np.unique(positions // count):
        rng = np.random.default_rng([seed, int(epoch)])
        order, flip = rng.permutation(count), rng.random(count) < 0.5
        here = positions // count == epoch
        indices[here] = order[positions[here] % count]
        flips[here] = flip[positions[here] % count]
    return indices, flips


def head_gradient_by_hand(features, logits, labels):
    """dL/dW_head of the mean cross-entropy: (softmax - one_hot)^T y / batch, (classes, width).

    With logits = y W^T + b and L = mean_i -ln p_i[t_i], dL/dlogits = (p - t) / batch, and the
    weight's gradient is that error times the input y of each picture.
    """
    error = torch.softmax(logits, dim=1) - F.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return error.T @ features / len(labels)


def update_average(average, model, factor=AVERAGE_FACTOR):
    """Polyak average in place: w_bar <- factor w_bar + (1 - factor) w, for every parameter."""
    with torch.no_grad():
        for averaged, current in zip(average.parameters(), model.parameters()):
            averaged.mul_(factor).add_(current.detach(), alpha=1 - factor)


def run_statistics(losses, norms, clip_norm, norm_window, loss_window):
    """How often clipping acted, median gradient norms and mean losses at both ends of the run."""
    return {"clipped steps": sum(norm > clip_norm for norm in norms),
            "median norm first": statistics.median(norms[:norm_window]),
            "median norm last": statistics.median(norms[-norm_window:]),
            "mean loss first": statistics.fmean(losses[:loss_window]),
            "mean loss last": statistics.fmean(losses[-loss_window:])}


def body_gradient_norm(model):
    """sqrt(sum of squares) of the gradients of every number outside the head.

    Summed in float64 on the host (Apple's mps has no float64), so a zero is exactly 0.0 on every device.
    """
    squares = sum(float(np.square(p.grad.cpu().numpy().astype(np.float64)).sum())
                  for name, p in model.named_parameters() if not name.startswith("classifier.") and p.grad is not None)
    return math.sqrt(squares)


def micro_batches(pixels, labels, passes):
    """(pictures, labels, weight) of each of `passes` parts of a batch; weight = the part's share of the batch, so
    that the parts' mean losses, each times its weight, add up to the batch's mean loss (and so the gradients)."""
    for x, y in zip(pixels.chunk(passes), labels.chunk(passes)):
        yield x, y, len(y) / len(labels)


def head_step(model, pixels, labels, passes=1):
    """One forward and backward pass on a batch: what the head and the body receive. Leaves .grad set.

    The batch goes through in `passes` micro-batches, as training's --accum-steps does, so that the
    peak memory is a micro-batch's: each micro-batch's mean loss is weighted by its share of the batch,
    so the losses add up to the batch's mean loss and the gradients to its gradients.
    """
    captured, logits, loss = [], [], 0.0
    hook = model.classifier.register_forward_hook(
        lambda module, inputs, output: captured.append(inputs[0].detach().float()))
    model.zero_grad(set_to_none=True)
    try:
        for x, y, weight in micro_batches(pixels, labels, passes):
            part = model(pixel_values=x, interpolate_pos_encoding=True).logits.float()  # the loss in float32, bf16 too
            share = F.cross_entropy(part, y) * weight
            share.backward()
            logits.append(part.detach())
            loss += share.item()
    finally:
        hook.remove()
    logits = torch.cat(logits)
    by_hand = head_gradient_by_hand(torch.cat(captured), logits, labels)
    return {"logits": logits, "loss": loss, "head by hand": by_hand,
            "head autograd": model.classifier.weight.grad.detach().clone(), "body norm": body_gradient_norm(model)}


def zero_head(model):
    """W_head = 0 and b_head = 0; returns how many numbers that is."""
    torch.nn.init.zeros_(model.classifier.weight)
    torch.nn.init.zeros_(model.classifier.bias)
    return model.classifier.weight.numel() + model.classifier.bias.numel()


# ---------------------------------------------------------------- processes, data, model

def init_distributed(device_name):
    """(rank, world size, device). Under torchrun (WORLD_SIZE > 1): gloo on the CPU, nccl on GPUs."""
    device = pick_device(device_name)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    if device.type == "mps":
        raise UserError("torchrun with --device mps: torch.distributed does not support Apple's backend; "
                        "use --device cpu, or one process")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), world, device




def build_classifier(checkpoint, classes, resolution):
    """(model, pre-logits shape or None): the checkpoint's body with a zero head of `classes` outputs.

    The head is replaced, not loaded; the pre-logits layer of an ImageNet-21k checkpoint is dropped
    (ViTForImageClassification has none). At another resolution the position table is stretched by
    the official 2D bilinear rule, as the paper does before fine-tuning.
    """
    model, info = checkpoint
    config = model.config
    dropped = any(key.startswith("pooler.") for key in info.get("unexpected_keys", ()))
    pre_logits = (getattr(config, "pooler_output_size", None) or config.hidden_size, config.hidden_size)
    config.num_labels = classes
    model.classifier = torch.nn.Linear(config.hidden_size, classes)
    zero_head(model)
    n_old, n_new = config.image_size // config.patch_size, resolution // config.patch_size
    if n_new != n_old:
        stretched = bilinear_table(model_table(model), n_new)
        model.vit.embeddings.position_embeddings = torch.nn.Parameter(as_parameter_rows(stretched, "cpu"))
    return model, pre_logits if dropped else None


def load_classifier(name, classes, resolution):
    """build_classifier() of the checkpoint `name`, loaded as ViTForImageClassification."""
    from transformers import ViTForImageClassification

    return build_classifier(load_pretrained(ViTForImageClassification, name, output_loading_info=True), classes,
                            resolution)


def check_resolution(config, resolution):
    """The position grid at the fine-tuning resolution needs at least 2x2 places."""
    if resolution // config.patch_size < 2:
        raise UserError(f"--resolution {resolution} gives fewer than 2 patches of {config.patch_size} on a side: "
                        f"choose at least {2 * config.patch_size} pixels")


def load_data(run):
    args = run.args
    root = main_process_first(run, lambda: ensure_imagenette(args.data_dir))
    return {"root": root, "train": list_split(root, "train", args.per_class),
            "val": list_split(root, "val", args.per_class), "classes": len(class_folders(root, "val")),
            "name": "Imagenette" if is_imagenette(root) else Path(root).name}


def load_checkpoint_model(run):
    from transformers import ViTForImageClassification

    def load():
        checkpoint = load_pretrained(ViTForImageClassification, run.args.model, output_loading_info=True)
        check_resolution(checkpoint[0].config, run.args.resolution)
        return checkpoint

    return main_process_first(run, load)


def load_the_classifier(run):
    checkpoint, data = run.need("checkpoint", "data")
    model, pre_logits = build_classifier(checkpoint, data["classes"], run.args.resolution)
    return {"model": model.to(run.device), "pre-logits": pre_logits}


def main_process_first(run, load):
    """load() on process 0 first (it downloads), then on the others; an error there stops every process."""
    result, problem = None, None
    if run.rank == 0:
        try:
            result = load()
        except UserError as error:
            problem = str(error)
    if run.world > 1:
        message = [problem]
        dist.broadcast_object_list(message, src=0)
        problem = message[0]
    if problem:
        raise UserError(problem)
    return result if run.rank == 0 else load()


def sum_over_processes(value, run):
    if run.world == 1:
        return float(value)
    total = torch.tensor(float(value), dtype=torch.float64, device=run.device)
    dist.all_reduce(total)
    return total.item()


def accuracies(models, pictures, labels, batch_size, run, desc):
    """([per cent right of each model, over all processes' shares of the pictures], this process's pass timing).

    One pass: each batch goes through every model. Each process holds its own share of the pictures
    (a loader, or its batches kept on the device: read_monitor()).
    """
    def predictions(**inputs):
        return [model(**inputs).logits.argmax(1) for model in models]

    predicted, timing = run_model(predictions, pictures, run.args.resolution, run.device, batch_size, list, desc,
                                  run.autocast)
    total, percents = sum_over_processes(len(labels), run), []
    for k in range(len(models)):
        correct = int((torch.cat([batch[k] for batch in predicted]) == torch.as_tensor(labels)).sum()) if labels else 0
        percents.append(100 * sum_over_processes(correct, run) / total)
    return percents, timing


def read_monitor(items, batch_size, run, history):
    """The validation subset watched during the run: {"pictures": its batches on the model's device, "labels",
    "batch size"}, and the timing of reading them (pictures: 0, none is checked yet).

    The checks read the same pictures at the same size every time, so they are read once, before the
    first step (a picture that cannot be read stops the run there, resumed or not), and kept as uint8
    batches on the model's device: 150 MB at 224, 442 MB at 384, each process its share. The checks
    then wait for no loader; the loader's workers end here.
    """
    loader, labels = share_loader(items, run, history)
    timing, kept, begun = pass_timing(), [], time.perf_counter()
    for pixels in timed(picture_batches(loader, run.args.resolution, batch_size), timing, count=lambda batch: 0,
                        device=run.device):
        kept.append(to_device(pixels, run.device))
    timing["seconds"] = time.perf_counter() - begun
    end_workers(loader)
    return {"pictures": kept, "labels": labels, "batch size": batch_size}, timing


def check_accuracy(model, monitor, run, desc):
    """(per cent right on the validation subset, the check's pass timing), from the batches read_monitor() kept."""
    (percent,), timing = accuracies([model], monitor["pictures"], monitor["labels"], monitor["batch size"], run, desc)
    return percent, timing


def add_timing(total, timing):
    """Add one pass's seconds, waiting seconds and pictures to a running total (common/loader.py's pass_timing)."""
    for key, value in timing.items():
        total[key] += value


def process_share(step_batch, rank, share):
    """This process's contiguous share of a step's (indices, flips)."""
    indices, flips = step_batch
    return indices[rank * share:(rank + 1) * share], flips[rank * share:(rank + 1) * share]


def share_loader(items, run, history):
    """(A loader over this process's share of the pictures (every world-th), their labels).

    Each picture is read once (the checks keep their batches; both final weights share a pass), so
    the loader reads the files itself, in its workers beside a GPU. The workers are started here,
    before the pass, and the seconds that took are kept apart from the passes.
    """
    share = items[run.rank::run.world]
    loader = picture_loader([path for path, _ in share], run.device)
    count_start_up(history, loader)
    return loader, [label for _, label in share]


def count_start_up(history, loader):
    """Start the loader's worker processes (if any) and add the seconds it took to the history's, outside the passes."""
    history["loader start-up seconds"] = history.get("loader start-up seconds", 0.0) + start_workers(loader)
    history["loader workers"] = loader.num_workers


# ---------------------------------------------------------------- checkpoints

def run_settings(args, world):
    """What must not change between a run and its --resume."""
    return {"model": args.model, "steps": args.steps, "batch size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "resolution": args.resolution, "per class": args.per_class, "precision": args.precision,
            "processes": world}


CHECKPOINT_FORMAT = "vit_part3_finetune checkpoint, v3"  # v3: the history holds the passes' timings


def state_digest(state):
    """blake2b over every value of the checkpoint, in a fixed order: a flipped bit in any weight changes it.

    Tensors are hashed by their dtype, shape and bytes (viewed as uint8, so bfloat16 works too),
    everything else by its repr, so the digest is the same after torch.load as before torch.save.
    """
    digest = hashlib.blake2b(digest_size=16)

    def feed(value):
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                digest.update(repr(key).encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(b"[")
            for item in value:
                feed(item)
            digest.update(b"]")
        elif isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())

    feed(state)
    return digest.hexdigest()


def save_checkpoint(save_dir, model, average, optimizer, step, history, settings):
    """Weights, average, optimizer, step, history, RNG states and their digest, written whole or not at all."""
    path = Path(save_dir) / CHECKPOINT
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    state = {"model": model.state_dict(), "average": average.state_dict(), "optimizer": optimizer.state_dict(),
             "step": step, "history": history, "settings": settings, "rng": rng}
    checked = {"format": CHECKPOINT_FORMAT, "digest": state_digest(state), "state": state}
    return write_atomic(path, lambda f: torch.save(checked, f), what="checkpoint")


def restore(save_dir, settings, model, average, optimizer):
    """Load DIR/checkpoint.pt into the model, the average and the optimizer; returns (step, history)."""
    state = load_checkpoint(save_dir, settings)
    model.load_state_dict(state["model"])
    average.load_state_dict(state["average"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state["step"], state["history"]


def read_checkpoint(path):
    """The state saved at path, refused in one line when it is not this script's or changed since it was written."""
    try:
        checked = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a truncated or foreign file
        raise UserError(f"--resume: {path} is truncated or not a checkpoint of this script ({type(error).__name__}); "
                        f"start again without --resume, or pass another --save-dir") from error
    if not isinstance(checked, dict) or checked.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"--resume: {path} is a torch file but not a checkpoint of this version of "
                        f"vit_part3_finetune.py: start again without --resume, or pass another --save-dir")
    if state_digest(checked["state"]) != checked["digest"]:
        raise UserError(f"--resume: {path} has changed since it was written (its contents no longer match their "
                        f"digest): the file is damaged; start again without --resume, or restore a copy of it")
    return checked["state"]


def load_checkpoint(save_dir, settings):
    path = Path(save_dir) / CHECKPOINT
    if not path.is_file():
        raise UserError(f"--resume: no {CHECKPOINT} in {save_dir}; start without --resume")
    state = read_checkpoint(path)
    changed = [f"{key} {state['settings'].get(key)} -> {value}" for key, value in settings.items()
               if key != "processes" and state["settings"].get(key) != value]
    if changed:
        raise UserError(f"--resume: {path} was made with other settings ({'; '.join(changed)}); "
                        f"pass the same flags, or a new --save-dir")
    return state


def train_step(model, optimizer, pixels, labels, lr, run):
    """One SGD step on this process's share; returns (mean loss over the global batch, gradient norm).

    Each of the accum_steps passes adds (its pictures / the share) x its mean loss, so the gradients
    sum to the mean over the share; DDP averages the equal shares, giving the mean over the batch.
    Nothing is applied when the loss is not finite.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss_sum, passes = 0.0, run.args.accum_steps
    for k, (x, y, weight) in enumerate(micro_batches(pixels, labels, passes)):
        gradients_wait = run.world > 1 and k < passes - 1  # DDP averages over processes after the last pass only
        with model.no_sync() if gradients_wait else contextlib.nullcontext(), run.autocast:
            logits = model(pixel_values=x, interpolate_pos_encoding=True).logits.float()  # on CUDA, autocast would
            loss = F.cross_entropy(logits, y) * weight  # give a bf16 loss; this pass's share of the mean
            loss.backward()
        loss_sum += loss.item()
    loss = sum_over_processes(loss_sum, run) / run.world
    if not math.isfinite(loss):
        return loss, float("nan")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM).item()
    optimizer.step()
    return loss, norm


class StopOnSignal:
    """In the block, a first Ctrl-C or SIGTERM asks to stop after the current step (saved whole); a second, at once.

    SIGTERM is what schedulers (SLURM), `timeout`, `docker stop` and systemd send some seconds before
    they kill a job: the step in flight is finished and saved in that time, as on Ctrl-C. A SIGTERM
    that follows the first within REPEAT_SECONDS is the same stop delivered twice (systemd and SLURM
    signal every process of a job, and reproduce.py passes its own on), not a second request.
    """
    REPEAT_SECONDS = 2.0

    def __init__(self):
        self.names = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
        self.asked = None  # the name of the first signal
        self.asked_at = None

    def _handler(self, signum, frame):
        if self.asked:
            if signum == signal.SIGTERM == self.first and time.monotonic() - self.asked_at < self.REPEAT_SECONDS:
                return
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        self.asked, self.first, self.asked_at = self.names[signum], signum, time.monotonic()
        if os.environ.get("RANK", "0") == "0":  # one process speaks for all
            print(f"\n{self.asked}: stopping after this step (again: at once)", file=sys.stderr)

    def stop(self):
        """Leave the run as the signal asked: exit status 143 for SIGTERM, 130 for Ctrl-C."""
        raise Terminated if self.asked == "SIGTERM" else KeyboardInterrupt

    def __enter__(self):
        self.previous = {signum: signal.signal(signum, self._handler) for signum in self.names}
        return self

    def __exit__(self, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


# ---------------------------------------------------------------- sections

def section_data_and_model(run, report):
    """0. data and model"""
    data, classifier = run.need("data", "classifier")
    model, pre_logits, n = classifier["model"], classifier["pre-logits"], report.num
    report.header(f"0. data: {data['name']}, {n('training pictures', len(data['train']))} training and "
                  f"{n('validation pictures', len(data['val']))} validation pictures, "
                  f"{n('classes', data['classes'])} classes; device {run.device.type}")
    report.line(f"loaded {run.args.model} into a {data['classes']}-class classifier")
    if pre_logits:
        report.line(f"the pre-logits layer ({n('pre-logits rows', pre_logits[0])} x "
                    f"{n('pre-logits columns', pre_logits[1])} + tanh) is dropped: model.vit.pooler is "
                    f"{model.vit.pooler}")
    else:
        report.line(f"the checkpoint has no pre-logits layer: model.vit.pooler is {model.vit.pooler}")
    numbers = model.classifier.weight.numel() + model.classifier.bias.numel()
    report.line(f"new head: {model.classifier} with every weight and bias set to 0 ({n('head numbers', numbers, ',')} "
                f"numbers)")
    config = model.config
    n_old, n_new = config.image_size // config.patch_size, run.args.resolution // config.patch_size
    if run.args.resolution % config.patch_size:
        report.line(f"--resolution {run.args.resolution} is not a multiple of the patch size {config.patch_size}: the "
                    f"last {run.args.resolution % config.patch_size} pixels of each side fall outside the patches")
    if n_new != n_old:
        how = "stretched" if n_new > n_old else "shrunk"
        report.line(f"position table {how} {n_old}x{n_old} -> {n_new}x{n_new} by the official 2D bilinear rule "
                    f"(scipy.ndimage.zoom, order=1): {n_old * n_old + 1} -> {n_new * n_new + 1} rows")


def first_step_batch(run, data):
    """The pictures and labels of step 1, on the device."""
    indices, flips = step_pictures(1, run.args.batch_size, len(data["train"]), run.args.seed)
    items = [data["train"][i] for i in indices]
    loader = picture_loader([path for path, _ in items], run.device, workers=0)
    pixels = next(picture_batches(loader, run.args.resolution, len(items), flips))
    labels = torch.tensor([label for _, label in items], device=run.device)
    return to_pixels(pixels, run.device), labels


def millions_or_count(millions):
    """85.8M as the article prints ViT-B's body; a small stand-in's count in full."""
    return f"{millions:.1f}M" if millions >= 0.1 else f"{millions * 1e6:,.0f}"


def norm_text(norm):
    return "0.0" if norm == 0 else f"{norm:.3g}"


def section_zero_head(run, report):
    """1. step 0 with the zero head"""
    data, classifier = run.need("data", "classifier")
    if run.rank != 0:
        return
    model, n = classifier["model"], report.num
    report.header("1. step 0 with the zero head")
    pixels, labels = first_step_batch(run, data)
    passes = run.world * run.args.accum_steps  # the micro-batch of a training step, so the peak is training's
    with run.autocast:
        zero = head_step(model, pixels, labels, passes)
    classes, first = data["classes"], zero["logits"][0]
    probabilities = torch.softmax(first.float(), 0)
    spread = (f"softmax gives {n('zero head probability', round(probabilities[0].item(), 6), 'g')} to each of the "
              f"{classes} classes" if torch.all(first == first[0]) else
              f"softmax gives {n('zero head probability min', probabilities.min(), '.3f')} to "
              f"{n('zero head probability max', probabilities.max(), '.3f')}")
    report.line(f"logits of the first picture: {report.nums('zero head logits', first)}  -> {spread}")
    report.line(f"loss = -ln({1 / classes:g}) = ln {classes} = {n('ln 10', math.log(classes), '.6f')};  "
                f"measured {n('zero head loss', zero['loss'], '.6f')}")
    report.line(f"gradient of the head weight by hand, (softmax - one_hot)^T y / batch: norm "
                f"{n('head gradient norm by hand', zero['head by hand'].norm(), '.4f')}; autograd: "
                f"{n('head gradient norm autograd', zero['head autograd'].norm(), '.4f')}; max |difference| "
                f"{n('head gradient max diff', (zero['head by hand'] - zero['head autograd']).abs().max(), '.1e')}")
    body = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("classifier."))
    report.line(f"gradient reaching the body (all {n('body numbers (M)', body / 1e6, millions_or_count)} "
                f"other numbers): norm {n('zero head body gradient norm', zero['body norm'], norm_text)}  "
                f"(W_head^T (softmax - one_hot) = 0 because W_head = 0)")
    report_random_head(run, report, model, pixels, labels, passes)


def report_random_head(run, report, model, pixels, labels, passes):
    """For comparison: a random head's loss and the gradient it sends into the body; the zero head is restored."""
    generator = torch.Generator().manual_seed(run.args.seed)
    with torch.no_grad():
        head = model.classifier
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * RANDOM_HEAD_STD)
    with run.autocast:
        random_head = head_step(model, pixels, labels, passes)
    zero_head(model)
    model.zero_grad(set_to_none=True)
    logits, n = random_head["logits"][0], report.num
    report.line(f"for comparison, a random head (normal, std {RANDOM_HEAD_STD}): loss "
                f"{n('random head loss', random_head['loss'], '.4f')}, gradient reaching the body: norm "
                f"{n('random head body gradient norm', random_head['body norm'], norm_text)}, logits of picture 1 "
                f"range {n('random head logit min', logits.min(), '.2f')} to "
                f"{n('random head logit max', logits.max(), '.2f')}")


def report_line(report, row):
    """One logged step; its numbers are named after the step."""
    def n(what, spec):
        return report.num(f"step {row['step']} {what}", row[what], spec)

    report.line(f"step {row['step']:3d}: lr {n('lr', '.5f')}  loss {n('loss', '.4f')}  gradient norm before clipping "
                f"{n('norm', '7.3f')}  validation {n('accuracy', '5.1f')}%   [{n('seconds', '.0f')} s, "
                f"{n('waiting seconds', '.1f')} s waiting for pictures]")


def section_finetune(run, report):
    """2. fine-tuning"""
    data, classifier = run.need("data", "classifier")
    args, model = run.args, classifier["model"]
    warmup = warmup_steps(args.steps)
    micro = args.batch_size // (run.world * args.accum_steps)
    report.header(f"2. fine-tuning: {args.steps} steps, batch {args.batch_size}, SGD momentum {MOMENTUM}, no weight "
                  f"decay, base LR {args.lr:g}, linear warm-up {report.num('warm-up steps', warmup)} "
                  f"step{'s' * (warmup != 1)}, cosine decay to 0, clip at global norm {CLIP_NORM}, weight average "
                  f"factor {AVERAGE_FACTOR}, random horizontal flips")
    if run.world > 1 or args.accum_steps > 1 or args.resolution != 224:
        report.line(f"{args.resolution} pixels; batch {args.batch_size} = {run.world} process(es) x {args.accum_steps} "
                    f"accumulation step(s) x {micro} pictures")
    training = prepare_training(run, report, model)
    monitor = report_step_0(run, report, data, training, micro)
    for row in training["history"]["rows"]:
        report_line(report, row)
    last_step = min(args.pause_at or args.steps, args.steps)
    train_steps(run, report, data, training, monitor, warmup, last_step)
    if last_step < args.steps:
        report_passes(report, training["history"], last_step)
        report.line(f"paused after step {last_step} of {args.steps}; saved {Path(args.save_dir) / CHECKPOINT}: add "
                    f"--resume to continue")
        return
    finish_run(run, report, data, training, warmup)


def report_step_0(run, report, data, training, batch_size):
    """The validation subset watched during the run, and its accuracy before the first step.

    Returns the subset (read_monitor()) for check_accuracy(); the time it took to read its pictures counts
    as the checks' wait. On --resume, step 0 comes from the history.
    """
    args, model, history = run.args, training["model"], training["history"]
    monitor_items = list_split(data["root"], "val", min(MONITOR_PER_CLASS, args.per_class or MONITOR_PER_CLASS))
    monitor, reading = read_monitor(monitor_items, batch_size, run, history)
    add_timing(history["passes"]["checks"], reading)
    if training["start"] == 0:
        model.eval()
        history["step 0"], timing = check_accuracy(model, monitor, run, "step 0")
        add_timing(history["passes"]["checks"], timing)
        ties = not model.classifier.weight.any() and not model.classifier.bias.any()
        history["tie note"] = "  (zero head: every class ties, the first wins)" if ties else ""
    report.line(f"step   0: validation accuracy ({report.num('monitor pictures', len(monitor_items), ',')} pictures, "
                f"{report.num('monitor per class', len(monitor_items) // data['classes'])} per class) "
                f"{report.num('step 0 validation', history['step 0'], '.1f')}%{history['tie note']}")
    return monitor


def prepare_training(run, report, model):
    """The optimizer, the weight average, the DDP wrapper, and the step and history to start from."""
    args = run.args
    average = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    settings = run_settings(args, run.world)
    start, history = 0, {"losses": [], "norms": [], "rows": [], "seconds": 0.0}
    if args.resume:
        start, history = restore(args.save_dir, settings, model, average, optimizer)
        report.line(f"resumed from {Path(args.save_dir) / CHECKPOINT} at step {start}")
    # the passes over pictures so far: the training steps' batches and the checks of the validation subset
    history.setdefault("passes", {"training": pass_timing(), "checks": pass_timing()})
    ids = [run.device.index] if run.device.type == "cuda" else None
    trained = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids) if run.world > 1 else model
    return {"model": model, "trained": trained, "average": average, "optimizer": optimizer, "settings": settings,
            "start": start, "history": history, "clock": time.perf_counter() - history["seconds"]}


def step_batches(run, data, first, last, history):
    """This process's (indices, flips) of steps first..last, and their pixel batches, built ahead on a GPU."""
    args = run.args
    share = args.batch_size // run.world
    shares = [process_share(step_pictures(s, args.batch_size, len(data["train"]), args.seed), run.rank, share)
              for s in range(first, last + 1)]
    paths = [data["train"][i][0] for indices, _ in shares for i in indices]
    flips = np.concatenate([f for _, f in shares]) if shares else None
    loader = picture_loader(paths, run.device)
    count_start_up(history, loader)
    return shares, picture_batches(loader, args.resolution, share, flips)


def train_steps(run, report, data, training, monitor, warmup, last_step):
    """Steps start+1 .. last_step: the NaN stop, the logged rows, checkpoints, Ctrl-C and SIGTERM."""
    from tqdm import tqdm

    args, model, history = run.args, training["model"], training["history"]
    passes = history["passes"]
    shares, batches = step_batches(run, data, training["start"] + 1, last_step, history)
    batches = timed(batches, passes["training"])  # each step ends in loss.item(): the host's wait is the device's
    steps = tqdm(range(training["start"] + 1, last_step + 1), desc="fine-tuning", unit="step", file=sys.stderr,
                 initial=training["start"], total=args.steps)
    reports = report_steps(args.steps)
    with StopOnSignal() as stop:
        for step, (indices, _) in zip(steps, shares):
            begun = time.perf_counter()
            pixels = next(batches)  # the wait for it is timed
            training["trained"].train()
            labels = torch.tensor([data["train"][i][1] for i in indices], device=run.device)
            lr = lr_at(step, args.lr, args.steps)
            loss, norm = train_step(training["trained"], training["optimizer"], to_pixels(pixels, run.device), labels,
                                    lr, run)
            if not math.isfinite(loss):
                stop_diverged(args, loss, step, lr)
            update_average(training["average"], model)
            history["losses"].append(loss)
            history["norms"].append(norm)
            passes["training"]["seconds"] += time.perf_counter() - begun
            if step in reports:
                model.eval()
                percent, timing = check_accuracy(model, monitor, run, f"step {step}")
                add_timing(passes["checks"], timing)
                row = {"step": step, "lr": lr, "loss": loss, "norm": norm, "accuracy": percent,
                       "seconds": time.perf_counter() - training["clock"],
                       "waiting seconds": passes["training"]["waiting seconds"] + passes["checks"]["waiting seconds"]}
                history["rows"].append(row)
                report_line(report, row)
            save_or_stop(run, report, training, step, last_step, stop)


def stop_diverged(args, loss, step, lr):
    saved = Path(args.save_dir) / CHECKPOINT if args.save_dir else None
    where_saved = f"; the last good checkpoint is {saved}" if saved and saved.exists() else ""
    raise UserError(f"the training loss is {loss} at step {step} (lr {lr:.2g}): the run stopped before applying "
                    f"it{where_saved}; lower --lr")


def save_or_stop(run, report, training, step, last_step, stop):
    """A checkpoint every --save-every steps, at the last step and on a stop signal; then stop if asked.

    Every process learns of a signal that reached any of them and of a checkpoint that could not be
    written, so all stop at the same step.
    """
    args = run.args
    interrupted = sum_over_processes(bool(stop.asked), run) > 0
    path, problem = None, None
    if args.save_dir and run.rank == 0 and (step % args.save_every == 0 or step == last_step or interrupted):
        training["history"]["seconds"] = time.perf_counter() - training["clock"]
        try:
            path = save_checkpoint(args.save_dir, training["model"], training["average"], training["optimizer"], step,
                                   training["history"], training["settings"])
        except UserError as error:
            problem = error
    if sum_over_processes(problem is not None, run) > 0:
        raise problem or UserError("the first process could not write its checkpoint (it names the reason)")
    if interrupted:
        saved = f"; saved {path}: add --resume to continue" if path else " (no --save-dir: nothing saved)"
        report.say(f"\nstopped after step {step}{' on ' + stop.asked if stop.asked else ''}{saved}")
        stop.stop()


def report_passes(report, history, steps, final=None):
    """One line: each pass over pictures with its time and the part of it the model waited for pictures."""
    passes = history["passes"]
    checks = passes["checks"]
    checked = f"the checks of the validation subset, {checks['pictures']:,} pictures in all"
    parts = [f"training, {steps} steps {report.pass_text('training', passes['training'])}",
             f"{checked} {report.pass_text('checks', checks)}"]
    parts += [f"{what} {report.pass_text(what, timing)}" for what, timing in (final or {}).items()]
    parts.append(f"the loaders' {history['loader workers']} worker processes each (none on a CPU, whose cores the "
                 f"model uses) started in {history['loader start-up seconds']:.1f} s, outside the passes")
    report.line("passes over pictures (this process's): " + "; ".join(parts))


def finish_run(run, report, data, training, warmup):
    """How often clipping acted, the losses at both ends, and both sets of weights on every validation picture."""
    args, history, n = run.args, training["history"], report.num
    norm_window, loss_window = scaled(50, args.steps), scaled(10, args.steps)
    stats = run_statistics(history["losses"], history["norms"], CLIP_NORM, norm_window, loss_window)
    report.line(f"clipping was active in {n('clipped steps', stats['clipped steps'])} of {args.steps} steps; median "
                f"gradient norm: first {norm_window} steps "
                f"{n('median norm first', stats['median norm first'], '.3f')}, last {norm_window} steps "
                f"{n('median norm last', stats['median norm last'], '.3f')}")
    seen = args.steps * args.batch_size
    report.line(f"mean training loss: steps 1 to {loss_window} "
                f"{n('mean loss first', stats['mean loss first'], '.3f')}, steps {args.steps - loss_window + 1} to "
                f"{args.steps} {n('mean loss last', stats['mean loss last'], '.3f')}; pictures seen "
                f"{n('pictures seen', seen, ',')} = {n('passes', seen / len(data['train']), '.2f')} "
                f"passes over the training set")
    loader, labels = share_loader(data["val"], run, history)
    micro = args.batch_size // (run.world * args.accum_steps)
    model, average = training["model"].eval(), training["average"].eval()
    (last_weights, averaged), final = accuracies([model, average], loader, labels, micro, run, "both weights")
    end_workers(loader)
    report.line(f"on all {len(data['val']):,} validation pictures: the weight average (factor {AVERAGE_FACTOR}) "
                f"{n('average accuracy', averaged, '.2f')}%, the last weights "
                f"{n('last accuracy', last_weights, '.2f')}%")
    report_passes(report, history, args.steps, {"both weights on all validation pictures": final})
    report.keep("training loss", history["losses"])
    report.keep("gradient norm", history["norms"])
    report.keep("learning rate", [lr_at(step, args.lr, args.steps) for step in range(1, args.steps + 1)])
    if args.plots and run.rank == 0:
        figures.finetune_curves(report.series, report.values(), article_values("finetune"), CLIP_NORM,
                                Path(args.plots) / FIGURE, report.say)


SECTIONS = [section_data_and_model, section_zero_head, section_finetune]
# The article's recipe; --accum-steps and torchrun's processes keep its arithmetic, so they are not here.
ARTICLE_FLAGS = {"steps": ("steps", ARTICLE_STEPS), "batch": ("batch_size", 32), "lr": ("lr", 0.003),
                 "resolution": ("resolution", 224), "precision": ("precision", "fp32")}


def unreached_steps(names, steps):
    """The names of the article's logged steps ("step 250 loss") that a run of `steps` steps never logs."""
    logged = set(report_steps(steps))
    return [name for name in names if name.startswith("step ") and int(name.split()[1]) not in logged]


def setup_differences(run):
    """How this run's setup differs from the article's: the pictures and the recipe.

    Another --steps also removes the article's rows of the steps this run never logs: not comparable, not "not run".
    """
    args, data = run.args, run.loaded.get("data")
    loaded = isinstance(data, dict)
    counts = {"train": len(data["train"]) if loaded else None, "val": len(data["val"]) if loaded else None}
    differences = {**data_differences(args, args.data_dir or DEFAULT_DATA_DIR, counts),
                   **flag_differences(args, ARTICLE_FLAGS)}
    if "steps" in differences:
        differences["steps"]["removes"] = unreached_steps(load_reference("finetune"), args.steps)
    return differences


def parse_flags(argv):
    parser = script_parser(__doc__)
    add_data_arguments(parser, DEFAULT_MODEL, "the body to fine-tune; its head is replaced")
    parser.add_argument("--steps", type=positive_int, default=ARTICLE_STEPS, help="optimizer steps; warm-up stays 10%%")
    parser.add_argument("--lr", type=positive_float, default=0.003, help="base learning rate, finite and > 0")
    parser.add_argument("--seed", type=seed, default=0, help="the order and flips of the pictures, the random head")
    parser.add_argument("--resolution", type=side_pixels, default=224, help="fine-tuning resolution (384: the paper's)")
    parser.add_argument("--accum-steps", type=positive_int, default=1, help="split each process's batch into N passes")
    parser.add_argument("--save-dir", metavar="DIR", help=f"write DIR/{CHECKPOINT} every --save-every steps, at the "
                                                          "end and on Ctrl-C or SIGTERM")
    parser.add_argument("--save-every", type=positive_int, default=50, help="steps between checkpoints")
    parser.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt of --save-dir")
    parser.add_argument("--pause-at", type=positive_int, metavar="STEP", help="save and stop after STEP; --resume "
                                                                              "continues")
    parser.add_argument("--plots", metavar="DIR", help="save the loss, accuracy and LR curves as PNG (matplotlib)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if (args.resume or args.pause_at) and not args.save_dir:
        parser.error("--resume and --pause-at need --save-dir")
    return args


def check_before_work(args, world):
    """Every flag and output path that can be checked without the data: one line and exit 2 before any work."""
    if args.batch_size % (world * args.accum_steps):
        raise UserError(f"--batch-size {args.batch_size} does not split into {world} process(es) x {args.accum_steps} "
                        f"accumulation step(s); use a multiple of {world * args.accum_steps}")
    config = checkpoint_config(args.model)  # refuses a --model path that does not exist
    if config is not None:
        check_resolution(config, args.resolution)
    if args.json:
        check_output_file(args.json, "--json")  # before torchrun starts its processes
    if args.save_dir:
        check_output_dir(args.save_dir, "--save-dir")


def main(argv=None):
    args = parse_flags(argv)
    check_before_work(args, int(os.environ.get("WORLD_SIZE", "1")))
    rank, world, device = init_distributed(args.device)
    if rank != 0:  # one process speaks for all
        os.environ["TQDM_DISABLE"] = "1"
    torch.manual_seed(args.seed)
    loaders = {"data": load_data, "checkpoint": load_checkpoint_model, "classifier": load_the_classifier}
    try:
        status = run_sections("finetune", Run(args, loaders, device, rank, world), SECTIONS, setup_differences)
        if world > 1:  # leave together: a process that exits while the first still writes its JSON can abort in gloo
            dist.barrier()
            LEAVING["together"] = True
        return status
    finally:
        if world > 1:
            dist.destroy_process_group()


LEAVING = {"together": False}  # main() sets it once the torchrun processes have all finished their sections


def leave(status):
    """End the process with `status`; under torchrun, once all processes have finished their sections (main() has
    passed its barrier, whatever the status), without the interpreter's finalization.

    Measured on a 2-core CPU under load: about 4 in 100 runs of 2 gloo processes ended with SIGABRT after
    their last line, all their files written ("terminate called without an active exception"). The core
    dump shows why: a gloo worker thread was still dropping the work of the last collective, whose tensor
    is a Python object; it needs the GIL for that, the finalizing interpreter ends such a thread, and
    the unwinding through a destructor calls std::terminate. destroy_process_group() does not end
    those threads. Everything is written (atomically) and printed by then, so the process leaves at once.
    A process that stopped before the barrier (a refused flag, a signal) leaves as usual: torchrun stops
    the others when one fails, and one that left at once could have the first stopped before it prints.
    """
    if not LEAVING["together"]:
        sys.exit(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    leave(guarded(main))
