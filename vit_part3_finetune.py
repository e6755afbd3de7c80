"""ViT, explained, Part 3: a new head for a new task, and the paper's fine-tuning recipe on Imagenette.

Reproduces the article's sections "Fine-tuning: a new head for a new task" and "Our fine-tuning run":
  0. the ImageNet-21k checkpoint of ViT-B/16 loaded into a 10-class classifier, its new head set to 0;
  1. step 0 with the zero head: loss ln 10, the head's gradient by hand against autograd, exactly no
     gradient into the body; a random head for comparison;
  2. 300 steps of batch 32: SGD momentum 0.9, no weight decay, base LR 0.003, 30 warm-up steps, cosine
     decay to 0, clipping at global norm 1, a Polyak average of the weights (factor 0.99), random
     horizontal flips; validation along the way, then the averaged and the last weights on all pictures.

    python vit_part3_finetune.py                              # downloads ViT-B/16 in21k (346 MB), Imagenette (94 MB)
    python vit_part3_finetune.py --save-dir runs/ft           # a checkpoint every 50 steps and on Ctrl-C ...
    python vit_part3_finetune.py --save-dir runs/ft --resume  # ... and the run continues where it stopped
    python vit_part3_finetune.py --batch-size 512 --accum-steps 16 --resolution 384   # the paper's batch and size
    torchrun --nproc_per_node 4 vit_part3_finetune.py         # the batch split over 4 processes (DDP)
    python vit_part3_finetune.py --steps 30 --per-class 50 --compare --json ft.json --plots figures/

--batch-size is the batch of one optimizer step; it is split over the torchrun processes, and each
process's share over --accum-steps passes, so every setting follows the same mathematics.
"""
import contextlib
import copy
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
from common.checkpoints import load_pretrained
from common.cli import (
    add_common_arguments,
    add_data_arguments,
    finish,
    guarded,
    positive_int,
    run_sections,
    script_parser,
    side_pixels,
)
from common.device import pick_device, set_precision
from common.errors import UserError
from common.imagenette import (
    class_folders,
    ensure_imagenette,
    is_imagenette,
    list_split,
    load_all,
    loader_workers,
    picture_batches,
    to_pixels,
)
from common.inference import run_model
from common.printing import header, line, short_list
from vit_part3_posemb import bilinear_table
from vit_part3_setup import cosine_lr

DEFAULT_MODEL = "google/vit-base-patch16-224-in21k"
ARTICLE_STEPS = 300
REPORT_STEPS = (0, 5, 10, 25, 50, 100, 150, 200, 250, 300)  # at 300 steps; other lengths scale them
MOMENTUM, WEIGHT_DECAY, CLIP_NORM, AVERAGE_FACTOR, WARMUP_FRACTION = 0.9, 0.0, 1.0, 0.99, 0.1
MONITOR_PER_CLASS = 100  # the fixed validation subset watched during the run
RANDOM_HEAD_STD = 0.02
CHECKPOINT = "checkpoint.pt"


# ---------------------------------------------------------------- the recipe, as pure functions

def lr_at(step, base_lr, total_steps, warmup_steps):
    """The LR after `step` finished steps: eta_0 t / W while t < W, then eta_0 / 2 (1 + cos(pi (t - W) / (T - W)))."""
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    return cosine_lr(step - warmup_steps, base_lr, total_steps - warmup_steps)


def scaled(article_step, total_steps):
    """A step count of the 300-step run, scaled to a run of total_steps (at least 1)."""
    return max(1, round(article_step * total_steps / ARTICLE_STEPS))


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
        for kept, current in zip(average.parameters(), model.parameters()):
            kept.mul_(factor).add_(current.detach(), alpha=1 - factor)


def run_statistics(losses, norms, clip_norm, norm_window, loss_window):
    """How often clipping acted, median gradient norms and mean losses at both ends of the run."""
    return {"clipped steps": sum(norm > clip_norm for norm in norms),
            "median norm first": statistics.median(norms[:norm_window]),
            "median norm last": statistics.median(norms[-norm_window:]),
            "mean loss first": statistics.fmean(losses[:loss_window]),
            "mean loss last": statistics.fmean(losses[-loss_window:])}


def body_gradient_norm(model):
    """sqrt(sum of squares) of the gradients of every number outside the head."""
    squares = sum(float((p.grad.double() ** 2).sum()) for name, p in model.named_parameters()
                  if not name.startswith("classifier.") and p.grad is not None)
    return math.sqrt(squares)


def head_step(model, pixels, labels):
    """One forward and backward pass on a batch: what the head and the body receive. Leaves .grad set."""
    captured = []
    hook = model.classifier.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
    model.zero_grad(set_to_none=True)
    try:
        logits = model(pixel_values=pixels, interpolate_pos_encoding=True).logits
    finally:
        hook.remove()
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    by_hand = head_gradient_by_hand(captured[0].detach(), logits.detach(), labels)
    return {"logits": logits.detach(), "loss": loss.item(), "head by hand": by_hand,
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


def main_process_first(rank, world, load):
    """load() on process 0 first (it downloads), then on the others; an error there stops every process."""
    result, problem = None, None
    if rank == 0:
        try:
            result = load()
        except UserError as error:
            problem = str(error)
    if world > 1:
        message = [problem]
        dist.broadcast_object_list(message, src=0)
        problem = message[0]
    if problem:
        raise UserError(problem)
    return result if rank == 0 else load()


def sum_over_processes(value, world, device):
    if world == 1:
        return float(value)
    total = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.item()


def load_classifier(name, classes, resolution):
    """(model, pre-logits shape or None): the checkpoint's body and a new head of `classes` outputs."""
    from transformers import ViTForImageClassification

    model, info = load_pretrained(ViTForImageClassification, name, num_labels=classes,
                                  ignore_mismatched_sizes=True, output_loading_info=True)
    config = model.config
    dropped = any(key.startswith("pooler.") for key in info.get("unexpected_keys", ()))
    pre_logits = (getattr(config, "pooler_output_size", None) or config.hidden_size, config.hidden_size)
    if resolution != config.image_size:  # the paper's rule before fine-tuning at a higher resolution
        table = model.vit.embeddings.position_embeddings.detach()[0].double().cpu().numpy()
        stretched = bilinear_table(table, resolution // config.patch_size)
        model.vit.embeddings.position_embeddings = torch.nn.Parameter(torch.from_numpy(stretched).float()[None])
    return model, pre_logits if dropped else None


def accuracy(model, pictures, labels, resolution, device, batch_size, autocast, world, desc):
    """Per cent right over all processes' shares of the pictures (each process holds its own share)."""
    predicted = run_model(model, pictures, resolution, device, batch_size, lambda out: out.logits.argmax(1).cpu(),
                          desc, autocast)
    right = int((torch.cat(predicted) == torch.as_tensor(labels)).sum()) if pictures else 0
    return 100 * sum_over_processes(right, world, device) / sum_over_processes(len(pictures), world, device)


def process_share(step_batch, rank, share):
    """This process's contiguous share of a step's (indices, flips)."""
    indices, flips = step_batch
    return indices[rank * share:(rank + 1) * share], flips[rank * share:(rank + 1) * share]


def decode_share(items, rank, world):
    """This process's share of the pictures (every world-th), decoded once: (images, labels)."""
    share = items[rank::world]
    return load_all([path for path, _ in share]), [label for _, label in share]


# ---------------------------------------------------------------- checkpoints

def run_settings(args, world):
    return {"model": args.model, "steps": args.steps, "batch size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "resolution": args.resolution, "per class": args.per_class, "precision": args.precision,
            "processes": world}


def save_checkpoint(save_dir, model, average, optimizer, step, history, settings):
    """Weights, average, optimizer, step, history and RNG states, written whole (a .part file, then a rename)."""
    path = Path(save_dir) / CHECKPOINT
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    state = {"model": model.state_dict(), "average": average.state_dict(), "optimizer": optimizer.state_dict(),
             "step": step, "history": history, "settings": settings, "rng": rng}
    part = path.with_name(path.name + ".part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, part)
        part.replace(path)
    except OSError as error:
        raise UserError(f"cannot write the checkpoint {path} ({error}): pass another --save-dir") from error
    return path


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


def load_checkpoint(save_dir, settings):
    path = Path(save_dir) / CHECKPOINT
    if not path.is_file():
        raise UserError(f"--resume: no {CHECKPOINT} in {save_dir}; start without --resume")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a truncated or foreign file
        raise UserError(f"--resume: {path} is truncated or not a checkpoint of this script ({type(error).__name__}); "
                        f"start again without --resume, or pass another --save-dir") from error
    changed = [f"{key} {state['settings'].get(key)} -> {value}" for key, value in settings.items()
               if key != "processes" and state["settings"].get(key) != value]
    if changed:
        raise UserError(f"--resume: {path} was made with other settings ({'; '.join(changed)}); "
                        f"pass the same flags, or a new --save-dir")
    return state


# ---------------------------------------------------------------- sections

def section_data_and_model(args, ctx):
    root = main_process_first(ctx["rank"], ctx["world"], lambda: ensure_imagenette(args.data_dir))
    train, val = list_split(root, "train", args.per_class), list_split(root, "val", args.per_class)
    classes = len(class_folders(root, "val"))
    name = "Imagenette" if is_imagenette(root) else Path(root).name
    header(f"0. data: {name}, {len(train)} training and {len(val)} validation pictures, {classes} classes; "
           f"device {ctx['device'].type}")
    model, pre_logits = main_process_first(ctx["rank"], ctx["world"],
                                           lambda: load_classifier(args.model, classes, args.resolution))
    line(f"loaded {args.model} into a {classes}-class classifier")
    if pre_logits:
        line(f"the pre-logits layer ({pre_logits[0]} x {pre_logits[1]} + tanh) is dropped: model.vit.pooler is "
             f"{model.vit.pooler}")
    else:
        line(f"the checkpoint has no pre-logits layer: model.vit.pooler is {model.vit.pooler}")
    numbers = zero_head(model)
    line(f"new head: {model.classifier} with every weight and bias set to 0 ({numbers:,} numbers)")
    config = model.config
    if args.resolution != config.image_size:
        n_old, n_new = config.image_size // config.patch_size, args.resolution // config.patch_size
        line(f"position table stretched {n_old}x{n_old} -> {n_new}x{n_new} by the official 2D bilinear rule "
             f"(scipy.ndimage.zoom, order=1): {n_old * n_old + 1} -> {n_new * n_new + 1} rows")
    ctx.update(model=model.to(ctx["device"]), root=root, train=train, val=val, classes=classes)
    return {"head numbers": numbers}


def section_zero_head(args, ctx):
    model, device = ctx["model"], ctx["device"]
    if ctx["rank"] != 0:
        return {}
    header("1. step 0 with the zero head")
    indices, flips = step_pictures(1, args.batch_size, len(ctx["train"]), args.seed)
    items = [ctx["train"][i] for i in indices]
    pixels = next(picture_batches([path for path, _ in items], args.resolution, len(items), flips))
    pixels, labels = to_pixels(pixels, device), torch.tensor([label for _, label in items], device=device)
    with ctx["autocast"]:
        zero = head_step(model, pixels, labels)
    classes = ctx["classes"]
    first = zero["logits"][0]
    probabilities = torch.softmax(first.float(), 0)
    spread = (f"softmax gives {round(probabilities[0].item(), 6):g} to each of the {classes} classes"
              if torch.all(first == first[0]) else
              f"softmax gives {probabilities.min():.3f} to {probabilities.max():.3f}")
    line(f"logits of the first picture: {short_list(first, 4)}  -> {spread}")
    line(f"loss = -ln({1 / classes:g}) = ln {classes} = {math.log(classes):.6f};  measured {zero['loss']:.6f}")
    difference = (zero["head by hand"] - zero["head autograd"]).abs().max().item()
    line(f"gradient of the head weight by hand, (softmax - one_hot)^T y / batch: norm "
         f"{zero['head by hand'].norm():.4f}; autograd: {zero['head autograd'].norm():.4f}; "
         f"max |difference| {difference:.1e}")
    body = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("classifier."))
    count = f"{body / 1e6:.1f}M" if body >= 100_000 else f"{body:,}"

    def norm_text(norm):
        return "0.0" if norm == 0 else f"{norm:.3g}"

    line(f"gradient reaching the body (all {count} other numbers): norm {norm_text(zero['body norm'])}  "
         f"(W_head^T (softmax - one_hot) = 0 because W_head = 0)")
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        head = model.classifier
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * RANDOM_HEAD_STD)
    with ctx["autocast"]:
        random_head = head_step(model, pixels, labels)
    zero_head(model)
    model.zero_grad(set_to_none=True)
    picture_1 = random_head["logits"][0]
    line(f"for comparison, a random head (normal, std {RANDOM_HEAD_STD}): loss {random_head['loss']:.4f}, gradient "
         f"reaching the body: norm {norm_text(random_head['body norm'])}, logits of picture 1 range "
         f"{picture_1.min():.2f} to {picture_1.max():.2f}")
    return {"zero head logit": first.abs().max().item(), "ln 10": math.log(classes), "zero head loss": zero["loss"],
            "head gradient norm by hand": zero["head by hand"].norm().item(),
            "head gradient norm autograd": zero["head autograd"].norm().item(), "head gradient max diff": difference,
            "zero head body gradient norm": zero["body norm"], "random head loss": random_head["loss"],
            "random head body gradient norm": random_head["body norm"],
            "random head logit min": picture_1.min().item(), "random head logit max": picture_1.max().item()}


def train_step(model, optimizer, pixels, labels, lr, accum_steps, autocast, world, device):
    """One SGD step on this process's share; returns (mean loss over the global batch, gradient norm).

    Each of the accum_steps passes adds (its pictures / the share) x its mean loss, so the gradients
    sum to the mean over the share; DDP averages the equal shares, giving the mean over the batch.
    Nothing is applied when the loss is not finite.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for k, (x, y) in enumerate(zip(pixels.chunk(accum_steps), labels.chunk(accum_steps))):
        last = k == accum_steps - 1
        with (model.no_sync() if world > 1 and not last else contextlib.nullcontext()), autocast:
            logits = model(pixel_values=x, interpolate_pos_encoding=True).logits
            loss = F.cross_entropy(logits, y) * (len(y) / len(labels))  # this pass's share of the mean
            loss.backward()
        loss_sum += loss.item()
    loss = sum_over_processes(loss_sum, world, device) / world
    if not math.isfinite(loss):
        return loss, float("nan")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM).item()
    optimizer.step()
    return loss, norm


class StopOnCtrlC:
    """Within the block, a first Ctrl-C asks to stop after the current step (saved whole); a second, at once."""

    def __init__(self):
        self.asked = False

    def _handler(self, signum, frame):
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        print("\nCtrl-C: stopping after this step (again: at once)", file=sys.stderr)

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)


def report_line(row):
    return (f"step {row['step']:3d}: lr {row['lr']:.5f}  loss {row['loss']:.4f}  gradient norm before clipping "
            f"{row['norm']:7.3f}  validation {row['accuracy']:5.1f}%   [{row['seconds']:.0f} s]")


def section_finetune(args, ctx):
    rank, world, device, autocast = ctx["rank"], ctx["world"], ctx["device"], ctx["autocast"]
    model, train, val = ctx["model"], ctx["train"], ctx["val"]
    share, micro = args.batch_size // world, args.batch_size // (world * args.accum_steps)
    warmup = round(WARMUP_FRACTION * args.steps)
    warmup_text = f"{warmup} step{'s' * (warmup != 1)}"
    header(f"2. fine-tuning: {args.steps} steps, batch {args.batch_size}, SGD momentum {MOMENTUM}, no weight decay, "
           f"base LR {args.lr:g}, linear warm-up {warmup_text}, cosine decay to 0, clip at global norm {CLIP_NORM}, "
           f"weight average factor {AVERAGE_FACTOR}, random horizontal flips")
    if world > 1 or args.accum_steps > 1 or args.resolution != 224:
        line(f"{args.resolution} pixels; batch {args.batch_size} = {world} process(es) x {args.accum_steps} "
             f"accumulation step(s) x {micro} pictures")
    average = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    settings = run_settings(args, world)
    start, history = 0, {"losses": [], "norms": [], "rows": [], "seconds": 0.0}
    if args.resume:
        start, history = restore(args.save_dir, settings, model, average, optimizer)
        line(f"resumed from {Path(args.save_dir) / CHECKPOINT} at step {start}")
    ids = [device.index] if device.type == "cuda" else None
    trained = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids) if world > 1 else model
    monitor_items = list_split(ctx["root"], "val", min(MONITOR_PER_CLASS, args.per_class or MONITOR_PER_CLASS))
    monitor, monitor_labels = decode_share(monitor_items, rank, world)
    per_class = len(monitor_items) // ctx["classes"]
    clock = time.perf_counter() - history["seconds"]
    if start == 0:
        model.eval()
        step_0 = accuracy(model, monitor, monitor_labels, args.resolution, device, micro, autocast, world, "step 0")
        ties = not model.classifier.weight.any() and not model.classifier.bias.any()
        history["step 0"] = step_0
        history["tie note"] = "  (zero head: every class ties, the first wins)" if ties else ""
    line(f"step   0: validation accuracy ({len(monitor_items):,} pictures, {per_class} per class) "
         f"{history['step 0']:.1f}%{history['tie note']}")
    for row in history["rows"]:
        line(report_line(row))
    last_step = min(args.pause_at or args.steps, args.steps)
    reports = report_steps(args.steps)
    mine = [process_share(step_pictures(s, args.batch_size, len(train), args.seed), rank, share)
            for s in range(start + 1, last_step + 1)]
    paths = [train[i][0] for indices, _ in mine for i in indices]
    flips = np.concatenate([f for _, f in mine]) if mine else None
    batches = picture_batches(paths, args.resolution, share, flips, loader_workers(device))  # built ahead on a GPU
    from tqdm import tqdm

    stop = StopOnCtrlC()
    steps = tqdm(range(start + 1, last_step + 1), desc="fine-tuning", unit="step", file=sys.stderr, initial=start,
                 total=args.steps)
    with stop:
        for step, pixels, (indices, _) in zip(steps, batches, mine):
            trained.train()
            labels = torch.tensor([train[i][1] for i in indices], device=device)
            lr = lr_at(step - 1, args.lr, args.steps, warmup)
            loss, norm = train_step(trained, optimizer, to_pixels(pixels, device), labels, lr, args.accum_steps,
                                    autocast, world, device)
            if not math.isfinite(loss):
                kept = (f"; the last good checkpoint is {Path(args.save_dir) / CHECKPOINT}"
                        if args.save_dir and (Path(args.save_dir) / CHECKPOINT).exists() else "")
                raise UserError(f"the training loss is {loss} at step {step} (lr {lr:.2g}): the run stopped before "
                                f"applying it{kept}; lower --lr")
            update_average(average, model)
            history["losses"].append(loss)
            history["norms"].append(norm)
            if step in reports:
                model.eval()
                right = accuracy(model, monitor, monitor_labels, args.resolution, device, micro, autocast, world,
                                 f"step {step}")
                row = {"step": step, "lr": lr, "loss": loss, "norm": norm, "accuracy": right,
                       "seconds": time.perf_counter() - clock}
                history["rows"].append(row)
                line(report_line(row))
            interrupted = sum_over_processes(stop.asked, world, device) > 0
            if args.save_dir and rank == 0 and (step % args.save_every == 0 or step == last_step or interrupted):
                history["seconds"] = time.perf_counter() - clock
                path = save_checkpoint(args.save_dir, model, average, optimizer, step, history, settings)
            if interrupted:
                if rank == 0:
                    saved = f"; saved {path}: add --resume to continue" if args.save_dir else " (no --save-dir)"
                    print(f"\nstopped after step {step}{saved}", file=sys.stderr)
                raise KeyboardInterrupt
    if last_step < args.steps:
        line(f"paused after step {last_step} of {args.steps}; saved {Path(args.save_dir) / CHECKPOINT}: add --resume "
             f"to continue")
        return {}
    return finish_run(args, ctx, history, model, average, val, warmup)


def finish_run(args, ctx, history, model, average, val, warmup):
    norm_window, loss_window = scaled(50, args.steps), scaled(10, args.steps)
    stats = run_statistics(history["losses"], history["norms"], CLIP_NORM, norm_window, loss_window)
    line(f"clipping was active in {stats['clipped steps']} of {args.steps} steps; median gradient norm: first "
         f"{norm_window} steps {stats['median norm first']:.3f}, last {norm_window} steps "
         f"{stats['median norm last']:.3f}")
    seen = args.steps * args.batch_size
    passes = seen / len(ctx["train"])
    line(f"mean training loss: steps 1 to {loss_window} {stats['mean loss first']:.3f}, steps "
         f"{args.steps - loss_window + 1} to {args.steps} {stats['mean loss last']:.3f}; pictures seen {seen:,} = "
         f"{passes:.2f} passes over the training set")
    rank, world, device = ctx["rank"], ctx["world"], ctx["device"]
    pictures, labels = decode_share(val, rank, world)
    micro = args.batch_size // (world * args.accum_steps)
    model.eval()
    average.eval()
    last = accuracy(model, pictures, labels, args.resolution, device, micro, ctx["autocast"], world, "last weights")
    averaged = accuracy(average, pictures, labels, args.resolution, device, micro, ctx["autocast"], world,
                        "averaged weights")
    line(f"on all {len(val):,} validation pictures: the weight average (factor {AVERAGE_FACTOR}) {averaged:.2f}%, "
         f"the last weights {last:.2f}%")
    if args.plots and rank == 0:
        save_curves(history, [lr_at(s, args.lr, args.steps, warmup) for s in range(args.steps)], args.plots)
    results = {"step 0 validation": history["step 0"], "pictures seen": seen, "passes": passes,
               "average accuracy": averaged, "last accuracy": last, **stats}
    for row in history["rows"]:
        results.update({f"step {row['step']} {key}": row[key] for key in ("lr", "loss", "norm", "accuracy")})
    return results


def save_curves(history, lrs, plots_dir):
    plt = figures.pyplot()
    if plt is None:
        return
    figure, (loss_axis, accuracy_axis, lr_axis) = plt.subplots(1, 3, figsize=(15, 4))
    loss_axis.plot(range(1, len(history["losses"]) + 1), history["losses"])
    loss_axis.set(title="training loss", xlabel="step")
    rows = history["rows"]
    accuracy_axis.plot([0] + [r["step"] for r in rows], [history["step 0"]] + [r["accuracy"] for r in rows], "o-")
    accuracy_axis.set(title="validation accuracy (%)", xlabel="step")
    lr_axis.plot(range(1, len(lrs) + 1), lrs)
    lr_axis.set(title="learning rate", xlabel="step")
    figures.save(figure, plots_dir, "finetune_curves.png")


def main(argv=None):
    parser = script_parser(__doc__)
    add_data_arguments(parser, DEFAULT_MODEL, "the body to fine-tune; its head is replaced")
    parser.add_argument("--steps", type=positive_int, default=ARTICLE_STEPS,
                        help="optimizer steps; warm-up stays 10%%")
    parser.add_argument("--lr", type=float, default=0.003, help="base learning rate (default 0.003)")
    parser.add_argument("--seed", type=int, default=0, help="the order and flips of the pictures, the random head")
    parser.add_argument("--resolution", type=side_pixels, default=224,
                        help="fine-tuning resolution (384: the paper's)")
    parser.add_argument("--accum-steps", type=positive_int, default=1, help="split each process's batch into N passes")
    parser.add_argument("--save-dir", metavar="DIR", help=f"write DIR/{CHECKPOINT} every --save-every steps, "
                                                          "at the end and on Ctrl-C")
    parser.add_argument("--save-every", type=positive_int, default=50)
    parser.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt of --save-dir")
    parser.add_argument("--pause-at", type=positive_int, metavar="STEP",
                        help="save and stop after STEP; --resume continues")
    parser.add_argument("--plots", metavar="DIR", help="save the loss, accuracy and LR curves as PNG (matplotlib)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if (args.resume or args.pause_at) and not args.save_dir:
        parser.error("--resume and --pause-at need --save-dir")
    rank, world, device = init_distributed(args.device)
    if args.batch_size % (world * args.accum_steps):
        parser.error(f"--batch-size {args.batch_size} does not split into {world} process(es) x {args.accum_steps} "
                     f"accumulation step(s); use a multiple of {world * args.accum_steps}")
    if rank != 0:  # one process speaks for all
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
        os.environ["TQDM_DISABLE"] = "1"
    torch.manual_seed(args.seed)
    ctx = {"rank": rank, "world": world, "device": device, "autocast": set_precision(device, args.precision)}

    def needs_model(section):
        def run():
            if "model" not in ctx:
                raise ctx.get("problem") or UserError("the checkpoint or the data could not be loaded")
            return section(args, ctx)
        return run

    def first_section():
        try:
            return section_data_and_model(args, ctx)
        except UserError as problem:
            ctx["problem"] = problem
            raise

    try:
        results, problems = run_sections([first_section, needs_model(section_zero_head), needs_model(section_finetune)])
    finally:
        if world > 1:
            dist.destroy_process_group()
    return finish("finetune", args, results, problems) if rank == 0 else (1 if problems else 0)


if __name__ == "__main__":
    sys.exit(guarded(main))
