"""ViT, explained, Part 3: the few-shot metric, a closed-form linear probe on frozen features.

Reproduces the article's section "Metrics: fine-tuning accuracy and few-shot accuracy":
  1. the closed form W = (X^T X + lambda I)^-1 X^T Y by hand on 4 pictures with 2 features;
  2. frozen ViT-B/16 (ImageNet-21k weights) on Imagenette: 1, 5 and 10 pictures per class drawn 5
     times from a pool of 50 per class, three values of lambda, two representations.

    python vit_part3_fewshot.py                  # downloads the checkpoint (346 MB) and Imagenette (94 MB) once
    python vit_part3_fewshot.py --lambdas 0.1 10 --draws 20     # a second run reads the cached features
    python vit_part3_fewshot.py --per-class 20 --compare

Features are cached in data/features/ (keyed by checkpoint, resolution and the exact list of
pictures), so only the first run pays for the forward passes.
"""
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from common.checkpoints import load_pretrained
from common.cli import (
    add_common_arguments,
    add_data_arguments,
    finish,
    guarded,
    positive_int,
    run_sections,
    script_parser,
    side_pixels,
)
from common.device import pick_device, set_precision
from common.errors import UserError
from common.imagenette import class_names, ensure_imagenette, list_split
from common.inference import run_model
from common.printing import header, line, short_list

DEFAULT_MODEL = "google/vit-base-patch16-224-in21k"
CACHE_DIR = Path(__file__).resolve().parent / "data" / "features"
REPRESENTATIONS = ("pre-logits", "class token")

# The article's tiny example: pictures A1, A2 (class A) and B1, B2 (class B), two features each.
HAND_X = [[2.0, 1.0], [1.0, 0.0], [0.0, 2.0], [1.0, 3.0]]
HAND_LABELS = [0, 0, 1, 1]
HAND_NEW = [1.5, 0.5]


def targets(labels, classes):
    """Y (n, K): +1 in the column of each picture's class, -1 in the other K - 1 columns."""
    y = -np.ones((len(labels), classes))
    y[np.arange(len(labels)), labels] = 1
    return y


def closed_form(x, y, lam):
    """W = (X^T X + lambda I)^-1 X^T Y, found by one linear solve of (X^T X + lambda I) W = X^T Y.

    It minimises ||X W - Y||^2 + lambda ||W||^2: the gradient 2 X^T (X W - Y) + 2 lambda W is 0 there.
    """
    return np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ y)


def with_bias(features):
    """X = [features, 1]: the bias column."""
    return np.hstack([features, np.ones((len(features), 1))])


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


# ---------------------------------------------------------------- features and their cache

def extract_features(model, items, resolution, device, batch_size, desc, autocast=None):
    """{"pre-logits", "class token"}: (n, d) float32 each, both from one forward pass per batch."""
    def take(out):
        return (out.pooler_output.float().cpu().numpy(),             # tanh(dense(class token))
                out.last_hidden_state[:, 0].float().cpu().numpy())   # after the final LayerNorm

    kept = run_model(model, [path for path, _ in items], resolution, device, batch_size, take, desc, autocast)
    return {name: np.concatenate(part) for name, part in zip(REPRESENTATIONS, zip(*kept))}


def cache_key(model_name, resolution, precision, items, root):
    """A short hash, and the full description stored beside the features to check on reading."""
    pictures = [str(Path(path).relative_to(root)) for path, _ in items]
    weights = Path(model_name) / "model.safetensors"
    version = [weights.stat().st_size, weights.stat().st_mtime_ns] if weights.is_file() else None  # a local dir
    text = json.dumps({"model": model_name, "weights": version, "resolution": resolution, "precision": precision,
                       "pictures": pictures})
    return hashlib.sha256(text.encode()).hexdigest()[:20], text


def cached_features(compute, key, items, desc, use_cache=True):
    """(features, source): from data/features/<desc>-<hash>.npz when it matches exactly, else compute()d and saved."""
    short_key, description = key
    path = CACHE_DIR / f"{desc}-{short_key}.npz"
    if use_cache and path.exists():
        try:
            with np.load(path) as stored:
                features = {name: stored[name] for name in REPRESENTATIONS}
                if str(stored["key"]) == description and all(len(f) == len(items) for f in features.values()):
                    return features, "cache"
        except Exception:  # noqa: BLE001, S110 - a truncated or foreign file is recomputed, never used
            pass
    features = compute()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part.npz")
    np.savez(part, key=description, **features)
    part.rename(path)
    return features, "computed"


# ---------------------------------------------------------------- sections

def section_by_hand():
    header("1. the closed form by hand: 4 pictures, 2 features, K = 2 classes, lambda = 1")
    x = np.array(HAND_X)
    y = targets(HAND_LABELS, 2)
    gram = x.T @ x
    regularised = gram + np.eye(2)
    det = np.linalg.det(regularised)
    inverse = np.linalg.inv(regularised)  # printed for the pencil check; the fit itself solves
    w = closed_form(x, y, 1.0)
    new_scores = np.array(HAND_NEW) @ w
    train_scores = x @ w
    line(f"X (rows = pictures A1, A2, B1, B2) = {short_list(x)}")
    line(f"Y (targets in {{-1, 1}}: class A = [1, -1], class B = [-1, 1]) = {short_list(y)}")
    line(f"X^T X = {short_list(gram)}   + lambda I = {short_list(regularised)}   det = {round(det, 6):g}")
    line(f"(X^T X + I)^-1 = {short_list(inverse)}")
    line(f"X^T Y = {short_list(x.T @ y)}")
    line(f"W = (X^T X + I)^-1 X^T Y = {short_list(w)}")
    line(f"new picture x = {short_list(HAND_NEW)}: scores x W = {short_list(new_scores)} -> class "
         f"{'AB'[int(new_scores.argmax())]}")
    right_side = all(np.sign(train_scores[i]) @ np.sign(y[i]) == 2 for i in range(len(x)))
    line(f"training scores X W = {short_list(train_scores)} "
         f"({'all on the right side of 0' if right_side else 'not all on the right side of 0'})")
    results = {"det": det, "W 11": w[0, 0], "W 21": w[1, 0], "new score A": new_scores[0]}
    results.update({f"inverse {i + 1}{j + 1}": inverse[i, j] for i in range(2) for j in range(2)})
    results.update({f"training score {i + 1}": train_scores[i, 0] for i in range(4)})
    return results


def section_frozen(args, device, model_loader, autocast):
    root = ensure_imagenette(args.data_dir)
    pool = draw_pool(list_split(root, "train", args.per_class), args.pool, args.seed)
    smallest = min(np.bincount([label for _, label in pool]))
    if smallest < max(args.shots):
        raise UserError(f"a class has only {smallest} training pictures in the pool, fewer than --shots "
                        f"{max(args.shots)}: lower --shots or raise --per-class")
    val = list_split(root, "val", args.per_class)
    names = class_names(root)
    what = "ViT-B/16 (ImageNet-21k weights)" if args.model == DEFAULT_MODEL else args.model
    header(f"2. frozen {what}, device {device.type}: features of {len(pool)} training pictures "
           f"(a pool of {args.pool} per class) and {len(val)} validation pictures")

    def features_of(items, desc):
        def compute():
            return extract_features(model_loader(), items, args.resolution, device, args.batch_size, desc, autocast)

        key = cache_key(args.model, args.resolution, args.precision, items, root)
        return cached_features(compute, key, items, desc, not args.no_cache)

    start = time.perf_counter()
    (pool_features, pool_source), (val_features, val_source) = features_of(pool, "pool"), features_of(val, "val")
    sources = [pool_source, val_source]
    seconds = time.perf_counter() - start
    how = "read from the cache" if sources == ["cache", "cache"] else "computed"
    line(f"features {how} in {seconds:.1f} s ({CACHE_DIR.relative_to(Path(__file__).resolve().parent)}/; "
         f"--no-cache recomputes)")
    width = pool_features["pre-logits"].shape[1]
    line(f'representation "pre-logits": the tanh layer on the [class] token, {width} numbers;  '
         f'"class token": the final LayerNorm output (Eq. 4)')
    line(f"accuracy on the {len(val):,} validation pictures, mean +- std over {args.draws} random draws of the "
         f"training pictures")
    pool_labels = np.array([label for _, label in pool])
    val_labels = np.array([label for _, label in val])
    classes = len(names)
    results = {}
    for representation in REPRESENTATIONS:
        x_pool, x_val = with_bias(pool_features[representation]), with_bias(val_features[representation])
        for lam in args.lambdas:
            parts = []
            for shots in args.shots:
                accuracies = []
                for draw in range(args.draws):
                    chosen = draw_shots(pool_labels, shots, draw, args.seed)
                    w = closed_form(x_pool[chosen], targets(pool_labels[chosen], classes), lam)
                    accuracies.append(100 * np.mean((x_val @ w).argmax(1) == val_labels))
                mean, std = np.mean(accuracies), np.std(accuracies)  # std over the draws (ddof=0)
                parts.append(f"{shots}-shot {mean:5.1f} +- {std:4.1f}%")
                results[f"{representation} lambda {lam:g} {shots}-shot mean"] = mean
            line(f"{representation:<11} lambda {lam:>6g}:  " + "   ".join(parts))
    line(f"chance is {100 / classes:.0f}%; 1-shot means {classes} training pictures in total, one per class")
    shots = 5 if 5 in args.shots else args.shots[0]
    lam = 1.0 if 1.0 in args.lambdas else args.lambdas[0]
    chosen = draw_shots(pool_labels, shots, 0, args.seed)
    x = with_bias(pool_features["pre-logits"])[chosen]
    w = closed_form(x, targets(pool_labels[chosen], classes), lam)
    line(f"{shots}-shot, draw 0, pre-logits, lambda {lam:g}: X is {x.shape} ({len(x)} pictures x {width} features + "
         f"bias), Y is ({len(x)}, {classes}), W is {w.shape}; one solve of a {w.shape[0]}x{w.shape[0]} system")
    scores = with_bias(val_features["pre-logits"]) @ w
    predicted = scores.argmax(1)
    per_class = [100 * np.mean(predicted[val_labels == c] == c) for c in range(classes)]
    line(f"per-class accuracy ({shots}-shot, draw 0): "
         + ", ".join(f"{name} {acc:.0f}%" for name, acc in zip(names, per_class)))
    line(f"scores of the first validation picture (a {names[val_labels[0]]}): "
         + " ".join(f"{s:+.2f}" for s in scores[0]) + f"  -> class {names[predicted[0]]}")
    results.update({f"per-class {name}": acc for name, acc in zip(names, per_class)})
    results.update({f"first picture score {i + 1}": s for i, s in enumerate(scores[0])})
    results["features seconds"] = seconds
    return results


def load_frozen_model(name, device):
    from transformers import ViTModel

    model, info = load_pretrained(ViTModel, name, add_pooling_layer=True, output_loading_info=True)
    if any("pooler" in key for key in info.get("missing_keys", [])):
        raise UserError(f"{name} has no pre-logits layer (pooler): pass an ImageNet-21k checkpoint such as "
                        f"{DEFAULT_MODEL}")
    return model.to(device).eval()


def main(argv=None):
    parser = script_parser(__doc__)
    add_data_arguments(parser, DEFAULT_MODEL, "with its pre-logits layer")
    parser.add_argument("--shots", type=positive_int, nargs="+", default=[1, 5, 10])
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.01, 1.0, 100.0])
    parser.add_argument("--draws", type=positive_int, default=5,
                        help="random draws of the training pictures per setting")
    parser.add_argument("--pool", type=positive_int, default=50, help="training pictures per class to draw from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resolution", type=side_pixels, default=224)
    parser.add_argument("--no-cache", action="store_true", help="recompute the features")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    autocast = set_precision(device, args.precision)
    if max(args.shots) > args.pool:
        parser.error(f"--shots {max(args.shots)} is more than the pool of {args.pool} per class")
    loaded = {}

    def model_loader():
        if "model" not in loaded:
            loaded["model"] = load_frozen_model(args.model, device)
        return loaded["model"]

    results, problems = run_sections([section_by_hand, lambda: section_frozen(args, device, model_loader, autocast)])
    return finish("fewshot", args, results, problems)


if __name__ == "__main__":
    sys.exit(guarded(main))
