"""ViT, explained, Part 3: fine-tuning at a higher resolution, by stretching the position table.

Reproduces the article's section "Fine-tuning at a higher resolution":
  1. a 2x2 grid resized to 3x3 the way the official code does (scipy.ndimage.zoom, order=1);
  2. the 14x14 position table of google/vit-base-patch16-224 stretched to 24x24: our bilinear loop
     against SciPy, and a bicubic call that equals the library's interpolate_pos_encoding;
  3. cosine similarity of one position row with its neighbours, before and after the stretch;
  4. accuracy on the Imagenette validation set at 224, and at 384 with four versions of the table.

    python vit_part3_posemb.py                    # downloads the checkpoint and Imagenette once
    python vit_part3_posemb.py --per-class 20     # a quick run on 200 validation pictures
    python vit_part3_posemb.py --compare --json posemb.json --plots figures/

Section 1 needs nothing; sections 2-4 need the checkpoint, section 4 the pictures too.
"""
from common.start_and_end import ARTICLE, UserError, before_torch_loads, guarded, say

if __name__ == "__main__":  # before torch loads: a Ctrl-C then is one line, as a later one
    before_torch_loads(ARTICLE)

import copy
import functools
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.ndimage
import torch
import torch.nn.functional as F
from tqdm import tqdm

# transformers is imported in the functions that use it: a DataLoader worker (spawn) runs this file's top
# lines again, where it would add about 3 s to every worker's start (docs/performance.md; tests/test_loader.py)
from common.data import CLASSES, DEFAULT_NAME, load_rgb, load_splits, run_model, workers_text
from common.pretrained import checkpoint_config, checkpoint_pixels, load_pretrained
from common.run import begin, conclude, experiment_parser, nonempty_path, pass_text, section, side_pixels, tried, values
from compare.data_set import data_differences
from compare.verdicts import article_values
from figures import origin_of
from figures.posemb import ACCURACY_FILE, COSINE_FILE, accuracy_bars, cosine_maps
from job.imagenette_archive import download_imagenette

DEFAULT_MODEL = "google/vit-base-patch16-224"
ARTICLE_PLACE = (3, 10)  # the position row of section 3, on the 14x14 grid


def accuracy_counts(logits, labels, imagenet_classes):
    """(right of 10, right of 1000): the head read at the 10 classes, and the top class of all 1000."""
    of_10 = (logits[:, imagenet_classes].argmax(1) == labels).sum().item()
    of_1000 = (logits.argmax(1) == torch.as_tensor(imagenet_classes)[labels]).sum().item()
    return of_10, of_1000


def grids(config, resolution):
    """(n_old, n_new): patches per side at the checkpoint's resolution and at the higher one."""
    return config.image_size // config.patch_size, resolution // config.patch_size


def check_resolution(config, resolution):
    """Section 2-4 stretch the table to a bigger grid, and section 3 needs a row with four neighbours."""
    n_old, n_new = grids(config, resolution)
    if n_old < 3:
        raise UserError(f"the checkpoint's position grid is {n_old}x{n_old}: a row with four neighbours needs at "
                        f"least 3x3; pass --model with a checkpoint of at least {3 * config.patch_size} pixels")
    if n_new <= n_old:
        raise UserError(f"--resolution {resolution} gives a {n_new}x{n_new} grid, no bigger than the checkpoint's "
                        f"{n_old}x{n_old}: choose at least {(n_old + 1) * config.patch_size} pixels")


def example_places(n_old, n_new):
    """Section 3's row on the old grid ((3, 10) on 14x14, scaled on others) and the same place on the new grid."""
    def inside(value, n):  # a row with four neighbours
        return min(max(value, 1), n - 2)

    old = tuple(inside(round(k * (n_old - 1) / 13), n_old) for k in ARTICLE_PLACE)
    new = tuple(inside(round(k * (n_new - 1) / (n_old - 1)), n_new) for k in old)
    return old, new


# ---------------------------------------------------------------- the position table, (1 + n^2, d): the [class] row,
# then an n x n grid of rows; its stretches to a bigger grid (the paper's 2D bilinear rule and the alternatives)

def stretch_positions(n_old, n_new):
    """For each new row i: (floor, delta) with y = i (n_old - 1) / (n_new - 1), delta = y - floor(y), corners onto
    corners as scipy.ndimage.zoom(order=1); the last row is (n_old - 2, 1.0), so that it needs no row past the end."""
    if n_new < 2 or n_old < 2:
        raise UserError(f"a {n_old}x{n_old} position grid cannot be stretched to {n_new}x{n_new}: "
                        f"choose a --resolution of at least 2 patches on a side")
    places = []
    for i in range(n_new):
        y = i * (n_old - 1) / (n_new - 1)
        lower = min(math.floor(y), n_old - 2)
        places.append((lower, y - lower))
    return places


def bilinear_resize_loop(grid, n_new):
    """(n_old, n_old, d) -> (n_new, n_new, d) by the rule above, first along rows, then columns."""
    places = stretch_positions(grid.shape[0], n_new)
    rows = np.stack([(1 - delta) * grid[lower] + delta * grid[lower + 1] for lower, delta in places])
    return np.stack([(1 - delta) * rows[:, lower] + delta * rows[:, lower + 1] for lower, delta in places], axis=1)


def scipy_resize(grid, n_new):
    """The official code's stretch: scipy.ndimage.zoom(order=1), linear in each direction, corners kept."""
    n_old = grid.shape[0]
    return scipy.ndimage.zoom(grid, (n_new / n_old, n_new / n_old) + (1,) * (grid.ndim - 2), order=1)


def bicubic_resize(grid, n_new):
    """The library's stretch (interpolate_pos_encoding): bicubic, align_corners=False, in float32."""
    image = torch.as_tensor(grid, dtype=torch.float32).permute(2, 0, 1)[None]
    resized = F.interpolate(image, size=(n_new, n_new), mode="bicubic", align_corners=False)
    return resized[0].permute(1, 2, 0)


def linear_resize_1d(rows, n_new):
    """The wrong stretch: the (n, d) rows as one list, linearly interpolated to n_new rows."""
    n_old = rows.shape[0]
    places = np.linspace(0, n_old - 1, n_new)
    return np.stack([np.interp(places, np.arange(n_old), rows[:, k]) for k in range(rows.shape[1])], axis=1)


def model_table(model):
    """A ViT's (1 + n^2, d) position table as float64 numpy on the host (cast there: mps has no float64 tensors)."""
    return model.vit.embeddings.position_embeddings.detach()[0].cpu().numpy().astype(np.float64)


def split_table(table):
    """([class] row (1, d), grid (n, n, d)) of a (1 + n^2, d) table."""
    n = math.isqrt(len(table) - 1)
    return table[:1], table[1:].reshape(n, n, -1)


def position_tables(table, n_new):
    """The four tables of the higher resolution, each (1 + n_new^2, d), the [class] row kept in the stretched ones;
    "2D bicubic" is None: the library computes it inside the forward pass (interpolate_pos_encoding)."""
    class_row, grid = split_table(table)
    return {"2D bilinear": np.concatenate([class_row, bilinear_resize_loop(grid, n_new).reshape(n_new * n_new, -1)]),
            "2D bicubic": None,
            "1D": np.concatenate([class_row, linear_resize_1d(table[1:], n_new * n_new)]),
            "zeros": np.zeros((1 + n_new * n_new, table.shape[1]))}


def cosine_similarities(grid, place):
    """Cosine similarity of the row at `place` with every row of the (n, n, d) grid: (n, n)."""
    flat = grid.reshape(-1, grid.shape[-1])
    row = grid[place]
    return (flat @ row / (np.linalg.norm(flat, axis=1) * np.linalg.norm(row))).reshape(grid.shape[:2])


# ---------------------------------------------------------------- resources

def load_model(name, resolution, device):
    from transformers import ViTForImageClassification

    model = load_pretrained(ViTForImageClassification, name)
    if model.config.num_labels != 1000:
        raise UserError(f"{name} has {model.config.num_labels} labels, not the 1,000 of ImageNet: pass an "
                        f"ImageNet-1k fine-tuned checkpoint")
    check_resolution(model.config, resolution)
    return model.to(device).eval()


def imagenet_indices(root, folders):
    """ImageNet-1k class index of each class folder of root (Imagenette's classes only)."""
    index = {wnid: i for wnid, _, i in CLASSES}
    unknown = [wnid for wnid in folders if wnid not in index]
    if unknown:
        raise UserError(f"{root} has classes outside Imagenette ({', '.join(unknown[:3])}): reading the ImageNet "
                        f"head needs Imagenette's WordNet ids as folder names")
    return [index[wnid] for wnid in folders]


def load_pictures(data_dir, per_class):
    """(decoded pictures, labels, the ImageNet index of each class) of the validation split: each picture decoded once,
    by threads (PIL decodes outside the GIL), for the five passes."""
    # a random sample of the split; no --data-dir: data/imagenette2-160, downloaded when missing
    data = load_splits(data_dir or download_imagenette(), {"val": per_class}, drawn=True)
    paths = [path for path, _ in data["val"]]
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        images = list(tqdm(pool.map(load_rgb, paths), total=len(paths), desc="decoding", unit="picture",
                           file=sys.stderr, leave=False))
    return images, torch.tensor([label for _, label in data["val"]]), imagenet_indices(data["root"], data["folders"])


# ---------------------------------------------------------------- sections

@section
def section_tiny_grid(report):
    """1. a 2x2 grid resized to 3x3"""
    report.print("\n== 1. resize a 2x2 grid to 3x3 the way the official code does (scipy.ndimage.zoom, order=1 = "
                 "linear) ==")
    grid = np.array([[0.0, 1.0], [2.0, 3.0]])
    resized = scipy.ndimage.zoom(grid, 1.5, order=1)
    report.print(f"  grid 2x2: {grid.tolist()}")
    for row in resized:
        report.print(f"    {'  '.join(f'{v:.2f}' for v in row)}")
    report.print(f"  corners stay, the new middle row and column are averages of their neighbours: (0+1)/2 = "
                 f"{resized[0, 1]:g}, (0+2)/2 = {resized[1, 0]:g}, (0+1+2+3)/4 = {resized[1, 1]:g}",
                 {"2x2 grid": grid, "3x3 grid": resized, "2x2 top middle": resized[0, 1],
                  "2x2 middle left": resized[1, 0], "2x2 centre": resized[1, 1]})


@section
def section_position_table(report, model, args):
    """2. the position table"""
    config, resolution = model.config, args.resolution
    table = model_table(model)
    n_old, n_new = grids(config, resolution)
    _, grid = split_table(table)
    ours = bilinear_resize_loop(grid, n_new)
    bicubic = bicubic_resize(grid.astype(np.float32), n_new).numpy().astype(np.float64)
    row = 5 if n_new > 6 else n_new - 2
    lower, delta = stretch_positions(n_old, n_new)[row]
    rows_needed = n_new * n_new + 1
    scipy_difference = np.abs(ours - scipy_resize(grid, n_new)).max()
    report.print(f"\n== 2. the position table of {args.model} ==")
    report.print(f"  E_pos {table.shape} = 1 row for [class] + {n_old * n_old} rows = a {n_old}x{n_old} grid of "
                 f"{table.shape[1]} numbers")
    report.print(f"  at {resolution} pixels: {resolution}/{config.patch_size} = {n_new} patches per side, N = "
                 f"{n_new * n_new}, so {rows_needed} rows are needed: {rows_needed - len(table)} rows do not exist")
    if resolution % config.patch_size:  # the patch embedding's stride steps over the rest
        report.print(f"  --resolution {resolution} is not a multiple of the patch size {config.patch_size}: the last "
                     f"{resolution % config.patch_size} pixels of each side fall outside the patches")
    report.print(f"  our bilinear {n_old}x{n_old} -> {n_new}x{n_new}: {ours.shape}; max |difference| vs "
                 f"scipy.ndimage.zoom(order=1): {scipy_difference:.1e}")
    report.print(f"  new row {row} sits at old position {row} x {n_old - 1}/{n_new - 1} = {lower + delta:.4f}: "
                 f"{1 - delta:.4f} of old row {lower} + {delta:.4f} of old row {lower + 1}",
                 {"E_pos shape": table.shape, "grid rows": n_old * n_old, "old grid side": n_old,
                  "row width": table.shape[1], "patch size": config.patch_size, "new grid side": n_new,
                  "new N": n_new * n_new, "rows needed": rows_needed, "rows missing": rows_needed - len(table),
                  "bilinear shape": ours.shape, "bilinear vs scipy max diff": scipy_difference,
                  f"new row {row} position": lower + delta, f"new row {row} weight of the lower row": 1 - delta,
                  f"new row {row} weight of the upper row": delta})
    # the library's stretched grid, from interpolate_pos_encoding, computed on the host as our bicubic call is: the
    # line compares the two formulas, and a GPU's bicubic kernel rounds otherwise than the CPU's (8.9e-08 apart, H200)
    embeddings = copy.deepcopy(model.vit.embeddings).cpu()
    with torch.no_grad():
        dummy = torch.zeros(1, n_new * n_new + 1, config.hidden_size)
        library = embeddings.interpolate_pos_encoding(dummy, resolution, resolution)[0, 1:]
    library_difference = np.abs(bicubic - library.numpy().astype(np.float64).reshape(n_new, n_new, -1)).max()
    stats = {"bicubic vs library max diff": library_difference,
             "bilinear vs bicubic mean diff": np.abs(ours - bicubic).mean(), "mean |value|": np.abs(ours).mean(),
             "corner max diff": np.abs(ours[0, 0] - grid[0, 0]).max()}
    report.print("  library interpolate_pos_encoding: bicubic, align_corners=False; our bicubic call matches it: max "
                 f"|difference| {library_difference:.1e}")
    report.print("  bilinear (official) vs bicubic (library) position rows: mean |difference| "
                 f"{stats['bilinear vs bicubic mean diff']:.4f}, mean |value| {stats['mean |value|']:.4f}")
    report.print(f"  corner row (0,0) kept by bilinear: max |difference| {stats['corner max diff']:.1e}", stats)


@section
def section_cosine(report, model, args):
    """3. cosine similarity"""
    n_old, n_new = grids(model.config, args.resolution)
    _, grid = split_table(model_table(model))
    old_place, new_place = example_places(n_old, n_new)
    report.print(f"\n== 3. cosine similarity of position row {old_place} with its four neighbours and the far "
                 "corner ==")
    maps = {}
    for name, g, (r, c), prefix in ((f"{n_old}x{n_old}", grid, old_place, "own grid "),
                                    (f"{n_new}x{n_new}", bilinear_resize_loop(grid, n_new), new_place,
                                     "stretched grid ")):
        size = g.shape[0]
        similarity = cosine_similarities(g, (r, c))
        corner = (size - 1 if r < size / 2 else 0, size - 1 if c < size / 2 else 0)
        up, down, left, right = neighbours = (similarity[r - 1, c], similarity[r + 1, c], similarity[r, c - 1],
                                              similarity[r, c + 1])
        report.print(f"  {name} grid, row ({r}, {c}): neighbours up {up:.2f}, down {down:.2f}, left {left:.2f}, "
                     f"right {right:.2f} ({min(neighbours):.2f} to {max(neighbours):.2f}); far corner {corner}: "
                     f"{similarity[corner]:.2f}",
                     {f"{prefix}neighbour up": up, f"{prefix}neighbour down": down,
                      f"{prefix}neighbour left": left, f"{prefix}neighbour right": right,
                      f"{prefix}neighbours min": min(neighbours), f"{prefix}neighbours max": max(neighbours),
                      f"{prefix}far corner": similarity[corner]})
        maps[name] = similarity.tolist()
    report.series["cosine maps"] = maps  # for the figures and the page
    if args.plots:
        cosine_maps(maps, args.plots, say, origin_of(args, DEFAULT_NAME))


@section
def section_accuracy(report, model, pictures, args, run):
    """4. accuracy at both resolutions"""
    images, labels, imagenet_classes = pictures
    pixels = checkpoint_pixels(args.model)  # what its image processor makes
    sides = sorted({min(image.size) for image in images})  # imagenette2-160's: 160 px each
    side = f"{sides[0]}" if len(sides) == 1 else f"{sides[0]} to {sides[-1]}"
    report.print(f"\n== 4. accuracy on the Imagenette validation set: {len(images)} pictures ({side} px on the short "
                 f"side), device {run.device.type} ==",
                 {"validation pictures": len(images)})
    report.print(f"  the ImageNet head of the checkpoint is read at the {len(imagenet_classes)} Imagenette classes; no "
                 "training; \"of 1000\" = the top class of all 1000 must be right")
    embeddings = model.vit.embeddings
    original = embeddings.position_embeddings.data.clone()
    n_old, n_new = grids(model.config, args.resolution)
    tables = position_tables(model_table(model), n_new)
    # each key names the article's row; the first row runs at the checkpoint's own resolution, the article's 224
    rows = [("224", f"{model.config.image_size}, the training resolution ({n_old * n_old} patches)"),
            ("2D bilinear", f"{args.resolution}, 2D bilinear (the official code)"),
            ("2D bicubic", f"{args.resolution}, 2D bicubic (the library)"),
            ("1D", f"{args.resolution}, 1D: the {n_old * n_old} rows stretched as one list"),
            ("zeros", f"{args.resolution}, no position rows at all (zeros)")]
    try:
        for key, label in rows:
            table = tables.get(key)  # None: the checkpoint's own, or 2D bicubic: the library's, stretched in the pass
            embeddings.position_embeddings.data = (original if table is None else torch.from_numpy(
                np.asarray(table, dtype=np.float32))[None].to(original.device))
            size = model.config.image_size if key == "224" else args.resolution
            logits, timing = run_model(model, images, size, run.device, args.batch_size,  # a pass of its own
                                       lambda out: out.logits.float(), key, run.autocast, pixels=pixels)
            workers, start_up = timing.pop("workers"), timing.pop("start-up seconds")  # its workers' start, outside it
            if key == "224":  # the first row's: said before the rows
                report.print(f"  the loader: {workers_text(workers, start_up)}; each row's wait for pictures is its "
                             "own")
            of_10, of_1000 = accuracy_counts(torch.cat(logits), labels, imagenet_classes)
            n = len(images)
            report.print(f"  {label:<46} accuracy {100 * of_10 / n:.2f}% (of {len(imagenet_classes)})   "
                         f"{100 * of_1000 / n:.2f}% (of 1000)   {pass_text(timing)}",
                         {f"{key} of 10": 100 * of_10 / n, f"{key} of 1000": 100 * of_1000 / n, key: timing},
                         counts={f"{key} of 10": (of_10, n), f"{key} of 1000": (of_1000, n)})
    finally:
        embeddings.position_embeddings.data = original
    report.print(f"  zeros: all {n_new * n_new + 1} rows of E_pos set to 0, the [class] row included; 1D and 2D "
                 "tables keep the [class] row as it is",
                 {"zeros rows": n_new * n_new + 1})
    if args.plots:
        accuracy_bars(values(report), article_values("posemb"), args.plots, say, origin_of(args, DEFAULT_NAME))


ARTICLE_FLAGS = {"resolution": ("resolution", 384), "precision": ("precision", "fp32")}


def setup_differences(pictures, run, known):
    """How this run's pictures (a UserError: none could be loaded) differ from the article's (the checkpoint and the
    flags: conclude)."""
    count = None if isinstance(pictures, UserError) else len(pictures[1])
    return data_differences(run.args, {"val": count}, True)


def main(argv=None):
    parser = experiment_parser(__doc__, model=DEFAULT_MODEL, model_help="with an ImageNet-1k head",
                               per_class_help="keep N validation pictures a class on average, drawn at random from "
                                              "the whole split with a fixed seed (default: all)",
                               batch_help="pictures per batch of the evaluation passes (at 224 and at --resolution)")
    parser.add_argument("--resolution", type=side_pixels, default=ARTICLE_FLAGS["resolution"][1],
                        help="the higher resolution (default: %(default)s)")
    parser.add_argument("--plots", type=nonempty_path, metavar="DIR",
                        help="save the similarity maps and the accuracy bars as PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    config = checkpoint_config(args.model)
    if config is not None:  # a checkpoint on disk: refuse a resolution it cannot serve before any work
        check_resolution(config, args.resolution)
    run, report = begin("posemb", args, figures=(COSINE_FILE, ACCURACY_FILE))
    section_tiny_grid(report)
    model = tried(load_model, args.model, args.resolution, run.device)
    section_position_table(report, model, args)
    section_cosine(report, model, args)
    pictures = tried(load_pictures, args.data_dir, args.per_class)
    section_accuracy(report, model, pictures, args, run)
    return conclude(run, report, functools.partial(setup_differences, pictures), DEFAULT_MODEL, ARTICLE_FLAGS)


if __name__ == "__main__":
    sys.exit(guarded(main))
