"""Stand-ins for what cannot be downloaded here: ViT checkpoints with random weights, Imagenette-shaped JPEGs.

The tests, the benchmark and the timing runs build them; numbers computed on them say nothing about
the released weights, only that the code runs and what it costs.
"""
from pathlib import Path

import numpy as np
from PIL import Image

from common.imagenette import CLASSES

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 4,
        "patch_size": 16, "image_size": 224}


def vit_config(size="tiny", num_labels=1000, **overrides):
    """A ViTConfig: "tiny" (2 layers of width 32) or a Table 1 size ("B", "L", "H") with patch 16."""
    from transformers import ViTConfig

    from common.compute import table1_config

    config = ViTConfig(num_labels=num_labels, **TINY) if size == "tiny" else table1_config(size, 16)
    config.num_labels = num_labels
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def vit_classifier(directory, num_labels=1000, seed=0, size="tiny", **overrides):
    """An ImageNet-1k-shaped ViTForImageClassification of random weights, saved with save_pretrained."""
    import torch
    from transformers import ViTForImageClassification

    torch.manual_seed(seed)
    model = ViTForImageClassification(vit_config(size, num_labels, **overrides))
    with torch.no_grad():  # position rows with structure, as a trained table has
        model.vit.embeddings.position_embeddings.normal_(0, 0.1)
    model.save_pretrained(directory)
    return Path(directory)


def vit_in21k(directory, seed=0, size="tiny", **overrides):
    """A ViTModel with its pooler (the pre-logits layer), the layout of the ImageNet-21k releases."""
    import torch
    from transformers import ViTModel

    torch.manual_seed(seed)
    ViTModel(vit_config(size, **overrides), add_pooling_layer=True).save_pretrained(directory)
    return Path(directory)


def picture(rng, tint, width=None, height=160):
    """A JPEG-like picture: a class-dependent colour with noise, `height` px high, 160 to 240 wide."""
    width = width or int(rng.integers(160, 240))
    base = np.full((height, width, 3), tint, dtype=np.uint8)
    return Image.fromarray(np.clip(base + rng.integers(0, 60, size=base.shape), 0, 255).astype(np.uint8))


def imagenette_folder(root, per_class=2, classes=None, seed=0, splits=("train", "val")):
    """{train,val}/<wnid>/*.JPEG of generated 160-px pictures; in each class one grayscale and one CMYK."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    wnids = classes or [wnid for wnid, _, _ in CLASSES]
    for split in splits:
        for k, wnid in enumerate(wnids):
            folder = root / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                image = picture(rng, 25 * k)
                if i % 3 == 1:
                    image = image.convert("L")
                elif i % 3 == 2:
                    image = image.convert("CMYK")
                image.save(folder / f"{wnid}_{i:04d}.JPEG", quality=90)
    return root


def smooth_pictures(folder, count, seed=0):
    """count JPEGs 160 px high, 160 to 240 wide, of smooth random colour (they decode like real photos)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        small = rng.integers(0, 256, size=(10, int(rng.integers(10, 15)), 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((small.shape[1] * 16, 160), Image.BICUBIC)
        path = Path(folder) / f"picture_{i:05d}.JPEG"
        image.save(path, quality=90)
        paths.append(path)
    return paths
