"""Running a model over a list of pictures: batched, under inference_mode, batches built ahead, the wait timed."""
import contextlib
import math
import sys
import time

import torch
from torch.utils.data import DataLoader

from common.loader import pass_timing, picture_batches, picture_loader, timed
from common.pictures import to_pixels


def on_host(value):
    """A tensor, or a tuple or list of them, copied to the host."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (tuple, list)):
        return type(value)(on_host(item) for item in value)
    return value


def run_model(model, pictures, resolution, device, batch_size, what_to_keep, desc="", autocast=None, indices=None,
              count=None):
    """([what_to_keep(output) of each batch, in order, on the host], timing); pictures: PIL images or paths, a shared
    picture_loader() (indices: which of its pictures), uint8 batches read before, or a started pass's batches (count:
    its pictures) (docs/data.md#one-batched-pass)."""
    from tqdm import tqdm

    start = time.perf_counter()
    timing = pass_timing()
    if isinstance(pictures, list) and all(isinstance(item, torch.Tensor) for item in pictures):  # batches read before
        batches, count = pictures, sum(len(batch) for batch in pictures)
    elif count is not None:  # a pass started before (common.loader.start_pass)
        batches = pictures
    else:
        loader = pictures if isinstance(pictures, DataLoader) else picture_loader(pictures, device)
        count = len(loader.dataset) if indices is None else len(indices)
        batches = picture_batches(loader, resolution, batch_size, indices=indices)
    outputs = []
    with torch.inference_mode(), autocast or contextlib.nullcontext():
        for pixels in tqdm(timed(batches, timing, device=device), desc=desc, unit="batch", file=sys.stderr,
                           leave=False, total=math.ceil(count / batch_size)):
            outputs.append(what_to_keep(model(pixel_values=to_pixels(pixels, device), interpolate_pos_encoding=True)))
        outputs = on_host(outputs)
    timing["seconds"] = time.perf_counter() - start
    return outputs, timing
