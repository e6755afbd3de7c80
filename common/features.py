"""Frozen features, cached only when everything that decides them matches (a file that cannot be read or written is
one warning; docs/data.md), and Part 3's closed-form probe W = (X^T X + lambda I)^-1 X^T Y."""
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import scipy.linalg

from common.files import reason, write_atomic
from common.paths import FEATURE_CACHE_DIR as CACHE_DIR
from common.pretrained import NESTED_PROCESSOR_FILE, PROCESSOR_FILE, cached_weight_file
from common.start_and_end import UserError, say


def cache_key(name, model, paths=None, root=None, **decides):
    """(file name, description) of the features of `model` (its weight file's path and a digest of its bytes, and the
    bytes of its config and image processor files), `decides` and the pictures at `paths` (each path under root, and
    a digest of its bytes); None when no weight file is on disk."""
    weights = cached_weight_file(os.path.expanduser(model))
    if weights is None:
        return None
    if paths is not None:
        decides["pictures"] = [[str(Path(path).relative_to(root)), picture_digest(path)] for path in paths]
    folder = Path(weights).parent
    configs = {file: hashlib.blake2b((folder / file).read_bytes(), digest_size=12).hexdigest()
               for file in ("config.json", PROCESSOR_FILE, NESTED_PROCESSOR_FILE) if (folder / file).is_file()}
    with open(weights, "rb") as file:  # its bytes: a copy or a chmod keeps the key, an edit that keeps the time not
        digest = hashlib.file_digest(file, "blake2b").hexdigest()
    text = json.dumps({"model": model, "weights": [str(Path(weights).resolve()), digest], "configs": configs,
                       **decides})
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.npz", text


def picture_digest(path):
    """A digest of a picture's bytes; one that cannot be read is one line, in the loader's words (common/data.py)."""
    try:
        return hashlib.blake2b(Path(path).read_bytes(), digest_size=12).hexdigest()
    except OSError as error:
        raise UserError(f"cannot read picture {path}: {error}") from error


def cached(compute, key, rows, cache_dir=CACHE_DIR, warn=lambda text: say(f"warning: {text}")):
    """(arrays, "cache" or "computed"): read from cache_dir when they match a cache_key exactly ({name: rows}), else
    compute()d and stored; with no key (--no-cache, or no weight file on disk) compute()d, neither read nor written."""
    if key is None:
        return compute(), "computed"
    path, description = cache_dir / key[0], key[1]
    arrays = stored(path, description, rows, warn)
    if arrays is not None:
        return arrays, "cache"
    arrays = compute()
    try:
        write_atomic(path, lambda f: np.savez(f, key=description, **arrays), what="feature cache")
    except UserError as problem:
        warn(f"{problem}; the run goes on without caching the features")
    return arrays, "computed"


def stored(path, description, rows, warn):
    """{name: array} stored at path for exactly this description, with rows[name] rows each, else None."""
    if not path.exists() or path.is_fifo():  # none, or a pipe: its read would wait for a writer for ever
        return None
    try:
        with np.load(path) as npz:
            if str(npz["key"]) != description:
                return None  # made for other pictures or weights: a hash collision of the short name
            arrays = {name: npz[name] for name in rows}
    except OSError as error:
        warn(f"cannot read the cached features {path} ({reason(error)}): computing them")
        return None
    except Exception:  # noqa: BLE001 - a truncated or foreign file is recomputed, never used
        warn(f"the cached features {path} are damaged: computing them again")
        return None
    return None if any(len(array) != rows[name] for name, array in arrays.items()) else arrays


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
