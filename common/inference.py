"""Running a model over a list of pictures: batched, under inference_mode, batches built ahead."""
import contextlib
import math
import sys

import torch

from common.imagenette import loader_workers, picture_batches, to_pixels


def run_model(model, pictures, resolution, device, batch_size, take, desc="", autocast=None):
    """[take(model(batch)) for each batch of the pictures, in order]; take keeps what is needed, on the CPU.

    interpolate_pos_encoding=True lets the model take any resolution: the library stretches the
    position table (bicubic) only when its row count differs from the sequence, so a table that was
    already stretched is used as it is.
    """
    from tqdm import tqdm

    batches = picture_batches(pictures, resolution, batch_size, workers=loader_workers(device))
    kept = []
    with torch.inference_mode(), autocast or contextlib.nullcontext():
        for pixels in tqdm(batches, desc=desc, unit="batch", file=sys.stderr, leave=False,
                           total=math.ceil(len(pictures) / batch_size)):
            kept.append(take(model(pixel_values=to_pixels(pixels, device), interpolate_pos_encoding=True)))
    return kept
