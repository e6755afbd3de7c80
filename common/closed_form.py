"""Part 3's closed-form few-shot probe: frozen features X (with a bias column), targets Y in {-1, +1}, and the ridge
solution W = (X^T X + lambda I)^-1 X^T Y, a linear head fitted by one solve."""
import numpy as np
import scipy.linalg

# The solve loses about log10(1 / rcond) of float64's 16 digits: below this, fewer than 6 would be left, quietly.
MIN_RCOND = 1e-10


def ridge(x, y, lam):
    """W = (X^T X + lambda I)^-1 X^T Y, the minimum of ||X W - Y||^2 + lambda ||W||^2, by one linear solve; lambda = 0
    is least squares, its minimum-norm solution X^+ Y where X^T X is singular."""
    if lam > 0:
        gram = x.T @ x + lam * np.eye(x.shape[1])
        try:  # lambda > 0 makes X^T X + lambda I positive definite: Cholesky
            factor = scipy.linalg.cho_factor(gram)
        except scipy.linalg.LinAlgError:  # not so in floating point
            factor = None
        if factor and scipy.linalg.lapack.dpocon(factor[0], np.linalg.norm(gram, 1))[0] >= MIN_RCOND:  # upper factor
            return scipy.linalg.cho_solve(factor, x.T @ y)
        # a lambda so small that X^T X + lambda I is (nearly) singular in floating point: solved stably below
    # The same minimum as least squares on X over sqrt(lambda) I, Y over 0: no X^T X, whose condition is squared.
    stacked_x = np.vstack([x, np.sqrt(lam) * np.eye(x.shape[1])])
    stacked_y = np.vstack([y, np.zeros((x.shape[1], y.shape[1]))])
    return np.linalg.lstsq(stacked_x, stacked_y, rcond=None)[0]


def closed_form(features, labels, classes, lam, bias=True):
    """Part 3's probe: W (d + 1, K) from X = [features, 1] (bias=False: X = features, (d, K)) and Y (n, K), +1 in the
    column of each picture's class and -1 in the other K - 1; a picture's scores are then [x, 1] W."""
    x = np.hstack([features, np.ones((len(features), 1))]) if bias else np.asarray(features, dtype=np.float64)
    return ridge(x, 2 * np.eye(classes)[labels] - 1, lam)
