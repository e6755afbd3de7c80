"""ViT, explained, Part 3: fine-tuning at a higher resolution, by stretching the position table.

Reproduces the article's section "Fine-tuning at a higher resolution":
  1. a 2x2 grid resized to 3x3 the way the official code does (scipy.ndimage.zoom, order=1);
  2. the 14x14 position table of google/vit-base-patch16-224 stretched to 24x24: our bilinear loop
     against SciPy, and a bicubic call that equals the library's interpolate_pos_encoding;
  3. cosine similarity of one position row with its neighbours, before and after the stretch;
  4. accuracy on the Imagenette validation set at 224, and at 384 with four versions of the table.

    python vit_part3_posemb.py                    # downloads the checkpoint (350 MB) and Imagenette (94 MB) once
    python vit_part3_posemb.py --per-class 20     # a quick run on 200 validation pictures
    python vit_part3_posemb.py --compare --json posemb.json --plots figures/

Section 1 needs nothing; sections 2-4 need the checkpoint, section 4 the pictures too.
"""
import math
import sys
import time

import numpy as np
import scipy.ndimage
import torch
import torch.nn.functional as F

from common import figures
from common.checkpoints import load_pretrained
from common.cli import (
    add_common_arguments,
    add_data_arguments,
    finish,
    guarded,
    run_sections,
    script_parser,
    side_pixels,
)
from common.device import pick_device, set_precision
from common.errors import UserError
from common.imagenette import ensure_imagenette, imagenet_indices, list_split, load_all
from common.inference import run_model
from common.printing import header, line, short_list

DEFAULT_MODEL = "google/vit-base-patch16-224"


# ---------------------------------------------------------------- the stretch rules

def stretch_positions(n_old, n_new):
    """For each new row i: (floor, delta) with y = i (n_old - 1) / (n_new - 1), delta = y - floor(y).

    The corners map onto the corners, as in scipy.ndimage.zoom(order=1); the last row uses
    (n_old - 2, 1.0) so that it needs no row past the end.
    """
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
    n_old = grid.shape[0]
    places = stretch_positions(n_old, n_new)
    rows = np.stack([(1 - delta) * grid[lower] + delta * grid[lower + 1] for lower, delta in places])
    return np.stack([(1 - delta) * rows[:, lower] + delta * rows[:, lower + 1] for lower, delta in places], axis=1)


def scipy_resize(grid, n_new):
    """The official code's stretch: linear interpolation in each direction, corners kept."""
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


def bilinear_table(table, n_new):
    """The official stretch of a (1 + n^2, d) table to (1 + n_new^2, d): the [class] row kept, the grid bilinear."""
    class_row, rows = table[:1], table[1:]
    n_old = math.isqrt(len(rows))
    stretched = bilinear_resize_loop(rows.reshape(n_old, n_old, -1), n_new)
    return np.concatenate([class_row, stretched.reshape(n_new * n_new, -1)])


def position_tables(table, n_new):
    """The four 384 tables, each (1 + n_new^2, d) with the [class] row first, from a (1 + n^2, d) table.

    "bicubic" is None: the library computes it inside the forward pass (interpolate_pos_encoding).
    """
    class_row, rows = table[:1], table[1:]
    return {"2D bilinear": bilinear_table(table, n_new),
            "2D bicubic": None,
            "1D": np.concatenate([class_row, linear_resize_1d(rows, n_new * n_new)]),
            "zeros": np.zeros((1 + n_new * n_new, table.shape[1]))}


def cosine_similarities(grid, place):
    """Cosine similarity of the row at `place` with every row of the (n, n, d) grid: (n, n)."""
    flat = grid.reshape(-1, grid.shape[-1])
    row = grid[place]
    return (flat @ row / (np.linalg.norm(flat, axis=1) * np.linalg.norm(row))).reshape(grid.shape[:2])


def accuracy_counts(logits, labels, imagenet_classes):
    """(right of 10, right of 1000): the head read at the 10 classes, and the top class of all 1000."""
    of_10 = (logits[:, imagenet_classes].argmax(1) == labels).sum().item()
    of_1000 = (logits.argmax(1) == torch.as_tensor(imagenet_classes)[labels]).sum().item()
    return of_10, of_1000


# ---------------------------------------------------------------- sections

def section_tiny_grid():
    header("1. resize a 2x2 grid to 3x3 the way the official code does (scipy.ndimage.zoom, order=1 = linear)")
    grid = np.array([[0.0, 1.0], [2.0, 3.0]])
    resized = scipy.ndimage.zoom(grid, 1.5, order=1)
    line(f"grid 2x2: {short_list(grid)}")
    for row in resized:
        line("  " + "  ".join(f"{v:.2f}" for v in row))
    line(f"corners stay, the new middle row and column are averages of their neighbours: (0+1)/2 = {resized[0, 1]:g}, "
         f"(0+2)/2 = {resized[1, 0]:g}, (0+1+2+3)/4 = {resized[1, 1]:g}")
    return {"2x2 top middle": resized[0, 1], "2x2 middle left": resized[1, 0], "2x2 centre": resized[1, 1]}


def section_position_table(model, model_name, resolution):
    config = model.config
    table = model.vit.embeddings.position_embeddings.detach()[0].double().cpu().numpy()
    n_old, n_new = config.image_size // config.patch_size, resolution // config.patch_size
    header(f"2. the position table of {model_name}")
    line(f"E_pos {tuple(table.shape)} = 1 row for [class] + {n_old * n_old} rows = a {n_old}x{n_old} grid of "
         f"{table.shape[1]} numbers")
    needed = n_new * n_new + 1
    line(f"at {resolution} pixels: {resolution}/{config.patch_size} = {n_new} patches per side, N = {n_new * n_new}, "
         f"so {needed} rows are needed: {needed - len(table)} rows do not exist")
    grid = table[1:].reshape(n_old, n_old, -1)
    ours = bilinear_resize_loop(grid, n_new)
    scipy_diff = np.abs(ours - scipy_resize(grid, n_new)).max()
    line(f"our bilinear {n_old}x{n_old} -> {n_new}x{n_new}: {ours.shape}; max |difference| vs "
         f"scipy.ndimage.zoom(order=1): {scipy_diff:.1e}")
    lower, delta = stretch_positions(n_old, n_new)[5]
    line(f"new row 5 sits at old position 5 x {n_old - 1}/{n_new - 1} = {lower + delta:.4f}: {1 - delta:.4f} of old "
         f"row {lower} + {delta:.4f} of old row {lower + 1}")
    embeddings = model.vit.embeddings
    with torch.no_grad():
        dummy = torch.zeros(1, needed, table.shape[1], device=embeddings.position_embeddings.device)
        library = embeddings.interpolate_pos_encoding(dummy, resolution, resolution)[0, 1:].double().cpu().numpy()
    bicubic = bicubic_resize(table[1:].reshape(n_old, n_old, -1).astype(np.float32), n_new).double().numpy()
    library_diff = np.abs(bicubic.reshape(-1, table.shape[1]) - library).max()
    line(f"library interpolate_pos_encoding: bicubic, align_corners=False; our bicubic call matches it: "
         f"max |difference| {library_diff:.1e}")
    mean_diff = np.abs(ours - bicubic).mean()
    mean_value = np.abs(ours).mean()
    line(f"bilinear (official) vs bicubic (library) position rows: mean |difference| {mean_diff:.4f}, "
         f"mean |value| {mean_value:.4f}")
    corner_diff = np.abs(ours[0, 0] - grid[0, 0]).max()
    line(f"corner row (0,0) kept by bilinear: max |difference| {corner_diff:.1e}")
    return {"rows missing at 384": needed - len(table), "bilinear vs scipy max diff": scipy_diff,
            "row 5 position": lower + delta, "row 5 weight of old row 2": 1 - delta,
            "bicubic vs library max diff": library_diff, "bilinear vs bicubic mean diff": mean_diff,
            "mean |value|": mean_value, "corner max diff": corner_diff}


def section_cosine(model, resolution, plots_dir=None):
    config = model.config
    table = model.vit.embeddings.position_embeddings.detach()[0].double().cpu().numpy()
    n_old, n_new = config.image_size // config.patch_size, resolution // config.patch_size
    grid = table[1:].reshape(n_old, n_old, -1)
    stretched = bilinear_resize_loop(grid, n_new)
    row, col = 3, 10
    new_place = (round(row * (n_new - 1) / (n_old - 1)), round(col * (n_new - 1) / (n_old - 1)))
    header(f"3. cosine similarity of position row ({row}, {col}) with its four neighbours and the far corner")
    results, maps = {}, {}
    for name, g, (r, c) in ((f"{n_old}x{n_old}", grid, (row, col)), (f"{n_new}x{n_new}", stretched, new_place)):
        n = g.shape[0]
        similarity = cosine_similarities(g, (r, c))
        corner = (n - 1 if r < n / 2 else 0, n - 1 if c < n / 2 else 0)
        neighbours = [similarity[r - 1, c], similarity[r + 1, c], similarity[r, c - 1], similarity[r, c + 1]]
        line(f"{name} grid, row ({r}, {c}): neighbours up {neighbours[0]:.2f}, down {neighbours[1]:.2f}, "
             f"left {neighbours[2]:.2f}, right {neighbours[3]:.2f} ({min(neighbours):.2f} to {max(neighbours):.2f}); "
             f"far corner {corner}: {similarity[corner]:.2f}")
        results.update({f"{name} neighbours min": min(neighbours), f"{name} neighbours max": max(neighbours),
                        f"{name} far corner": similarity[corner]})
        maps[name] = similarity
    if plots_dir:
        save_similarity_plot(maps, plots_dir)
    return results


def save_similarity_plot(maps, plots_dir):
    plt = figures.pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(1, len(maps), figsize=(4 * len(maps), 4))
    for axis, (name, similarity) in zip(axes, maps.items()):
        axis.imshow(similarity, cmap="viridis", vmin=-1, vmax=1)
        axis.set_title(f"cosine similarity, {name} grid")
    figures.save(figure, plots_dir, "posemb_cosine_similarity.png")


def decode_pictures(items):
    """Each picture decoded once (RGB), kept for every row of section 4."""
    return load_all([path for path, _ in items])


def evaluate(model, images, labels, resolution, device, batch_size, imagenet_classes, desc="", autocast=None):
    """(right of 10, right of 1000) over all pictures."""
    logits = run_model(model, images, resolution, device, batch_size, lambda out: out.logits.float().cpu(), desc,
                       autocast)
    return accuracy_counts(torch.cat(logits), labels, imagenet_classes)


def section_accuracy(model, data_dir, per_class, device, batch_size, resolution, autocast=None):
    root = ensure_imagenette(data_dir)
    items = list_split(root, "val", per_class)
    imagenet_classes = imagenet_indices(root)
    labels = torch.tensor([label for _, label in items])
    header(f"4. accuracy on the Imagenette validation set: {len(items)} pictures (160 px on the short side), "
           f"device {device.type}")
    line('the ImageNet head of the checkpoint is read at the 10 Imagenette classes; no training; '
         '"of 1000" = the top class of all 1000 must be right')
    images = decode_pictures(items)
    embeddings = model.vit.embeddings
    original = embeddings.position_embeddings.data.clone()
    n_old = model.config.image_size // model.config.patch_size
    n_new = resolution // model.config.patch_size
    tables = position_tables(original[0].double().cpu().numpy(), n_new)
    rows = [("224", f"224, the training resolution ({n_old * n_old} patches)", model.config.image_size, None),
            ("2D bilinear", f"{resolution}, 2D bilinear (the official code)", resolution, "2D bilinear"),
            ("2D bicubic", f"{resolution}, 2D bicubic (the library)", resolution, "2D bicubic"),
            ("1D", f"{resolution}, 1D: the {n_old * n_old} rows stretched as one list", resolution, "1D"),
            ("zeros", f"{resolution}, no position rows at all (zeros)", resolution, "zeros")]
    results = {}
    for key, label, size, table_name in rows:
        table = tables.get(table_name) if table_name else None
        embeddings.position_embeddings.data = (original if table is None else
                                               torch.from_numpy(table).float()[None].to(original.device))
        start = time.perf_counter()
        r10, r1000 = evaluate(model, images, labels, size, device, batch_size, imagenet_classes, key, autocast)
        seconds = time.perf_counter() - start
        of_10, of_1000 = 100 * r10 / len(items), 100 * r1000 / len(items)
        line(f"{label:<46} accuracy {of_10:.2f}% (of 10)   {of_1000:.2f}% (of 1000)   [{seconds:.0f} s]")
        results.update({f"{key} of 10": of_10, f"{key} of 1000": of_1000})
    embeddings.position_embeddings.data = original
    line(f"zeros: all {n_new * n_new + 1} rows of E_pos set to 0, the [class] row included; "
         f"1D and 2D tables keep the [class] row as it is")
    return results


def main(argv=None):
    parser = script_parser(__doc__)
    add_data_arguments(parser, DEFAULT_MODEL, "with an ImageNet-1k head")
    parser.add_argument("--resolution", type=side_pixels, default=384, help="the higher resolution (default 384)")
    parser.add_argument("--plots", metavar="DIR", help="save the similarity maps as PNG (needs matplotlib)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    autocast = set_precision(device, args.precision)

    loaded = {}

    def need_model():
        """The checkpoint, loaded on first use; a failure is reported once and remembered."""
        if "model" not in loaded:
            from transformers import ViTForImageClassification

            try:
                model = load_pretrained(ViTForImageClassification, args.model)
                if model.config.num_labels != 1000:
                    raise UserError(f"{args.model} has {model.config.num_labels} labels, not the 1,000 of "
                                    f"ImageNet: pass an ImageNet-1k fine-tuned checkpoint")
                loaded["model"] = model.to(device).eval()
            except UserError as problem:
                loaded["model"] = problem
        if isinstance(loaded["model"], UserError):
            raise loaded["model"]
        return loaded["model"]

    results, problems = run_sections([
        section_tiny_grid,
        lambda: section_position_table(need_model(), args.model, args.resolution),
        lambda: section_cosine(need_model(), args.resolution, args.plots),
        lambda: section_accuracy(need_model(), args.data_dir, args.per_class, device, args.batch_size,
                                 args.resolution, autocast),
    ])
    return finish("posemb", args, results, problems)


if __name__ == "__main__":
    sys.exit(guarded(main))
