"""The closed-form linear probe of Part 3's few-shot metric, shared by the few-shot and backbone scripts.

Frozen features X (one row per picture, with a bias column), targets Y in {-1, +1}, and the ridge
solution W = (X^T X + lambda I)^-1 X^T Y: a linear head fitted by one linear solve, no training loop.
"""
import warnings

import numpy as np
import scipy.linalg


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
    if lam > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("error", scipy.linalg.LinAlgWarning)
            try:
                return scipy.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ y, assume_a="pos")
            except (scipy.linalg.LinAlgWarning, np.linalg.LinAlgError):
                pass  # a lambda so small that X^T X + lambda I is singular in floating point: solve it stably below
    # The same minimum as least squares on X stacked over sqrt(lambda) I, Y over 0: no X^T X is formed, so
    # its squared condition number never costs digits (lambda = 0: the minimum-norm X^+ Y).
    stacked_x = np.vstack([x, np.sqrt(lam) * np.eye(x.shape[1])])
    stacked_y = np.vstack([y, np.zeros((x.shape[1], y.shape[1]))])
    return np.linalg.lstsq(stacked_x, stacked_y, rcond=None)[0]


def with_bias(features):
    """X = [features, 1]: the bias column."""
    return np.hstack([features, np.ones((len(features), 1))])
