"""Stand-ins for timing the scripts where the checkpoints and Imagenette cannot be downloaded.

Randomly initialised ViT-B/16 checkpoints do the same arithmetic as the released ones, and a folder
of generated JPEGs in Imagenette's layout costs the loader what the real pictures cost. Accuracies
from them mean nothing; their times are the scripts' times.

    python benchmarks/timing_standins.py DIR --per-class 393    # 3,930 pictures in each split
"""
import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from standins import imagenette_folder, tiny_vit_classifier, tiny_vit_in21k  # the tests' own stand-ins

from common.imagenette import CLASSES


def vit_b16(directory, in21k):
    """ViT-B/16 with random weights: in the ImageNet-21k layout (pre-logits, no head) or with a 1,000-class head."""
    import torch
    from transformers import ViTForImageClassification, ViTModel

    from vit_part3_setup import table1_config

    torch.manual_seed(0)
    config = table1_config("B", 16)
    config.num_labels = 1000
    model = ViTModel(config, add_pooling_layer=True) if in21k else ViTForImageClassification(config)
    model.save_pretrained(directory)


def one_class(job):
    root, per_class, wnid, seed = job
    imagenette_folder(root, per_class, classes=[wnid], seed=seed)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--per-class", type=int, default=393, help="pictures per class in each split")
    args = parser.parse_args(argv)
    out = Path(args.directory)
    jobs = [(out / "nette", args.per_class, wnid, seed) for seed, (wnid, _, _) in enumerate(CLASSES)]
    with ProcessPoolExecutor() as pool:
        list(pool.map(one_class, jobs))
    vit_b16(out / "vit-b16-in21k", in21k=True)
    vit_b16(out / "vit-b16-1k", in21k=False)
    tiny_vit_in21k(out / "tiny-in21k")
    tiny_vit_classifier(out / "tiny-1k")
    imagenette_folder(out / "tiny-nette", per_class=4)
    print(f"stand-ins in {out}")


if __name__ == "__main__":
    main()
