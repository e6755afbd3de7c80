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


def vit_classifier(directory, num_labels=1000, seed=0, size="tiny", processor=False, **overrides):
    """An ImageNet-1k-shaped ViTForImageClassification of random weights, saved with save_pretrained.

    processor: also save the image processor of google/vit-base-patch16-224 (resize to the model's size,
    rescale to [0, 1], normalise with mean 0.5 and std 0.5), for code that loads AutoImageProcessor.
    """
    import torch
    from transformers import ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(seed)
    model = ViTForImageClassification(vit_config(size, num_labels, **overrides))
    with torch.no_grad():  # position rows with structure, as a trained table has
        model.vit.embeddings.position_embeddings.normal_(0, 0.1)
    model.save_pretrained(directory)
    if processor:
        side = model.config.image_size
        ViTImageProcessor(size={"height": side, "width": side}, image_mean=[0.5] * 3,
                          image_std=[0.5] * 3).save_pretrained(directory)
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


BEANS_CLASSES = ("angular_leaf_spot", "bean_rust", "healthy")
BEANS_CARD = """---
pretty_name: Beans (stand-in)
dataset_info:
  features:
  - name: image_file_path
    dtype: string
  - name: image
    dtype: image
  - name: labels
    dtype:
      class_label:
        names:
          '0': angular_leaf_spot
          '1': bean_rust
          '2': healthy
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
  - split: validation
    path: data/validation-*
  - split: test
    path: data/test-*
---
A stand-in for AI-Lab-Makerere/beans in the Hub's own file layout: generated pictures, not leaves.
"""


# The released dataset's pictures of each class (angular_leaf_spot, bean_rust, healthy): 1,034 training, 133
# validation and 128 test pictures of 500 x 500 px.
BEANS_SIZE = {"train": (345, 348, 341), "validation": (44, 45, 44), "test": (43, 43, 42)}


def smooth_picture(rng, side):
    """A side x side picture of smooth random colour: it decodes like a photo, not like noise."""
    small = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
    return Image.fromarray(small).resize((side, side), Image.BICUBIC)


def beans_folder(root, per_class=None, seed=0, side=64, smooth=False):
    """A copy of AI-Lab-Makerere/beans's files, in its layout, with generated pictures.

    The Hub stores the dataset as README.md (its card: features and splits) and one parquet file per
    split, data/{train,validation,test}-00000-of-00001.parquet, with the columns image_file_path
    (string), image (JPEG bytes) and labels (ClassLabel angular_leaf_spot, bean_rust, healthy).
    per_class: {split: pictures of each class, or a count per class (BEANS_SIZE is the release's)}; the
    pictures are JPEGs of side x side pixels, noisy, or smooth (photo-like to decode, for timing runs).
    """
    import io

    from datasets import ClassLabel, Dataset, Features, Image, Value

    per_class = per_class or {"train": 4, "validation": 2, "test": 1}
    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / "data").mkdir(parents=True, exist_ok=True)
    features = Features({"image_file_path": Value("string"), "image": Image(),
                         "labels": ClassLabel(names=list(BEANS_CLASSES))})
    for split, counts in per_class.items():
        counts = [counts] * len(BEANS_CLASSES) if isinstance(counts, int) else counts
        rows = {"image_file_path": [], "image": [], "labels": []}
        for k, (name, count) in enumerate(zip(BEANS_CLASSES, counts)):
            for i in range(count):
                buffer = io.BytesIO()
                image = smooth_picture(rng, side) if smooth else picture(rng, 70 * k, width=side, height=side)
                image.save(buffer, format="JPEG", quality=90)
                path = f"{split}/{name}/{name}_{split}.{i}.jpg"
                rows["image_file_path"].append(path)
                rows["image"].append({"bytes": buffer.getvalue(), "path": path})
                rows["labels"].append(k)
        Dataset.from_dict(rows, features=features).to_parquet(root / "data" / f"{split}-00000-of-00001.parquet")
    (root / "README.md").write_text(BEANS_CARD)
    return root
