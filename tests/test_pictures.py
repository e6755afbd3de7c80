"""common/data.py: the pixels a checkpoint's image processor makes, followed or refused in one line; the followed
ones against transformers' own processor with the same settings."""
import numpy as np
import pytest
import torch

from common.data import list_split, load_rgb, resized_rgb, to_pixels
from common.pretrained import ARTICLE_PIXELS, processor_pixels
from common.start_and_end import UserError
from job.standins import HUB_PROCESSOR

IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
# (its preprocessor_config.json, the pixels the scripts make, or the refusal's words after "its image processor")
PROCESSORS = [
    (None, ARTICLE_PIXELS),  # none: the article's
    (HUB_PROCESSOR, ARTICLE_PIXELS),  # the article's checkpoints' own
    ({**HUB_PROCESSOR, **IMAGENET, "resample": 3},
     {"resample": 3, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}),
    ({**HUB_PROCESSOR, "do_normalize": False}, {"resample": 2, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}),
    ({**HUB_PROCESSOR, "do_center_crop": True, "crop_size": 224}, " crops the picture (do_center_crop)"),
    ({**HUB_PROCESSOR, "do_resize": False}, " does not resize it (do_resize false)"),
    ({**HUB_PROCESSOR, "rescale_factor": 1 / 127.5}, " does not rescale by 1/255"),
    ({**HUB_PROCESSOR, "do_rescale": False}, " does not rescale by 1/255"),
    ({**HUB_PROCESSOR, "resample": 7}, " resamples with filter 7, not one of PIL's"),
    ({**HUB_PROCESSOR, "image_mean": 0.5, "image_std": 0.25}, {"resample": 2, "mean": (0.5, 0.5, 0.5),
                                                                "std": (0.25, 0.25, 0.25)}),  # one for all channels
    ({**HUB_PROCESSOR, "image_mean": [0.5, 0.5]}, "'s image_mean [0.5, 0.5] and image_std [0.5, 0.5, 0.5] are not"),
    ({**HUB_PROCESSOR, "image_std": [0.5, 0.0, 0.5]}, "'s image_mean [0.5, 0.5, 0.5] and image_std [0.5, 0.0, 0.5]"),
    ({**HUB_PROCESSOR, "resample": [2]}, " has a value of the wrong type"),
    ({**HUB_PROCESSOR, "rescale_factor": None}, " has a value of the wrong type"),
    ({**HUB_PROCESSOR, "image_mean": None}, " has a value of the wrong type"),
]


@pytest.mark.parametrize("config,expected", PROCESSORS)
def test_a_checkpoints_image_processor_is_followed_or_refused_in_one_line(config, expected):
    if isinstance(expected, dict):
        assert processor_pixels(config, "m") == expected
        return
    with pytest.raises(UserError) as refused:
        processor_pixels(config, "m")
    assert str(refused.value).startswith(f"--model m: its image processor{expected}")
    assert "\n" not in str(refused.value)


def test_followed_pixels_are_the_library_processors(pictures, resolution=72):
    """ImageNet's statistics and bicubic resizing: resized_rgb on the workers, to_pixels on the device, equal
    transformers' ViTImageProcessorPil with the same settings."""
    from transformers import ViTImageProcessorPil

    config = {**HUB_PROCESSOR, **IMAGENET, "resample": 3}
    pixels = processor_pixels(config, "m")
    images = [load_rgb(path) for path, _ in list_split(pictures, "val")[:3]]
    batch = torch.from_numpy(np.stack([resized_rgb(image, resolution, resample=pixels["resample"])
                                       for image in images]))
    ours = to_pixels(batch, torch.device("cpu"), pixels).numpy()
    library = ViTImageProcessorPil(size={"height": resolution, "width": resolution}, resample=3, **IMAGENET)
    assert np.abs(ours - library(images=images, return_tensors="np")["pixel_values"]).max() < 1e-5
