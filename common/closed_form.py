"""The closed-form linear probe of Part 3's few-shot metric, shared by the few-shot and backbone scripts.

Frozen features X (one row per picture, with a bias column), targets Y in {-1, +1}, and the ridge
solution W = (X^T X + lambda I)^-1 X^T Y: a linear head fitted by one linear solve, no training loop.
"""
import numpy as np


def targets(labels, classes):
    """Y (n, K): +1 in the column of each picture's class, -1 in the other K - 1 columns."""
    y = -np.ones((len(labels), classes))
    y[np.arange(len(labels)), labels] = 1
    return y


def closed_form(x, y, lam):
    """W = (X^T X + lambda I)^-1 X^T Y, found by one linear solve of (X^T X + lambda I) W = X^T Y.

    It minimises ||X W - Y||^2 + lambda ||W||^2: the gradient 2 X^T (X W - Y) + 2 lambda W is 0 there.
    lambda = 0 is plain least squares; with fewer pictures than features X^T X is singular, and the
    answer is the limit as lambda -> 0, the minimum-norm solution X^+ Y (pseudo-inverse).
    """
    if lam == 0:
        return np.linalg.lstsq(x, y, rcond=None)[0]
    return np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ y)


def with_bias(features):
    """X = [features, 1]: the bias column."""
    return np.hstack([features, np.ones((len(features), 1))])
