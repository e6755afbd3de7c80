"""Imagenette (imagenette2-160/{train,val}/<wnid>/*.JPEG): find or download it, check it, list its pictures; any
folder in that layout works, Imagenette's counts are checked only for its ten WordNet ids (docs/data.md)."""
import hashlib
import json
from pathlib import Path

import numpy as np

from common.errors import UserError
from common.marks import made_here
from common.output import say
from common.paths import IMAGENETTE_DIR as DEFAULT_DIR

URL = "https://s3.amazonaws.com/fast-ai-imageclas/imagenette2-160.tgz"
MD5 = "e793b78cc4c9e9a4ccc0c1155377a412"  # the release's, as torchvision's Imagenette publishes it for URL
URL_VARIABLE = "VIT_PART3_IMAGENETTE_URL"  # a mirror of the archive (a test's server, a local copy)
ARCHIVE_BYTES = 99_003_388  # the release's archive
ARCHIVE_MB = 99  # MB are 10^6 bytes, as every size the project states (94 MiB)
SPLIT_COUNTS = {"train": 9_469, "val": 3_925}
PICTURE_SIDE = 160  # imagenette2-160: every picture is 160 px on its short side
DEFAULT_NAME = "imagenette2-160 (the project's download)"  # the data a run without --data-dir reads
SAMPLE_SEED = 0  # the draw of --per-class's validation pictures, where they are a sample: the same in every run
# WordNet id, the article's short name, ImageNet-1k index (parachute is n03888257, not n03888605)
CLASSES = [("n01440764", "tench", 0), ("n02102040", "springer", 217), ("n02979186", "cassette player", 482),
           ("n03000684", "chain saw", 491), ("n03028079", "church", 497), ("n03394916", "French horn", 566),
           ("n03417042", "garbage truck", 569), ("n03425413", "gas pump", 571), ("n03445777", "golf ball", 574),
           ("n03888257", "parachute", 701)]
IMAGENETTE_WNIDS = sorted(wnid for wnid, _, _ in CLASSES)  # as class_folders() lists them
SPLIT_WORDS = {"train": "training", "val": "validation"}


def class_folders(root, split):
    folder = Path(root) / split
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def list_split(root, split, per_class=None, drawn=False):
    """[(path, label)] sorted by class folder, then file name; per_class keeps N of each class: the first N by name
    (in Imagenette's val/ its ILSVRC2012_val_* pictures, whose names sort first: docs/data.md), or, drawn, N times the
    classes drawn at random with a fixed seed from the whole split, N a class on average: a simple random sample,
    which --compare's exact intervals take them for."""
    paths = [sorted(p for p in (Path(root) / split / wnid).iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".png"))
             for wnid in class_folders(root, split)]
    if not drawn:
        return [(path, label) for label, each in enumerate(paths) for path in each[:per_class]]
    items = [(path, label) for label, each in enumerate(paths) for path in each]
    if per_class and per_class * len(paths) < len(items):
        chosen = np.random.default_rng(SAMPLE_SEED).choice(len(items), per_class * len(paths), replace=False)
        items = [items[i] for i in sorted(chosen)]
    return items


def check_counts(root, strict,
                 fix=": delete the folder to download it again, or pass --data-dir with a complete copy"):
    """The layout: both splits hold the same class folders, and every class folder holds pictures; then Imagenette's
    counts: strict (UserError) for the copy we download, else the warning for a partial copy, or None."""
    folders = {split: class_folders(root, split) for split in SPLIT_COUNTS}
    for split, names in folders.items():
        if not names:
            raise UserError(f"no class folders in {Path(root) / split}: expected the layout {split}/<class>/*.JPEG")
    only = sorted(set(folders["train"]) ^ set(folders["val"]))
    if not only and len(folders["val"]) < 2:  # one class: every loss would be ln 1 = 0, every accuracy 100%
        raise UserError(f"one class folder in {root} ({folders['val'][0]}): a classifier needs at least 2 classes")
    if only:
        where = "train" if only[0] in folders["train"] else "val"
        raise UserError(f"class {only[0]} is in {Path(root) / where} but not in the other split: both splits need "
                        f"the same class folders")
    found = {}
    for split in SPLIT_COUNTS:
        labels = [label for _, label in list_split(root, split)]
        per_class = np.bincount(labels, minlength=len(folders[split]))
        if per_class.min() == 0:
            raise UserError(f"no pictures in {Path(root) / split / folders[split][int(per_class.argmin())]}: every "
                            f"class needs pictures (.JPEG, .jpg or .png) in both splits")
        found[split] = len(labels)
    if folders["val"] != IMAGENETTE_WNIDS or found == SPLIT_COUNTS:
        return None  # another data set (its own counts), or Imagenette whole
    counts = ", ".join(f"{found[split]:,} of {expected:,} {SPLIT_WORDS[split]}"
                       for split, expected in SPLIT_COUNTS.items())
    if strict:
        raise UserError(f"found {counts} pictures in {root}{fix}")
    return f"{root} holds {counts} pictures of Imagenette: a partial copy, so its numbers cannot match the article's"


def data_differences(args, counts, drawn=False):
    """{item: difference} of this run's pictures ({split: count used, or None when not loaded}) against Imagenette's;
    the pictures: --data-dir, else the default folder. Another data set is told by what can be checked cheaply: a
    folder job/standins.py or job/miniature.py made, other class folders, a class's first picture in either split
    not 160 px on its short side; else only a draw --per-class made at random (drawn) from a folder that holds the
    release's counts is a sample of its pictures: a partial copy is none."""
    from PIL import Image

    root, unlike = Path(args.data_dir or DEFAULT_DIR), None
    if root.is_dir() and (made := made_here(root)):
        unlike = f"{made}, not Imagenette"
    elif root.is_dir() and (changed := changed_pictures(root)):
        unlike = f"the pictures the project downloaded, but {changed}"
    elif root.is_dir() and class_folders(root, "val") != IMAGENETTE_WNIDS:
        unlike = "another data set than Imagenette"
    elif root.is_dir():
        for path in [path for split in SPLIT_COUNTS for path, _ in list_split(root, split, 1)]:  # each class's first
            try:
                with Image.open(path) as picture:
                    size = picture.size
            except (OSError, Image.DecompressionBombError):  # unreadable: the section that read it said so
                continue
            if min(size) != PICTURE_SIDE:
                unlike = (f"pictures of another size than Imagenette-160's ({path.name} is {size[0]}x{size[1]}, the "
                          f"release's are {PICTURE_SIDE} px on the short side)")
                break
    flag = f"--data-dir {args.data_dir}" if args.data_dir else str(root)
    if unlike:
        return {"data set": {"flag": flag, "why": f"{flag}: {unlike}"}}
    from compare.verdicts import subset_differences  # asked only for --compare or --json

    items = {split: f"{SPLIT_WORDS[split]} pictures" for split in counts}
    whole = not root.is_dir() or all(len(list_split(root, split)) == SPLIT_COUNTS[split] for split in SPLIT_COUNTS)
    differences = subset_differences(args, {items[split]: count for split, count in counts.items()},
                                     {items[split]: SPLIT_COUNTS[split] for split in counts}, drawn, whole)
    if whole and root.is_dir() and extracted_from(root) != MD5:  # a copy of the release's layout and counts
        differences["pictures unchecked"] = {
            "flag": flag, "moves": False, "note": True,
            "why": f"{flag}: the release's layout and counts, its pictures not checked against the release (the "
                   f"project checks the pictures of its own download, by the archive's MD5)"}
    return differences


MANIFEST = ".manifest.json"  # in the folder the project extracted: each picture's size, time and sha256


def picture_files(root):
    """{path relative to root: path} of every picture in root's splits."""
    return {str(path.relative_to(root)): path for split in SPLIT_COUNTS for path, _ in list_split(root, split)}


def write_manifest(root, url, md5):
    """The archive the folder came from (url, as shown: no secret in it), the MD5 computed of its bytes, and each
    picture's size, time and sha256, so that the folder is told later for the one the project extracted, and a
    picture changed, added or removed since is noticed (changed_pictures)."""
    pictures = {name: [path.stat().st_size, path.stat().st_mtime_ns, sha256_of(path)]
                for name, path in picture_files(root).items()}
    (root / MANIFEST).write_text(json.dumps({"archive": url, "md5": md5, "pictures": pictures}))


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # in blocks: the file is never read whole


def extracted_from(root):
    """The MD5 of the archive the project extracted into root, as its manifest records it, or None."""
    try:
        return json.loads((Path(root) / MANIFEST).read_text()).get("md5")
    except (OSError, ValueError, AttributeError):
        return None


def changed_pictures(root):
    """Why root's pictures are no longer the ones its manifest lists (the first picture changed, removed or added),
    or None when they are; a picture whose size and time are as listed is not read again. No manifest: None."""
    try:
        listed = json.loads((Path(root) / MANIFEST).read_text())["pictures"]
    except (OSError, ValueError, KeyError):
        return None
    found = picture_files(root)
    odd = sorted(set(listed) ^ set(found))
    if odd:
        return f"{odd[0]} was {'removed' if odd[0] in listed else 'added'} since the project extracted the archive"
    for name, (size, mtime, sha256) in listed.items():
        stat = found[name].stat()
        if [stat.st_size, stat.st_mtime_ns] != [size, mtime] and sha256_of(found[name]) != sha256:
            return f"{name} changed since the project extracted the archive"
    return None


def ensure_imagenette(data_dir=None):
    """The data folder, downloaded first (archive_source()) when it is the default and missing; the default must hold
    the whole release, a partial --data-dir copy runs after a warning naming its counts."""
    root = Path(data_dir) if data_dir else DEFAULT_DIR
    default = root.resolve() == DEFAULT_DIR
    if not root.exists():
        if not default:
            raise UserError(f"--data-dir {data_dir} does not exist")
        from common.imagenette_archive import DownloadError, archive_source, download_and_extract  # to download
        from common.pretrained import hub_offline, shown_url, without_secrets

        url, md5 = archive_source()
        fix = f"download {shown_url(url)} ({ARCHIVE_MB} MB) and extract it into {root.parent}, or pass --data-dir"
        if hub_offline():
            raise UserError(f"Imagenette is not in {root} and offline mode is on (HF_HUB_OFFLINE=1): {fix}")
        try:
            download_and_extract(url, md5, root)
        except DownloadError as error:
            raise UserError(without_secrets(f"Imagenette is not in {root} and could not be downloaded ({error}): "
                                            f"{fix}", url)) from error
        except UserError as error:  # a library's words may repeat the URL
            raise UserError(without_secrets(str(error), url)) from error
    if not root.is_dir():
        raise UserError(f"--data-dir {data_dir} is a file, not a folder of {{train,val}}/<class>/ pictures")
    warning = check_counts(root, strict=default)
    if warning:
        say(f"warning: {warning}")
    return root


def load_splits(data_dir, per_class, drawn=False):
    """The data folder (ensure_imagenette) and its pictures: {"root", "folders": its class folders (WordNet ids),
    "names": their classes' names (Imagenette's short names, another set's folder names), "name": "Imagenette" or the
    folder's own, and each split of per_class ({split: N or None}): list_split(root, split, N, drawn)}."""
    root = ensure_imagenette(data_dir)
    folders = class_folders(root, "val")
    imagenette = Path(root).name == DEFAULT_DIR.name and folders == IMAGENETTE_WNIDS  # a folder whose counts are known
    short = {wnid: name for wnid, name, _ in CLASSES}
    return {"root": root, "folders": folders, "names": [short.get(wnid, wnid) for wnid in folders],
            "name": "Imagenette" if imagenette else Path(root).name,
            **{split: list_split(root, split, n, drawn) for split, n in per_class.items()}}
