"""ViT, explained, Part 3: the few-shot metric, a closed-form linear probe on frozen features.

Reproduces the article's section "Metrics: fine-tuning accuracy and few-shot accuracy":
  1. the closed form W = (X^T X + lambda I)^-1 X^T Y by hand on 4 pictures with 2 features;
  2. frozen ViT-B/16 (ImageNet-21k weights) on Imagenette: 1, 5 and 10 pictures per class drawn 5
     times from a pool of 50 per class, three values of lambda, two representations.

    python vit_part3_fewshot.py                  # downloads the checkpoint and Imagenette once
    python vit_part3_fewshot.py --lambdas 0.1 10 --draws 20     # a second run reads the cached features
    python vit_part3_fewshot.py --per-class 20 --compare     # 200 validation pictures, the article's pool

Features are cached in data/features/, keyed by everything that decides them: the checkpoint's
weight file and config files, the resolution, the precision and each picture's name and contents. --no-cache neither
reads nor writes the cache.
"""
from common.start_and_end import ARTICLE, UserError, before_torch_loads, guarded, say

if __name__ == "__main__":  # before torch loads: a Ctrl-C then is one line, as a later one
    before_torch_loads(ARTICLE)

import argparse
import functools
import re
import sys
import time

import numpy as np
import torch

# transformers is imported in the functions that use it: a DataLoader worker (spawn) runs this file's top
# lines again, where it would add about 3 s to every worker's start (docs/performance.md; tests/test_loader.py)
from common.data import DEFAULT_NAME, load_splits, run_model, workers_text
from common.features import cache_key, cached, closed_form
from common.paths import CHECKOUT, FEATURE_CACHE_DIR
from common.pretrained import ARTICLE_PIXELS, checkpoint_config, checkpoint_pixels, load_pretrained
from common.run import (
    EachOnce,
    begin,
    conclude,
    experiment_parser,
    listed,
    nonempty_path,
    nonnegative_float,
    pass_text,
    positive_int,
    section,
    seed_number,
    side_pixels,
    tried,
    values,
    whole_number,
)
from compare.data_set import data_differences
from compare.verdicts import article_values, load_reference
from figures import origin_of
from figures.fewshot import FILE as FIGURE_FILE
from figures.fewshot import fewshot_accuracy
from job.imagenette_archive import download_imagenette

DEFAULT_MODEL = "google/vit-base-patch16-224-in21k"
REPRESENTATIONS = ("pre-logits", "class token")
WHAT = {"pool": "the pool", "val": "the validation pictures"}

# The article's tiny example: pictures A1, A2 (class A) and B1, B2 (class B), two features each.
HAND_X = [[2.0, 1.0], [1.0, 0.0], [0.0, 2.0], [1.0, 3.0]]
HAND_LABELS = [0, 0, 1, 1]
HAND_NEW = [1.5, 0.5]


def draw_shots(labels, shots, draw, seed):
    """Indices of `shots` pictures of each class from the pool, the same for every lambda and representation."""
    rng = np.random.default_rng([seed, shots, draw])
    return np.concatenate([rng.choice(np.flatnonzero(labels == c), shots, replace=False)
                           for c in np.unique(labels)])


def draw_pool(items, per_class, seed):
    """The pool: `per_class` training pictures of each class, drawn with the seed, in a fixed order."""
    rng = np.random.default_rng(seed)
    labels = np.array([label for _, label in items])
    chosen = [np.sort(rng.choice(np.flatnonzero(labels == c), min(per_class, (labels == c).sum()), replace=False))
              for c in np.unique(labels)]
    return [items[i] for i in np.concatenate(chosen)]


def few_shot_accuracies(x_pool, pool_labels, x_val, val_labels, shots, lam, draws, seed):
    """The validation pictures the closed form gets right on each of `draws` random draws of `shots` pictures per
    class."""
    classes = len(np.unique(pool_labels))
    accuracies = []
    for draw in range(draws):
        chosen = draw_shots(pool_labels, shots, draw, seed)
        w = closed_form(x_pool[chosen], pool_labels[chosen], classes, lam)
        right = (x_val @ w[:-1] + w[-1]).argmax(1) == val_labels
        accuracies.append(int(right.sum()))
    return accuracies


# ---------------------------------------------------------------- resources

def extract_features(model, paths, resolution, device, batch_size, desc, autocast=None, pixels=ARTICLE_PIXELS):
    """({"pre-logits", "class token"}: (n, d) float32 each, both from one forward pass per batch; the timing of the
    pass of its own, its workers' start-up in it: common/data.py's run_model)."""
    def both_representations(out):
        return (out.pooler_output.float(),             # tanh(dense(class token))
                out.last_hidden_state[:, 0].float())   # after the final LayerNorm

    batches, timing = run_model(model, paths, resolution, device, batch_size, both_representations, desc, autocast,
                                pixels=pixels)
    parts = zip(*batches, strict=True)  # each representation's batches
    return {name: torch.cat(part).numpy() for name, part in zip(REPRESENTATIONS, parts, strict=True)}, timing


def load_frozen_model(name, device):
    from transformers import ViTModel

    model, info = load_pretrained(ViTModel, name, add_pooling_layer=True, output_loading_info=True)
    if any("pooler" in key for key in info.get("missing_keys", [])):
        raise UserError(f"{name} has no pre-logits layer (pooler): pass an ImageNet-21k checkpoint such as "
                        f"{DEFAULT_MODEL}")
    return model.to(device).eval()


def load_data(args, device):
    """The data folder, the seeded pool of training pictures, the validation pictures and the class names; without
    them, one UserError that names the checkpoint too when it is missing (loaded otherwise only for features not
    cached), so that one line says all an offline run lacks."""
    try:
        # no --data-dir: data/imagenette2-160, downloaded when missing; the validation pictures: a sample
        data = load_splits(args.data_dir or download_imagenette(), {"train": None, "val": args.per_class}, drawn=True)
        pool = draw_pool(data["train"], args.pool, args.seed)  # the article's pool whatever --per-class
        smallest = min(np.bincount([label for _, label in pool]))
        if smallest < max(args.shots):
            raise UserError(f"a class has only {smallest} training pictures in the pool, fewer than --shots "
                            f"{max(args.shots)}: lower --shots")
    except UserError as missing:
        model = tried(load_frozen_model, args.model, device)
        raise UserError(*missing.args, *(model.args if isinstance(model, UserError) else ())) from None
    return {**data, "pool": pool, "training": len(data["train"])}


def load_features(data, args, run):
    """{"pool", "val": {representation: rows}, their labels, "passes" (the timing of each pass computed), "loader",
    "seconds", "source"}: each set of pictures read from the feature cache, else computed in a pass of its own."""
    model = functools.cache(lambda: load_frozen_model(args.model, run.device))  # loaded by the first pass, if any
    pixels = checkpoint_pixels(args.model)  # what its image processor makes
    start, features, sources, started = time.perf_counter(), {"passes": {}}, set(), []
    for desc in ("pool", "val"):
        paths = [path for path, _ in data[desc]]
        def compute(desc=desc, paths=paths):  # a pass of its own, its workers started before it
            arrays, timing = extract_features(model(), paths, args.resolution, run.device, args.batch_size, desc,
                                              run.autocast, pixels)
            started.append((timing.pop("workers"), timing.pop("start-up seconds")))
            features["passes"][desc] = timing
            return arrays

        key = None if args.no_cache else cache_key(desc, args.model, paths, data["root"], resolution=args.resolution,
                                                   precision=args.precision, pixels=pixels)  # all that decides them
        features[desc], source = cached(compute, key, dict.fromkeys(REPRESENTATIONS, len(paths)), FEATURE_CACHE_DIR)
        features[f"{desc} labels"] = np.array([label for _, label in data[desc]])
        sources.add(source)
    features["loader"] = workers_text(started[0][0], sum(seconds for _, seconds in started)) if started else None
    return {**features, "seconds": time.perf_counter() - start,
            "source": "read from the cache" if sources == {"cache"} else "computed"}


# ---------------------------------------------------------------- sections

@section
def section_by_hand(report):
    """1. the closed form by hand"""
    report.print("\n== 1. the closed form by hand: 4 pictures, 2 features, K = 2 classes, lambda = 1 ==")
    x, y = np.array(HAND_X), 2 * np.eye(2)[HAND_LABELS] - 1  # +1 in the column of the picture's class, -1 elsewhere
    regularised = x.T @ x + np.eye(2)
    w = closed_form(x, HAND_LABELS, 2, 1.0, bias=False)
    new_scores, training_scores = np.array(HAND_NEW) @ w, x @ w
    right_side = all(np.sign(training_scores[i]) @ np.sign(y[i]) == 2 for i in range(len(x)))
    gram, det, x_t_y = x.T @ x, round(np.linalg.det(regularised), 6), x.T @ y
    inverse = np.linalg.inv(regularised)  # printed for the pencil check; the fit itself solves
    report.print(f"  X (rows = pictures A1, A2, B1, B2) = {listed(x)}")
    report.print(f"  Y (targets in {{-1, 1}}: class A = [1, -1], class B = [-1, 1]) = {listed(y)}")
    report.print(f"  X^T X = {listed(gram)}   + lambda I = {listed(regularised)}   det = {det:g}")
    report.print(f"  (X^T X + I)^-1 = {listed(inverse)}")
    report.print(f"  X^T Y = {listed(x_t_y)}")
    report.print(f"  W = (X^T X + I)^-1 X^T Y = {listed(w)}")
    report.print(f"  new picture x = {listed(HAND_NEW)}: scores x W = {listed(new_scores)} -> class "
                 f"{'AB'[int(new_scores.argmax())]}")
    report.print(f"  training scores X W = {listed(training_scores)} ("
                 f"{'all on the right side of 0' if right_side else 'not all on the right side of 0'})",
                 {"X": x, "Y": y, "X^T X": gram, "X^T X + I": regularised, "det": det, "inverse": inverse,
                  "X^T Y": x_t_y, "W": w, "new picture": HAND_NEW, "new picture scores": new_scores,
                  "training scores": training_scores})


@section
def section_frozen(report, data, args, run):
    """2. few-shot accuracy"""
    each = np.bincount([label for _, label in data["pool"]])  # --pool, or all a class holds
    pool = f"{each.min()}" if each.min() == each.max() else f"{each.min()} to {each.max()}"
    report.print(f"\n== 2. frozen {'ViT-B/16 (ImageNet-21k weights)' if args.model == DEFAULT_MODEL else args.model}, "
                 f"device {run.device.type}: features of {len(data['pool'])} training pictures (a pool of {pool} "
                 f"per class) and {len(data['val'])} validation pictures ==",
                 {"pool pictures": len(data["pool"]), "validation pictures": len(data["val"])})
    config = None if args.resolution == 224 else checkpoint_config(args.model)  # 224: a multiple of 14, 16 and 32
    if config is not None and args.resolution % config.patch_size:  # the patch embedding's stride steps over the rest
        report.print(f"  --resolution {args.resolution} is not a multiple of the patch size {config.patch_size}: the "
                     f"last {args.resolution % config.patch_size} pixels of each side fall outside the patches")
    features = load_features(data, args, run)
    accuracies = {(name, lam, shots): few_shot_accuracies(features["pool"][name], features["pool labels"],
                                                          features["val"][name], features["val labels"], shots, lam,
                                                          args.draws, args.seed)
                  for name in REPRESENTATIONS for lam in args.lambdas for shots in args.shots}
    passes = "".join(f"; {WHAT[desc]} {pass_text(timing)}" for desc, timing in features["passes"].items())
    passes += f"; the loader: {features['loader']}" if features["loader"] else ""
    cache = FEATURE_CACHE_DIR.relative_to(CHECKOUT) if FEATURE_CACHE_DIR.is_relative_to(CHECKOUT) else FEATURE_CACHE_DIR
    width = features["pool"]["pre-logits"].shape[1]
    report.print(f"  features {features['source']} in {features['seconds']:.1f} s ({cache}/; "
                 f"{'--no-cache: the cache was neither read nor written' if args.no_cache else '--no-cache recomputes'}"
                 f"){passes}")
    report.print(f"  representation \"pre-logits\": the tanh layer on the [class] token, {width} numbers;  \"class "
                 "token\": the final LayerNorm output (Eq. 4)")
    report.print(f"  accuracy on the {len(data['val']):,} validation pictures, mean +- std over {args.draws} random "
                 "draws of the training pictures",
                 {f"{desc} features": timing for desc, timing in features["passes"].items()}
                 | {"features seconds": features["seconds"], "feature width": width,
                    "validation pictures (table)": len(data["val"])})
    for representation in REPRESENTATIONS:
        for lam in args.lambdas:
            cells, numbers, counts = [], {}, {}
            for shots in args.shots:
                rights, of = accuracies[representation, lam, shots], len(features["val labels"])
                cell = [100 * (right / of) for right in rights]  # per cent right, each draw
                name = f"{representation} lambda {lam:g} {shots}-shot"  # the mean over the draws, each draw's count
                mean, std = np.mean(cell), np.std(cell)  # std: ddof=0
                cells.append(f"{shots}-shot {mean:5.1f} +- {std:4.1f}%")
                numbers |= {f"{name} mean": mean, f"{name} std": std}
                counts[f"{name} mean"] = rights, of
            report.print(f"  {representation:<11} lambda {lam:>6g}:  {'   '.join(cells)}", numbers, counts)
    classes = len(data["names"])
    report.print(f"  chance is {100 / classes:.0f}%; 1-shot means {classes} training pictures in total, one per class",
                 {"chance (%)": 100 / classes, "1-shot pictures": classes})
    if args.plots:
        fewshot_accuracy(values(report), article_values("fewshot"), args.plots, say, args.draws,
                         origin_of(args, DEFAULT_NAME))
    return features


@section
def section_one_solve(report, data, features, args):
    """2b. one solve in detail"""
    names = data["names"]
    shots = 5 if 5 in args.shots else args.shots[0]
    lam = 1.0 if 1.0 in args.lambdas else args.lambdas[0]
    pool_labels, val_labels = features["pool labels"], features["val labels"]
    chosen = draw_shots(pool_labels, shots, 0, args.seed)
    x = features["pool"]["pre-logits"][chosen]
    w = closed_form(x, pool_labels[chosen], len(names), lam)
    scores = features["val"]["pre-logits"] @ w[:-1] + w[-1]
    predicted = scores.argmax(1)
    per_class = [100 * np.mean(predicted[val_labels == c] == c) if (val_labels == c).any() else None
                 for c in range(len(names))]  # a --per-class draw may hold none of a class
    x_shape, y_shape = (len(x), x.shape[1] + 1), (len(x), len(names))  # X with the bias column
    report.print(f"  {shots}-shot, draw 0, pre-logits, lambda {lam:g}: X is {x_shape} ({len(x)} pictures x "
                 f"{x.shape[1]} features + bias), Y is {y_shape}, W is {w.shape}; one solve of a {w.shape[0]}x"
                 f"{w.shape[0]} system",
                 {"X shape": x_shape, "solve pictures": len(x), "solve features": x.shape[1], "Y shape": y_shape,
                  "W shape": w.shape, "system size": w.shape[0]})
    classes = ", ".join(f"{name} {accuracy:.0f}%" if accuracy is not None else f"{name} none drawn"
                        for name, accuracy in zip(names, per_class, strict=True))
    report.print(f"  per-class accuracy ({shots}-shot, draw 0): {classes}")
    report.print(f"  scores of the first validation picture (a {names[val_labels[0]]}): "
                 f"{' '.join(f'{s:+.2f}' for s in scores[0])}  -> class {names[predicted[0]]}",
                 {f"per-class {name}": accuracy for name, accuracy in zip(names, per_class, strict=True)
                  if accuracy is not None} | {f"first picture score {i}": s for i, s in enumerate(scores[0], 1)})


ARTICLE_FLAGS = {"pool": ("pool", 50), "draws": ("draws", 5), "resolution": ("resolution", 224),
                 "precision": ("precision", "fp32")}
ARTICLE_TABLE = {"shots": [1, 5, 10], "lambdas": [0.01, 1.0, 100.0]}
draw_count = functools.partial(whole_number, low=1, high=1000,  # argparse type: 200 x the article's 5, minutes
                               refusal="is not a number of draws from 1 to 1,000")


def table_differences(args, names):
    """--shots and --lambdas other than the article's: the accuracy table's cells this run does not fill. "moves":
    False, since a draw is seeded by [seed, shots, draw]: a cell filled depends on its own shots and lambda alone."""
    cells = {name: {"lambdas": float(cell[1]), "shots": int(cell[2])} for name in names
             if (cell := re.fullmatch(r".* lambda (\S+) (\d+)-shot (?:mean|std)", name))}
    differences = {}
    for dest, article in ARTICLE_TABLE.items():
        values = getattr(args, dest)
        if sorted(values) != sorted(article):
            shown = " ".join(f"{value:g}" for value in values)
            differences[dest] = {"flag": f"--{dest} {shown}", "moves": False,
                                 "removes": [name for name, cell in cells.items() if cell[dest] not in values],
                                 "why": f"--{dest} {shown}: the article's are {', '.join(f'{v:g}' for v in article)}"}
    return differences


def setup_differences(data, run, known):
    """How this run's setup differs from the article's: the checkpoint, the pictures (data: a UserError when none could
    be loaded; the pool is drawn from every training picture of the folder: a partial copy moves it), the pool, draws,
    the solve shown."""
    args = run.args
    data = None if isinstance(data, UserError) else data  # said by sections 2 and 2b: the counts are unknown
    pool_source = argparse.Namespace(data_dir=args.data_dir, per_class=None)  # all training pictures: no --per-class
    differences = {**data_differences(args, {"val": len(data["val"]) if data else None}, drawn=True),
                   **data_differences(pool_source, {"train": data["training"] if data else None}),
                   **table_differences(args, load_reference("fewshot"))}
    if 5 not in args.shots:
        differences["solve shots"] = {"flag": f"--shots {' '.join(map(str, args.shots))}",
                                      "why": f"--shots without 5: the solve in detail is {args.shots[0]}-shot"}
    if 1.0 not in args.lambdas:
        differences["solve lambda"] = {"flag": f"--lambdas {' '.join(f'{lam:g}' for lam in args.lambdas)}",
                                       "why": "--lambdas without 1: the solve in detail has lambda "
                                              f"{args.lambdas[0]:g}"}
    return differences


def main(argv=None):
    parser = experiment_parser(__doc__, model=DEFAULT_MODEL, model_help="with its pre-logits layer",
        per_class_help="keep N validation pictures a class on average, drawn at random from the whole split with a "
                       "fixed seed (default: all); the pool is drawn from every training picture, as in a full run",
        batch_help="pictures per batch of the passes that extract the frozen features (the pool's pictures and the "
                   "validation pictures)")
    parser.add_argument("--shots", type=positive_int, nargs="+", action=EachOnce, default=ARTICLE_TABLE["shots"],
                        help="pictures per class (default: %(default)s)")
    parser.add_argument("--lambdas", type=nonnegative_float, nargs="+", action=EachOnce,
                        default=ARTICLE_TABLE["lambdas"],
                        help="ridge penalties, finite and >= 0 (0: plain least squares, the minimum-norm solution when "
                             "pictures are fewer than features) (default: %(default)s)")
    parser.add_argument("--draws", type=draw_count, default=ARTICLE_FLAGS["draws"][1],
                        help="random draws of the training pictures per setting (default: %(default)s)")
    parser.add_argument("--pool", type=positive_int, default=ARTICLE_FLAGS["pool"][1],
                        help="training pictures per class to draw from (default: %(default)s)")
    parser.add_argument("--seed", type=seed_number, default=0, help="the pool and the draws (default: %(default)s)")
    parser.add_argument("--resolution", type=side_pixels, default=ARTICLE_FLAGS["resolution"][1],
                        help="pixels on a side (default: %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write data/features/")
    parser.add_argument("--plots", type=nonempty_path, metavar="DIR",
                        help="save accuracy against shots as PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if max(args.shots) > args.pool:
        parser.error(f"--shots {max(args.shots)} is more than the pool of {args.pool} per class")
    run, report = begin("fewshot", args, figures=(FIGURE_FILE,))
    section_by_hand(report)
    data = tried(load_data, args, run.device)
    features = section_frozen(report, data, args, run)
    section_one_solve(report, data, features, args)
    return conclude(run, report, functools.partial(setup_differences, data), DEFAULT_MODEL, ARTICLE_FLAGS)


if __name__ == "__main__":
    sys.exit(guarded(main))
