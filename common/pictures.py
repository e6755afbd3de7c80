"""Pictures to a ViT's pixels: decode (RGB), resize to R x R, (x/255 - mean) / std, as the checkpoint's image processor
does (the article's: bilinear, mean and std 0.5); the batched path splits it between the loader's workers
(resized_rgb) and the model's device (to_pixels)."""
import functools
import os
import reprlib
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
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


# the article's checkpoints' image processor (ViTImageProcessor): bilinear, then (x/255 - 0.5) / 0.5
ARTICLE_PIXELS = {"resample": Image.BILINEAR, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
RESAMPLES = {Image.NEAREST, Image.BILINEAR, Image.BICUBIC, Image.LANCZOS, Image.BOX, Image.HAMMING}  # PIL's filters


def processor_pixels(config, name):
    """The pixels the image processor of --model `name` makes (config: its preprocessor_config.json; None: it has
    none, and the scripts make the article's), as the scripts follow it: {"resample", "mean", "std"}: resized to
    R x R with its filter, then (x/255 - mean) / std. A processor that does otherwise (a crop, no resize, another
    rescale) is refused in one line, not followed halfway."""
    if config is None:
        return ARTICLE_PIXELS
    try:
        return followed_pixels(config, name)
    except (TypeError, ValueError) as error:  # a value of another type: null, a list where a number goes
        raise UserError(f"--model {name}: its image processor has a value of the wrong type ({error}): pass a "
                        f"checkpoint whose preprocessor_config.json is as transformers writes it") from None


def followed_pixels(config, name):
    """processor_pixels of a preprocessor_config.json."""
    otherwise = [what for what, does in (
        ("crops the picture (do_center_crop)", config.get("do_center_crop")),
        ("does not resize it (do_resize false)", config.get("do_resize", True) is False),
        ("does not rescale by 1/255", config.get("do_rescale", True) is False
         or abs(config.get("rescale_factor", 1 / 255) - 1 / 255) > 1e-12),
        (f"resamples with filter {reprlib.repr(config.get('resample'))}, not one of PIL's",
         config.get("resample", Image.BILINEAR) not in RESAMPLES),
    ) if does]
    if otherwise:
        raise UserError(f"--model {name}: its image processor {otherwise[0]}, which the scripts do not follow (they "
                        f"resize the whole picture to R x R and scale it by 1/255): pass a checkpoint whose processor "
                        f"does so")
    if not config.get("do_normalize", True):
        return {"resample": config.get("resample", Image.BILINEAR), "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
    stats = {what: np.ravel(config.get(f"image_{what}", ARTICLE_PIXELS[what])) for what in ("mean", "std")}
    if any(len(value) not in (1, 3) or not np.all(np.isfinite(value)) for value in stats.values()) \
            or not np.all(stats["std"] > 0):
        shown = {what: value.tolist() if len(value) <= 3 else f"of {len(value):,} values"
                 for what, value in stats.items()}
        raise UserError(f"--model {name}: its image processor's image_mean {shown['mean']} and image_std "
                        f"{shown['std']} are not one finite value, or one a channel, with std above 0: "
                        f"pass a checkpoint whose processor has them")
    return {"resample": config.get("resample", Image.BILINEAR),
            **{what: tuple(float(v) for v in np.broadcast_to(value, 3)) for what, value in stats.items()}}


def resized_rgb(picture, resolution, flip=False, resample=Image.BILINEAR):
    """The picture (a PIL image or a path) resized to R x R (PIL's filter `resample`): uint8 (R, R, 3), mirrored if
    flip."""
    image = picture if isinstance(picture, Image.Image) else load_rgb(picture)
    array = np.asarray(image.resize((resolution, resolution), resample))
    return array[:, ::-1] if flip else array


def to_pixels(batch, device, pixels=ARTICLE_PIXELS):
    """uint8 (B, R, R, 3) -> float32 (B, 3, R, R) on the device, (x/255 - mean) / std as the image processor: a quarter
    of the bytes travel."""
    x = to_device(batch, device).permute(0, 3, 1, 2).float().contiguous()
    mean, std = channel_constants(tuple(pixels["mean"]), tuple(pixels["std"]), x.device)
    return (x * (1 / 255) - mean) / std


@functools.lru_cache(maxsize=8)
def channel_constants(mean, std, device):
    """(mean, std) as (1, 3, 1, 1) tensors on the device, made once: a copy to a GPU each batch would wait for it."""
    return tuple(torch.tensor(values, device=device).view(1, 3, 1, 1) for values in (mean, std))


def pixels_processor(resolution, pixels=ARTICLE_PIXELS):
    """The image processor that makes these pixels from a picture, as transformers saves and loads it (a model
    saved for from_pretrained and pipeline() carries it)."""
    from transformers import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": resolution, "width": resolution}, resample=pixels["resample"],
                                image_mean=list(pixels["mean"]), image_std=list(pixels["std"]))


def load_all(paths, desc="decoding"):
    """Every picture decoded (RGB), in order; by threads (PIL decodes outside the GIL)."""
    from tqdm import tqdm

    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        return list(tqdm(pool.map(load_rgb, paths), total=len(paths), desc=desc, unit="picture", file=sys.stderr,
                         leave=False))
