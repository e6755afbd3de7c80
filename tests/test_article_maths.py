"""The articles' maths against values worked out by hand (written here) or computed by an independent library.

Each test guards a formula whose change the rest of the suite let through: the five of issue 31 first, then the
mutants that benchmarks/mutation.py found surviving (docs/mutation.md). Pure functions and tiny tensors only.
"""
import copy
import math
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vit_backbone as backbone
import vit_part3_finetune as finetune
from common.loader import pass_timing
from common.output import Report
from common.position_table import bilinear_table, cosine_similarities, split_table

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


def test_the_training_loop_applies_and_logs_lr_at_of_each_step(monkeypatch):
    """train_steps() with its model step, checks and checkpoints replaced: the LR it hands to each step is the
    article's of that step, and the LR its logged lines print is the article's."""
    applied = []

    def model_step(model, optimizer, pixels, labels, lr, run):
        applied.append(lr)
        return 1.0, 1.0

    def batches(run, data, first, last, history):
        count = last - first + 1
        return ([(np.array([0, 1]), np.zeros(2, dtype=bool))] * count,
                iter([torch.zeros(2, 4, 4, 3, dtype=torch.uint8)] * count))

    monkeypatch.setattr(finetune, "train_step", model_step)
    monkeypatch.setattr(finetune, "step_batches", batches)
    monkeypatch.setattr(finetune, "check_accuracy", lambda *args: (10.0, pass_timing()))
    monkeypatch.setattr(finetune, "save_or_stop", lambda *args: None)
    args = SimpleNamespace(lr=0.003, steps=300, batch_size=2, seed=0, save_dir=None)
    run = SimpleNamespace(args=args, device=torch.device("cpu"), rank=0, world=1)
    model = torch.nn.Linear(1, 1)
    history = {"losses": [], "norms": [], "rows": [], "seconds": 0.0,
               "passes": {"training": pass_timing(), "checks": pass_timing()}}
    training = {"model": model, "trained": model, "average": copy.deepcopy(model), "optimizer": None, "start": 0,
                "history": history, "clock": time.perf_counter()}
    report = Report("finetune", quiet=True)
    finetune.train_steps(run, report, {"train": [("a", 0), ("b", 1)]}, training, None, 30, 300)
    assert applied == pytest.approx([article_lr(s) for s in range(1, 301)], rel=1e-12, abs=1e-18)
    assert {s: report.numbers[f"step {s} lr"]["text"] for s in ARTICLE_LRS} == ARTICLE_LRS


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
