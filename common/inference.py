"""Running a model over a list of pictures: batched, under inference_mode, batches built ahead, the wait timed."""
import contextlib
import math
import sys
import time

import torch

from common.loader import NEW_PASS, one_pass, start_pass, timed
from common.pictures import ARTICLE_PIXELS, to_pixels


def run_model(model, pictures, resolution, device, batch_size, what_to_keep, desc="", autocast=None, count=None,
              timing=None, pixels=ARTICLE_PIXELS):
    """([what_to_keep(output) of each batch, in order, on the host], timing); pictures: PIL images or paths (a pass of
    its own, its workers started before it: their start-up seconds and number in timing, "start-up seconds" and
    "workers"), uint8 batches read before, or a started pass's batches (count: its pictures; common.loader.started_pass)
    (docs/data.md#one-batched-pass). timing: the pass's seconds, wait and pictures, added to the given dict (a running
    total) or to a new one. pixels: what the checkpoint's image processor makes (common/pictures.py)."""
    from tqdm import tqdm

    def on_host(value):  # a tensor, or a tuple or list of them
        if isinstance(value, torch.Tensor):
            return value.cpu()
        return type(value)(on_host(item) for item in value) if isinstance(value, (tuple, list)) else value

    if timing is None:
        timing = dict(NEW_PASS)  # timed() adds the wait and pictures
    if isinstance(pictures, list) and all(isinstance(item, torch.Tensor) for item in pictures):  # batches read before
        batches, count = pictures, sum(len(batch) for batch in pictures)
    elif count is None:
        loader = one_pass(pictures, resolution, batch_size, device, resample=pixels["resample"])
        batches, timing["start-up seconds"] = start_pass(loader)
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
        outputs = on_host(outputs)
    timing["seconds"] += time.perf_counter() - start
    return outputs, timing
