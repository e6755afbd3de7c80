"""ViT, explained, Part 3: a new head for a new task, and the paper's fine-tuning recipe on Imagenette.

Reproduces the article's sections "Fine-tuning: a new head for a new task" and "Our fine-tuning run":
  0. the ImageNet-21k checkpoint of ViT-B/16 loaded into a 10-class classifier, its new head set to 0;
  1. step 0 with the zero head: loss ln 10, the head's gradient by hand against autograd, exactly no
     gradient into the body; a random head for comparison;
  2. the recipe below: 300 steps of batch 32, validation along the way, then the averaged and the last
     weights on all validation pictures.

    python vit_part3_finetune.py                              # downloads ViT-B/16 in21k and Imagenette once
    python vit_part3_finetune.py --save-dir runs/ft           # a checkpoint every 50 steps, on Ctrl-C and SIGTERM
    python vit_part3_finetune.py --save-dir runs/ft --resume  # ... and the run continues where it stopped
    python vit_part3_finetune.py --batch-size 512 --accum-steps 16 --resolution 384   # the paper's batch and size
    torchrun --nproc_per_node 4 vit_part3_finetune.py         # the batch split over 4 processes (DDP)
    python vit_part3_finetune.py --steps 30 --per-class 50 --compare --json ft.json --plots figures/

--batch-size is the batch of one optimizer step; it is split over the torchrun processes, and each
process's share over --accum-steps passes, so every setting follows the same mathematics.
"""
from common.start_and_end import (
    ARTICLE,
    IN_JOB,
    LEAVING,
    Terminated,
    UserError,
    before_torch_loads,
    guarded,
    quiet_if_nobody_reads,
    say,
    speaks,
)

if __name__ == "__main__":  # before torch loads: a Ctrl-C then is one line, as a later one
    before_torch_loads(ARTICLE)

import collections
import contextlib
import copy
import functools
import itertools
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy.ndimage
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

# transformers is imported in the functions that use it: a DataLoader worker (spawn) runs this file's top
# lines again, where it would add about 3 s to every worker's start (docs/performance.md; tests/test_loader.py)
from common.data import (
    CLASSES,
    DEFAULT_NAME,
    NEW_PASS,
    load_splits,
    picture_loader,
    run_model,
    start_loader,
    to_pixels,
)
from common.features import cache_key
from common.files import (
    CHECKPOINT,
    CHECKPOINT_FORMAT,
    SAVED_AVERAGE,
    SAVED_LAST,
    TEMP_PREFIX,
    read_checkpoint,
    write_atomic,
)
from common.pretrained import checkpoint_config, checkpoint_pixels, load_pretrained, save_loadable
from common.run import (
    begin,
    conclude,
    experiment_parser,
    listed,
    nonempty_path,
    pass_text,
    pick_device,
    positive_float,
    positive_int,
    section,
    seed_number,
    side_pixels,
    values,
    whole_number,
)
from compare.data_set import data_differences
from compare.verdicts import article_values
from figures import origin_of
from figures.finetune import FILE as FIGURE_FILE
from figures.finetune import finetune_curves
from job.imagenette_archive import download_imagenette

# ---------------------------------------------------------------- the recipe
# The article's run ("Our fine-tuning run"), the pieces of the paper's Table 4 at a smaller scale.
MODEL = "google/vit-base-patch16-224-in21k"  # the ImageNet-21k checkpoint of ViT-B/16, with a zero head
STEPS = 300             # optimizer steps, about one pass over Imagenette (the paper: 500 to 20,000)
step_count = functools.partial(whole_number, low=1, high=100_000,  # argparse type: 5 x the paper's longest
                               refusal="is not a number of steps from 1 to 100,000")
BATCH = 32              # pictures per step (the paper: 512)
LR = 0.003              # base learning rate, a value of Table 4's grid, picked without a search
WARMUP_FRACTION = 0.1   # a linear warm-up over the first 30 of 300 steps (ours: Table 4 lists none)
MOMENTUM = 0.9          # SGD with momentum 0.9 (Table 4)
WEIGHT_DECAY = 0.0      # no weight decay (Table 4)
CLIP_NORM = 1.0         # gradients clipped at global norm 1 (Table 4)
AVERAGE_FACTOR = 0.99   # a Polyak average of the weights (the article's snippet)
RESOLUTION = 224        # pixels (the paper fine-tunes at 384)
PRECISION = "fp32"      # the article ran on Apple's mps, which has no TF32
REPORT_STEPS = (0, 5, 10, 25, 50, 100, 150, 200, 250, 300)  # the logged steps; another --steps scales them
STEP_NUMBERS = ("lr", "loss", "norm", "accuracy", "seconds")  # the article's numbers on a logged step's line
NORM_WINDOW = 50        # the first and last steps whose median gradient norm is printed (scaled as the steps)
LOSS_WINDOW = 10        # the first and last steps whose mean loss is printed (scaled as the steps)
CHECK_PER_CLASS = 100  # the validation subset watched during the run, 1,000 pictures (--check-per-class)
RANDOM_HEAD_STD = 0.02   # the random head shown for comparison
ARTICLE_FLAGS = {"steps": ("steps", STEPS), "batch": ("batch_size", BATCH), "lr": ("lr", LR),
                 "resolution": ("resolution", RESOLUTION), "precision": ("precision", PRECISION)}
# --accum-steps and torchrun's processes keep the recipe's arithmetic, so they are not in ARTICLE_FLAGS.


# ---------------------------------------------------------------- the recipe, as pure functions

def scaled(article_step, total_steps):
    """A step count of the 300-step run, scaled to a run of total_steps (at least 1)."""
    return max(1, round(article_step * total_steps / STEPS))


def report_steps(total_steps):
    return sorted({0} | {scaled(s, total_steps) for s in REPORT_STEPS[1:]})


def warmup_steps(total_steps):
    """The linear warm-up: the first 10% of the steps (30 of the article's 300)."""
    return round(WARMUP_FRACTION * total_steps)


def lr_at(t, base_lr, total_steps):
    """The schedule after t finished steps, the article's lr_at(step - 1), which step s = t + 1 applies and logs:
    eta_0 t / W during the W warm-up steps, then the cosine decay eta_0 / 2 (1 + cos(pi (t - W) / (T - W))) to 0."""
    warmup = warmup_steps(total_steps)
    if t < warmup:
        return base_lr * t / warmup
    return base_lr / 2 * (1 + math.cos(math.pi * (t - warmup) / (total_steps - warmup)))


def step_pictures(step, batch_size, count, seed):
    """(indices, flips) of the global batch of step s = 1, 2, ...: positions (s-1) B ... s B - 1 of an endless sequence
    of passes over the count pictures, pass e in its own order and flips, drawn from the seed [seed, e]. It depends on
    the step alone, so a resumed run, any number of processes and any accumulation see the same pictures."""
    positions = np.arange((step - 1) * batch_size, step * batch_size)
    indices, flips = np.empty(batch_size, dtype=np.int64), np.empty(batch_size, dtype=bool)
    for epoch in np.unique(positions // count):
        rng = np.random.default_rng([seed, int(epoch)])
        order, flip = rng.permutation(count), rng.random(count) < 0.5
        here = positions // count == epoch
        indices[here] = order[positions[here] % count]
        flips[here] = flip[positions[here] % count]
    return indices, flips


def process_share(items, rank, world):
    """This process's contiguous share of a step's batch (an array, or a tuple of arrays)."""
    share = len(items[0]) // world
    return tuple(part[rank * share:(rank + 1) * share] for part in items)


def micro_batches(pixels, labels, count):
    """(pictures, labels, weight) of each of `count` parts of a batch; weight: the part's share, so that the weighted
    mean losses add up to the batch's."""
    for x, y in zip(pixels.chunk(count), labels.chunk(count), strict=True):
        yield x, y, len(y) / len(labels)


def head_gradient_by_hand(features, logits, labels):
    """dL/dW_head of the mean cross-entropy: (softmax - one_hot)^T y / batch, (classes, width). With logits = y W^T + b
    and L = mean_i -ln p_i[t_i], dL/dlogits = (p - t) / batch, times the input y of each picture."""
    error = torch.softmax(logits, dim=1) - F.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return error.T @ features / len(labels)


def millions(count):
    """A parameter count as the article prints ViT-B's body, in millions (85.8M); a small stand-in's in full."""
    return f"{count:.1f}M" if count >= 0.1 else f"{count * 1e6:,.0f}"


def zero_or_3g(value):
    """An exact zero as 0.0 (the zero head's body gradient), anything else to 3 significant digits."""
    return "0.0" if value == 0 else f"{value:.3g}"


def update_average(average, model, factor=AVERAGE_FACTOR):
    """Polyak average in place: w_bar <- factor w_bar + (1 - factor) w, for every parameter."""
    with torch.no_grad():
        for averaged, current in zip(average.parameters(), model.parameters(), strict=True):
            averaged.mul_(factor).add_(current.detach(), alpha=1 - factor)


def run_statistics(losses, norms, clip_norm, norm_window, loss_window):
    """(steps clipping acted on, median gradient norm of the first and of the last norm_window steps, mean loss of
    the first and of the last loss_window steps)."""
    return (sum(norm > clip_norm for norm in norms), statistics.median(norms[:norm_window]),
            statistics.median(norms[-norm_window:]), statistics.fmean(losses[:loss_window]),
            statistics.fmean(losses[-loss_window:]))


def body_gradient_norm(model):
    """sqrt(sum of squares) of the gradients of every number outside the head, in float64 on the host (Apple's mps
    has none), so that a zero is exactly 0.0 on every device."""
    squares = sum(float(np.square(p.grad.cpu().numpy().astype(np.float64)).sum())
                  for name, p in model.named_parameters() if not name.startswith("classifier.") and p.grad is not None)
    return math.sqrt(squares)


def head_step(model, pixels, labels, micro_batch_count=1):
    """One forward and backward pass on a batch, in micro_batch_count parts as training's: what the head and the body
    receive. Leaves .grad set."""
    captured, logits, loss = [], [], 0.0
    hook = model.classifier.register_forward_hook(
        lambda module, inputs, output: captured.append(inputs[0].detach().float()))
    model.zero_grad(set_to_none=True)
    try:
        for x, y, weight in micro_batches(pixels, labels, micro_batch_count):
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


def random_head(model, seed):
    """W_head drawn from a normal distribution of mean 0 and std RANDOM_HEAD_STD, by a generator of its own seed."""
    weight = model.classifier.weight  # drawn on the host, so that every device gets the same numbers
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed)) * RANDOM_HEAD_STD)


# ---------------------------------------------------------------- the model and the pictures

def stretched_table(table, n_new):
    """The paper's stretch of a (1 + n^2, d) position table to a bigger grid: the [class] row kept, the n x n grid
    resized by the official code's call, scipy.ndimage.zoom(order=1): bilinear, corners onto corners."""
    n = math.isqrt(len(table) - 1)
    grid = scipy.ndimage.zoom(table[1:].reshape(n, n, -1), (n_new / n, n_new / n, 1), order=1)
    return np.concatenate([table[:1], grid.reshape(n_new * n_new, -1)])


def build_classifier(checkpoint, classes, resolution):
    """(model, pre-logits shape or None): the checkpoint's body with a new zero head of `classes` outputs; the
    pre-logits layer of an ImageNet-21k checkpoint is dropped (ViTForImageClassification has none). At another
    resolution the position table is stretched by the official 2D bilinear rule, as the paper does."""
    model, info = checkpoint
    config = model.config
    dropped = any(key.startswith("pooler.") for key in info.get("unexpected_keys", ()))
    pre_logits = (getattr(config, "pooler_output_size", None) or config.hidden_size, config.hidden_size)
    config.num_labels = classes
    model.classifier = torch.nn.Linear(config.hidden_size, classes)
    zero_head(model)
    n_old, n_new = config.image_size // config.patch_size, resolution // config.patch_size
    if n_new != n_old:  # in float64 by numpy on the host: Apple's mps has no float64 tensors
        table = model.vit.embeddings.position_embeddings.detach()[0].cpu().numpy().astype(np.float64)
        stretched = torch.from_numpy(stretched_table(table, n_new).astype(np.float32))[None]
        model.vit.embeddings.position_embeddings = torch.nn.Parameter(stretched)
    return model, pre_logits if dropped else None


def check_resolution(config, resolution):
    """The position grid at the fine-tuning resolution needs at least 2x2 places."""
    if resolution // config.patch_size < 2:
        raise UserError(f"--resolution {resolution} gives fewer than 2 patches of {config.patch_size} on a side: "
                        f"choose at least {2 * config.patch_size} pixels")


def data_and_model(run):
    """(the pictures, the classifier on the device, its dropped pre-logits shape, the pixels its image processor
    makes), each loaded by the first process first (it downloads); one line names all that an offline run lacks, the
    pictures and the checkpoint."""
    from transformers import ViTForImageClassification

    args = run.args
    splits = dict.fromkeys(["train", "val"], args.per_class)
    loads = (lambda: load_splits(args.data_dir or download_imagenette(), splits),
             lambda: load_pretrained(ViTForImageClassification, args.model, output_loading_info=True),
             lambda: checkpoint_pixels(args.model))
    data, checkpoint, pixels = loaded(*(functools.partial(first_process_first, run, load) for load in loads))
    check_resolution(checkpoint[0].config, args.resolution)
    data["classes"] = len(data["folders"])
    model, pre_logits = build_classifier(checkpoint, data["classes"], args.resolution)
    return data, model.to(run.device), pre_logits, pixels


# ---------------------------------------------------------------- sections

@section
def section_data_and_model(report, run):
    """0. data and model"""
    data, model, pre_logits, pixels = data_and_model(run)
    args = run.args
    report.print(f"\n== 0. data: {data['name']}, {len(data['train'])} training and {len(data['val'])} validation "
                 f"pictures, {data['classes']} classes; device {run.device.type} ==",
                 {"training pictures": len(data["train"]), "validation pictures": len(data["val"]),
                  "classes": data["classes"]})
    report.print(f"  loaded {args.model} into a {data['classes']}-class classifier")
    if pre_logits:
        rows, columns = pre_logits
        report.print(f"  the pre-logits layer ({rows} x {columns} + tanh) is dropped: model.vit.pooler is "
                     f"{model.vit.pooler}",
                     {"pre-logits rows": rows, "pre-logits columns": columns})
    else:
        report.print(f"  the checkpoint has no pre-logits layer: model.vit.pooler is {model.vit.pooler}")
    head_numbers = model.classifier.weight.numel() + model.classifier.bias.numel()
    report.print(f"  new head: {model.classifier} with every weight and bias set to 0 ({head_numbers:,} numbers)",
                 {"head numbers": head_numbers})
    patch = model.config.patch_size
    n_old, n_new = model.config.image_size // patch, args.resolution // patch
    if args.resolution % patch:
        report.print(f"  --resolution {args.resolution} is not a multiple of the patch size {patch}: the last "
                     f"{args.resolution % patch} pixels of each side fall outside the patches")
    if n_new != n_old:
        report.print(f"  position table {'stretched' if n_new > n_old else 'shrunk'} {n_old}x{n_old} -> "
                     f"{n_new}x{n_new} by the official 2D bilinear rule (scipy.ndimage.zoom, order=1): "
                     f"{n_old * n_old + 1} -> {n_new * n_new + 1} rows")
    return data, model, pixels


@section
def section_zero_head(report, run, prepared):
    """1. step 0 with the zero head"""
    data, model, pixels_made = prepared  # section 0's
    if run.rank != 0:
        return
    classes = data["classes"]
    report.print("\n== 1. step 0 with the zero head ==")
    indices, flips = step_pictures(1, run.args.batch_size, len(data["train"]), run.args.seed)  # step 1's whole batch
    batches, _ = start_loader(picture_loader([data["train"][i][0] for i in indices], run.args.resolution,
                                             run.args.batch_size, run.device, flips, workers=0,
                                             resample=pixels_made["resample"]))  # one batch
    pixels = to_pixels(next(batches), run.device, pixels_made)
    labels = torch.tensor([data["train"][i][1] for i in indices], device=run.device)
    micro_batch_count = run.world * run.args.accum_steps  # a training step's, so the peak is training's
    with run.autocast:
        zero = head_step(model, pixels, labels, micro_batch_count)
    first = zero["logits"][0]
    probabilities = torch.softmax(first.float(), 0)
    by_hand, autograd = zero["head by hand"], zero["head autograd"]
    if torch.all(first == first[0]):
        probability = round(probabilities[0].item(), 6)
        report.print(f"  logits of the first picture: {listed(first)}  -> softmax gives {probability:g} to each of the "
                     f"{classes} classes",
                     {"zero head logits": first, "zero head probability": probability})
    else:
        lowest, highest = probabilities.min(), probabilities.max()
        report.print(f"  logits of the first picture: {listed(first)}  -> softmax gives {lowest:.3f} to {highest:.3f}",
                     {"zero head logits": first, "zero head probability min": lowest,
                      "zero head probability max": highest})
    ln = math.log(classes)
    report.print(f"  loss = -ln({1 / classes:g}) = ln {classes} = {ln:.6f};  measured {zero['loss']:.6f}")
    # in float32: a bf16 run's gradient by hand is a bf16 tensor, whose own norm is rounded to bf16's 8 bits
    hand_norm, autograd_norm = by_hand.float().norm(), autograd.float().norm()
    difference = (by_hand.float() - autograd.float()).abs().max()
    report.print("  gradient of the head weight by hand, (softmax - one_hot)^T y / batch: norm "
                 f"{hand_norm:.4f}; autograd: {autograd_norm:.4f}; max |difference| {difference:.1e}")
    body_millions = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("classifier.")) / 1e6
    report.print(f"  gradient reaching the body (all {millions(body_millions)} other numbers): norm "
                 f"{zero_or_3g(zero['body norm'])}  (W_head^T (softmax - one_hot) = 0 because W_head = 0)",
                 {"ln 10": ln, "zero head loss": zero["loss"], "head gradient norm by hand": hand_norm,
                  "head gradient norm autograd": autograd_norm, "head gradient max diff": difference,
                  "body numbers (M)": body_millions, "zero head body gradient norm": zero["body norm"]})
    random_head(model, run.args.seed)  # for comparison: the loss and the body's gradient of a random head
    with run.autocast:
        noisy = head_step(model, pixels, labels, micro_batch_count)
    zero_head(model)
    model.zero_grad(set_to_none=True)
    logits = noisy["logits"][0]
    lowest, highest = logits.min(), logits.max()
    report.print(f"  for comparison, a random head (normal, std {RANDOM_HEAD_STD}): loss {noisy['loss']:.4f}, gradient "
                 f"reaching the body: norm {zero_or_3g(noisy['body norm'])}, logits of picture 1 range {lowest:.2f} to "
                 f"{highest:.2f}",
                 {"random head loss": noisy["loss"], "random head body gradient norm": noisy["body norm"],
                  "random head logit min": lowest, "random head logit max": highest})


def print_step(report, step, row):
    """The article's step line, the wait for pictures inside its brackets; row["accuracy"]: (right, of) of the check."""
    name, (right, of) = f"step {step}", row["accuracy"]
    accuracy = 100 * right / of
    report.print(f"  step {step:3d}: lr {row['lr']:.5f}  loss {row['loss']:.4f}  gradient norm before clipping "
                 f"{row['norm']:7.3f}  validation {accuracy:5.1f}%   {pass_text(row)}",
                 {f"{name} lr": row["lr"], f"{name} loss": row["loss"], f"{name} norm": row["norm"],
                  f"{name} accuracy": accuracy, f"{name} seconds": row["seconds"],
                  f"{name} waiting seconds": row["waiting seconds"]}, counts={f"{name} accuracy": (right, of)})
    # the run's clock and its waits so far, printed as a pass's are, recorded as two plain numbers: no pass of its own


@section
def section_finetune(report, run, prepared):
    """2. fine-tuning"""
    data, model, pixels = prepared  # section 0's
    args = run.args
    warmup, micro = warmup_steps(args.steps), args.batch_size // (run.world * args.accum_steps)
    report.print(f"\n== 2. fine-tuning: {args.steps} steps, batch {args.batch_size}, SGD momentum {MOMENTUM}, no "
                 f"weight decay, base LR {args.lr:g}, linear warm-up {warmup} step{'s' * (warmup != 1)}, cosine "
                 f"decay to 0, clip at global norm {CLIP_NORM}, weight average factor {AVERAGE_FACTOR}, random "
                 "horizontal flips ==",
                 {"warm-up steps": warmup})
    if run.world > 1 or args.accum_steps > 1 or args.resolution != RESOLUTION:
        report.print(f"  {args.resolution} pixels; batch {args.batch_size} = {run.world} process(es) x "
                     f"{args.accum_steps} accumulation step(s) x {micro} pictures")
    average = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    # what the run logs, kept whole in its checkpoint: a resumed run goes on with it
    log = {"losses": [], "norms": [], "rows": [], "seconds": 0.0, "loader workers": 0, "loader start-up seconds": 0.0,
           "passes": {"training": dict(NEW_PASS), "checks": dict(NEW_PASS)}}
    run_inputs = read_inputs(args, data) if args.save_dir else None  # what a checkpoint's run read, for --resume
    start = 0
    if args.resume:
        start, log = resume(run, model, average, optimizer, run_inputs)
        report.print(f"  resumed from {Path(args.save_dir) / CHECKPOINT} at step {start}")
    n = check_pictures_per_class(args)  # the first n of each class: validation pictures are listed by class, then name
    items = [item for _, group in itertools.groupby(data["val"], key=lambda item: item[1]) for item in list(group)[:n]]
    # read once, kept on the device: an unreadable picture stops the run here; the reading counts as the checks' wait
    check_batches = kept_batches(items, run, micro, log, pixels)
    if start == 0:
        right, of = accuracies([model.eval()], *check_batches, run, micro, "step 0", log["passes"]["checks"],
                               pixels)[0]
        log["step 0"] = 100 * right / of  # no sample: the zero head's tie is 100 / classes on a balanced check
        ties = not model.classifier.weight.any() and not model.classifier.bias.any()
        log["tie note"] = "  (zero head: every class ties, the first wins)" if ties else ""
    each = collections.Counter(label for _, label in items).values()  # a class that holds fewer is checked whole
    per_class = f"{min(each)}" if min(each) == max(each) else f"{min(each)} to {max(each)}"
    report.print(f"  step   0: validation accuracy ({len(items):,} pictures, {per_class} per class) "
                 f"{log['step 0']:.1f}%{log['tie note']}",
                 {"monitor pictures": len(items), "monitor per class": min(each), "step 0 validation": log["step 0"]})
    last_step = min(args.pause_at or args.steps, args.steps)
    train(run, report, data=data, model=model, average=average, optimizer=optimizer, log=log,
          check_batches=check_batches, micro=micro, steps=(start, last_step), pixels=pixels, run_inputs=run_inputs)
    try:
        finish(run, report, data=data, model=model, average=average, log=log, micro=micro, last_step=last_step,
               pixels=pixels)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM in the last passes: the last step is saved, only they are left
        if args.save_dir:
            say(f"\nsaved {Path(args.save_dir) / CHECKPOINT} at step {last_step}: add --resume to finish")
        raise


def train(run, report, *, data, model, average, optimizer, log, check_batches, micro, steps, pixels, run_inputs):
    """Steps (start, last_step): start+1 .. last_step, the article's loop, its logged steps, and a checkpoint every
    --save-every steps, at the last one and on Ctrl-C or SIGTERM (then the run stops, every process at the same step).
    micro: the pictures of one forward pass; check_batches: the checks' batches and labels; pixels: how a picture is
    made into the model's pixels; run_inputs: what the run reads (read_inputs), kept in each checkpoint."""
    (start, last_step), args, timings = steps, run.args, log["passes"]
    trained = torch.nn.parallel.DistributedDataParallel(model) if run.world > 1 else model  # on the model's device
    for row in log["rows"]:  # a resumed run's logged steps, printed again
        print_step(report, row["step"], row)
    begun = time.perf_counter() - log["seconds"]  # the run's clock: a resumed run's seconds go on
    batches = step_batches(data["train"], start + 1, last_step, run, log, pixels)
    logged = report_steps(args.steps)  # the steps whose line the article prints, each checked on the validation subset
    progress = tqdm(range(start + 1, last_step + 1), desc="fine-tuning", unit="step", file=sys.stderr, initial=start,
                    total=args.steps)

    def checkpoint(step):  # what --resume continues from
        log["seconds"] = time.perf_counter() - begun
        return {"model": model.state_dict(), "average": average.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step, "log": log, "settings": settings(run, run_inputs)}

    with stop_between_steps() as stop:
        for step in progress:
            step_begun = time.perf_counter()  # a step's seconds and wait for pictures, not its check's
            inputs, labels = next(batches)  # this process's share of the step's batch, on the device
            lr = lr_at(step - 1, args.lr, args.steps)  # warm-up, then cosine to 0
            for group in optimizer.param_groups:
                group["lr"] = lr
            trained.train()  # dropout on, as the checks of the logged steps left it off
            optimizer.zero_grad(set_to_none=True)
            loss = 0.0  # the batch's mean loss: this process's share in --accum-steps micro-batches
            for k, (x, y, weight) in enumerate(micro_batches(inputs, labels, args.accum_steps)):
                syncing = run.world == 1 or k == args.accum_steps - 1  # DDP averages the gradients after the last
                with (contextlib.nullcontext() if syncing else trained.no_sync()), run.autocast:
                    logits = trained(pixel_values=x, interpolate_pos_encoding=True).logits.float()  # a float32 loss
                    part = F.cross_entropy(logits, y) * weight  # this micro-batch's share of the batch's mean loss
                    part.backward()
                loss += part.item()
            loss = sum_over_processes(loss, run) / run.world  # the processes' equal shares, as DDP averages them
            norm = torch.nn.utils.clip_grad_norm_(trained.parameters(), CLIP_NORM).item()  # global norm 1
            check_finite(loss, norm, step, lr, args)
            optimizer.step()
            update_average(average, model)  # Polyak average
            log["losses"].append(loss)
            log["norms"].append(norm)
            timings["training"]["seconds"] += time.perf_counter() - step_begun
            if step in logged:
                checked = accuracies([model.eval()], *check_batches, run, micro, f"step {step}", timings["checks"],
                                     pixels)[0]
                log["seconds"] = time.perf_counter() - begun
                row = {"lr": lr, "loss": loss, "norm": norm, "accuracy": checked, "seconds": log["seconds"],
                       "waiting seconds": sum(timing["waiting seconds"] for timing in timings.values())}
                log["rows"].append({"step": step, **row})
                print_step(report, step, row)
            end_of_step(run, stop, step, last_step, checkpoint)


def check_finite(loss, norm, step, lr, args):
    """A loss or gradient norm that is nan or inf (a finite loss can still overflow its gradient) stops the run
    before the step is applied."""
    if math.isfinite(loss) and math.isfinite(norm):
        return
    what = f"loss is {loss}" if not math.isfinite(loss) else f"gradient norm is {norm}"
    saved = Path(args.save_dir or ".") / CHECKPOINT
    kept = f"; the last good checkpoint is {saved}" if args.save_dir and saved.exists() else ""
    raise UserError(f"the training {what} at step {step} (lr {lr:.2g}): the run stopped before applying it{kept}; "
                    "lower --lr")


def end_of_step(run, stop, step, last_step, checkpoint):
    """A step's end, every process at the same step: the first process writes the checkpoint due (every
    --save-every steps, and the last), then one sum over the processes tells each whether any was asked to stop
    (Ctrl-C, SIGTERM) or the write failed; on a stop between two due steps, the first process writes this step's
    checkpoint while the others wait for it in a second sum (torchrun would stop the first when another ends), and
    every process stops."""
    args = run.args
    due = bool(args.save_dir) and (step % args.save_every == 0 or step == last_step)
    path, problem = write_checkpoint(args, checkpoint(step)) if due and run.rank == 0 else (None, None)
    asked, failed = sum_over_processes((bool(stop["asked"]), problem is not None), run)
    stop_if_failed(failed, problem)
    if not asked:
        return
    if args.save_dir and not due:
        path, problem = write_checkpoint(args, checkpoint(step)) if run.rank == 0 else (None, None)
        stop_if_failed(sum_over_processes(problem is not None, run), problem)
    saved = f"; saved {path}: add --resume to continue" if path else " (no --save-dir: nothing saved)"
    say(f"\nstopped after step {step}{' on ' + stop['asked'] if stop['asked'] else ''}{saved}")
    raise Terminated if stop["asked"] == "SIGTERM" else KeyboardInterrupt


def stop_if_failed(failed, problem):
    """Every process stops when the first could not write its checkpoint: the first with its reason."""
    if failed:
        raise problem or UserError("the first process could not write its checkpoint (it names the reason)")


@contextlib.contextmanager
def only_run_in(run):
    """An exclusive lock on --save-dir's .finetune.lock while the run lives (a second run there would replace this
    one's checkpoint), taken by the first process and refused by every one together; then the temporary checkpoint
    of a run killed while writing it (as large as a checkpoint) removed: none is being written now. Where the system
    cannot lock a file (no flock), nothing is locked."""
    lock, held = None, None  # held: True when this run holds it, False when another does, None when unknown
    if run.rank == 0:
        try:
            import fcntl  # POSIX's

            lock = open(Path(run.args.save_dir) / ".finetune.lock", "a")  # noqa: SIM115 - closed by the with below
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
        except (ImportError, OSError):  # Windows, a disk without locks: nothing is locked
            pass
    with lock or contextlib.nullcontext():  # closed however the run ends: the lock freed
        if sum_over_processes(held is False, run):  # every process refuses: one line under torchrun
            raise UserError(f"--save-dir {run.args.save_dir}: another vit_part3_finetune.py is running there: wait "
                            f"for it to end, or pass another --save-dir")
        for left in Path(run.args.save_dir).glob(f"{TEMP_PREFIX}{CHECKPOINT}-*") if held else ():
            with contextlib.suppress(OSError):  # one it cannot remove stays, as it did
                left.unlink()
        yield


def write_checkpoint(args, checkpoint):
    """(its path, None), or (None, the UserError that kept it from being written)."""
    try:
        return save_checkpoint(Path(args.save_dir) / CHECKPOINT, checkpoint, CHECKPOINT_FORMAT), None
    except UserError as error:
        return None, error


def settings(run, run_inputs):
    """The flags a checkpoint was made with and what it read (run_inputs): all but the processes must be the same on
    --resume."""
    args = run.args
    return {"model": args.model, "steps": args.steps, "batch size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "resolution": args.resolution, "per class": args.per_class, "precision": args.precision,
            "processes": run.world,
            "checked per class": None if args.check_per_class == CHECK_PER_CLASS else args.check_per_class,
            "inputs": run_inputs}


def model_named(model):
    """--model as a checkpoint records it: a folder by its real path (given with a trailing / or from another folder,
    the same folder), a Hub id as given."""
    folder = os.path.expanduser(model)
    return os.path.realpath(folder) if os.path.isdir(folder) else model


def read_inputs(args, data):
    """The pictures a run reads (each one's path and bytes) and its checkpoint's files (the weights by path, size and
    time, the config files by their bytes), described as the feature cache describes them (common/features.py)."""
    key = cache_key("inputs", args.model, [path for split in ("train", "val") for path, _ in data[split]], data["root"])
    return key and key[1]


def save_checkpoint(path, state, version):
    """The state, torch's RNG states (a resumed run draws what the uninterrupted one drew) and its format `version`,
    one dict written whole or not at all; torch.save's zip file keeps each record's CRC-32, for read_checkpoint."""
    cuda = {"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}
    checkpoint = {**state, "rng": {"torch": torch.get_rng_state(), **cuda}, "format": version}
    return write_atomic(path, lambda f: torch.save(checkpoint, f), what="checkpoint")


def set_rng_states(rng):
    """torch's RNG states as a checkpoint saved them: a resumed run draws what the uninterrupted one drew next."""
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def compared(settings_made):
    """A checkpoint's settings as --resume compares them: --model, and the model its inputs name, as model_named()
    gives it (a checkpoint made before it recorded the name as typed), the inputs read from their text."""
    inputs = json.loads(settings_made.get("inputs") or "{}")
    inputs = {**inputs, "model": model_named(str(inputs["model"]))} if "model" in inputs else inputs
    return {**settings_made, "model": model_named(str(settings_made.get("model"))), "inputs": inputs}


def changed_input(made, now):
    """Which of a checkpoint's inputs differs now (two read_inputs() descriptions, as compared()): the first picture
    that changed, came or went, else the checkpoint's files."""
    pictures = set(map(tuple, made.get("pictures", []))) ^ set(map(tuple, now.get("pictures", [])))  # (path, digest)
    if pictures:
        return f"its picture {min(pictures)[0]} under --data-dir is not the one it read"
    return f"the files of --model {now.get('model', made.get('model'))} are not those it read"


def resume(run, model, average, optimizer, run_inputs):
    """(the step, the log) of --save-dir's checkpoint, its weights, average and momentum loaded, torch's RNG set back;
    refused when it is missing, foreign, changed or made with other flags."""
    path = Path(run.args.save_dir) / CHECKPOINT
    if not path.is_file():
        raise UserError(f"--resume: no {CHECKPOINT} in {run.args.save_dir}; start without --resume")
    checkpoint = read_checkpoint(path, CHECKPOINT_FORMAT, "vit_part3_finetune.py")
    missing = [key for key in ("model", "average", "optimizer", "step", "log", "settings", "rng")
               if key not in checkpoint]
    if missing:  # a file of this format that this script did not write whole
        raise UserError(f"--resume: {path} lacks its {', '.join(missing)}: start again without --resume, or pass "
                        f"another --save-dir")
    if not (type(checkpoint["step"]) is int and checkpoint["step"] >= 0 and all(
            isinstance(checkpoint[key], dict) for key in ("model", "average", "optimizer", "log", "settings", "rng"))):
        raise UserError(f"--resume: {path} holds a step or a part of another type than this script writes (edited "
                        f"and saved again?): start again without --resume, or pass another --save-dir")
    now, made = compared(settings(run, run_inputs)), compared(checkpoint["settings"])
    moved = [key for key, value in now.items() if key != "processes" and made.get(key) != value]
    if {"model", "per class"} & set(moved):  # each changes what the run reads: the inputs' change is theirs
        moved = [key for key in moved if key != "inputs"]
    changed = [f"{key} {made.get(key)} -> {now[key]}" if key != "inputs" else changed_input(made.get(key), now[key])
               for key in moved]
    if changed:
        fix = ("move it away: the job's same command then starts fine-tuning afresh" if os.environ.get(IN_JOB) == "1"
               else "pass the same flags, or a new --save-dir")  # the job sets both flags itself
        raise UserError(f"--resume: {path} was made with other settings ({'; '.join(changed)}); {fix}")
    if run.args.pause_at and run.args.pause_at < checkpoint["step"]:
        raise UserError(f"--pause-at {run.args.pause_at}: {path} is at step {checkpoint['step']} already; pause at a "
                        f"later step, or drop --pause-at")
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    if any({name: getattr(tensor, "shape", None) for name, tensor in checkpoint[part].items()} != shapes
           for part in ("model", "average")):  # the tensors of another model, or none: load_state_dict would raise
        raise UserError(f"--resume: {path} holds weights of another model than --model's: start again without "
                        f"--resume, or pass another --save-dir")
    model.load_state_dict(checkpoint["model"])
    average.load_state_dict(checkpoint["average"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    set_rng_states(checkpoint["rng"])
    return checkpoint["step"], checkpoint["log"]


def step_batches(items, first, last, run, log, pixels):
    """(pixels, labels) on the device: this process's share of each step's batch, steps first .. last, in the recipe's
    order (step_pictures), built ahead by one pass's loader, its wait timed into the training pass."""
    args = run.args
    chosen = [process_share(step_pictures(s, args.batch_size, len(items), args.seed), run.rank, run.world)
              for s in range(first, last + 1)]
    if not chosen:
        return
    indices, flips = np.concatenate([i for i, _ in chosen]), np.concatenate([f for _, f in chosen])
    batches = logged_pass([path for path, _ in items], args.batch_size // run.world, run, log, pixels, flips,
                          indices, log["passes"]["training"])
    for (indices, _), batch in zip(chosen, batches, strict=True):
        yield (to_pixels(batch, run.device, pixels),
               torch.tensor([items[i][1] for i in indices], device=run.device))


def logged_pass(paths, batch_size, run, log, pixels, flips=None, indices=None, timing=None, count=len):
    """A pass's batches of the pictures at paths, its loader started (common/data.py's start_loader; timing, count:
    as there): its workers and their start-up in the log."""
    loader = picture_loader(paths, run.args.resolution, batch_size, run.device, flips, indices,
                            resample=pixels["resample"])
    batches, seconds = start_loader(loader, timing, count)
    log["loader workers"], log["loader start-up seconds"] = loader.num_workers, log["loader start-up seconds"] + seconds
    return batches


def kept_batches(items, run, batch_size, log, pixels):
    """(this process's share of the (path, label) items, read once as uint8 batches kept on the device (the checks,
    read ten times), their labels): the reading's seconds and wait added to the checks' pass (no pictures counted)."""
    share = items[run.rank::run.world]
    checks, begun = log["passes"]["checks"], time.perf_counter()
    batches = logged_pass([path for path, _ in share], batch_size, run, log, pixels, timing=checks,
                          count=lambda batch: 0)
    kept = [pixels.to(run.device, non_blocking=True) for pixels in batches]  # pinned by the loader beside a CUDA GPU
    checks["seconds"] += time.perf_counter() - begun
    return kept, [label for _, label in share]


def accuracies(models, batches, labels, run, batch_size, desc, timing, pixels):
    """[(right, of) of each model: the pictures it gets right, of all, over all processes]: one pass, each batch
    through every model, its seconds and wait added to timing; batches as run_model's, labels this process's share."""
    def predictions(**inputs):
        return [model(**inputs).logits.argmax(1) for model in models]

    predicted, _ = run_model(predictions, batches, run.args.resolution, run.device, batch_size, list, desc,
                             run.autocast, count=len(labels), timing=timing, pixels=pixels)
    total, counts = sum_over_processes(len(labels), run), []
    for k in range(len(models)):
        correct = int((torch.cat([batch[k] for batch in predicted]) == torch.as_tensor(labels)).sum()) if labels else 0
        counts.append((round(sum_over_processes(correct, run)), round(total)))
    return counts


def pixels_processor(resolution, pixels):
    """The image processor that makes these pixels from a picture, as transformers saves and loads it (a model
    saved for from_pretrained and pipeline() carries it)."""
    from transformers import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": resolution, "width": resolution}, resample=pixels["resample"],
                                image_mean=list(pixels["mean"]), image_std=list(pixels["std"]))


def finish(run, report, *, data, model, average, log, micro, last_step, pixels):
    """At the end: how often clipping acted, the losses at both ends, both sets of weights on every validation
    picture. Then, a paused run's too: the passes over pictures and the curves (kept for the page, drawn with
    --plots)."""
    args, final = run.args, {}
    if last_step == args.steps:
        norm_window, loss_window = scaled(NORM_WINDOW, args.steps), scaled(LOSS_WINDOW, args.steps)
        clipped, norm_first, norm_last, loss_first, loss_last = run_statistics(
            log["losses"], log["norms"], CLIP_NORM, norm_window, loss_window)
        seen = args.steps * args.batch_size
        epochs = seen / len(data["train"])
        report.print(f"  clipping was active in {clipped} of {args.steps} steps; median gradient norm: first "
                     f"{norm_window} steps {norm_first:.3f}, last {norm_window} steps {norm_last:.3f}")
        report.print(f"  mean training loss: steps 1 to {loss_window} {loss_first:.3f}, steps "
                     f"{args.steps - loss_window + 1} to {args.steps} {loss_last:.3f}; pictures seen {seen:,} = "
                     f"{epochs:.2f} passes over the training set",
                     {"clipped steps": clipped, "median norm first": norm_first, "median norm last": norm_last,
                      "mean loss first": loss_first, "mean loss last": loss_last, "pictures seen": seen,
                      "passes": epochs})
        share = data["val"][run.rank::run.world]
        batches = logged_pass([path for path, _ in share], micro, run, log, pixels)
        final["both weights on all validation pictures"] = dict(NEW_PASS)
        (last, of), (averaged, _) = accuracies([model.eval(), average.eval()], batches, [label for _, label in share],
                                               run, micro, "both weights",
                                               final["both weights on all validation pictures"], pixels)
        average_accuracy, last_accuracy = 100 * averaged / of, 100 * last / of
        report.print(f"  on all {len(data['val']):,} validation pictures: the weight average (factor {AVERAGE_FACTOR}) "
                     f"{average_accuracy:.2f}%, the last weights {last_accuracy:.2f}%",
                     {"average accuracy": average_accuracy, "last accuracy": last_accuracy},
                     counts={"average accuracy": (averaged, of), "last accuracy": (last, of)})
        if args.save_dir and run.rank == 0:
            save_models(args, {SAVED_AVERAGE: average, SAVED_LAST: model}, data["names"], pixels)
    timings = {**log["passes"], **final}
    texts = {what: pass_text(timing) for what, timing in timings.items()}
    report.print(f"  passes over pictures (this process's): training, {last_step} steps {texts['training']}; the "
                 f"checks of the validation subset, {timings['checks']['pictures']:,} pictures in all {texts['checks']}"
                 f"{''.join(f'; {what} {texts[what]}' for what in final)}; the loaders' {log['loader workers']} "
                 "worker processes each (none on a CPU, whose cores the model uses) started in "
                 f"{log['loader start-up seconds']:.1f} s, outside the passes",
                 timings)
    if last_step < args.steps:
        report.print(f"  paused after step {last_step} of {args.steps}; saved {Path(args.save_dir) / CHECKPOINT}: add "
                     "--resume and a later --pause-at (or none) to continue")  # the same --pause-at pauses again
    report.series.update({"training loss": log["losses"], "gradient norm": log["norms"],  # for the figures and the page
                          "learning rate": [lr_at(step - 1, args.lr, args.steps) for step in range(1, last_step + 1)],
                          "clipping threshold": CLIP_NORM})
    if args.plots and run.rank == 0:
        finetune_curves(report.series, values(report), article_values("finetune"), args.plots, say,
                        origin_of(args, DEFAULT_NAME))


def save_models(args, models, names, pixels):
    """Each of {folder: model} saved in --save-dir as from_pretrained and pipeline("image-classification") load it;
    one that cannot be written costs the saved copy, not the run's numbers."""
    try:
        for folder, model in models.items():
            model.config.image_size = args.resolution  # its position table's, stretched by build_classifier
            save_loadable(Path(args.save_dir) / folder, model, names, pixels_processor(args.resolution, pixels),
                          what="fine-tuned model")
        say(f"saved the weight average in {Path(args.save_dir) / SAVED_AVERAGE} and the last weights in "
            f"{Path(args.save_dir) / SAVED_LAST}: from_pretrained and pipeline(\"image-classification\") load either")
    except UserError as problem:
        say(f"warning: {problem}; the run's numbers are printed as usual")


def setup_differences(prepared, run, known):
    """How this run's setup differs from the article's: the checkpoint, the pictures (prepared: section 0's, a UserError
    when they could not be loaded) and the recipe. Another --steps also removes the article's rows of the steps this
    run never logs: not comparable, not "not run"."""
    args, data = run.args, None if isinstance(prepared, UserError) else prepared[0]
    counts = {split: len(data[split]) if data else None for split in ("train", "val")}
    differences = {**data_differences(args, counts), **check_differences(args, data)}
    if "steps" in known:  # --steps: the article's step rows this run never logs
        logged = set(report_steps(args.steps))
        removes = [f"step {step} {what}" for step in REPORT_STEPS if step not in logged for what in STEP_NUMBERS]
        differences["steps"] = {**known["steps"], "removes": removes}
    return differences


def check_pictures_per_class(args):
    """The validation pictures of each class checked at the logged steps: --check-per-class, at most --per-class."""
    return min(args.check_per_class or CHECK_PER_CLASS, args.per_class or math.inf)


def check_differences(args, data):
    """--check-per-class other than the article's 100, or a data folder with a class of fewer validation pictures:
    the logged steps check other pictures than its 1,000 (a class that holds fewer is checked whole); classes checked
    on unequal counts also move step 0's zero-head accuracy, the first class's share of them, which is 100 / classes
    only on equal counts ("checked shares")."""
    per_class = check_pictures_per_class(args)
    held = collections.Counter(label for _, label in data["val"]) if data else {}  # data: not loaded
    each = [min(per_class, held[label]) for label in range(data["classes"])] if data else [per_class]
    article = args.check_per_class in (None, CHECK_PER_CLASS)
    if article and min(each) == max(each):  # equal classes of fewer: not the article's pictures, a difference of theirs
        return {}
    flag = f"--check-per-class {args.check_per_class}" if not article else (
        f"--data-dir {args.data_dir}" if args.data_dir else "the data folder")
    span = f"{min(each)} to {max(each)}" if min(each) < max(each) else f"{min(each)}"
    fewer = f", all of a class that holds fewer: {span} a class" if min(each) < per_class else ""
    checked = f"{sum(each):,} pictures checked" if data else "pictures checked"
    why = (f"{flag}: {checked} (the first {per_class} of each class{fewer}), the article's "
           f"{len(CLASSES) * CHECK_PER_CLASS:,}")
    differences = {"checked pictures": {"flag": flag, "why": why}}
    if min(each) < max(each):
        differences["checked shares"] = {"flag": flag, "why": f"{flag}: classes of {span} checked pictures, so the "
                                         f"zero head's step 0 is the first class's share of them, not 100 / classes"}
    return differences


def parse_flags(argv, world):
    parser = experiment_parser(__doc__, model=MODEL, model_help="the body to fine-tune; its head is replaced",
                               batch_help="pictures per optimizer step, split over the torchrun processes and "
                                          "--accum-steps")
    parser.set_defaults(batch_size=BATCH)
    parser.add_argument("--steps", type=step_count, default=STEPS,
                        help="optimizer steps; warm-up stays 10%% (default: %(default)s)")
    parser.add_argument("--lr", type=positive_float, default=LR,
                        help="base learning rate, finite and > 0 (default: %(default)s)")
    parser.add_argument("--seed", type=seed_number, default=0,
                        help="the order and flips of the pictures, the random head (default: %(default)s)")
    parser.add_argument("--resolution", type=side_pixels, default=RESOLUTION,
                        help="fine-tuning resolution (384: the paper's) (default: %(default)s)")
    parser.add_argument("--accum-steps", type=positive_int, default=1,
                        help="split each process's batch into N passes (default: %(default)s)")
    parser.add_argument("--save-dir", type=nonempty_path, metavar="DIR",
                        help=f"write DIR/{CHECKPOINT} every --save-every steps, at the end and on Ctrl-C or SIGTERM; "
                             f"at the last step, the weight average in DIR/{SAVED_AVERAGE} and the last weights in "
                             f"DIR/{SAVED_LAST}, as from_pretrained and pipeline() load them")
    parser.add_argument("--save-every", type=positive_int, default=50,
                        help="steps between checkpoints (default: %(default)s)")
    parser.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt of --save-dir")
    parser.add_argument("--check-per-class", type=positive_int, metavar="N", help="validation pictures of each "
                        f"class checked at the logged steps (default: the article's {CHECK_PER_CLASS})")
    parser.add_argument("--pause-at", type=positive_int, metavar="STEP",
                        help="save and stop after STEP; --resume continues")
    parser.add_argument("--plots", type=nonempty_path, metavar="DIR",
                        help="save the loss, accuracy and LR curves as PNG (matplotlib)")
    args = parser.parse_args(argv)
    if (args.resume or args.pause_at) and not args.save_dir:
        parser.error("--resume and --pause-at need --save-dir")
    if args.pause_at and args.pause_at >= args.steps:  # it would finish the run, not pause it
        parser.error(f"--pause-at {args.pause_at} is not before the last step of --steps {args.steps}: pause at a "
                     f"step from 1 to {args.steps - 1}, or drop --pause-at")
    # every flag and output path that can be checked without the data: one line and exit 2 before any work
    if args.batch_size % (world * args.accum_steps):
        raise UserError(f"--batch-size {args.batch_size} does not split into {world} process(es) x {args.accum_steps} "
                        f"accumulation step(s); use a multiple of {world * args.accum_steps}")
    config = checkpoint_config(args.model)  # refuses a --model path that does not exist
    if config is not None:
        check_resolution(config, args.resolution)
    # else found at the first save; begin() checks that the folder itself can be written
    if args.save_dir and (Path(args.save_dir) / CHECKPOINT).is_dir():
        raise UserError(f"--save-dir {args.save_dir}: its {CHECKPOINT} is a folder; remove it, or pass another "
                        f"--save-dir")
    written = [Path(args.save_dir) / name for name in (CHECKPOINT, SAVED_AVERAGE, SAVED_LAST)] if args.save_dir else []
    if args.json and any(Path(args.json).resolve() in (path.resolve(), *path.resolve().parents) for path in written):
        raise UserError(f"--json {args.json} is where --save-dir {args.save_dir} keeps the run: give another file")
    if args.plots and any(path.resolve() in (Path(args.plots).resolve(), *Path(args.plots).resolve().parents)
                          for path in written):  # figures in a folder the save replaces, or where its file goes
        raise UserError(f"--plots {args.plots} is where --save-dir {args.save_dir} keeps the run: give another place")
    model = Path(args.model).expanduser().resolve()
    if model.is_dir() and any(path.resolve() in (model, *model.parents) for path in written):  # an earlier run's
        raise UserError(f"--model {args.model} is where --save-dir {args.save_dir} saves this run's models, which "
                        f"would replace it: copy it elsewhere and pass that, or pass another --save-dir")
    return args


# ---------------------------------------------------------------- torchrun's processes, and the stop between steps

def start_processes(device_name):
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


def loaded(*loads):
    """Each load() in turn, their values; when any raises a UserError, one that names every problem of them all, so
    that one line says all that an offline run lacks."""
    values, problems = [], []
    for load in loads:
        try:
            values.append(load())
        except UserError as problem:
            problems += [reason for reason in problem.args if reason not in problems]
    if problems:
        raise UserError(*problems)
    return values


def first_process_first(run, load):
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


def sum_over_processes(values, run):
    """The sum over every process of a number, or of each of a tuple of numbers: one all_reduce."""
    many = isinstance(values, tuple)
    if run.world == 1:
        return tuple(map(float, values)) if many else float(values)
    total = torch.tensor(values if many else [values], dtype=torch.float64, device=run.device)
    dist.all_reduce(total)
    return tuple(total.tolist()) if many else total.item()


@contextlib.contextmanager
def peers_kept():
    """Under torchrun, a process killed mid-run (out of memory, a scheduler) breaks the others' next exchange with it:
    one line (the first process's), not torch.distributed's traceback; torchrun's own lines then name the process."""
    try:
        yield
    except RuntimeError as error:  # gloo's lost connection is a plain RuntimeError; a backend's own fault is not it
        if not (isinstance(error, dist.DistNetworkError) or "by peer" in str(error)):
            raise
        why = str(error).splitlines()[0].split("] ", 1)[-1].split(". ")[0][:160]  # gloo's: after its source line
        raise UserError(f"another torchrun process ended during the run ({why}): torchrun's lines below name it and "
                        "why; run the same torchrun command again, adding --resume where --save-dir keeps a "
                        "checkpoint") from None


def finish_together(world):
    """Every process waits here for the others; then each may leave at once (leave)."""
    if world > 1:
        dist.barrier()
        LEAVING["together"] = True


REPEAT_SECONDS = 2.0  # a SIGTERM this soon after the first is the same stop delivered twice (systemd, SLURM)


@contextlib.contextmanager
def stop_between_steps():
    """In the block, a first Ctrl-C or SIGTERM asks the loop to stop after its step: the dict yielded says which
    ({"asked": "Ctrl-C"}); a second one stops at once (status 130 or 143), a repeated SIGTERM aside."""
    stop = {"asked": None, "signal": None, "at": 0.0}

    def ask(signum, frame):
        quiet_if_nobody_reads()
        if stop["asked"]:
            if signum == signal.SIGTERM == stop["signal"] and time.monotonic() - stop["at"] < REPEAT_SECONDS:
                return
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        stop.update(asked="SIGTERM" if signum == signal.SIGTERM else "Ctrl-C", signal=signum, at=time.monotonic())
        if speaks():  # one process speaks for all
            print(f"\n{stop['asked']}: stopping after this step (again: at once)", file=sys.stderr)

    previous = {signum: signal.signal(signum, ask) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv=None):
    args = parse_flags(argv, int(os.environ.get("WORLD_SIZE", "1")))
    torch.manual_seed(args.seed)
    rank, world, device = start_processes(args.device)  # torchrun's, or this one alone
    run, report = begin("finetune", args, device=device, rank=rank, world=world, figures=(FIGURE_FILE,))
    with peers_kept() if world > 1 else contextlib.nullcontext():
        with only_run_in(run) if args.save_dir else contextlib.nullcontext():
            prepared = section_data_and_model(report, run)  # (data, model, pixels), or why they could not be loaded
            section_zero_head(report, run, prepared)
            section_finetune(report, run, prepared)
            status = conclude(run, report, functools.partial(setup_differences, prepared), MODEL, ARTICLE_FLAGS)
        finish_together(world)  # a process that leaves while the first writes its JSON can abort gloo
    return status


if __name__ == "__main__":
    sys.exit(guarded(main))
