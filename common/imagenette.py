"""Imagenette (imagenette2-160/{train,val}/<wnid>/*.JPEG): find or download it, check it, list its pictures; any
folder in that layout works, Imagenette's counts are checked only for its ten WordNet ids (docs/data.md)."""
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from common.environment import made_here
from common.errors import UserError
from common.files import reason
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
    from common.verdicts import subset_differences  # asked only for --compare or --json

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


class DownloadError(Exception):
    """The network failed while the archive was being fetched (not the disk): why, in the user's words."""


def archive_source():
    """(url, md5) of the archive: URL, or the mirror VIT_PART3_IMAGENETTE_URL names (as HF_ENDPOINT names the Hub's:
    http, https or file); a mirror serves the release, checked by MD5, unless its URL ends in pip's '#md5=<32 hex
    digits>'."""
    url, _, fragment = (os.environ.get(URL_VARIABLE) or URL).partition("#")
    md5 = fragment.removeprefix("md5=")
    if fragment and not (fragment.startswith("md5=") and len(md5) == 32 and set(md5) <= set("0123456789abcdef")):
        raise UserError(f"{URL_VARIABLE}={os.environ[URL_VARIABLE]}: its '#' part must be md5= and the archive's 32 "
                        f"hex digits, or nothing (the release's MD5)")
    if urllib.parse.urlparse(url).scheme not in ("http", "https", "file"):
        raise UserError(f"{URL_VARIABLE}={url}: not an http, https or file URL (a file on disk: "
                        f"file://{Path(url).expanduser().resolve()})")
    return url, md5 or MD5


def timeout_seconds():
    """How long the archive's server may keep silent: huggingface_hub's HF_HUB_DOWNLOAD_TIMEOUT, one knob for every
    download (10 s unless set)."""
    from huggingface_hub import constants

    return float(constants.HF_HUB_DOWNLOAD_TIMEOUT)


def download(url, md5, archive, progress=True):
    """url into the file archive, whole and checked by its MD5 or not at all. The bytes go to archive.part first: a
    connection that drops leaves them for the next run, which asks for the rest with an HTTP Range request (a server
    that ignores it sends the whole file again). Two runs take turns (folder_lock). Renamed into place when its MD5
    is md5; a wrong file is deleted."""
    part = archive.with_name(archive.name + ".part")
    with folder_lock(archive.parent):
        if archive.exists():
            return  # that run finished it meanwhile
        try:
            with open(part, "ab") as out:
                fetch_rest(url, out, part, md5, progress)
                out.flush()
                os.fsync(out.fileno())
        except UserError:  # the disk: what could not be written is not kept
            part.unlink(missing_ok=True)
            raise
        finally:
            if part.exists() and part.stat().st_size == 0:
                part.unlink()  # nothing to continue from
        if not part.exists():
            raise DownloadError(f"{urllib.parse.urlparse(url).netloc or url} sent an empty file")
        with open(part, "rb") as f:
            found = hashlib.file_digest(f, "md5").hexdigest()
        if found != md5:
            part.unlink()
            raise DownloadError(f"the file from {url} is not the release: its MD5 is {found}, not {md5}; deleted it")
        os.replace(part, archive)


@contextlib.contextmanager
def folder_lock(folder):
    """Held by one process at a time: flock on the folder itself, which is never deleted (a lock on the part file
    could be taken on a file another run has just deleted); where the system has no flock (Windows), nothing."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another run downloading into the same data/ holds it until it is done
        yield
    finally:
        os.close(handle)  # the lock goes with it


def fetch_rest(url, out, part, md5, progress):
    """What url has beyond the bytes out holds, appended to out (the whole file where the server ignores Range);
    a failure of the network is a DownloadError in the user's words, the bytes so far kept. The whole size: the
    server's Content-Length or Content-Range, else the release's when its MD5 is asked for."""
    import http.client

    from tqdm import tqdm

    host, have = urllib.parse.urlparse(url).netloc or url, out.seek(0, os.SEEK_END)
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds()) as response:
            if have and response.status != 206:  # the whole file again: start over
                out.truncate(0)
                have = out.seek(0)
            whole = response.headers.get("Content-Range", "").rpartition("/")[2]
            size = int(response.headers.get("Content-Length") or 0)
            total = int(whole) if whole.isdigit() else have + size if size else ARCHIVE_BYTES if md5 == MD5 else None
            with tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=f"downloading {Path(part).stem}",
                      disable=not progress, file=sys.stderr) as bar:
                while block := response.read(1 << 20):
                    write_block(out, block, part)
                    bar.update(len(block))
            if total and out.tell() < total:
                raise DownloadError(f"the connection to {host} closed after {out.tell():,} of {total:,} bytes: run "
                                    f"again to continue it")
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # nothing beyond what the part holds: its MD5 decides
            return
        if error.code in (429, 500, 502, 503, 504):
            again = "the server has trouble, try again later"
        elif os.environ.get(URL_VARIABLE):
            again = f"check {URL_VARIABLE}"
        else:
            again = f"the release may have moved: set {URL_VARIABLE} to a copy of it, or pass --data-dir"
        raise DownloadError(f"{host} answered {error.code} {error.reason}: {again}") from error
    except (OSError, EOFError, ValueError, http.client.HTTPException) as error:  # refused, silent, dropped mid-way
        if isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError):
            raise DownloadError(f"{host} did not answer within {timeout_seconds():g} s: try again later") from error
        raise DownloadError(f"{host}: {reason(error)}") from error


def write_block(out, block, part):
    """A block of the download into the part file; a full or read-only disk is a UserError, as every write the
    scripts make (common/files.py), and download() removes the part (it could not finish)."""
    try:
        out.write(block)
        out.flush()
    except OSError as error:
        raise UserError(f"cannot write the download {part}: {reason(error)}") from error


DATA_FILTER = hasattr(tarfile, "data_filter")  # extractall(filter="data"): Python 3.11.4 and later


def extract(archive, folder):
    """The archive's members into folder, none outside it: tarfile's "data" filter, or, on a Python without filters
    (3.11.0 to 3.11.3), the same refusals by hand for what the release holds (plain files and folders)."""
    with tarfile.open(archive) as tar:
        if DATA_FILTER:
            tar.extractall(folder, filter="data")
            return
        for member in tar.getmembers():
            if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in member.name.split("/"):
                raise tarfile.TarError(f"{member.name} is a link or lies outside the archive's folder")
            member.mode &= 0o755  # no set-user-id and the like, as the data filter
        tar.extractall(folder)


def scratch_prefix(target):
    return f".{Path(target).name}-extracting-"


def process_alive(pid):
    """Whether process pid runs (psutil's rule by hand: the article's packages do not bring psutil); where it cannot
    be told (Windows, whose os.kill has no probe), alive."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def remove_abandoned_scratch(target):
    """Folders left by an extraction that was killed: their process (the number in the name) is gone."""
    for folder in Path(target).parent.glob(scratch_prefix(target) + "*"):
        pid = folder.name[len(scratch_prefix(target)):].split("-")[0]
        if folder.is_dir() and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def download_and_extract(url, md5, target, progress=True):
    """Download url (.tgz) and extract it so that target appears whole or not at all: extracted into a scratch folder
    beside it, checked, renamed into place; an archive that fails is deleted (docs/data.md#imagenette)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_scratch(target)
    archive = target.with_name(target.name + ".tgz")
    if not archive.exists():
        download(url, md5, archive, progress)
    scratch = Path(tempfile.mkdtemp(prefix=f"{scratch_prefix(target)}{os.getpid()}-", dir=target.parent))
    try:
        extract(archive, scratch)
        extracted = scratch / target.name
        if not extracted.is_dir():
            raise UserError(f"it holds no folder {target.name}")
        check_counts(extracted, strict=True, fix="")
        write_manifest(extracted, url, md5)
        try:
            extracted.rename(target)
        except OSError:
            if not target.is_dir():
                raise  # else another run put its own checked copy there first: this one is not needed
    except (tarfile.TarError, EOFError, OSError, UserError) as error:
        archive.unlink(missing_ok=True)  # a wrong or broken archive is downloaded again next time
        what = (f"its contents are not the release ({error})" if isinstance(error, UserError) else
                f"could not extract it ({reason(error)})")
        raise UserError(f"the archive downloaded from {url}: {what}; removed {archive}: run again to download it "
                        f"anew, or pass --data-dir with a complete copy") from error
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    archive.unlink(missing_ok=True)  # another run that finished first removed it


MANIFEST = ".manifest.json"  # in the folder the project extracted: each picture's size, time and sha256


def picture_files(root):
    """{path relative to root: path} of every picture in root's splits."""
    return {str(path.relative_to(root)): path for split in SPLIT_COUNTS for path, _ in list_split(root, split)}


def write_manifest(root, url, md5):
    """The archive the folder came from and each picture's size, time and sha256, so that the folder is told later
    for the one the project extracted, and a picture changed, added or removed since is noticed (changed_pictures)."""
    pictures = {name: [path.stat().st_size, path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()]
                for name, path in picture_files(root).items()}
    (root / MANIFEST).write_text(json.dumps({"archive": url, "md5": md5, "pictures": pictures}))


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
        if [stat.st_size, stat.st_mtime_ns] != [size, mtime] and \
                hashlib.sha256(found[name].read_bytes()).hexdigest() != sha256:
            return f"{name} changed since the project extracted the archive"
    return None


def ensure_imagenette(data_dir=None):
    """The data folder, downloaded first (archive_source()) when it is the default and missing; the default must hold
    the whole release, a partial --data-dir copy runs after a warning naming its counts."""
    from common.pretrained import hub_offline

    root = Path(data_dir) if data_dir else DEFAULT_DIR
    default = root.resolve() == DEFAULT_DIR
    if not root.exists():
        if not default:
            raise UserError(f"--data-dir {data_dir} does not exist")
        url, md5 = archive_source()
        fix = f"download {url} ({ARCHIVE_MB} MB) and extract it into {root.parent}, or pass --data-dir"
        if hub_offline():
            raise UserError(f"Imagenette is not in {root} and offline mode is on (HF_HUB_OFFLINE=1): {fix}")
        try:
            download_and_extract(url, md5, root)
        except DownloadError as error:
            raise UserError(f"Imagenette is not in {root} and could not be downloaded ({error}): {fix}") from error
    if not root.is_dir():
        raise UserError(f"--data-dir {data_dir} is a file, not a folder of {{train,val}}/<class>/ pictures")
    warning = check_counts(root, strict=default)
    if warning:
        say(f"warning: {warning}")
    return root


def load_splits(data_dir, per_class, drawn=False):
    """The data folder (ensure_imagenette) and its pictures: {"root", "folders": its class folders (WordNet ids),
    "name": "Imagenette" or the folder's own, and each split of per_class ({split: N or None}): list_split(root,
    split, N, drawn)}."""
    root = ensure_imagenette(data_dir)
    folders = class_folders(root, "val")
    imagenette = Path(root).name == DEFAULT_DIR.name and folders == IMAGENETTE_WNIDS  # a folder whose counts are known
    return {"root": root, "folders": folders, "name": "Imagenette" if imagenette else Path(root).name,
            **{split: list_split(root, split, n, drawn) for split, n in per_class.items()}}
