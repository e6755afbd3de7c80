"""Stand-ins the tests build themselves: tiny ViT checkpoints and an Imagenette-shaped folder."""
from pathlib import Path

import numpy as np
from PIL import Image

from common.imagenette import CLASSES

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 4,
        "patch_size": 16, "image_size": 224}


def tiny_vit_classifier(directory, num_labels=1000, seed=0):
    """An ImageNet-1k-shaped ViTForImageClassification (1,000 labels), saved with save_pretrained."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    model = ViTForImageClassification(ViTConfig(num_labels=num_labels, **TINY))
    with torch.no_grad():  # position rows with structure, as a trained table has
        model.vit.embeddings.position_embeddings.normal_(0, 0.1)
    model.save_pretrained(directory)
    return Path(directory)


def tiny_vit_in21k(directory, seed=0):
    """A ViTModel with its pooler (the pre-logits layer), the layout of the ImageNet-21k releases."""
    import torch
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(seed)
    ViTModel(ViTConfig(**TINY), add_pooling_layer=True).save_pretrained(directory)
    return Path(directory)


def imagenette_folder(root, per_class=2, classes=None, seed=0):
    """{train,val}/<wnid>/*.JPEG of generated 160-px pictures; in each class one grayscale and one CMYK."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    wnids = classes or [wnid for wnid, _, _ in CLASSES]
    for split in ("train", "val"):
        for k, wnid in enumerate(wnids):
            folder = root / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                width = int(rng.integers(160, 240))
                base = np.full((160, width, 3), 25 * k, dtype=np.uint8)  # a class-dependent colour
                pixels = np.clip(base + rng.integers(0, 60, size=base.shape), 0, 255).astype(np.uint8)
                image = Image.fromarray(pixels)
                if i % 3 == 1:
                    image = image.convert("L")
                elif i % 3 == 2:
                    image = image.convert("CMYK")
                image.save(folder / f"{wnid}_{i:04d}.JPEG", quality=90)
    return root
