"""Whether this run's pictures are Imagenette's, as the project downloaded them: the setup differences of the data
(data_differences), and the manifest of the folder the project extracted (job/imagenette_archive.py writes it)."""
import hashlib
import json
from pathlib import Path

from PIL import Image

from common import data
from compare.marks import made_here

MD5 = "e793b78cc4c9e9a4ccc0c1155377a412"  # the release's archive's, as torchvision's Imagenette publishes it
PICTURE_SIDE = 160  # imagenette2-160: every picture is 160 px on its short side


def data_differences(args, counts, drawn=False):
    """{item: difference} of this run's pictures ({split: count used, or None when not loaded}) against Imagenette's;
    the pictures: --data-dir, else the default folder. Another data set is told by what can be checked cheaply: a
    folder job/standins.py or job/miniature.py made, other class folders, a class's first picture in either split
    not 160 px on its short side; else only a draw --per-class made at random (drawn) from a folder that holds the
    release's counts is a sample of its pictures: a partial copy is none."""
    root, unlike = Path(args.data_dir or data.DEFAULT_DIR), None
    if root.is_dir() and (made := made_here(root)):
        unlike = f"{made}, not Imagenette"
    elif root.is_dir() and (changed := changed_pictures(root)):
        unlike = f"the pictures the project downloaded, but {changed}"
    elif root.is_dir() and data.class_folders(root, "val") != data.IMAGENETTE_WNIDS:
        unlike = "another data set than Imagenette"
    elif root.is_dir():
        firsts = [path for split in data.SPLIT_COUNTS for path, _ in data.list_split(root, split, 1)]  # each class's
        for path in firsts:
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
    items = {split: f"{data.SPLIT_WORDS[split]} pictures" for split in counts}
    whole = not root.is_dir() or all(len(data.list_split(root, split)) == count
                                     for split, count in data.SPLIT_COUNTS.items())
    differences = subset_differences(args, {items[split]: count for split, count in counts.items()},
                                     {items[split]: data.SPLIT_COUNTS[split] for split in counts}, drawn, whole)
    if root.is_dir() and extracted_from(root) != MD5:  # a copy of the release's layout: its split used may be whole
        layout = "the release's layout and counts" if whole else "the release's layout (a partial copy)"
        differences["pictures unchecked"] = {
            "flag": flag, "moves": False, "note": True,
            "why": f"{flag}: {layout}, its pictures not checked against the release (the project checks the pictures "
                   f"of its own download, by the archive's MD5)"}
    return differences


MANIFEST = ".manifest.json"  # in the folder the project extracted: each picture's size, time and sha256


def picture_files(root):
    """{path relative to root: path} of every picture in root's splits."""
    return {str(path.relative_to(root)): path
            for split in data.SPLIT_COUNTS for path, _ in data.list_split(root, split)}


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
    or None when they are; a picture whose size and time are as listed, and whose change time (which no call sets back)
    is not after the manifest's, is not read again. No manifest: None."""
    try:
        manifest = Path(root) / MANIFEST
        listed, written = json.loads(manifest.read_text())["pictures"], manifest.stat().st_ctime_ns
    except (OSError, ValueError, KeyError):
        return None
    found = picture_files(root)
    odd = sorted(set(listed) ^ set(found))
    if odd:
        return f"{odd[0]} was {'removed' if odd[0] in listed else 'added'} since the project extracted the archive"
    for name, (size, mtime, sha256) in listed.items():
        stat = found[name].stat()
        touched = [stat.st_size, stat.st_mtime_ns] != [size, mtime] or stat.st_ctime_ns > written
        if touched and sha256_of(found[name]) != sha256:
            return f"{name} changed since the project extracted the archive"
    return None


def subset_differences(args, counts, released, drawn=False, whole=True):
    """{item: difference} for each split ("validation pictures") of which this run used (counts; None: not loaded)
    another number of pictures than the release (released). Only a draw the project made is a sample, with n and of
    for the sampling interval: --per-class drawing at random (drawn) from the release or a whole copy (whole). The
    first N of each class, a partial copy (the first files by name, say) and a folder with more than the release are
    not comparable."""
    differences = {}
    for item, count in counts.items():
        if args.per_class:
            flag = f"--per-class {args.per_class}"
            flag = flag if whole else f"--data-dir {args.data_dir} {flag}"
            how = (f"{args.per_class} a class on average, drawn at random" if drawn
                   else f"the first {args.per_class} of each class") + ("" if whole else " of a partial copy")
        else:
            flag = f"--data-dir {args.data_dir}"
            how = "more than the release" if count and count > released[item] else "a partial copy, not a draw"
        if args.per_class and count is None:
            differences[item] = {"flag": flag, "why": f"{flag}: {how}"}
        elif count is not None and count != released[item]:
            sample = drawn and whole and count < released[item]
            differences[item] = {"flag": flag, "why": f"{flag}: {count:,} of {released[item]:,} {item} ({how})",
                                 **({"n": count, "of": released[item]} if sample else {})}
    return differences
