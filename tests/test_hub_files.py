"""The project's loaders against the Hub's files as they are: the image processor's backend, the stand-ins' configs."""
import json

import numpy as np
import torch
from PIL import Image

from common.data import resized_rgb, to_pixels
from common.pretrained import ARTICLE_PIXELS
from job.standins import vit_classifier, vit_in21k
from vit_backbone import image_processor

# The fields of the Hub's config.json of google/vit-base-patch16-224-in21k (transformers 4.13.0.dev0 wrote it):
# no id2label, no label2id, no num_labels.
HUB_IN21K_FIELDS = {"architectures", "attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob", "hidden_size",
                    "image_size", "initializer_range", "intermediate_size", "layer_norm_eps", "model_type",
                    "num_attention_heads", "num_channels", "num_hidden_layers", "patch_size", "qkv_bias",
                    "transformers_version"}


def test_the_processor_is_pils_even_where_the_library_would_pick_torchvisions(tmp_path, monkeypatch):
    """transformers picks the torchvision backend wherever torchvision is installed, unless told; here it is made to
    believe torchvision is installed, its torchvision class a stand-in, so that the test holds the same with or
    without torchvision: the library's own choice is the stand-in, the project's loader's the PIL class."""
    from transformers import AutoImageProcessor, ViTImageProcessorPil
    from transformers.models.auto import image_processing_auto as auto

    class TorchvisionViT(ViTImageProcessorPil):
        """What ViTImageProcessor (the torchvision backend) would be."""

    real = auto.get_image_processor_class_from_name
    monkeypatch.setattr(auto, "is_torchvision_available", lambda: True)
    monkeypatch.setattr(auto, "get_image_processor_class_from_name",
                        lambda name: TorchvisionViT if name == "ViTImageProcessor" else real(name))
    folder = vit_classifier(tmp_path / "vit", image_size=32, processor=True)
    assert type(AutoImageProcessor.from_pretrained(folder)) is TorchvisionViT
    assert type(image_processor(str(folder))) is ViTImageProcessorPil


def test_the_loaded_processor_makes_the_pixels_of_the_batched_path(tmp_path):
    """docs/data.md: within 1e-6 (float32's rounding) of resized_rgb then to_pixels, with the Hub's processor file
    (the old feature extractor's fields, size 32: resize to 32 x 32, bilinear, then (x/255 - 0.5) / 0.5)."""
    processor = image_processor(str(vit_classifier(tmp_path / "vit", image_size=32, processor=True)))
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)) for h, w in ((40, 60), (70, 45))]
    library = processor(images, return_tensors="np")["pixel_values"]
    ours = to_pixels(torch.from_numpy(np.stack([resized_rgb(image, 32) for image in images])), torch.device("cpu"),
                     ARTICLE_PIXELS)
    assert library.shape == (2, 3, 32, 32) and np.abs(ours.numpy() - library).max() < 1e-6


def test_the_in21k_standin_has_the_hubs_config_fields(tmp_path):
    """No labels at all, as the file a user downloads: transformers then reads num_labels 2, its default."""
    from transformers import AutoConfig

    folder = vit_in21k(tmp_path / "in21k")
    written = json.loads((folder / "config.json").read_text())
    assert set(written) == HUB_IN21K_FIELDS and written["architectures"] == ["ViTModel"]
    config = AutoConfig.from_pretrained(folder)
    assert config.num_labels == 2 and config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    assert (config.hidden_size, config.num_hidden_layers) == (32, 2)  # the stand-in's sizes
