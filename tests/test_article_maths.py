"""The articles' maths against values worked out by hand (written here) or computed by an independent library.

Each test guards a formula whose change the rest of the suite let through: the five of issue 31 first, then the
mutants that benchmarks/mutation.py found surviving (docs/mutation.md). Pure functions and tiny tensors only.
"""
import contextlib
import copy
import math
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vit_backbone as backbone
import vit_part3_fewshot as fewshot
import vit_part3_finetune as finetune
import vit_part3_posemb as posemb
import vit_part3_setup as setup
from common import compute
from common.closed_form import closed_form
from common.errors import UserError
from common.loader import pass_timing
from common.output import Report
from common.position_table import (
    bicubic_resize,
    bilinear_resize_loop,
    bilinear_table,
    cosine_similarities,
    scipy_resize,
    split_table,
    stretch_positions,
)

# The article's logged learning rates of the 300-step run (step: lr as printed).
ARTICLE_LRS = {5: "0.00040", 10: "0.00090", 25: "0.00240", 50: "0.00296", 100: "0.00254", 150: "0.00178",
               200: "0.00092", 250: "0.00026", 300: "0.00000"}


def article_lr(step):
    """The LR of step s = 1..300 by the article's loop, g['lr'] = lr_at(step - 1): 0.003 t / 30 for t = s - 1 < 30,
    then 0.0015 (1 + cos(pi (t - 30) / 270))."""
    t = step - 1
    return 0.003 * t / 30 if t < 30 else 0.0015 * (1 + math.cos(math.pi * (t - 30) / 270))


def tiny_vit(image_size=12, patch_size=4, hidden_size=4):
    """A ViTForImageClassification of random weights, built in memory (no file, no download)."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=hidden_size, num_hidden_layers=1, intermediate_size=8, num_attention_heads=1,
                       image_size=image_size, patch_size=patch_size)
    return ViTForImageClassification(config).eval()


# ---------------------------------------------------------------- 1. the position grid is row-major

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


def test_the_fine_tuned_classifier_stretches_its_table_row_major():
    """build_classifier() at a higher resolution: the same [R/2, C/2] rows in the model's own table."""
    model = tiny_vit(image_size=12, patch_size=4)  # a 3x3 grid
    with torch.no_grad():
        rows = [[7.0, 7.0, 7.0, 7.0]] + [[r, c, 0.0, 1.0] for r in range(3) for c in range(3)]
        model.vit.embeddings.position_embeddings.copy_(torch.tensor([rows]))
    model, _ = finetune.build_classifier((model, {}), 10, 20)  # 20 px / 4 = a 5x5 grid
    table = model.vit.embeddings.position_embeddings.detach()[0]
    assert table.shape == (26, 4)
    assert table[0].tolist() == [7.0, 7.0, 7.0, 7.0]
    expected = torch.tensor([[R / 2, C / 2, 0.0, 1.0] for R in range(5) for C in range(5)])
    assert torch.allclose(table[1:], expected, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- 2. the cosine-similarity map

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


# ---------------------------------------------------------------- 3. the learning rate of every step

def test_lr_at_every_logged_step_is_the_articles():
    assert finetune.warmup_steps(300) == 30
    assert {s: f"{finetune.lr_at(s, 0.003, 300):.5f}" for s in ARTICLE_LRS} == ARTICLE_LRS


def test_lr_at_every_step_of_the_300():
    """Warm-up by hand; the cosine part against torch's CosineAnnealingLR (T_max 270) stepped once per step."""
    lrs = [finetune.lr_at(s, 0.003, 300) for s in range(1, 301)]
    assert lrs[0] == 0.0  # step 1 applies lr_at(0) of the article's loop
    assert lrs[:31] == pytest.approx([0.003 * t / 30 for t in range(31)], rel=1e-12, abs=0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.003)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=270, eta_min=0.0)
    by_torch = []
    for _ in range(270):  # steps 31..300: 0 .. 269 finished steps of the decay
        by_torch.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs[30:] == pytest.approx(by_torch, rel=1e-9, abs=1e-15)
    assert lrs == pytest.approx([article_lr(s) for s in range(1, 301)], rel=1e-12, abs=1e-18)


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the learning rate of each step it takes."""

    def __init__(self, params, **settings):
        super().__init__(params, **settings)
        self.applied = []

    def step(self, closure=None):
        self.applied.append(self.param_groups[0]["lr"])
        return super().step(closure)


def train(monkeypatch, model, optimizer, batches, labels, steps, accum_steps=1, world=1, lr=None):
    """finetune.train() on these batches (already the model's inputs), its checks and checkpoints replaced; with lr,
    every step's LR is lr. Returns its history (the loss and gradient norm of each step), its report, and the
    training state (the average). Each check must see the model in eval mode; each step asks for a checkpoint."""
    monkeypatch.setattr(finetune, "step_batches", lambda items, chosen, run, resolution, batch_size, history: (
        (pixels, labels) for pixels in batches))

    def accuracies(models, pictures, labels, run, batch_size, desc, into):
        assert not any(model.training for model in models)  # a check is an evaluation: no dropout
        return [10.0], pass_timing()

    asked = []
    monkeypatch.setattr(finetune, "accuracies", accuracies)
    monkeypatch.setattr(finetune, "save_or_stop", lambda run, stop, step, *args: asked.append(step))
    if lr is not None:
        monkeypatch.setattr(finetune, "lr_at", lambda step, base_lr, total_steps: lr)
    args = SimpleNamespace(lr=0.003, steps=steps, batch_size=len(labels), accum_steps=accum_steps, seed=0,
                           save_dir=None, resolution=224)
    run = SimpleNamespace(args=args, device=torch.device("cpu"), rank=0, world=world,
                          autocast=contextlib.nullcontext())
    history = {"losses": [], "norms": [], "rows": [], "seconds": 0.0,
               "passes": {"training": pass_timing(), "checks": pass_timing()}}
    training = {"model": model, "trained": model, "average": copy.deepcopy(model), "optimizer": optimizer, "start": 0,
                "history": history, "clock": time.perf_counter, "monitor": ([], []), "micro": len(labels)}
    report = Report("finetune", quiet=True)
    finetune.train(run, report, {"train": [(None, int(label)) for label in labels]}, training, steps)
    assert asked == list(range(1, steps + 1))  # a checkpoint (or a stop) is considered after every step
    return history, report, training


def test_the_training_loop_applies_and_logs_lr_at_of_each_step(monkeypatch):
    """train() over the 300 steps, its checks and checkpoints replaced: the LR it applies at each step is the
    article's of that step, and the LR its logged lines print is the article's."""
    model = TinyClassifier()
    optimizer = RecordingSGD(model.parameters(), lr=1.0, momentum=0.9)
    pixels, labels = step_batch()
    history, report, _ = train(monkeypatch, model, optimizer, [pixels] * 300, labels, 300)
    assert optimizer.applied == pytest.approx([article_lr(s) for s in range(1, 301)], rel=1e-12, abs=1e-18)
    assert {s: report.numbers[f"step {s} lr"]["text"] for s in ARTICLE_LRS} == ARTICLE_LRS
    assert [row["step"] for row in history["rows"]] == [5, 10, 25, 50, 100, 150, 200, 250, 300]  # kept for a resume
    assert model.modes == [True] * 300  # every step trains in training mode (dropout), after each check's eval


def test_the_loop_keeps_the_polyak_average_of_the_weights(monkeypatch):
    """Two steps: the average is 0.99 (0.99 w0 + 0.01 w1) + 0.01 w2, w_k the weights after step k (w0 the start)."""
    model, (pixels, labels) = TinyClassifier(), step_batch()
    weights = [[p.detach().clone() for p in model.parameters()]]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    real_step = optimizer.step

    def step(closure=None):
        real_step(closure)
        weights.append([p.detach().clone() for p in model.parameters()])

    optimizer.step = step
    _, _, training = train(monkeypatch, model, optimizer, [pixels] * 2, labels, 2, lr=0.1)
    for averaged, w0, w1, w2 in zip(training["average"].parameters(), *weights):
        assert torch.allclose(averaged, 0.99 * (0.99 * w0 + 0.01 * w1) + 0.01 * w2, rtol=0, atol=1e-7)


# ---------------------------------------------------------------- 4. the zero head

def test_the_zero_head_is_weight_and_bias_exactly_0_so_every_logit_is_exactly_0():
    model = SimpleNamespace(classifier=torch.nn.Linear(8, 10))  # zero_head() reads model.classifier only
    assert finetune.zero_head(model) == 8 * 10 + 10
    assert torch.equal(model.classifier.weight, torch.zeros(10, 8))
    assert torch.equal(model.classifier.bias, torch.zeros(10))
    features = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.classifier(features), torch.zeros(3, 10))


def test_the_classifier_built_for_fine_tuning_gives_logits_of_exactly_0():
    model, _ = finetune.build_classifier((tiny_vit(), {}), 10, 12)
    assert torch.equal(model.classifier.weight, torch.zeros(10, 4))
    assert torch.equal(model.classifier.bias, torch.zeros(10))
    with torch.no_grad():
        logits = model(pixel_values=torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0))).logits
    assert torch.equal(logits, torch.zeros(2, 10))


# ---------------------------------------------------------------- 5. the backbone's patch tokens

def test_feature_map_cell_r_c_is_hidden_token_1_plus_r_w_plus_c():
    """Z_L token k of picture b is [100 b + k, -k, 0.5]: the class token is k = 0, cell (r, c) of a 2x3 map is
    k = 1 + 3 r + c."""
    hidden = torch.tensor([[[100.0 * b + k, -k, 0.5] for k in range(1 + 2 * 3)] for b in range(2)])
    class_token, patch_tokens = backbone.split_tokens(hidden)
    assert class_token.tolist() == [[0.0, 0.0, 0.5], [100.0, 0.0, 0.5]]
    feature_map = backbone.patch_tokens_to_feature_map(patch_tokens, (2, 3))
    assert feature_map.shape == (2, 3, 2, 3)
    for b in range(2):
        for r in range(2):
            for c in range(3):
                k = 1 + 3 * r + c
                assert feature_map[b, :, r, c].tolist() == [100.0 * b + k, -k, 0.5]


# ---------------------------------------------------------------- the position stretch (common/position_table.py)

def test_a_stretch_needs_two_places_on_each_side():
    assert stretch_positions(2, 2) == [(0, 0.0), (0, 1.0)]
    assert stretch_positions(2, 3) == [(0, 0.0), (0, 0.5), (0, 1.0)]  # the last row: (n_old - 2, 1.0)
    for n_old, n_new in ((1, 5), (5, 1), (1, 1)):
        with pytest.raises(UserError, match="cannot be stretched"):
            stretch_positions(n_old, n_new)


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


# ---------------------------------------------------------------- the closed form (common/closed_form.py)

def test_lambda_0_recovers_the_weights_of_an_ill_conditioned_x():
    """X of condition number 1e6: its X^T X has 1e12, and solving the normal equations would lose about 12 digits
    (3e-5 here); least squares on X loses about 6. Y = X W exactly, so W comes back to 1e-8."""
    rng = np.random.default_rng(1)
    u, v = np.linalg.qr(rng.normal(size=(20, 3)))[0], np.linalg.qr(rng.normal(size=(3, 3)))[0]
    x = u @ np.diag([1.0, 1e-3, 1e-6]) @ v.T
    w = np.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 1.0]])
    np.testing.assert_allclose(closed_form(x, x @ w, 0.0), w, rtol=0, atol=1e-8)


@pytest.mark.parametrize("lam", [1e-16, 1e-30])
def test_a_lambda_too_small_for_float64_gives_the_limit_of_ridge(lam):
    """3 pictures, 5 features: X^T X is singular, and X^T X + lambda I nearly so (scipy warns) at 1e-16, exactly so in
    float64 at 1e-30. The answer is the ridge limit, numpy's pseudo-inverse X^+ Y."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(3, 5)), rng.normal(size=(3, 2))
    np.testing.assert_allclose(closed_form(x, y, lam), np.linalg.pinv(x) @ y, rtol=0, atol=1e-9)


# ---------------------------------------------------------------- compute (common/compute.py)

def test_forward_compute_of_vit_b16_by_hand():
    """2 L (4 s D^2 + 2 s D M + 2 s^2 D), L 12, D 768, M 3072: s = 197 gives 24 x 1,453,954,560 FLOPs at 224; s = 577
    gives 110,287,687,680 at 384."""
    assert compute.forward_gflops("B", 16, 224) == pytest.approx(34.89490944, rel=1e-13)
    config = compute.table1_config("B", 16)
    assert compute.config_forward_flops(config, 224) == 34_894_909_440
    assert compute.config_forward_flops(config, 384) == 110_287_687_680


# ---------------------------------------------------------------- vit_part3_posemb.py

def test_accuracy_counts_on_more_pictures_than_classes():
    """4 pictures, the head read at 3 classes (0, 217, 482 of 1000)."""
    logits = torch.full((4, 1000), -5.0)
    logits[0, 0] = 1.0                        # label 0: right of 10 and of 1000
    logits[1, 217] = 1.0                      # label 1: right of both
    logits[2, 482], logits[2, 7] = 1.0, 3.0   # label 2: right of 10, wrong of 1000 (class 7 wins)
    logits[3, 217] = 1.0                      # label 0: wrong of both
    assert posemb.accuracy_counts(logits, torch.tensor([0, 1, 2, 0]), [0, 217, 482]) == (3, 2)


def test_grids_are_whole_patches_per_side():
    config = SimpleNamespace(image_size=224, patch_size=16)
    assert posemb.grids(config, 384) == (14, 24)
    assert posemb.grids(config, 390) == (14, 24)  # 390 / 16 = 24.4: the last 6 pixels make no patch


def test_the_cosine_section_needs_a_3x3_grid_and_a_bigger_one():
    """A row with four neighbours needs 3 places a side; the stretch needs more places than the checkpoint has."""
    posemb.check_resolution(SimpleNamespace(image_size=48, patch_size=16), 64)  # 3x3 -> 4x4: fine
    for image_size, resolution in ((32, 64), (48, 48), (48, 32)):  # 2x2 -> 4x4; 3x3 -> 3x3; 3x3 -> 2x2
        with pytest.raises(UserError):
            posemb.check_resolution(SimpleNamespace(image_size=image_size, patch_size=16), resolution)


@pytest.mark.parametrize("n_old,n_new,expected", [
    (14, 24, ((3, 10), (5, 18))),  # the article's: 3 x 23/13 = 5.31 -> 5, 10 x 23/13 = 17.7 -> 18
    (3, 5, ((1, 1), (2, 2))),      # 3 x 2/13 = 0.46 -> 0, raised to 1; 10 x 2/13 = 1.54 -> 2, lowered to n - 2 = 1
    (5, 9, ((1, 3), (2, 6))),      # 3 x 4/13 = 0.92 -> 1; 10 x 4/13 = 3.08 -> 3; then x 8/4
])
def test_the_cosine_sections_place_on_both_grids_by_hand(n_old, n_new, expected):
    assert posemb.example_places(n_old, n_new) == expected


# ---------------------------------------------------------------- vit_part3_fewshot.py

def test_few_shot_accuracy_on_the_articles_hand_example():
    """The article's 4 pictures are the pool; 2 shots of each of its 2 classes take all of them, in any draw, so
    W is the article's [[0.625, -0.625], [-0.475, 0.475]] (lambda 1). Three validation pictures score
    [0.7, -0.7] (class A), [-0.95, 0.95] (B) and [0.625, -0.625] (A); labelled A, B, B: 2 of 3 right."""
    x_pool, labels = np.array(fewshot.HAND_X), np.array(fewshot.HAND_LABELS)
    x_val = np.array([[1.5, 0.5], [0.0, 2.0], [1.0, 0.0]])
    accuracies = fewshot.few_shot_accuracies(x_pool, labels, x_val, np.array([0, 1, 1]), 2, 1.0, 2, 0)
    assert accuracies == pytest.approx([200 / 3, 200 / 3], abs=1e-12)


def test_the_pool_is_per_class_pictures_of_each_class_in_a_fixed_order():
    """8 pictures, 5 of class 0 and 3 of class 1; 4 per class: 4 of class 0, all 3 of class 1, none twice."""
    items = [(f"p{i}.jpg", label) for i, label in enumerate([0, 1, 0, 0, 1, 0, 1, 0])]
    pool = fewshot.draw_pool(items, 4, seed=0)
    assert [label for _, label in pool] == [0, 0, 0, 0, 1, 1, 1]
    assert len(set(pool)) == 7 and set(pool) <= set(items)
    class_0 = [int(path[1:-4]) for path, label in pool if label == 0]
    assert class_0 == sorted(class_0)
    assert fewshot.draw_pool(items, 4, seed=0) == pool


# ---------------------------------------------------------------- vit_part3_setup.py

def test_weight_standardization_is_over_the_last_dimension_with_its_eps():
    """Filter [1, 2, 3, 2]: mean 2, variance 0.5, so (w - 2) / sqrt(0.5) = [-sqrt 2, 0, sqrt 2, 0]; with eps 1, divided
    by sqrt(1.5) instead. Two filter sets of two filters: each filter (last dimension) on its own."""
    filters = torch.tensor([[[1.0, 2.0, 3.0, 2.0], [2.0, 4.0, 6.0, 4.0]],
                            [[3.0, 2.0, 1.0, 2.0], [0.0, 0.0, 0.0, 4.0]]], dtype=torch.float64)
    s = math.sqrt(2)
    expected = [[[-s, 0, s, 0], [-s, 0, s, 0]], [[s, 0, -s, 0], [-1 / math.sqrt(3), -1 / math.sqrt(3),
                                                                  -1 / math.sqrt(3), math.sqrt(3)]]]
    np.testing.assert_allclose(setup.weight_standardize(filters).numpy(), expected, rtol=0, atol=1e-12)
    with_eps = setup.weight_standardize(filters[0, :1], eps=1.0)
    np.testing.assert_allclose(with_eps.numpy(), [[-1 / math.sqrt(1.5), 0, 1 / math.sqrt(1.5), 0]], rtol=0, atol=1e-12)


def test_the_optimizer_rows_count_steps_from_1():
    assert [row[0] for row in setup.sgd_momentum_by_hand([0.5, -0.1, 0.3])] == [1, 2, 3]
    assert [row[0] for row in setup.adam_by_hand([0.5, -0.1, 0.3])] == [1, 2, 3]


def test_torch_adam_with_its_default_lr_gives_the_articles_weight():
    """The article's line: torch.optim.Adam after the same three gradients: w=0.997824 (lr 0.001)."""
    assert setup.torch_adam([0.5, -0.1, 0.3]) == pytest.approx(0.997824, abs=5e-7)
    assert setup.torch_sgd([0.5, -0.1, 0.3]) == pytest.approx(0.98535, abs=5e-6)


# ---------------------------------------------------------------- vit_part3_finetune.py

def test_scaled_steps_are_at_least_1():
    assert finetune.scaled(5, 10) == 1  # 5 x 10/300 = 0.17 rounds to 0: at least 1
    assert (finetune.scaled(50, 30), finetune.scaled(300, 300)) == (5, 300)


def test_each_pass_flips_about_half_its_pictures_each_by_its_own_draw():
    for step in (1, 2):  # two whole passes of 2000 pictures
        flips = finetune.step_pictures(step, 2000, 2000, seed=0)[1]
        assert 0.45 < flips.mean() < 0.55


def test_clipping_counts_the_norms_above_the_cap_and_the_windows_are_the_runs_ends():
    """A norm of exactly 1 is not clipped: min(1, 1/||g||) = 1. Windows of 2: the first and the last two steps."""
    stats = finetune.run_statistics([5.0, 4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 0.5, 1.5, 4.0], 1.0, norm_window=2,
                                    loss_window=2)
    assert stats == {"clipped steps": 3, "median norm first": 1.5, "median norm last": 2.75, "mean loss first": 4.5,
                     "mean loss last": 1.5}


def test_the_body_gradient_norm_leaves_out_the_head_and_what_got_no_gradient():
    model = torch.nn.Module()
    model.body, model.unused, model.classifier = torch.nn.Linear(2, 1), torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    model.body.weight.grad, model.body.bias.grad = torch.tensor([[3.0, 0.0]]), torch.tensor([4.0])
    model.classifier.weight.grad, model.classifier.bias.grad = torch.tensor([[100.0]]), torch.tensor([100.0])
    assert finetune.body_gradient_norm(model) == 5.0  # sqrt(9 + 0 + 16)


def test_micro_batches_weigh_each_part_by_its_share_so_the_losses_add_up_to_the_batchs():
    logits = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.tensor([0, 2, 1, 1, 0])
    parts = list(finetune.micro_batches(logits, labels, 2))
    assert [y.tolist() for _, y, _ in parts] == [[0, 2, 1], [1, 0]]
    assert [weight for _, _, weight in parts] == pytest.approx([3 / 5, 2 / 5])
    total = sum(F.cross_entropy(x, y) * weight for x, y, weight in parts)
    assert total.item() == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-12)


def test_each_process_takes_its_contiguous_share_of_the_steps_batch():
    batch = (np.arange(8) * 10, np.arange(8) % 3 == 0)
    shares = [finetune.process_share(batch, rank, 4) for rank in range(4)]
    assert [indices.tolist() for indices, _ in shares] == [[0, 10], [20, 30], [40, 50], [60, 70]]
    assert [flips.tolist() for _, flips in shares] == [[True, False], [False, True], [False, False], [True, False]]


def test_a_shorter_run_removes_the_article_steps_it_never_logs():
    """30 steps log 0, 1, 2, 5, 10, 15, 20, 25, 30: the article's rows of its other steps are not comparable."""
    run = SimpleNamespace(args=SimpleNamespace(steps=30, batch_size=32, lr=0.003, resolution=224, precision="fp32",
                                               per_class=None, data_dir=None), loaded={})
    differences = finetune.setup_differences(run)
    removed = differences["steps"]["removes"]
    assert "step 250 loss" in removed and "step 300 norm" in removed and "step 0 validation" not in removed
    assert not [name for name in removed if name.split()[1] in ("1", "2", "5", "10", "15", "20", "25", "30")]
    assert "mean loss first" not in removed and "data set" not in differences


def test_fine_tuning_on_another_data_set_is_not_the_articles_setup(tmp_path):
    """--data-dir with other classes than Imagenette's: the difference names that folder, not the default one."""
    for split in ("train", "val"):
        (tmp_path / "flowers" / split / "rose").mkdir(parents=True)
    run = SimpleNamespace(args=SimpleNamespace(steps=300, batch_size=32, lr=0.003, resolution=224, precision="fp32",
                                               per_class=None, data_dir=str(tmp_path / "flowers")), loaded={})
    assert finetune.setup_differences(run)["data set"]["flag"] == f"--data-dir {tmp_path / 'flowers'}"


class TinyClassifier(torch.nn.Module):
    """A linear layer called as the training step calls a ViT; it records, per pass, whether DDP's no_sync() held."""

    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Linear(3, 4)
        self.waiting, self.passes, self.modes = False, [], []

    def forward(self, pixel_values, interpolate_pos_encoding):
        self.passes.append(self.waiting)
        self.modes.append(self.training)
        return SimpleNamespace(logits=self.classifier(pixel_values))

    @contextlib.contextmanager
    def no_sync(self):
        self.waiting = True
        try:
            yield
        finally:
            self.waiting = False


def step_batch():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 3, generator=generator) * 3, torch.tensor([0, 3, 1, 1, 2, 0])


@pytest.mark.parametrize("accum_steps", [1, 3])
def test_a_training_step_is_one_sgd_step_on_the_clipped_mean_gradient(accum_steps, monkeypatch):
    """By hand with autograd: the batch's mean loss, its gradient's global norm g, the gradient times min(1, 1/g);
    the first step of SGD with momentum moves each weight by -lr x that. Gradients left from before do not count."""
    torch.manual_seed(0)
    model, (pixels, labels) = TinyClassifier(), step_batch()
    by_hand = copy.deepcopy(model)
    loss = F.cross_entropy(by_hand(pixel_values=pixels, interpolate_pos_encoding=True).logits, labels)
    loss.backward()
    norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in by_hand.parameters()))
    assert norm > 1  # so that clipping acts
    expected = [p.detach() - 0.002 * p.grad / norm for p in by_hand.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=99.0, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    history, _, _ = train(monkeypatch, model, optimizer, [pixels], labels, 1, accum_steps, lr=0.002)
    assert history["losses"] == pytest.approx([loss.item()], rel=1e-6)
    assert history["norms"] == pytest.approx([norm], rel=1e-6)
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.detach(), e, rtol=0, atol=1e-7)
    assert optimizer.param_groups[0]["lr"] == 0.002


def test_a_step_whose_loss_is_not_finite_changes_no_weight(monkeypatch):
    model, (pixels, labels) = TinyClassifier(), step_batch()
    before = [p.detach().clone() for p in model.parameters()]
    pixels[0, 0] = float("nan")
    with pytest.raises(UserError, match="the training loss is nan at step 1"):
        train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels], labels, 1, lr=0.1)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_under_torchrun_the_gradients_are_averaged_once_after_the_last_pass(monkeypatch):
    """2 processes, 3 passes: passes 1 and 2 inside DDP's no_sync(), the last one not; the loss is the sum over the
    processes (here two with the same share) divided by 2."""
    monkeypatch.setattr(finetune, "sum_over_processes", lambda value, run: 2 * float(value))
    model, (pixels, labels) = TinyClassifier(), step_batch()
    expected = F.cross_entropy(model.classifier(pixels), labels).item()
    history, _, _ = train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels], labels, 1, 3,
                       world=2, lr=0.1)
    assert model.passes == [True, True, False]
    assert history["losses"] == pytest.approx([expected], rel=1e-6)
    model.passes.clear()
    train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels], labels, 1, 3, lr=0.1)
    assert model.passes == [False, False, False]  # one process: nothing to synchronise


def test_a_training_step_at_another_resolution_reads_the_stretched_table(monkeypatch):
    """The tiny ViT of 12 px fine-tuned at 20 px: the zero head's loss is ln 10."""
    model, _ = finetune.build_classifier((tiny_vit(), {}), 10, 20)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pixels = torch.randn(2, 3, 20, 20, generator=torch.Generator().manual_seed(0))
    history, _, _ = train(monkeypatch, model, optimizer, [pixels], torch.tensor([1, 7]), 1, lr=0.002)
    assert history["losses"] == pytest.approx([math.log(10)], abs=1e-6) and history["norms"][0] > 0


# ---------------------------------------------------------------- vit_backbone.py

def test_accuracy_metric_3_of_4():
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 5.0], [4.0, 0.0, 0.0]])
    assert backbone.accuracy_metrics((logits, np.array([0, 1, 2, 2]))) == {"accuracy": 0.75}


def test_pca_colours_of_identical_tokens_are_0_not_nan():
    """No spread at all: every component is constant, and (x - low) / (high - low) would divide 0 by 0."""
    assert backbone.pca_rgb(np.ones((2, 4, 5)), (2, 2)).tolist() == np.zeros((2, 2, 2, 3)).tolist()


def test_one_per_class_takes_the_first_of_each_class_then_the_second():
    """Labels 1, 1, 0, 2, 0, 1: the firsts are pictures 0, 2, 3, the seconds 1, 4, the third 5."""
    assert backbone.one_per_class([1, 1, 0, 2, 0, 1], 4) == [0, 2, 3, 1]
    assert backbone.one_per_class([1, 1, 0, 2, 0, 1], 10) == [0, 2, 3, 1, 4, 5]


def test_the_feature_grid_is_patches_per_side():
    model = SimpleNamespace(config=SimpleNamespace(image_size=224, patch_size=16))
    assert backbone.feature_grid(model) == (14, 14)


def test_linear_probe_three_epochs_of_three_batches_by_hand():
    """SGD with momentum 0.9 on the mean cross-entropy, written out in numpy: batches of 4, 4 and 2 pictures in each
    epoch's order, the learning rate 0.001 x 4/256 times (1 + cos(pi e / 3)) / 2 in epoch e (cosine to 0)."""
    rng = np.random.default_rng(8)
    x, labels = (rng.normal(size=(10, 5)) * 10).astype(np.float32), rng.integers(0, 3, 10)
    generator = torch.Generator().manual_seed(7)  # the probe's draws, in its order: the weights, then each epoch's order
    w = torch.empty(3, 5).normal_(0.0, 0.01, generator=generator).double().numpy()
    orders = [torch.randperm(10, generator=generator).numpy() for _ in range(3)]
    b, velocity = np.zeros(3), [np.zeros((3, 5)), np.zeros(3)]
    for epoch, order in enumerate(orders):
        lr = 0.001 * 4 / 256 * (1 + math.cos(math.pi * epoch / 3)) / 2
        for start in range(0, 10, 4):
            batch = order[start:start + 4]
            logits = x[batch] @ w.T + b
            p = np.exp(logits - logits.max(1, keepdims=True))
            error = (p / p.sum(1, keepdims=True) - np.eye(3)[labels[batch]]) / len(batch)
            velocity = [0.9 * velocity[0] + error.T @ x[batch], 0.9 * velocity[1] + error.sum(0)]
            w, b = w - lr * velocity[0], b - lr * velocity[1]
    layer = backbone.linear_probe(x, labels, 3, epochs=3, seed=7, batch_size=4)
    np.testing.assert_allclose(layer.weight.detach().numpy(), w, rtol=0, atol=2e-7)
    np.testing.assert_allclose(layer.bias.detach().numpy(), b, rtol=0, atol=2e-7)


@pytest.mark.parametrize("lam", [1.0, 1e-6, 1e-12, 1e-15])
def test_a_tiny_lambda_still_gives_the_ridge_solution(lam):
    """3 pictures of 5 features: the dual form W = X^T (X X^T + lambda I)^-1 Y solves a well-conditioned 3 x 3
    system, however small lambda is; the closed form must agree (the normal equations' 5 x 5 solve would not)."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 5)), rng.standard_normal((3, 2))
    dual = x.T @ np.linalg.solve(x @ x.T + lam * np.eye(3), y)
    assert np.allclose(closed_form(x, y, lam), dual, rtol=1e-7, atol=1e-9)


def test_a_well_conditioned_system_is_one_cholesky_solve_not_least_squares(monkeypatch):
    """The article's lambdas on more pictures than features: one Cholesky solve of X^T X + lambda I, the answer of
    scipy.linalg.solve(assume_a="pos"); the slower SVD least squares is kept for (nearly) singular systems."""
    import scipy.linalg

    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((40, 9)), rng.standard_normal((40, 3))
    expected = {lam: scipy.linalg.solve(x.T @ x + lam * np.eye(9), x.T @ y, assume_a="pos") for lam in (0.01, 1.0)}

    def not_here(*args, **kwargs):
        raise AssertionError("least squares on a well-conditioned system")

    monkeypatch.setattr(np.linalg, "lstsq", not_here)
    for lam, w in expected.items():
        np.testing.assert_allclose(closed_form(x, y, lam), w, rtol=1e-12, atol=0)
