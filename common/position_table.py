"""Stretching ViT's position table, (1 + n^2, d): the [class] row, then an n x n grid of rows, to a bigger grid: the
paper's 2D bilinear rule and its alternatives."""
import math

import numpy as np

from common.errors import UserError


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
    import scipy.ndimage

    n_old = grid.shape[0]
    return scipy.ndimage.zoom(grid, (n_new / n_old, n_new / n_old) + (1,) * (grid.ndim - 2), order=1)


def bicubic_resize(grid, n_new):
    """The library's stretch (interpolate_pos_encoding): bicubic, align_corners=False, in float32."""
    import torch
    import torch.nn.functional as F

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


def as_parameter_rows(table, device):
    """A (rows, d) float64 table as the (1, rows, d) float32 tensor a ViT holds, on the device."""
    import torch

    return torch.from_numpy(np.asarray(table, dtype=np.float32))[None].to(device)


def split_table(table):
    """([class] row (1, d), grid (n, n, d)) of a (1 + n^2, d) table."""
    n = math.isqrt(len(table) - 1)
    return table[:1], table[1:].reshape(n, n, -1)


def bilinear_table(table, n_new):
    """The official stretch of a (1 + n^2, d) table to (1 + n_new^2, d): the [class] row kept, the grid bilinear."""
    class_row, grid = split_table(table)
    return np.concatenate([class_row, bilinear_resize_loop(grid, n_new).reshape(n_new * n_new, -1)])


def position_tables(table, n_new):
    """The four tables of the higher resolution, each (1 + n_new^2, d); "2D bicubic" is None: the library computes it
    inside the forward pass (interpolate_pos_encoding)."""
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
