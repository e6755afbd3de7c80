"""The pictures the scripts run on: Imagenette's folders ({train,val}/<wnid>/*.JPEG) checked and listed, decoded,
resized, batched by torch's DataLoader (workers beside a GPU), and a model run over them (docs/data.md)."""
import collections
import contextlib
import functools
import math
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from common.paths import IMAGENETTE_DIR as DEFAULT_DIR
from common.start_and_end import UserError, end_with, say

SPLIT_COUNTS, SPLIT_WORDS = {"train": 9_469, "val": 3_925}, {"train": "training", "val": "validation"}
DEFAULT_NAME = "imagenette2-160 (the project's download)"  # the data a run without --data-dir reads
SAMPLE_SEED = 0  # the draw of --per-class's validation pictures, where they are a sample: the same in every run
# WordNet id, the article's short name, ImageNet-1k index (parachute is n03888257, not n03888605)
CLASSES = [("n01440764", "tench", 0), ("n02102040", "springer", 217), ("n02979186", "cassette player", 482),
           ("n03000684", "chain saw", 491), ("n03028079", "church", 497), ("n03394916", "French horn", 566),
           ("n03417042", "garbage truck", 569), ("n03425413", "gas pump", 571), ("n03445777", "golf ball", 574),
           ("n03888257", "parachute", 701)]
IMAGENETTE_WNIDS = sorted(wnid for wnid, _, _ in CLASSES)  # as class_folders() lists them


def class_folders(root, split):
    folder = Path(root) / split
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def list_split(root, split, per_class=None, drawn=False):
    """[(path, label)] sorted by class folder, then file name; per_class keeps the first N of each class by name, or,
    drawn, N times the classes drawn with a fixed seed from the whole split: a simple random sample (docs/data.md)."""
    paths = [sorted(p for p in (Path(root) / split / wnid).iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".png"))
             for wnid in class_folders(root, split)]
    if not drawn:
        return [(path, label) for label, each in enumerate(paths) for path in each[:per_class]]
    items = [(path, label) for label, each in enumerate(paths) for path in each]
    if per_class and per_class * len(paths) < len(items):
        chosen = np.random.default_rng(SAMPLE_SEED).choice(len(items), per_class * len(paths), replace=False)
        items = [items[i] for i in sorted(chosen)]
    return items


def check_counts(root, strict, fix=": delete the folder to download it again, or pass --data-dir with a complete copy"):
    """The layout: both splits hold the same class folders, and every class folder holds pictures; then Imagenette's
    counts: strict (UserError) for the copy we download, else the warning for a partial copy, or None."""
    folders = {split: class_folders(root, split) for split in SPLIT_COUNTS}
    for split, names in folders.items():
        if not names:
            raise UserError(f"no class folders in {Path(root) / split}: expected the layout {split}/<class>/*.JPEG")
    only = sorted(set(folders["train"]) ^ set(folders["val"]))
    if not only and len(folders["val"]) < 2:  # one class: every loss would be ln 1 = 0, every accuracy 100%
        raise UserError(f"one class folder in {root} ({folders['val'][0]}): a classifier needs at least 2 classes")
    if only:
        where = "train" if only[0] in folders["train"] else "val"
        raise UserError(f"class {only[0]} is in {Path(root) / where} but not in the other split: both splits need "
                        f"the same class folders")
    found = {}
    for split in SPLIT_COUNTS:
        listed = list_split(root, split)
        if pipe := next((path for path, _ in listed if path.exists() and not (path.is_file() or path.is_dir())), None):
            raise UserError(f"{pipe} is not a picture file but a pipe, device or socket: remove it from the folder")
        per_class = np.bincount([label for _, label in listed], minlength=len(folders[split]))
        if per_class.min() == 0:
            raise UserError(f"no pictures in {Path(root) / split / folders[split][int(per_class.argmin())]}: every "
                            f"class needs pictures (.JPEG, .jpg or .png) in both splits")
        found[split] = len(listed)
    if folders["val"] != IMAGENETTE_WNIDS or found == SPLIT_COUNTS:
        return None  # another data set (its own counts), or Imagenette whole
    counts = ", ".join(f"{found[split]:,} of {expected:,} {SPLIT_WORDS[split]}"
                       for split, expected in SPLIT_COUNTS.items())
    if strict:
        raise UserError(f"found {counts} pictures in {root}{fix}")
    return f"{root} holds {counts} pictures of Imagenette: a partial copy, so its numbers cannot match the article's"


def load_splits(data_dir, per_class, drawn=False):
    """{"root", "folders" (WordNet ids), "names" (the classes' short names), "name" ("Imagenette" or the folder's),
    and each split of per_class ({split: N or None}): list_split(root, split, N, drawn)} of the data folder: --data-dir,
    else the default one (job/imagenette_archive.py's download_imagenette() fetches it); the default must hold the
    whole release, a partial --data-dir copy runs after a warning naming its counts."""
    root = Path(data_dir) if data_dir else DEFAULT_DIR
    default = root.resolve() == DEFAULT_DIR
    if not root.exists():
        raise UserError(f"--data-dir {data_dir} does not exist" if not default else
                        f"Imagenette is not in {root}: run without --data-dir to download it, or pass --data-dir")
    if not root.is_dir():
        raise UserError(f"--data-dir {data_dir} is a file, not a folder of {{train,val}}/<class>/ pictures")
    if warning := check_counts(root, strict=default):
        say(f"warning: {warning}")
    folders = class_folders(root, "val")
    imagenette = root.name == DEFAULT_DIR.name and folders == IMAGENETTE_WNIDS  # a folder whose counts are known
    short = {wnid: name for wnid, name, _ in CLASSES}
    return {"root": root, "folders": folders, "names": [short.get(wnid, wnid) for wnid in folders],
            "name": "Imagenette" if imagenette else root.name,
            **{split: list_split(root, split, n, drawn) for split, n in per_class.items()}}


def load_rgb(path):
    """The picture as RGB (Imagenette has grayscale and CMYK JPEGs); unreadable or too large, one line stops the run."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except Image.DecompressionBombError as error:
        raise UserError(f"cannot read picture {path}: it is too large to decode safely ({error}); remove it from "
                        f"the data folder or shrink it") from error
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read picture {path}: {error}") from error


def resized_rgb(picture, resolution, flip=False, resample=Image.BILINEAR):
    """A PIL image or a path resized to R x R (PIL's filter `resample`): uint8 (R, R, 3), mirrored if flip."""
    image = picture if isinstance(picture, Image.Image) else load_rgb(picture)
    array = np.asarray(image.resize((resolution, resolution), resample))
    return array[:, ::-1] if flip else array


def to_pixels(batch, device, pixels):
    """uint8 (B, R, R, 3) -> float32 (B, 3, R, R) on the device, (x/255 - mean) / std as the image processor whose
    pixels (common/pretrained.py) they are: a quarter of the bytes travel, to a GPU through pinned memory (no wait)."""
    x = torch.as_tensor(batch)
    x = x.pin_memory().to(device, non_blocking=True) if device.type == "cuda" and not x.is_cuda else x.to(device)
    x = x.permute(0, 3, 1, 2).float().contiguous()
    mean, std = channel_constants(tuple(pixels["mean"]), tuple(pixels["std"]), x.device)
    return (x * (1 / 255) - mean) / std


@functools.lru_cache(maxsize=8)
def channel_constants(mean, std, device):
    """(mean, std) as (1, 3, 1, 1) tensors on the device, made once: a copy to a GPU each batch would wait for it."""
    return tuple(torch.tensor(values, device=device).view(1, 3, 1, 1) for values in (mean, std))


PREFETCH = 4  # batches each worker builds ahead
NEW_PASS = {"seconds": 0.0, "waiting seconds": 0.0, "pictures": 0}  # a pass as timed() fills it; each takes a copy


def loader_workers(device):
    """Processes that build batches ahead: none on a CPU (its cores run the model), half the cores beside a GPU."""
    return 0 if device.type == "cpu" else max(1, min(8, (os.cpu_count() or 2) // 2))


# spawn: each worker a new interpreter, the script's own child (ended with it). A fork of the model's threaded process
# may deadlock (Python 3.12 warns) or crash after Metal's; a fork server outlives a killed script with its workers.
WORKER_START = "spawn"


class Pictures(Dataset):
    """The pictures (PIL images or paths) read by key (index, resolution, flip); decoded ones travel to the workers as
    one uint8 tensor in shared memory, which each worker maps: not a copy each."""

    def __init__(self, pictures, ready=None, resample=Image.BILINEAR):
        self.pictures, self.shared, self.resample = pictures, None, resample  # resample: PIL's filter of the resize
        self.ready = ready  # a semaphore each worker releases once it runs (start_loader waits for them)

    def __len__(self):
        return len(self.pictures)

    def __getitem__(self, key):
        index, resolution, flip = key
        picture = self.pictures[index]
        if isinstance(picture, SharedPicture):
            pixels = self.shared[0][picture.start:picture.end].numpy()
            picture = Image.frombuffer("RGB", picture.size, pixels, "raw", "RGB", 0, 1)
        try:
            return resized_rgb(picture, resolution, flip, self.resample)
        except UserError as error:
            return error  # a value, not raised: raised in a worker it would reach the user as the worker's traceback

    def __getstate__(self):
        """Pickled for a worker: the RGB pictures' pixels moved into shared memory once, for every worker (torch's
        pickler hands a tensor there over as a handle), each picture then named by its place in them."""
        if self.shared is None:
            self.shared = shared_pixels(self.pictures)
        pixels, places = self.shared
        return {"pictures": places, "shared": (pixels, places), "ready": self.ready, "resample": self.resample}


# An RGB picture's size and where its pixels lie in the shared tensor of Pictures: [start, end).
SharedPicture = collections.namedtuple("SharedPicture", ["size", "start", "end"])


def shared_pixels(pictures):
    """(one uint8 tensor in shared memory holding the RGB pictures' pixels, the pictures each of those replaced by its
    SharedPicture); paths and other pictures stay as they are, and with no RGB picture so do those (no tensor)."""
    places, end = [], 0
    for picture in pictures:
        if isinstance(picture, Image.Image) and picture.mode == "RGB":
            places.append(SharedPicture(picture.size, end, end + 3 * picture.size[0] * picture.size[1]))
            end = places[-1].end
        else:
            places.append(picture)
    if not end:
        return None, pictures
    pixels = torch.empty(end, dtype=torch.uint8).share_memory_()
    array = pixels.numpy()
    for picture, place in zip(pictures, places, strict=True):
        if isinstance(place, SharedPicture):
            array[place.start:place.end] = np.asarray(picture).reshape(-1)
    return pixels, places


def stack_or_error(items):
    """The batch as a uint8 tensor, or the first picture's UserError; stacked by numpy, in one thread (docs/data.md)."""
    errors = [item for item in items if isinstance(item, UserError)]
    return errors[0] if errors else torch.from_numpy(np.stack(items))


def worker_setup(worker_id):
    """In each worker: Ctrl-C left to the main process; on Linux, the worker ends with it, even one killed while its
    workers started; then it says it runs (Pictures.ready)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        end_with(multiprocessing.parent_process().pid, signal.SIGKILL)
    ready = getattr(torch.utils.data.get_worker_info().dataset, "ready", None)
    if ready is not None:
        ready.release()


def picture_loader(pictures, resolution, batch_size, device, flips=None, indices=None, workers=None,
             resample=Image.BILINEAR):
    """A DataLoader for one pass over the pictures (indices: which, in order): uint8 batches (B, R, R, 3), resized
    with PIL's filter `resample`, flips[i] mirroring the i-th; its workers, beside a GPU, end with the pass."""
    indices = range(len(pictures)) if indices is None else indices
    flips = np.zeros(len(indices), dtype=bool) if flips is None else np.asarray(flips)
    keys = [(int(i), resolution, bool(flip)) for i, flip in zip(indices, flips, strict=True)]  # the sampler's keys
    workers = loader_workers(device) if workers is None else workers
    context = multiprocessing.get_context(WORKER_START) if workers else None
    ready = context.Semaphore(0) if context else None
    return DataLoader(Pictures(pictures, ready, resample), batch_size=batch_size, sampler=keys,
                      collate_fn=stack_or_error, num_workers=workers, pin_memory=device.type == "cuda",
                      prefetch_factor=PREFETCH if workers else None,
                      worker_init_fn=worker_setup, multiprocessing_context=context,
                      generator=torch.Generator())  # each pass draws a seed from it: the global RNG stays as it was


def start_loader(loader, timing=None, count=len):
    """(the pass's batches, timed() (with timing, each batch's wait and pictures added to it), the seconds its workers
    took to start, before the pass: not counted as waiting)."""
    begun = time.perf_counter()
    batches = start_workers(loader) if loader.num_workers else iter(loader)
    return timed(batches, timing, count), time.perf_counter() - begun


def start_workers(loader):
    """iter(loader) once each of its worker processes runs (has imported what it needs)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
    try:  # Ctrl-C pending until the workers run: they inherit it held, until worker_setup (no traceback from them)
        batches = iter(loader)
        for _ in range(loader.num_workers):
            loader.dataset.ready.acquire(timeout=300)  # a bound: a worker that died is the pass's error
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return batches


def workers_text(workers, seconds):
    """'8 worker processes (...) started in 0.4 s, before the passes': the same words on every device."""
    return (f"{workers} worker processes (none on a CPU, whose cores the model uses), started in "
            f"{seconds:.1f} s, before the passes")


def timed(batches, timing=None, count=len, device=None):
    """The batches, in order, a picture's UserError raised; each one's wait and pictures added to timing: the host's
    time in next(), on a CUDA GPU the GPU's idle time between two CUDA events (docs/data.md#the-wait-for-pictures)."""
    timing = dict(NEW_PASS) if timing is None else timing
    on_cuda = device is not None and device.type == "cuda"
    pairs, iterator = [], iter(batches)  # (asked, arrived) CUDA events of each batch
    try:
        while True:
            asked, start = record_event() if on_cuda else None, time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                if on_cuda:
                    pairs.append((asked, record_event()))
                else:
                    timing["waiting seconds"] += time.perf_counter() - start
            if isinstance(batch, UserError):  # a picture that cannot be read: its pictures not counted
                raise batch
            timing["pictures"] += count(batch)
            yield batch
    finally:  # the workers end now, not once a raised error (which holds this frame) is freed
        del batches, iterator
        if pairs:  # the GPU's idle times are known once it gets to the last event
            pairs[-1][1].synchronize()
            timing["waiting seconds"] += sum(asked.elapsed_time(arrived) for asked, arrived in pairs) / 1000


def record_event():
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def run_model(model, pictures, resolution, device, batch_size, what_to_keep, desc="", autocast=None, count=None,
              timing=None, *, pixels):
    """([what_to_keep(output) of each batch (a tensor, or a tuple or list of them), in order, on the host], timing):
    pictures are PIL images or paths (a pass of its own: its workers and their start-up seconds in timing), uint8
    batches read before, or a started pass's batches (count: its pictures); timing adds up the pass's seconds, wait
    and pictures (docs/data.md#one-batched-pass)."""
    timing = dict(NEW_PASS) if timing is None else timing  # timed() adds the wait and pictures
    if isinstance(pictures, list) and all(isinstance(item, torch.Tensor) for item in pictures):  # batches read before
        batches, count = pictures, sum(len(batch) for batch in pictures)
    elif count is None:
        loader = picture_loader(pictures, resolution, batch_size, device, resample=pixels["resample"])
        batches, timing["start-up seconds"] = start_loader(loader)
        timing["workers"], count = loader.num_workers, len(pictures)
    else:
        batches = pictures
    start = time.perf_counter()
    outputs = []
    with torch.inference_mode(), autocast or contextlib.nullcontext():
        for batch in tqdm(timed(batches, timing, device=device), desc=desc, unit="batch", file=sys.stderr,
                          leave=False, total=math.ceil(count / batch_size)):
            output = model(pixel_values=to_pixels(batch, device, pixels), interpolate_pos_encoding=True)
            outputs.append(what_to_keep(output))
        # on the host once the pass ends: a tensor, or a tuple or list of them, a batch
        outputs = [kept.cpu() if isinstance(kept, torch.Tensor) else type(kept)(t.cpu() for t in kept)
                   for kept in outputs]
    timing["seconds"] += time.perf_counter() - start
    return outputs, timing
