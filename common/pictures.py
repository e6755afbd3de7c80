"""Pictures to a ViT's pixels: decode (RGB), resize to R x R, (x/255 - 0.5) / 0.5, as the checkpoints' image processor
does; the batched path splits it between the loader's workers (resized_rgb) and the model's device (to_pixels)."""
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from common.device import to_device
from common.errors import UserError


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


def resized_rgb(picture, resolution, flip=False):
    """The picture (a PIL image or a path) resized to R x R (bilinear): uint8 (R, R, 3), mirrored if flip."""
    image = picture if isinstance(picture, Image.Image) else load_rgb(picture)
    array = np.asarray(image.resize((resolution, resolution), Image.BILINEAR))
    return array[:, ::-1] if flip else array


def to_pixels(batch, device):
    """uint8 (B, R, R, 3) -> float32 (B, 3, R, R) on the device, as the image processor: a quarter of the
    bytes travel."""
    x = to_device(batch, device).permute(0, 3, 1, 2).float().contiguous()
    return (x * (1 / 255) - 0.5) / 0.5


def pixels_processor(resolution):
    """The image processor that makes these pixels from a picture, as transformers saves and loads it (a model
    saved for from_pretrained and pipeline() carries it)."""
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": resolution, "width": resolution})


def load_all(paths, desc="decoding"):
    """Every picture decoded (RGB), in order; by threads (PIL decodes outside the GIL)."""
    from tqdm import tqdm

    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        return list(tqdm(pool.map(load_rgb, paths), total=len(paths), desc=desc, unit="picture", file=sys.stderr,
                         leave=False))
