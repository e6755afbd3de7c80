"""common/features.py: the key of a cache file holds everything that decides the features, and a file made for
anything else is never read."""
import hashlib
import json
import os
import shutil
import threading

import numpy as np
import pytest

from common.features import cache_key, cached


def test_a_cache_key_holds_the_weight_file_and_what_decides_the_features(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"12345")
    name, text = cache_key("val", str(tmp_path), resolution=224, precision="fp32")
    weights = str((tmp_path / "model.safetensors").resolve())
    assert json.loads(text) == {"model": str(tmp_path), "configs": {}, "resolution": 224, "precision": "fp32",
                                "weights": [weights, hashlib.blake2b(b"12345").hexdigest()]}
    (tmp_path / "config.json").write_text('{"hidden_act": "gelu"}')  # beside the weights: its bytes decide them too
    configs = json.loads(cache_key("val", str(tmp_path), resolution=224, precision="fp32")[1])["configs"]
    assert configs == {"config.json": hashlib.blake2b(b'{"hidden_act": "gelu"}', digest_size=12).hexdigest()}
    (tmp_path / "config.json").unlink()
    assert name == f"val-{hashlib.sha256(text.encode()).hexdigest()[:20]}.npz"
    assert cache_key("val", str(tmp_path), resolution=384, precision="fp32")[0] != name
    (tmp_path / "model.safetensors").write_bytes(b"123456")  # the same path, other weights
    assert cache_key("val", str(tmp_path), resolution=224, precision="fp32")[0] != name
    (tmp_path / "empty").mkdir()
    assert cache_key("val", str(tmp_path / "empty"), resolution=224) is None  # no weight file: no cache
    assert cached(lambda: {"x": np.ones(2)}, None, {"x": 2}, tmp_path)[1] == "computed"
    assert list(tmp_path.glob("*.npz")) == []


def test_the_pictures_are_named_by_their_path_under_the_folder_and_their_bytes(tmp_path):
    """Each picture: [its path under the data folder, blake2b of its bytes, 12 bytes], in order, after `decides`."""
    (tmp_path / "model.safetensors").write_bytes(b"12345")
    (tmp_path / "val" / "a").mkdir(parents=True)
    picture = tmp_path / "val" / "a" / "1.JPEG"
    picture.write_bytes(b"pixels")
    _, text = cache_key("val", str(tmp_path), [picture], tmp_path, resolution=224)
    assert list(json.loads(text))[-2:] == ["resolution", "pictures"]
    assert json.loads(text)["pictures"] == [["val/a/1.JPEG", hashlib.blake2b(b"pixels", digest_size=12).hexdigest()]]
    name = cache_key("val", str(tmp_path), [picture], tmp_path, resolution=224)[0]
    picture.write_bytes(b"pixelz")  # the same path, other bytes
    assert cache_key("val", str(tmp_path), [picture], tmp_path, resolution=224)[0] != name


# The base of the keys below: a checkpoint folder's weight file of 5 bytes, modified at T nanoseconds; and what the
# scripts say decides the features (few-shot: resolution, precision, the pictures' digests; backbone: the data sets').
T = 1_700_000_000_123_456_789
DECIDES = {"resolution": 224, "precision": "fp32", "pictures": [["val/a/1.JPEG", "aa11"], ["val/b/2.JPEG", "bb22"]],
           "data": {"train": "cc33", "validation": "dd44"}}


def checkpoint(folder, contents=b"12345", mtime_ns=T, config="{}", processor="{}", nested=None, replaced=False):
    """A checkpoint folder whose model.safetensors holds contents, modified at mtime_ns (replaced: a new file put in
    its place, as cp -p or rsync -a do), beside its config and image processor files (nested: a processor_config.json
    too): its path as a string."""
    folder.mkdir(exist_ok=True)
    (folder / ("new.safetensors" if replaced else "model.safetensors")).write_bytes(contents)
    if replaced:
        (folder / "new.safetensors").replace(folder / "model.safetensors")
    os.utime(folder / "model.safetensors", ns=(mtime_ns, mtime_ns))
    (folder / "config.json").write_text(config)
    (folder / "preprocessor_config.json").write_text(processor)
    if nested is not None:
        (folder / "processor_config.json").write_text(nested)
    return str(folder)


def other_pictures(change):
    pictures = [list(picture) for picture in DECIDES["pictures"]]
    change(pictures)
    return pictures


# (what changes, {the model folder's name, contents, mtime}, {a field of DECIDES: its other value})
CHANGES = [
    ("the checkpoint: another folder with the same bytes, same time", {"folder": "other"}, {}),
    ("the weights: same folder, same time, another size", {"contents": b"123456"}, {}),
    ("the weights: same folder, same size and time, other bytes", {"contents": b"54321"}, {}),
    ("the weights: another file put in their place, same size and time", {"contents": b"54321", "replaced": True}, {}),
    ("the config: another activation", {"config": '{"hidden_act": "relu"}'}, {}),  # the weights untouched
    ("the image processor: another mean", {"processor": '{"image_mean": [0.1, 0.1, 0.1]}'}, {}),
    ("the image processor: a nested one, which transformers reads first", {"nested": '{"image_processor": {}}'}, {}),
    ("the resolution", {}, {"resolution": 384}),
    ("the precision", {}, {"precision": "bf16"}),
    ("a picture's bytes", {}, {"pictures": other_pictures(lambda p: p[1].__setitem__(1, "bb23"))}),
    ("a picture fewer", {}, {"pictures": other_pictures(lambda p: p.pop())}),
    ("the pictures' order", {}, {"pictures": other_pictures(lambda p: p.reverse())}),
    ("a data set's digest", {}, {"data": {"train": "cc33", "validation": "dd45"}}),
]


@pytest.mark.parametrize("what,weights,decides", CHANGES, ids=[change[0] for change in CHANGES])
def test_each_field_that_decides_the_features_changes_the_key(tmp_path, what, weights, decides):
    base = cache_key("val", checkpoint(tmp_path / "model"), **DECIDES)
    folder = tmp_path / weights.pop("folder", "model")
    changed = cache_key("val", checkpoint(folder, **weights), **{**DECIDES, **decides})
    assert changed[0] != base[0] and changed[1] != base[1], what  # another file, and another description in it


# what leaves the weights' bytes as they were, and so the features: the key stays (--resume's check too)
KEPT = [("a chmod", lambda path: path.chmod(0o600)),
        ("a copy put in their place (rsync -a, a restored backup)",
         lambda path: (shutil.copy2(path, path.with_name("copy")), path.with_name("copy").replace(path))),
        ("a touch", lambda path: os.utime(path, ns=(T + 5, T + 5)))]


@pytest.mark.parametrize("what,change", KEPT, ids=[kept[0] for kept in KEPT])
def test_what_keeps_the_weights_bytes_keeps_the_key(tmp_path, what, change):
    base = cache_key("val", checkpoint(tmp_path / "model"), **DECIDES)
    change(tmp_path / "model" / "model.safetensors")
    assert cache_key("val", str(tmp_path / "model"), **DECIDES) == base, what


def test_a_stale_file_is_never_read(tmp_path):
    """Each compute() gives arrays of its own number: a run is served from the cache only with the very same key."""
    calls = []

    def features(model, rows=2, **changes):
        def compute():
            calls.append(1)
            return {"x": np.full(rows, float(len(calls)))}

        arrays, source = cached(compute, cache_key("val", model, **{**DECIDES, **changes}), {"x": rows}, tmp_path)
        return arrays["x"].tolist(), source

    model = checkpoint(tmp_path / "model")
    assert features(model) == ([1.0, 1.0], "computed")
    assert features(model) == ([1.0, 1.0], "cache")
    assert features(model, precision="bf16") == ([2.0, 2.0], "computed")
    assert features(model, pictures=DECIDES["pictures"][:1], rows=1) == ([3.0], "computed")
    checkpoint(tmp_path / "model", contents=b"54321")  # the weights rewritten in place, the same size and time
    assert features(model) == ([4.0, 4.0], "computed")
    checkpoint(tmp_path / "model", contents=b"123456", mtime_ns=T)  # another size, the first time
    assert features(model) == ([5.0, 5.0], "computed")
    # a file under this key's name made for something else (a collision of the short name): not read
    name, _ = cache_key("val", model, **DECIDES)
    other = cache_key("val", model, **{**DECIDES, "resolution": 384})
    cached(lambda: {"x": np.full(2, -1.0)}, other, {"x": 2}, tmp_path)
    (tmp_path / other[0]).replace(tmp_path / name)
    assert features(model) == ([6.0, 6.0], "computed")
    # a file of this key with too few rows for the pictures (written by hand): not read
    cached(lambda: {"x": np.full(1, -1.0)}, cache_key("val", model, **DECIDES), {"x": 1}, tmp_path / "short")
    (tmp_path / "short" / name).replace(tmp_path / name)
    assert features(model) == ([7.0, 7.0], "computed")
    if hasattr(os, "mkfifo"):  # a pipe at the file's name (mkfifo): read, it would wait for a writer for ever
        (tmp_path / name).unlink()
        os.mkfifo(tmp_path / name)
        served = []
        reader = threading.Thread(target=lambda: served.append(features(model)), daemon=True)  # a hang: a failure
        reader.start()
        reader.join(timeout=120)
        assert served == [([8.0, 8.0], "computed")] and (tmp_path / name).is_file()  # the pipe replaced
