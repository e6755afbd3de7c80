"""Fine-tuning's plumbing: each step's pictures and batches, their timing, its clock, checkpoints, a signal's stop."""
import hashlib
import time
from pathlib import Path

import numpy as np
import torch

from common.device import to_device
from common.distributed import sum_over_processes
from common.errors import UserError
from common.files import write_atomic
from common.inference import run_model
from common.loader import add_timing, end_workers, pass_timing, picture_batches, picture_loader, start_workers, timed
from common.pictures import to_pixels
from common.start import Terminated


def state_digest(state):
    """blake2b over every value in a fixed order, tensors by dtype, shape and bytes (uint8, for bfloat16), the rest by
    repr: the same after torch.load as before torch.save."""
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


def save_checkpoint(path, state, version):
    """The state and torch's RNG states (the CPU's, each GPU's: a resumed run draws what the uninterrupted one drew),
    its format `version` and its digest, written whole or not at all; returns the path."""
    cuda = {"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}
    state = {**state, "rng": {"torch": torch.get_rng_state(), **cuda}}
    checked = {"format": version, "digest": state_digest(state), "state": state}
    return write_atomic(path, lambda f: torch.save(checked, f), what="checkpoint")


def read_checkpoint(path, version, program):
    """The state saved at path, refused in one line when it is not a `version` file of `program` or has changed."""
    try:
        checked = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a truncated or foreign file
        raise UserError(f"--resume: {path} is truncated or not a checkpoint of this script ({type(error).__name__}); "
                        f"start again without --resume, or pass another --save-dir") from error
    if not isinstance(checked, dict) or checked.get("format") != version:
        raise UserError(f"--resume: {path} is a torch file but not a checkpoint of this version of {program}: start "
                        f"again without --resume, or pass another --save-dir")
    if state_digest(checked["state"]) != checked["digest"]:
        raise UserError(f"--resume: {path} has changed since it was written (its contents no longer match their "
                        f"digest): the file is damaged; start again without --resume, or restore a copy of it")
    return checked["state"]


def resume(save_dir, name, version, program, settings, into):
    """The state in save_dir/name (refused when missing, foreign, changed or made with other settings but the number of
    processes), loaded into `into` ({part: module or optimizer}), its RNG states set."""
    path = Path(save_dir) / name
    if not path.is_file():
        raise UserError(f"--resume: no {name} in {save_dir}; start without --resume")
    state = read_checkpoint(path, version, program)
    changed = [f"{key} {state['settings'].get(key)} -> {value}" for key, value in settings.items()
               if key != "processes" and state["settings"].get(key) != value]
    if changed:
        raise UserError(f"--resume: {path} was made with other settings ({'; '.join(changed)}); "
                        f"pass the same flags, or a new --save-dir")
    for part, module in into.items():
        module.load_state_dict(state[part])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state


def micro_batches(pixels, labels, passes):
    """(pictures, labels, weight) of each of `passes` parts of a batch; weight: the part's share, so that the weighted
    mean losses add up to the batch's."""
    for x, y in zip(pixels.chunk(passes), labels.chunk(passes)):
        yield x, y, len(y) / len(labels)


def save_or_stop(run, stop, step, last_step, save, say):
    """save() (the first process alone) every --save-every steps, at the last and on a signal; then stop if one asked:
    every process learns of a signal or failed save in any, so all stop at the same step."""
    args = run.args
    interrupted = sum_over_processes(bool(stop["asked"]), run) > 0
    path, problem = None, None
    if args.save_dir and run.rank == 0 and (step % args.save_every == 0 or step == last_step or interrupted):
        try:
            path = save()
        except UserError as error:
            problem = error
    if sum_over_processes(problem is not None, run) > 0:
        raise problem or UserError("the first process could not write its checkpoint (it names the reason)")
    if interrupted:
        saved = f"; saved {path}: add --resume to continue" if path else " (no --save-dir: nothing saved)"
        say(f"\nstopped after step {step}{' on ' + stop['asked'] if stop['asked'] else ''}{saved}")
        raise Terminated if stop["asked"] == "SIGTERM" else KeyboardInterrupt


def started(loader, counts):
    """The loader, its workers started now; their start-up seconds and count kept in counts, apart from the passes."""
    counts["loader start-up seconds"] = counts.get("loader start-up seconds", 0.0) + start_workers(loader)
    counts["loader workers"] = loader.num_workers
    return loader


def share_loader(items, run, counts):
    """(A started() loader over this process's share of the (path, label) items, every world-th; its labels)."""
    share = items[run.rank::run.world]
    return started(picture_loader([path for path, _ in share], run.device), counts), [label for _, label in share]


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


def step_batches(items, chosen, run, resolution, batch_size, history, workers=None):
    """(pixels, labels) on the device for each (indices, flips) of `chosen` over the (path, label) items, built ahead
    by a started() loader, timed into the history's training pass."""
    paths = [items[i][0] for indices, _ in chosen for i in indices]
    loader = started(picture_loader(paths, run.device, workers), history)
    flips = np.concatenate([f for _, f in chosen]) if chosen else None
    batches = timed(picture_batches(loader, resolution, batch_size, flips), run_passes(history)["training"])
    for (indices, _), batch in zip(chosen, batches):
        yield to_pixels(batch, run.device), torch.tensor([items[i][1] for i in indices], device=run.device)


def run_passes(history):
    """The passes over pictures a run's history keeps: the training steps and the checks (a resumed history has them)."""
    return history.setdefault("passes", {"training": pass_timing(), "checks": pass_timing()})


def run_clock(history):
    """A function: the run's seconds so far, a resumed run's included, also kept in history["seconds"]."""
    begun = time.perf_counter() - history["seconds"]

    def seconds():
        history["seconds"] = time.perf_counter() - begun
        return history["seconds"]

    return seconds


def accuracies(models, pictures, labels, run, batch_size, desc, into=None):
    """([per cent right of each model over all processes], this process's pass timing, also added to `into`): one pass,
    each batch through every model; pictures as run_model's (a loader's workers end after it), labels this process's
    share."""
    def predictions(**inputs):
        return [model(**inputs).logits.argmax(1) for model in models]

    predicted, timing = run_model(predictions, pictures, run.args.resolution, run.device, batch_size, list, desc,
                                  run.autocast)
    total, percents = sum_over_processes(len(labels), run), []
    for k in range(len(models)):
        correct = int((torch.cat([batch[k] for batch in predicted]) == torch.as_tensor(labels)).sum()) if labels else 0
        percents.append(100 * sum_over_processes(correct, run) / total)
    if into is not None:
        add_timing(into, timing)
    end_workers(pictures)
    return percents, timing


def kept_batches(items, run, batch_size, counts):
    """(this process's share of the (path, label) items, read once by share_loader() as uint8 batches kept on the
    device (fine-tuning's checks, read ten times); their labels): the reading's seconds and wait added to the checks'
    pass (no pictures counted); the loader's workers end."""
    loader, labels = share_loader(items, run, counts)
    timing, kept, begun = pass_timing(), [], time.perf_counter()
    for pixels in timed(picture_batches(loader, run.args.resolution, batch_size), timing, count=lambda batch: 0,
                        device=run.device):
        kept.append(to_device(pixels, run.device))
    timing["seconds"] = time.perf_counter() - begun
    end_workers(loader)
    add_timing(run_passes(counts)["checks"], timing)
    return kept, labels
