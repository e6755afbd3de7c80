"""Stand-ins for timing the scripts where the checkpoints and Imagenette cannot be downloaded.

Randomly initialised ViT-B/16 checkpoints do the same arithmetic as the released ones, and a folder
of generated JPEGs in Imagenette's layout costs the loader what the real pictures cost. Accuracies
from them mean nothing; their times are the scripts' times.

    python benchmarks/timing_standins.py DIR --per-class 393    # 3,930 pictures in each split
"""
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for common/

from common.cli import positive_int, script_parser
from common.imagenette import CLASSES
from common.standins import imagenette_folder, vit_classifier, vit_in21k


def one_class(job):
    root, per_class, wnid, seed = job
    imagenette_folder(root, per_class, classes=[wnid], seed=seed)


def main(argv=None):
    parser = script_parser(__doc__)
    parser.add_argument("directory", help="where the stand-ins are written")
    parser.add_argument("--per-class", type=positive_int, default=393, help="pictures per class in each split")
    args = parser.parse_args(argv)
    out = Path(args.directory)
    jobs = [(out / "nette", args.per_class, wnid, seed) for seed, (wnid, _, _) in enumerate(CLASSES)]
    with ProcessPoolExecutor() as pool:
        list(pool.map(one_class, jobs))
    vit_in21k(out / "vit-b16-in21k", size="B")
    vit_classifier(out / "vit-b16-1k", size="B")
    vit_in21k(out / "tiny-in21k")
    vit_classifier(out / "tiny-1k")
    imagenette_folder(out / "tiny-nette", per_class=4)
    print(f"stand-ins in {out}")


if __name__ == "__main__":
    main()
