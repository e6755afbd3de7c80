"""Running a model over a list of pictures: batched, under inference_mode, batches built ahead."""
import contextlib
import math
import sys

import torch
from torch.utils.data import DataLoader

from common.imagenette import to_pixels
from common.loader import picture_batches, picture_loader


def run_model(model, pictures, resolution, device, batch_size, what_to_keep, desc="", autocast=None):
    """[what_to_keep(model output) for each batch of the pictures, in order], each on the host.

    pictures: a list (PIL images or paths), or a picture_loader() made once for several passes, so
    that its workers start once. interpolate_pos_encoding=True lets the model take any resolution:
    the library stretches the position table (bicubic) only when its row count differs from the
    sequence, so a table that was already stretched is used as it is.
    """
    from tqdm import tqdm

    loader = pictures if isinstance(pictures, DataLoader) else picture_loader(pictures, device)
    batches = picture_batches(loader, resolution, batch_size)
    outputs = []
    with torch.inference_mode(), autocast or contextlib.nullcontext():
        for pixels in tqdm(batches, desc=desc, unit="batch", file=sys.stderr, leave=False,
                           total=math.ceil(len(loader.dataset) / batch_size)):
            outputs.append(what_to_keep(model(pixel_values=to_pixels(pixels, device), interpolate_pos_encoding=True)))
    return outputs
