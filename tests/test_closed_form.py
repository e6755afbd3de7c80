"""common/features.py: the ridge regression of the few-shot metric, against numpy's and SciPy's solvers and
values worked out by hand."""
import numpy as np
import pytest
import scipy.linalg

from common.features import closed_form, ridge


def with_bias(features):
    return np.hstack([features, np.ones((len(features), 1))])


def targets(labels, classes):
    return np.where(np.arange(classes) == np.asarray(labels)[:, None], 1.0, -1.0)


def test_the_probe_fits_targets_of_plus_and_minus_one_on_a_bias_column():
    """Pictures [2] (class 0) and [4] (class 1), lambda 0: [x, 1] W = Y exactly, so W = [[-1, 1], [3, -3]] (the score
    of class 0 is 3 - x, of class 1 x - 3); without the bias column, least squares x w = Y: w = Y^T x / x^T x."""
    features, labels = np.array([[2.0], [4.0]]), [0, 1]
    np.testing.assert_allclose(closed_form(features, labels, 2, 0.0), [[-1.0, 1.0], [3.0, -3.0]], atol=1e-12)
    np.testing.assert_allclose(closed_form(features, labels, 2, 0.0, bias=False), [[(2 - 4) / 20, (-2 + 4) / 20]],
                               atol=1e-12)
    assert closed_form(np.zeros((3, 2)), [0, 2, 1], 3, 1.0).shape == (3, 3)  # K columns, d + 1 rows


# ---------------------------------------------------------------- the ridge solution

@pytest.mark.parametrize("lam", [0.0, 0.01, 1.0, 100.0])
def test_closed_form_equals_lstsq_on_the_augmented_system(lam):
    """min ||X W - Y||^2 + lambda ||W||^2 is least squares on [X; sqrt(lambda) I] W = [Y; 0]."""
    rng = np.random.default_rng(1)
    x, y = with_bias(rng.normal(size=(30, 6))), targets(rng.integers(0, 4, 30), 4)
    augmented_x = np.vstack([x, np.sqrt(lam) * np.eye(7)])
    augmented_y = np.vstack([y, np.zeros((7, 4))])
    expected = np.linalg.lstsq(augmented_x, augmented_y, rcond=None)[0]
    assert np.allclose(ridge(x, y, lam), expected, atol=1e-9)


@pytest.mark.parametrize("by_hand", ["cholesky", "least squares"])
def test_the_penalty_is_lambda_times_the_identity_by_hand(by_hand):
    """X = diag(a, b), Y = [1, 1]: W = [a / (a^2 + lambda), b / (b^2 + lambda)]. At a = 2, b = 1, lambda = 1 the
    system is well conditioned: [2/5, 1/2]. At a = 1e4, b = 0.01, lambda = 1e-4 the reciprocal condition number of
    X^T X + lambda I is 2e-4 / (1e8 + 1e-4) = 2e-12, below MIN_RCOND (1e-10), so the answer comes from the stacked
    least squares, [1e4 / (1e8 + 1e-4), 0.01 / 2e-4] = [1e-4, 50]: a penalty of lambda^2 or 2 lambda would give 99.99
    or 33.3 in the second row."""
    a, b, lam = (2.0, 1.0, 1.0) if by_hand == "cholesky" else (1e4, 0.01, 1e-4)
    gram = np.diag([a * a + lam, b * b + lam])
    assert (1 / np.linalg.cond(gram, 1) < 1e-10) == (by_hand == "least squares")  # which side of MIN_RCOND
    expected = [[a / (a * a + lam)], [b / (b * b + lam)]]
    np.testing.assert_allclose(ridge(np.diag([a, b]), np.ones((2, 1)), lam), expected, rtol=1e-9, atol=0)


@pytest.mark.parametrize("small,lam,below", [(0.1, 1e-2, False), (1e-3, 1e-6, True)])
def test_both_sides_of_min_rcond_give_the_svd_ridge_solution(small, lam, below):
    """W = V diag(s / (s^2 + lambda)) U^T Y from numpy's SVD of X: 8 pictures of 4 features, singular values 1e3, 1,
    0.3 and `small`, with lambda = small^2, so that the last direction is shrunk to half its least-squares size. The
    reciprocal condition number of X^T X + lambda I is about 2 small^2 / 1e6: 2e-8 at small 0.1 (above MIN_RCOND,
    1e-10: the system is solved as it is), 2e-12 at 1e-3 (below: the stable route)."""
    rng = np.random.default_rng(5)
    u, v = np.linalg.qr(rng.normal(size=(8, 4)))[0], np.linalg.qr(rng.normal(size=(4, 4)))[0]
    x, y = u @ np.diag([1e3, 1.0, 0.3, small]) @ v.T, rng.normal(size=(8, 3))
    assert (1 / np.linalg.cond(x.T @ x + lam * np.eye(4), 1) < 1e-10) == below
    u_x, s, vt = np.linalg.svd(x, full_matrices=False)
    expected = vt.T @ np.diag(s / (s**2 + lam)) @ u_x.T @ y
    np.testing.assert_allclose(ridge(x, y, lam), expected, rtol=1e-7, atol=0)


def test_a_well_conditioned_system_is_one_cholesky_solve_not_least_squares(monkeypatch):
    """The article's lambdas on more pictures than features: one Cholesky solve of X^T X + lambda I, the answer of
    scipy.linalg.solve(assume_a="pos"); the slower SVD least squares is kept for (nearly) singular systems."""
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((40, 9)), rng.standard_normal((40, 3))
    expected = {lam: scipy.linalg.solve(x.T @ x + lam * np.eye(9), x.T @ y, assume_a="pos") for lam in (0.01, 1.0)}

    def not_here(*args, **kwargs):
        raise AssertionError("least squares on a well-conditioned system")

    monkeypatch.setattr(np.linalg, "lstsq", not_here)
    for lam, w in expected.items():
        np.testing.assert_allclose(ridge(x, y, lam), w, rtol=1e-12, atol=0)


@pytest.mark.parametrize("lam", [1.0, 1e-6, 1e-12, 1e-15])
def test_a_tiny_lambda_still_gives_the_ridge_solution(lam):
    """3 pictures of 5 features: the dual form W = X^T (X X^T + lambda I)^-1 Y solves a well-conditioned 3 x 3
    system, however small lambda is; the closed form must agree (the normal equations' 5 x 5 solve would not)."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 5)), rng.standard_normal((3, 2))
    dual = x.T @ np.linalg.solve(x @ x.T + lam * np.eye(3), y)
    assert np.allclose(ridge(x, y, lam), dual, rtol=1e-7, atol=1e-9)


# ---------------------------------------------------------------- lambda 0 and lambdas too small for float64

def test_lambda_0_recovers_the_weights_of_an_ill_conditioned_x():
    """X of condition number 1e6: its X^T X has 1e12, and solving the normal equations would lose about 12 digits
    (3e-5 here); least squares on X loses about 6. Y = X W exactly, so W comes back to 1e-8."""
    rng = np.random.default_rng(1)
    u, v = np.linalg.qr(rng.normal(size=(20, 3)))[0], np.linalg.qr(rng.normal(size=(3, 3)))[0]
    x = u @ np.diag([1.0, 1e-3, 1e-6]) @ v.T
    w = np.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 1.0]])
    np.testing.assert_allclose(ridge(x, x @ w, 0.0), w, rtol=0, atol=1e-8)


def few_pictures(pictures):
    """5 pictures of 12 features and the bias, targets of 3 classes; or 3 pictures of 5 features, Y random."""
    if pictures == 5:
        rng = np.random.default_rng(2)
        return with_bias(rng.normal(size=(5, 12))), targets(rng.integers(0, 3, 5), 3)
    rng = np.random.default_rng(0)
    return rng.normal(size=(3, 5)), rng.normal(size=(3, 2))


@pytest.mark.parametrize("pictures,lam,atol", [(5, 0.0, 1e-10), (5, 1e-9, 1e-6), (3, 1e-16, 1e-9), (3, 1e-30, 1e-9)])
def test_fewer_pictures_than_features_give_the_limit_of_ridge(pictures, lam, atol):
    """X^T X is singular: at lambda 0 the answer is the ridge limit, numpy's pseudo-inverse X^+ Y, and at 1e-9 within
    1e-6 of it; X^T X + lambda I is nearly singular (scipy warns) at 1e-16 and exactly so in float64 at 1e-30, and the
    answer is still X^+ Y."""
    x, y = few_pictures(pictures)
    np.testing.assert_allclose(ridge(x, y, lam), np.linalg.pinv(x) @ y, rtol=0, atol=atol)
