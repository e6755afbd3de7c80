"""Running a model over a list of pictures: batched, under inference_mode, batches built ahead."""
import contextlib
import math
import sys

import torch

from common.imagenette import loader_workers, picture_batches, to_pixels


def run_model(model, pictures, resolution, device, batch_size, what_to_keep, desc="", autocast=None):
    """[what_to_keep(model output) for each batch of the pictures, in order], each on the host.

    interpolate_pos_encoding=True lets the model take any resolution: the library stretches the
    position table (bicubic) only when its row count differs from the sequence, so a table that was
    already stretched is used as it is.
    """
    from tqdm import tqdm

    batches = picture_batches(pictures, resolution, batch_size, workers=loader_workers(device))
    outputs = []
    with torch.inference_mode(), autocast or contextlib.nullcontext():
        for pixels in tqdm(batches, desc=desc, unit="batch", file=sys.stderr, leave=False,
                           total=math.ceil(len(pictures) / batch_size)):
            outputs.append(what_to_keep(model(pixel_values=to_pixels(pixels, device), interpolate_pos_encoding=True)))
    return outputs
