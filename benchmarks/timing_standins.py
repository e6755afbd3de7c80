"""Stand-ins for timing the scripts where the checkpoints and Imagenette cannot be downloaded.

Randomly initialised ViT-B/16 checkpoints do the same arithmetic as the released ones, a folder of
generated JPEGs in Imagenette's layout costs the loader what the real pictures cost, and a beans-shaped
dataset of the release's size (1,034 training and 133 validation pictures of 500 px) costs the
backbone script's Trainer what beans costs. Accuracies from them mean nothing; their times are the
scripts' times.

    python benchmarks/timing_standins.py DIR --per-class 393    # 3,930 pictures in each split
    python benchmarks/timing_standins.py DIR --per-class 12 --beans-per-class 4 --beans-side 64   # a smoke run
"""
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for common/

from common.data import CLASSES
from common.run import positive_int, script_parser
from job.standins import BEANS_SIZE, beans_folder, imagenette_folder, vit_classifier, vit_in21k


def one_class(job):
    root, per_class, wnid, seed = job
    imagenette_folder(root, per_class, classes=[wnid], seed=seed)


def main(argv=None):
    parser = script_parser(__doc__)
    parser.add_argument("directory", help="where the stand-ins are written")
    parser.add_argument("--per-class", type=positive_int, default=393,
                        help="pictures per class in each split (default: %(default)s)")
    parser.add_argument("--beans-per-class", type=positive_int,
                        help="pictures of each class in each split of the beans stand-in (default: the release's)")
    parser.add_argument("--beans-side", type=positive_int, default=500,
                        help="the beans stand-in's pictures, px (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        import datasets  # noqa: F401 - the beans stand-in needs it; said now, not after the pictures are made
    except ImportError:
        parser.error("the beans stand-in needs the datasets library: pip install datasets")
    out = Path(args.directory)
    jobs = [(out / "nette", args.per_class, wnid, seed) for seed, (wnid, _, _) in enumerate(CLASSES)]
    with ProcessPoolExecutor() as pool:
        list(pool.map(one_class, jobs))
    beans_size = BEANS_SIZE if args.beans_per_class is None else dict.fromkeys(BEANS_SIZE, args.beans_per_class)
    beans_folder(out / "beans", beans_size, side=args.beans_side, smooth=True)
    vit_in21k(out / "vit-b16-in21k", size="B")
    vit_classifier(out / "vit-b16-1k", size="B", processor=True)  # the backbone script loads its image processor
    vit_in21k(out / "tiny-in21k")
    vit_classifier(out / "tiny-1k", processor=True)
    imagenette_folder(out / "tiny-nette", per_class=4)
    print(f"stand-ins in {out}")


if __name__ == "__main__":
    main()
