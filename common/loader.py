"""Batches for the model: torch's DataLoader over the pictures, uint8 (B, R, R, 3), worker processes beside a GPU;
why it is built so: docs/data.md#the-loader."""
import collections
import multiprocessing
import os
import signal
import sys
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from common.errors import UserError
from common.pictures import resized_rgb

PREFETCH = 4  # batches each worker builds ahead
NEW_PASS = {"seconds": 0.0, "waiting seconds": 0.0, "pictures": 0}  # a pass as timed() fills it; each takes a copy


def loader_workers(device):
    """Processes that build batches ahead: none on a CPU (its cores run the model), half the cores beside a GPU."""
    return 0 if device.type == "cpu" else max(1, min(8, (os.cpu_count() or 2) // 2))


# How a worker starts. spawn: each worker a new interpreter, the script's own child (torch ends it when the script
# dies). Forking the model's process, whose libraries run threads, may deadlock the child (Python 3.12 on warns that it
# may); forking after Metal's threads can crash; a fork server outlives a killed script with its workers.
WORKER_START = "spawn"


class Pictures(Dataset):
    """The pictures (PIL images or paths) read by key (index, resolution, flip): one set of workers serves any pass.
    Into a worker process, decoded (RGB) pictures travel as one uint8 tensor in shared memory, which each worker maps:
    not a copy each."""

    def __init__(self, pictures, ready=None, resample=Image.BILINEAR):
        self.pictures, self.shared, self.resample = pictures, None, resample  # resample: PIL's filter of the resize
        self.ready = ready  # a semaphore each worker releases once it runs (start_pass waits for them)

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
    """In each worker: the main process alone decides what Ctrl-C does (fine-tuning finishes its step, saves, then
    stops); on Linux the worker ends with that process, even one killed while its workers started (torch looks for
    the parent it finds once it runs); then it says it runs (Pictures.ready)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
        if os.getppid() != multiprocessing.parent_process().pid:  # it ended before the request was made
            os._exit(0)
    ready = getattr(torch.utils.data.get_worker_info().dataset, "ready", None)
    if ready is not None:
        ready.release()


def one_pass(pictures, resolution, batch_size, device, flips=None, indices=None, workers=None,
             resample=Image.BILINEAR):
    """A DataLoader for one pass over the pictures (paths or PIL images; indices: which, in order; default all): uint8
    batches (B, R, R, 3), resized with PIL's filter `resample`, flips[i] mirroring the i-th. Its workers, beside a
    GPU, end with the pass (start_pass)."""
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


def start_pass(loader, timing=None, count=len):
    """(the pass's batches, the seconds its workers took to start): each worker runs before the pass begins, so the
    pass does not count their start as waiting for pictures. A picture that cannot be read raises its UserError; the
    workers end with the pass, or when its batches are dropped unfinished. With timing, each batch's wait (the
    host's) and pictures (count) are added to it (timed)."""
    begun = time.perf_counter()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
    try:  # Ctrl-C pending until the workers run: they inherit it held, until worker_setup (no traceback from them)
        batches = iter(loader)
        for _ in range(loader.num_workers):  # each new interpreter has imported what it needs and runs
            loader.dataset.ready.acquire(timeout=300)  # a bound: a worker that died is the pass's error
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    seconds = time.perf_counter() - begun

    def checked(iterator):
        timed_batches = iterator if timing is None else timed(  # a picture's error counts no pictures: raised below
            iterator, timing, lambda batch: 0 if isinstance(batch, UserError) else count(batch))
        try:
            for batch in timed_batches:
                if isinstance(batch, UserError):
                    raise batch
                yield batch
        finally:  # the workers end now, a failed pass's too, not once its error (which holds this frame) is freed
            del iterator, timed_batches

    return checked(batches), seconds


def started_pass(pictures, resolution, batch_size, device, flips=None, indices=None, workers=None, timing=None,
                 count=len, resample=Image.BILINEAR):
    """(the batches of one_pass(...), its workers, the seconds they took to start): start_pass's, timing and count
    as there."""
    loader = one_pass(pictures, resolution, batch_size, device, flips, indices, workers, resample)
    batches, seconds = start_pass(loader, timing, count)
    return batches, loader.num_workers, seconds


def workers_text(workers, seconds):
    """'8 worker processes (...) started in 0.4 s, before the passes': the same words on every device."""
    return (f"{workers} worker processes (none on a CPU, whose cores the model uses), started in "
            f"{seconds:.1f} s, before the passes")


def timed(batches, timing, count=len, device=None):
    """The batches, in order; each one's wait and pictures added to timing: the host's time in next(), on a CUDA GPU
    the GPU's own idle time between two CUDA events (docs/data.md#the-wait-for-pictures)."""
    on_cuda = device is not None and device.type == "cuda"
    pairs = []
    iterator = iter(batches)
    try:
        while True:
            asked = record_event() if on_cuda else None
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                if on_cuda:
                    pairs.append((asked, record_event()))
                else:
                    timing["waiting seconds"] += time.perf_counter() - start
            timing["pictures"] += count(batch)
            yield batch
    finally:  # the pass ended, or its consumer stopped early: the GPU's idle times are known once it gets there
        if pairs:
            pairs[-1][1].synchronize()
            timing["waiting seconds"] += sum(asked.elapsed_time(arrived) for asked, arrived in pairs) / 1000


def record_event():
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
