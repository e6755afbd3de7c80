"""A cache of arrays computed from a frozen model (features), keyed by everything that decides them.

A file holds the arrays and the full description of what made them; it is used only when that
description matches exactly. The cache is a convenience: a file that cannot be read or written
(read-only or full disk, damaged file, two runs at once) is said in one warning line, and the run goes
on as if there were no cache. Files are written by common/files.py, whole or not at all, under a
unique temporary name, so two runs filling the same cache never trip over each other.
"""
import sys

import numpy as np

from common.errors import UserError
from common.files import reason, write_atomic


def warn(text):
    print(f"warning: {text}", file=sys.stderr, flush=True)


def read_arrays(path, description, rows, say=warn):
    """{name: array} stored at path for exactly this description, with rows[name] rows each, else None."""
    if not path.exists():
        return None
    try:
        with np.load(path) as stored:
            if str(stored["key"]) != description:
                return None  # made for other pictures or weights: a hash collision of the short name
            arrays = {name: stored[name] for name in rows}
    except OSError as error:
        say(f"cannot read the cached features {path} ({reason(error)}): computing them")
        return None
    except Exception:  # noqa: BLE001 - a truncated or foreign file is recomputed, never used
        say(f"the cached features {path} are damaged: computing them again")
        return None
    if any(len(array) != rows[name] for name, array in arrays.items()):
        return None
    return arrays


def write_arrays(path, description, arrays, say=warn):
    """Store the arrays with their description; True when written, a warning and False when not."""
    try:
        write_atomic(path, lambda f: np.savez(f, key=description, **arrays), what="feature cache")
    except UserError as problem:
        say(f"{problem}; the run goes on without caching the features")
        return False
    return True


def cached_arrays(compute, path, description, rows, say=warn):
    """(arrays, "cache" or "computed"): read when they match exactly ({name: rows}), else compute()d and stored."""
    arrays = read_arrays(path, description, rows, say)
    if arrays is not None:
        return arrays, "cache"
    arrays = compute()
    write_arrays(path, description, arrays, say)
    return arrays, "computed"
