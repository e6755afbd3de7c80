"""vit_backbone.py's maths: the patch tokens' feature map, the accuracy metric, the PCA colours, the pictures shown,
the feature grid and the linear probe's SGD, against values worked out by hand (the probe's in numpy).

The script's other functions and its runs on stand-ins: tests/test_backbone.py.
"""
import math

import numpy as np
import torch

import vit_backbone as backbone


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


def test_linear_probe_three_epochs_of_three_batches_by_hand():
    """SGD with momentum 0.9 on the mean cross-entropy, written out in numpy: batches of 4, 4 and 2 pictures in each
    epoch's order, the learning rate 0.001 x 4/256 times (1 + cos(pi e / 3)) / 2 in epoch e (cosine to 0)."""
    rng = np.random.default_rng(8)
    x, labels = (rng.normal(size=(10, 5)) * 10).astype(np.float32), rng.integers(0, 3, 10)
    # the probe's draws, in its order: the weights, then each epoch's order
    generator = torch.Generator().manual_seed(7)
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
