"""Batches for the model: torch's DataLoader over the pictures, with worker processes beside a GPU.

A batch is uint8 (B, R, R, 3), the pictures resized by resized_rgb(); to_pixels() normalises it on
the model's device. Workers hand their batches back through shared memory, not a pipe.
"""
import os
import signal
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from common.errors import UserError
from common.pictures import resized_rgb

PREFETCH = 4  # batches each worker builds ahead


def loader_workers(device):
    """Processes that build batches ahead of the model: none on a CPU, half the cores beside a GPU.

    On a CPU the model's threads already use every core, so building ahead hides nothing; beside a
    GPU the cores are otherwise idle (the README's performance section has the measurements).
    """
    return 0 if device.type == "cpu" else max(1, min(8, (os.cpu_count() or 2) // 2))


def worker_start():
    """fork on Linux, so that pictures decoded in the main process are shared with the workers, not copied.

    spawn elsewhere: forking a process whose system libraries have started threads (Metal has, once
    mps is in use) can crash the child, and spawn is Python's default on macOS. A spawned worker
    receives the pictures pickled, once, since the workers persist.
    """
    return "fork" if sys.platform.startswith("linux") else "spawn"


class Pictures(Dataset):
    """The pictures (PIL images, or paths decoded at each read), read by key (index, resolution, flip).

    The resolution and the flip travel in the key, not in the dataset, so that one set of persistent
    workers serves passes at several resolutions (posemb's rows) and with any flips (fine-tuning).
    """

    def __init__(self, pictures):
        self.pictures = pictures

    def __len__(self):
        return len(self.pictures)

    def __getitem__(self, key):
        index, resolution, flip = key
        try:
            return resized_rgb(self.pictures[index], resolution, flip)
        except UserError as error:
            return error  # a value, not raised: raised in a worker it would reach the user as the worker's traceback


def stack_or_error(items):
    """The batch as a uint8 tensor, or the first picture's UserError for picture_batches() to raise as itself.

    numpy stacks in one thread: torch.stack would spread the copy over torch's threads, and in the
    main process they wait for every core, busy ones included (20 times slower on a loaded 2-core machine).
    """
    errors = [item for item in items if isinstance(item, UserError)]
    return errors[0] if errors else torch.from_numpy(np.stack(items))


def ignore_ctrl_c(worker_id):
    """The main process alone decides what Ctrl-C does (fine-tuning finishes its step, saves, then stops).

    A worker that died of the terminal's SIGINT would break that step. SIGTERM is left as it is: the
    DataLoader ends its workers with it when it shuts down.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def picture_loader(pictures, device, workers=None):
    """A DataLoader over the pictures; picture_batches() says what each pass reads.

    workers: loader_workers(device) unless given. They persist, so several passes (posemb's five
    rows, fine-tuning's checks) start them once; they end with the loader. Batches bound for a CUDA
    GPU are pinned, so that the copy does not block.
    """
    workers = loader_workers(device) if workers is None else workers
    return DataLoader(Pictures(pictures), batch_sampler=[], collate_fn=stack_or_error, num_workers=workers,
                      pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                      prefetch_factor=PREFETCH if workers else None, worker_init_fn=ignore_ctrl_c,
                      multiprocessing_context=worker_start() if workers else None,
                      generator=torch.Generator())  # each pass draws a seed from it: the global RNG stays as it was


def dataset_loader(dataset, collate_fn, workers, pin_memory=False, batch_size=32):
    """A DataLoader for one pass, in order, over a dataset that makes its own items (the backbone's beans through
    the article's transform), with picture_loader()'s workers: Ctrl-C left to the main process, the same start."""
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=workers, pin_memory=pin_memory,
                      prefetch_factor=PREFETCH if workers else None, worker_init_fn=ignore_ctrl_c,
                      multiprocessing_context=worker_start() if workers else None)


def picture_batches(loader, resolution, batch_size, flips=None, indices=None):
    """uint8 batches (B, R, R, 3) of the loader's pictures, in order; flips[i] True mirrors the i-th left to right.

    indices: which of the loader's pictures, in this order (default: all), so that one loader, its
    workers started once, serves passes over several sets (few-shot's pool and validation pictures).
    A DataLoader's batch sampler cannot be replaced, so this pass's batches of keys are put into
    the list it was given (picture_loader's batch_sampler).
    """
    indices = range(len(loader.dataset)) if indices is None else indices
    flips = np.zeros(len(indices), dtype=bool) if flips is None else np.asarray(flips)
    keys = [(int(i), resolution, bool(flip)) for i, flip in zip(indices, flips)]
    loader.batch_sampler[:] = [keys[start:start + batch_size] for start in range(0, len(keys), batch_size)]
    for batch in loader:
        if isinstance(batch, UserError):
            raise batch
        yield batch


def start_workers(loader):
    """Start the loader's worker processes now, before any timed pass; the seconds it took (0 without workers).

    They persist, so a run pays this once; the first pass would otherwise show it as its wait for pictures.
    """
    begun = time.perf_counter()
    if loader.num_workers:
        loader.batch_sampler[:] = []
        for _ in loader:  # no batches: this only makes the persistent iterator, which starts the workers
            pass
    return time.perf_counter() - begun


def end_workers(*loaders):
    """End the worker processes of persistent loaders now, not at the interpreter's exit.

    There torch waits up to 5 s for each worker still alive (seen on an H200: the backbone's process
    lived 87 s after its last line), so the persistent iterator a DataLoader keeps in its _iterator
    is shut down here, while its workers still answer. A loader may be used again: it starts new ones.
    """
    for loader in loaders:
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
            loader._iterator = None


def add_timing(total, timing):
    """Add one pass's seconds, waiting seconds and pictures to a running total (pass_timing)."""
    for key, value in timing.items():
        total[key] += value


def workers_text(loader, seconds):
    """'8 worker processes (...) started in 0.4 s, before the passes': the same words on every device."""
    return (f"{loader.num_workers} worker processes (none on a CPU, whose cores the model uses), started in "
            f"{seconds:.1f} s, before the passes")


def pass_timing():
    """A pass over pictures: its seconds, the seconds the model waited for its next batch, the pictures it got."""
    return {"seconds": 0.0, "waiting seconds": 0.0, "pictures": 0}


def timed(batches, timing, count=len, device=None):
    """The batches, in order; each one's wait for pictures and its pictures added to timing.

    On a CPU (and Apple's mps) the wait is timm's data time, the host's time in next(): the model
    computes on the host, so it idles while the loader decodes or its workers are behind. On a CUDA GPU
    the host runs ahead of the GPU, and its time in next() may overlap the GPU's work on the last batch;
    the GPU's own idle time is measured instead, with CUDA events: one recorded when the host asks for
    the next batch (the GPU reaches it once the work queued so far is done) and one when it has the
    batch, with nothing queued between them: their elapsed time is the GPU idling for want of it.
    """
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


class TimedLoader:
    """A data loader whose every next() is timed into a pass timing; all else is the loader's own.

    For loops that a library runs (transformers' Trainer), where the wait cannot be timed inside.
    count(batch): the pictures in a batch. Through the Trainer, accelerate's loader copies each batch to
    the GPU inside next(), so there the measured wait includes queuing that copy.
    """

    def __init__(self, loader, timing, count=len, device=None):
        self.loader, self.timing, self.count, self.device = loader, timing, count, device

    def __iter__(self):
        return timed(self.loader, self.timing, self.count, self.device)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)
