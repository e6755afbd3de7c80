"""common/position_table.py: the position table's layout, its stretches to a bigger grid and the cosine map, against
values worked out by hand and against SciPy, torch and the library's interpolate_pos_encoding."""
import math

import numpy as np
import pytest
import scipy.ndimage
import torch
import torch.nn.functional as F
from conftest import tiny_vit

from common.errors import UserError
from common.position_table import (
    bicubic_resize,
    bilinear_resize_loop,
    bilinear_table,
    cosine_similarities,
    position_tables,
    scipy_resize,
    split_table,
    stretch_positions,
)

# ---------------------------------------------------------------- the table: the [class] row, then the grid row-major

def test_table_row_1_plus_r_n_plus_c_is_grid_place_r_c():
    n = 3
    table = np.array([[-1.0, -1.0]] + [[r, c] for r in range(n) for c in range(n)], dtype=np.float64)
    class_row, grid = split_table(table)
    assert class_row.tolist() == [[-1.0, -1.0]]
    assert grid.shape == (n, n, 2)
    assert [[grid[r, c].tolist() for c in range(n)] for r in range(n)] == [
        [[0, 0], [0, 1], [0, 2]], [[1, 0], [1, 1], [1, 2]], [[2, 0], [2, 1], [2, 2]]]


def test_the_stretched_table_keeps_row_major_order():
    """Rows (r, c) = [r, c, 1] on 3x3: bilinear interpolation keeps a linear function exactly, so on 5x5 table row
    1 + R 5 + C is [R (3-1)/(5-1), C (3-1)/(5-1), 1] = [R/2, C/2, 1], and the [class] row is kept."""
    table = np.array([[7.0, 7.0, 7.0]] + [[r, c, 1.0] for r in range(3) for c in range(3)])
    stretched = bilinear_table(table, 5)
    assert stretched.shape == (26, 3)
    assert stretched[0].tolist() == [7.0, 7.0, 7.0]
    expected = [[R / 2, C / 2, 1.0] for R in range(5) for C in range(5)]
    np.testing.assert_allclose(stretched[1:], expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- where each new row reads the old grid

def test_a_stretch_needs_two_places_on_each_side():
    assert stretch_positions(2, 2) == [(0, 0.0), (0, 1.0)]
    assert stretch_positions(2, 3) == [(0, 0.0), (0, 0.5), (0, 1.0)]  # the last row: (n_old - 2, 1.0)
    for n_old, n_new in ((1, 5), (5, 1), (1, 1)):
        with pytest.raises(UserError, match="cannot be stretched"):
            stretch_positions(n_old, n_new)


def test_new_row_5_of_the_article():
    lower, delta = stretch_positions(14, 24)[5]
    assert lower == 2 and delta == pytest.approx(5 * 13 / 23 - 2)  # 0.8261 of old row 3


# ---------------------------------------------------------------- the bilinear stretches

# A 3x3 grid of 0 but a 1 in its last corner, stretched to 5x5: the new places sit at old 0, 0.5, 1, 1.5, 2 on each
# axis, where linear interpolation reads the ramp t = 0, 0, 0, 0.5, 1, so cell (R, C) is t[R] t[C]. (Not symmetric:
# a bump in the centre comes out the same from a quadratic spline.)
BUMP = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
RAMP = [0.0, 0.0, 0.0, 0.5, 1.0]
BUMP_5X5 = [[a * b for b in RAMP] for a in RAMP]
ARTICLE_2X2, ARTICLE_3X3 = [[0.0, 1.0], [2.0, 3.0]], [[0.0, 0.5, 1.0], [1.0, 1.5, 2.0], [2.0, 2.5, 3.0]]


@pytest.mark.parametrize("stretch", [bilinear_resize_loop, scipy_resize])
def test_both_bilinear_stretches_by_hand(stretch):
    """The article's 2x2 -> 3x3 and the bump, each as a grid of 1-number rows and of 2-number rows."""
    for grid, n_new, expected in ((ARTICLE_2X2, 3, ARTICLE_3X3), (BUMP, 5, BUMP_5X5)):
        two = np.stack([np.array(grid), -np.array(grid)], axis=2)  # rows [v, -v]
        np.testing.assert_allclose(stretch(two, n_new), np.stack([expected, -np.array(expected)], axis=2), atol=1e-12)


def test_the_scipy_stretch_of_a_grid_of_plain_numbers():
    np.testing.assert_allclose(scipy_resize(np.array(BUMP), 5), BUMP_5X5, atol=1e-12)


@pytest.mark.parametrize("n_old,n_new", [(2, 3), (7, 12), (14, 24), (5, 5), (6, 4)])
def test_bilinear_loop_equals_scipy_zoom(n_old, n_new):
    grid = np.random.default_rng(n_old).normal(size=(n_old, n_old, 3))
    expected = scipy.ndimage.zoom(grid, (n_new / n_old, n_new / n_old, 1), order=1)
    assert np.abs(bilinear_resize_loop(grid, n_new) - expected).max() < 1e-12


# ---------------------------------------------------------------- the library's bicubic stretch, the 1D and zero tables

def test_the_bicubic_stretch_is_the_librarys_interpolate_pos_encoding():
    """bicubic_resize() against transformers' ViTEmbeddings.interpolate_pos_encoding on a 3x3 grid of 4-number rows,
    stretched to 5x5 (20 px of 4-px patches)."""
    model = tiny_vit(image_size=12, patch_size=4)
    table = model.vit.embeddings.position_embeddings.detach()[0]
    with torch.no_grad():
        library = model.vit.embeddings.interpolate_pos_encoding(torch.zeros(1, 26, 4), 20, 20)[0]
    _, grid = split_table(table.numpy().astype(np.float64))
    assert torch.equal(bicubic_resize(grid, 5).reshape(25, 4), library[1:])
    assert torch.equal(library[0], table[0])


def test_1d_and_zero_tables():
    table = np.random.default_rng(0).normal(size=(1 + 14 * 14, 8))
    tables = position_tables(table, 24)
    assert tables["2D bilinear"].shape == tables["1D"].shape == tables["zeros"].shape == (577, 8)
    one_d = tables["1D"]
    assert np.array_equal(one_d[0], table[0])  # the [class] row is kept
    assert np.allclose(one_d[[1, -1]], table[[1, -1]])  # the list's ends stay
    assert np.allclose(one_d[2], table[1] + (table[2] - table[1]) * 195 / 575)  # one step of 195/575 along the list
    assert not tables["zeros"].any()


# ---------------------------------------------------------------- the cosine-similarity map

def test_cosine_map_by_hand():
    """Grid rows [1, 0], [0, 1] / [1, 1], [-1, 0] against place (0, 0) = [1, 0]: 1, 0, 1/sqrt(2), -1."""
    grid = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [-1.0, 0.0]]])
    np.testing.assert_allclose(cosine_similarities(grid, (0, 0)), [[1, 0], [1 / math.sqrt(2), -1]], atol=1e-15)
    # against place (1, 0) = [1, 1]: 1/sqrt(2), 1/sqrt(2) / 1, -1/sqrt(2)
    np.testing.assert_allclose(cosine_similarities(grid * 3.0, (1, 0)),
                               [[1 / math.sqrt(2), 1 / math.sqrt(2)], [1, -1 / math.sqrt(2)]], atol=1e-15)


@pytest.mark.parametrize("place", [(1, 2), (3, 0), (0, 3)])
def test_cosine_map_is_torchs_cosine_similarity_with_table_row_1_plus_r_n_plus_c(place):
    n, d = 4, 6
    table = np.random.default_rng(3).normal(size=(1 + n * n, d)) + 0.5
    _, grid = split_table(table)
    rows = torch.from_numpy(table[1:])
    expected = F.cosine_similarity(rows, rows[place[0] * n + place[1]][None], dim=1).reshape(n, n)
    np.testing.assert_allclose(cosine_similarities(grid, place), expected.numpy(), rtol=0, atol=1e-12)
