"""The release's archive of Imagenette (imagenette2-160.tgz): downloaded whole, resumed, checked by its MD5 and
extracted so that its folder appears whole or not at all (docs/data.md#imagenette); common/imagenette.py asks for it
only when the folder is missing."""
import contextlib
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from common.errors import UserError
from common.files import reason
from common.imagenette import ARCHIVE_BYTES, MD5, URL, URL_VARIABLE, check_counts, write_manifest


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
