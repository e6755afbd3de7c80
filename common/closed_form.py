"""The closed-form linear probe of Part 3's few-shot metric, shared by the few-shot and backbone scripts.

Frozen features X (one row per picture, with a bias column), targets Y in {-1, +1}, and the ridge
solution W = (X^T X + lambda I)^-1 X^T Y: a linear head fitted by one linear solve, no training loop.
"""
import numpy as np
import scipy.linalg


def targets(labels, classes):
    """Y (n, K): +1 in the column of each picture's class, -1 in the other K - 1 columns."""
    y = -np.ones((len(labels), classes))
    y[np.arange(len(labels)), labels] = 1
    return y


# The solve of the normal equations loses about log10(1 / rcond) of float64's 16 digits: below this reciprocal
# condition number (lambda 1e-12 on a few pictures, say) the answer would be quietly wrong in its 6th digit.
MIN_RCOND = 1e-10


def closed_form(x, y, lam):
    """W = (X^T X + lambda I)^-1 X^T Y, found by one linear solve of (X^T X + lambda I) W = X^T Y.

    It minimises ||X W - Y||^2 + lambda ||W||^2: the gradient 2 X^T (X W - Y) + 2 lambda W is 0 there.
    lambda = 0 is plain least squares; with fewer pictures than features X^T X is singular, and the
    answer is the limit as lambda -> 0, the minimum-norm solution X^+ Y (pseudo-inverse).
    """
    if lam > 0:
        gram = x.T @ x + lam * np.eye(x.shape[1])
        try:  # lambda > 0 makes X^T X + lambda I positive definite: Cholesky
            factor = scipy.linalg.cho_factor(gram)
        except scipy.linalg.LinAlgError:  # not so in floating point
            factor = None
        if factor and scipy.linalg.lapack.dpocon(factor[0], np.linalg.norm(gram, 1))[0] >= MIN_RCOND:  # upper factor
            return scipy.linalg.cho_solve(factor, x.T @ y)
        # a lambda so small that X^T X + lambda I is (nearly) singular in floating point: solved stably below
    # The same minimum as least squares on X stacked over sqrt(lambda) I, Y over 0: no X^T X is formed, so
    # its squared condition number never costs digits (lambda = 0: the minimum-norm X^+ Y).
    stacked_x = np.vstack([x, np.sqrt(lam) * np.eye(x.shape[1])])
    stacked_y = np.vstack([y, np.zeros((x.shape[1], y.shape[1]))])
    return np.linalg.lstsq(stacked_x, stacked_y, rcond=None)[0]


def with_bias(features):
    """X = [features, 1]: the bias column."""
    return np.hstack([features, np.ones((len(features), 1))])
