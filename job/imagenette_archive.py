"""The release's archive of Imagenette (imagenette2-160.tgz): downloaded whole, resumed, known by its MD5, and
extracted so that its folder appears whole or not at all, nothing written outside it (docs/data.md#imagenette);
a script asks for it (download_imagenette) only when it runs without --data-dir."""
import base64
import contextlib
import errno
import gzip
import hashlib
import json
import os
import queue
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

from huggingface_hub import is_offline_mode

from common import data
from common.data import check_counts
from common.files import reason
from common.pretrained import DownloadError, shown_url, without_secrets
from common.start_and_end import UserError
from compare.data_set import MANIFEST, MD5, picture_files, sha256_of

URL = "https://s3.amazonaws.com/fast-ai-imageclas/imagenette2-160.tgz"  # the release; its MD5: compare/data_set.py
URL_VARIABLE = "VIT_PART3_IMAGENETTE_URL"  # a mirror of the archive (a test's server, a local copy)
ARCHIVE_BYTES = 99_003_388  # the release's archive
ARCHIVE_MB = 99  # MB are 10^6 bytes, as every size the project states (94 MiB)
# The caps, generous multiples of the release's (99 MB, 13,394 pictures of 160 px, none near 1 MB): a mirror's
# archive that passes them is refused, if at all, by its contents, never by the disk or the memory it fills
DOWNLOAD_BYTES_MOST = 10 * ARCHIVE_BYTES  # a mirror's archive whose size its server does not say
MEMBER_BYTES_MOST = 10 * 2**20  # one picture
EXTRACTED_BYTES_MOST = 10 * ARCHIVE_BYTES  # the pictures are JPEGs: the release extracts to about its own size
MEMBERS_MOST = 50_000  # the release has 13,394 pictures and 23 folders
HEADER_BYTES_MOST = 64 * 2**10  # the headers of one member (a long name, PAX records, a sparse map): a few hundred
NAME_PARTS_MOST, NAME_CHARACTERS_MOST = 8, 1024  # imagenette2-160/<split>/<class>/<picture>: 4 parts, 60 characters
SLOWEST_BYTES_PER_SECOND = 10_000  # a server slower than this for HF_HUB_DOWNLOAD_TIMEOUT seconds is given up on
# the disk's faults, not the archive's, and what to do about each
DISK_ERRORS = {errno.ENOSPC: "free space there", errno.EDQUOT: "free space there", errno.EIO: "check that disk",
               errno.EROFS: "make it writable"}


def download_imagenette():
    """The default data folder (common/data.py's DEFAULT_DIR), downloaded and extracted first (archive_source())
    when it is missing."""
    root = data.DEFAULT_DIR
    if root.exists():
        return root
    url, md5 = archive_source()
    fix = f"download {shown_url(url)} ({ARCHIVE_MB} MB) and extract it into {root.parent}, or pass --data-dir"
    if is_offline_mode():
        raise UserError(f"Imagenette is not in {root} and offline mode is on (HF_HUB_OFFLINE=1): {fix}")
    try:
        download_and_extract(url, md5, root)
    except DownloadError as error:
        raise UserError(without_secrets(f"Imagenette is not in {root} and could not be downloaded ({error}): "
                                        f"{fix}", url)) from error
    except UserError as error:  # a library's words may repeat the URL
        raise UserError(without_secrets(str(error), url)) from error
    except OSError as error:  # the data folder itself (made, locked, a scratch folder in it): full, read-only
        raise UserError(f"Imagenette is not in {root}, and {root.parent} cannot be written ({reason(error)}): free "
                        f"space there or make it writable, or pass --data-dir") from error
    return root


def write_manifest(root, url, md5):
    """The archive the folder came from (url, as shown: no secret in it), the MD5 computed of its bytes, and each
    picture's size, time and sha256, so that the folder is told later for the one the project extracted, and a
    picture changed, added or removed since is noticed (changed_pictures)."""
    pictures = {name: [path.stat().st_size, path.stat().st_mtime_ns, sha256_of(path)]
                for name, path in picture_files(root).items()}
    (root / MANIFEST).write_text(json.dumps({"archive": url, "md5": md5, "pictures": pictures}))


def archive_source():
    """(url, md5) of the archive: URL, or the mirror VIT_PART3_IMAGENETTE_URL names (as HF_ENDPOINT names the Hub's:
    http, https or file); a mirror serves the release, checked by MD5, unless its URL ends in pip's '#md5=<32 hex
    digits>'."""
    url, _, fragment = (os.environ.get(URL_VARIABLE) or URL).partition("#")
    md5 = fragment.removeprefix("md5=")
    if fragment and not (fragment.startswith("md5=") and len(md5) == 32 and set(md5) <= set("0123456789abcdef")):
        raise UserError(f"{URL_VARIABLE}={shown_url(url)}#{fragment[:40]}: its '#' part must be md5= and the "
                        f"archive's 32 hex digits, or nothing (the release's MD5)")
    try:
        scheme = urllib.parse.urlsplit(url).scheme
    except ValueError:  # a malformed host ("http://[::1")
        scheme = None
    if scheme not in ("http", "https", "file"):
        hint = f" (a file on disk: file://{Path(url).expanduser().resolve()})" if scheme == "" else ""
        raise UserError(f"{URL_VARIABLE}={shown_url(url)}: not an http, https or file URL{hint}")
    return url, md5 or MD5


def shown_host(url):
    """The host (and port) of url without a user:password: whom a line about a download names."""
    return shown_url(url).split("://", 1)[-1].split("/", 1)[0].removeprefix("***@") or shown_url(url)


def timeout_seconds():
    """How long the archive's server may keep silent, or send less than SLOWEST_BYTES_PER_SECOND: huggingface_hub's
    HF_HUB_DOWNLOAD_TIMEOUT, one knob for every download (10 s unless set)."""
    from huggingface_hub import constants

    return float(constants.HF_HUB_DOWNLOAD_TIMEOUT)


def download(url, md5, archive, progress=True):
    """url into the file archive, whole and checked by its MD5 or not at all: the MD5 found, or None when another
    run put the archive there meanwhile. The bytes go to archive.part first: a connection that drops leaves them for
    the next run, which asks for the rest with an HTTP Range request (a server that ignores it sends the whole file
    again). Two runs take turns (folder_lock). Renamed into place when its MD5 is md5; a wrong file is deleted."""
    part = archive.with_name(archive.name + ".part")
    with folder_lock(archive.parent):
        if archive.exists():
            return None  # that run finished it meanwhile
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
            raise DownloadError(f"{shown_host(url)} sent an empty file")
        found = md5_of(part)
        if found != md5:
            part.unlink()
            raise DownloadError(f"the file from {shown_url(url)} is not the release: its MD5 is {found}, not {md5}; "
                                f"deleted it")
        os.replace(part, archive)
        return found


def md5_of(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()  # in blocks: the file is never read whole


def lock(path, wait=True):
    """A descriptor of the file or folder at path that holds flock's exclusive lock until it is closed, or None when
    not wait and another process holds it. flock works across processes that cannot see each other's numbers (other
    containers, other PID namespaces) on one filesystem; where the system has none (Windows), no lock is held."""
    try:
        import fcntl
    except ImportError:
        return os.open(os.devnull, os.O_RDONLY)
    handle = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(handle)
        return None
    return handle


@contextlib.contextmanager
def folder_lock(folder):
    """Held by one process at a time: flock on the folder itself, which is never deleted (a lock on the part file
    could be taken on a file another run has just deleted)."""
    handle = lock(folder)  # another run downloading into the same data/ holds it until it is done
    try:
        yield
    finally:
        os.close(handle)  # the lock goes with it


def fetch_rest(url, out, part, md5, progress):
    """What url has beyond the bytes out holds, appended to out (the whole file where the server ignores Range or
    answers from byte 0; a part that starts elsewhere is refused), and not a byte past the whole size: the release's
    when its MD5 is asked for, else the server's Content-Length or Content-Range, at most DOWNLOAD_BYTES_MOST. A
    failure of the network, or a server slower than SLOWEST_BYTES_PER_SECOND over timeout_seconds(), its headers too,
    is a DownloadError in the user's words naming the server that failed (after redirects), the bytes so far kept.
    The HTTP client runs in a thread of its own (received()): a socket's time-out ends only silence, and a server
    that trickles its headers or its chunks is never silent."""
    import http.client

    from tqdm import tqdm

    have, seconds = out.seek(0, os.SEEK_END), timeout_seconds()
    request = request_for(url, {"Range": f"bytes={have}-"} if have else {})
    redirects = redirect_handler(request.full_url)
    answers, stop = queue.Queue(maxsize=4), threading.Event()
    threading.Thread(target=received, args=(request, redirects, seconds, answers, stop), daemon=True).start()
    try:
        response = next_answer(answers, seconds)
        host = shown_host(response.url)  # after the redirects: the server that answers
        span = response.headers.get("Content-Range", "")  # "bytes FIRST-LAST/WHOLE"
        first = span.removeprefix("bytes ").partition("-")[0] if response.status == 206 else "0"
        if first != str(have):  # never appended where they do not belong
            if first != "0":
                raise DownloadError(f"{host} sent a part of the file ({span[:60] or 'no Content-Range'}) where the "
                                    f"bytes from {have:,} on were asked for: try again later, or set {URL_VARIABLE} "
                                    f"to another mirror")
            out.truncate(0)  # the whole file again (a server that ignores Range): start over
            have = out.seek(0)
        whole = span.rpartition("/")[2]
        size = int(response.headers.get("Content-Length") or 0)
        said = int(whole) if whole.isdigit() else have + size if size else None
        total = ARCHIVE_BYTES if md5 == MD5 else said
        if total is not None and total > DOWNLOAD_BYTES_MOST:
            raise DownloadError(f"{host} sends {total:,} bytes, more than {DOWNLOAD_BYTES_MOST:,}, ten times the "
                                f"release's archive: check {URL_VARIABLE}")
        end = total or DOWNLOAD_BYTES_MOST
        with tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=f"downloading {Path(part).stem}",
                  disable=not progress, file=sys.stderr) as bar:
            since, sent = time.monotonic(), 0  # the rate over the last timeout_seconds()
            while out.tell() < end and (block := next_answer(answers, seconds)):
                block = block[:end - out.tell()]
                write_block(out, block, part)
                bar.update(len(block))
                sent += len(block)
                if (elapsed := time.monotonic() - since) >= seconds:
                    if sent < SLOWEST_BYTES_PER_SECOND * elapsed:
                        raise DownloadError(
                            f"{host} sent {sent:,} bytes in {elapsed:.0f} s, slower than "
                            f"{SLOWEST_BYTES_PER_SECOND // 1000} kB/s: try again later to continue (the "
                            f"{out.tell():,} bytes so far are kept), or set {URL_VARIABLE} to another mirror")
                    since, sent = time.monotonic(), 0
        if total and out.tell() < total:
            raise DownloadError(f"the connection to {host} closed after {out.tell():,} of {total:,} bytes: run "
                                f"again to continue it")
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # nothing beyond what the part holds: its MD5 decides
            return
        host = shown_host(error.url)  # after the redirects: the server that answered
        if 300 <= error.code < 400:
            again = f"{redirect_trouble(error)}: check {URL_VARIABLE}"
        elif error.code in (429, 500, 502, 503, 504):
            again = "the server has trouble, try again later"
        elif os.environ.get(URL_VARIABLE):
            again = f"check {URL_VARIABLE}"
        else:
            again = f"the release may have moved: set {URL_VARIABLE} to a copy of it, or pass --data-dir"
        raise DownloadError(f"{host} answered {error.code} {str(error.reason).splitlines()[-1][:80]}: "
                            f"{again}") from error
    except (OSError, EOFError, ValueError, http.client.HTTPException) as error:  # refused, silent, dropped mid-way
        host = shown_host(redirects.asked)
        if isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError):
            raise DownloadError(f"{host} did not answer within {seconds:g} s: try again later") from error
        raise DownloadError(f"{host}: {reason(error)}") from error
    finally:
        stop.set()  # the thread ends at its next block, or with its socket's time-out


def request_for(url, headers=None, method=None):
    """A request for url without its user:password, which go as HTTP Basic authorization instead (urllib would take
    "user:password@host" for the host's name), on this request only: never to where it redirects."""
    url, authorization = without_credentials(url)
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    if authorization:
        request.add_unredirected_header("Authorization", authorization)
    return request


def without_credentials(url):
    """(url without its user:password, the HTTP Basic authorization that carries them, or None)."""
    parts = urllib.parse.urlsplit(url)
    credentials, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None
    user_and_password = ":".join(map(urllib.parse.unquote, credentials.partition(":")[::2]))  # each %-decoded
    return parts._replace(netloc=host).geturl(), f"Basic {base64.b64encode(user_and_password.encode()).decode()}"


def redirect_target(url, headers):
    """The URL a 3xx answer to url names (Location, or the older URI), made whole, or None."""
    location = headers.get("Location") or headers.get("URI")
    return urllib.parse.urljoin(url, location) if location else None


def redirect_handler(url):
    """urllib's redirects from url, to http and https only (urllib's own follow ftp too, and refuse file: in words
    that show the URL), one for each download: its `asked` is the URL last asked for, whom a line about a failure
    names."""

    class Redirects(urllib.request.HTTPRedirectHandler):
        asked = url

        def http_error_302(self, req, fp, code, msg, headers):
            target = redirect_target(req.full_url, headers)
            if target and urllib.parse.urlsplit(target).scheme not in ("http", "https"):
                raise urllib.error.HTTPError(req.full_url, code, msg, headers, fp)
            return super().http_error_302(req, fp, code, msg, headers)

        http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302

        def redirect_request(self, req, fp, code, msg, headers, newurl):
            self.asked, authorization = without_credentials(newurl)  # a Location's user:password, as request_for's
            request = super().redirect_request(req, fp, code, msg, headers, self.asked)
            if request is not None and authorization:
                request.add_unredirected_header("Authorization", authorization)
            return request

    return Redirects()


def redirect_trouble(error):
    """Why a 3xx answer (an HTTPError) was not followed, in the user's words."""
    target = redirect_target(error.url, error.headers)
    if str(error.reason).startswith(urllib.request.HTTPRedirectHandler.inf_msg):  # urllib's loop, or its 11th
        return "it redirects in a loop or more than 10 times"
    if target is None:
        return "it names no Location to go to"
    if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
        return f"it redirects to {shown_url(target)}, not an http or https URL"
    return "it is no redirect that is followed (301, 302, 303, 307, 308)"


def received(request, redirects, seconds, answers, stop):
    """The HTTP client's thread: the response (its status and headers), then each block as it comes, then b"" at
    the end, or the error that ended it, into the queue answers, until stop is set (then it closes the connection
    and ends, never waiting on a queue nobody reads)."""
    def handed(answer):
        while not stop.is_set():
            try:
                answers.put(answer, timeout=1)
                return True
            except queue.Full:
                continue
        return False

    try:
        with urllib.request.build_opener(redirects).open(request, timeout=seconds) as response:
            if not handed(response):
                return
            while not stop.is_set() and (block := response.read1(1 << 20)):
                if not handed(block):
                    return
        handed(b"")
    except Exception as error:  # noqa: BLE001 - handed to fetch_rest, which says it in one line
        handed(error)


def next_answer(answers, seconds):
    """The next item the HTTP client's thread hands over; TimeoutError when none comes within seconds."""
    try:
        answer = answers.get(timeout=seconds)
    except queue.Empty:
        raise TimeoutError from None
    if isinstance(answer, Exception):
        raise answer
    return answer


def write_block(out, block, part):
    """A block of the download into the part file; a full or read-only disk is a UserError, as every write the
    scripts make (common/files.py), and download() removes the part (it could not finish)."""
    try:
        out.write(block)
        out.flush()
    except OSError as error:
        raise UserError(f"cannot write the download {part}: {reason(error)}") from error


DATA_FILTER = hasattr(tarfile, "data_filter")  # extractall(filter="data"): Python 3.11.4 and later
KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a device",
         tarfile.BLKTYPE: "a device", tarfile.FIFOTYPE: "a FIFO"}


def capped_reads(stream):
    """The archive's decompressed stream, read within the caps: at most HEADER_BYTES_MOST of headers between two
    members while the members are listed (tarfile reads a long name, a chain of PAX headers or a sparse map whole, and
    recursively, before it hands the member over), each read at most MEMBER_BYTES_MOST, the whole at most `most`."""

    class CappedReads:
        def __init__(self):
            self.stream, self.most = stream, EXTRACTED_BYTES_MOST + 3 * tarfile.BLOCKSIZE * MEMBERS_MOST
            self.headers_from = 0  # where the next member's headers start; None once the members are listed

        def read(self, size=-1):
            end = self.stream.tell() + size
            if self.headers_from is not None and end - self.headers_from > HEADER_BYTES_MOST:
                raise UserError(f"a member's headers are longer than {HEADER_BYTES_MOST:,} bytes")
            if not 0 <= size <= MEMBER_BYTES_MOST or end > self.most:
                raise UserError(f"it asks to read {size:,} bytes at once, or more than {self.most:,} in all")
            return self.stream.read(size)

        def seek(self, *where):
            found = self.stream.seek(*where)
            if found > self.most:
                raise UserError(f"it is longer than {self.most:,} bytes once decompressed")
            return found

        def __getattr__(self, name):
            return getattr(self.stream, name)

    return CappedReads()


def refusal(member, top):
    """Why member is not one the release holds, or None: the release holds plain files and folders under top/, each
    file at most MEMBER_BYTES_MOST, its names short, its times those of a calendar, and nothing else (no link,
    device, FIFO or sparse file)."""
    parts = member.name.split("/")
    if parts[0] != top or "\0" in member.name or "\\" in member.name or {"", ".", ".."} & set(parts):
        return f"{member.name[:200]!r} lies outside {top}/"
    if len(parts) > NAME_PARTS_MOST or len(member.name) > NAME_CHARACTERS_MOST:
        return f"{member.name[:200]!r} is deeper than {NAME_PARTS_MOST} or longer than {NAME_CHARACTERS_MOST:,}"
    if member.issparse():
        return f"{member.name!r} is a sparse file"
    if not (member.isdir() or member.type in (tarfile.REGTYPE, tarfile.AREGTYPE)):
        return f"{member.name!r} is {KINDS.get(member.type, f'a member of type {member.type!r}')}"
    if member.name == top and not member.isdir():
        return f"{member.name!r} is a file where the folder goes"
    if not 0 <= member.size <= MEMBER_BYTES_MOST:
        return f"{member.name!r} holds {member.size:,} bytes, not 0 to {MEMBER_BYTES_MOST:,}"
    if not 0 <= member.mtime < 2**34:  # nan too; os.utime would overflow on 1e400
        return f"{member.name!r} has the time {member.mtime!r}"
    if len(member.pax_headers) > 64:
        return f"{member.name!r} has {len(member.pax_headers):,} PAX records"
    return None


def extract(archive, folder, top):
    """The archive's members into folder, each checked by refusal() before anything is written, and the count of its
    files. tarfile's "data" filter (Python 3.11.4 and later) is a second guard; without it (3.11.0 to 3.11.3) every
    file is the current user's, folders 0755 and files 0644."""
    with gzip.open(archive) as stream, tarfile.open(fileobj=(capped := capped_reads(stream)), mode="r:") as tar:
        members, total = [], 0
        for member in tar:  # one header at a time: a refused member stops the reading before the next
            total += member.size
            if why := refusal(member, top):
                raise UserError(why)
            if total > EXTRACTED_BYTES_MOST or len(members) >= MEMBERS_MOST:
                raise UserError(f"it holds more than {EXTRACTED_BYTES_MOST:,} bytes or {MEMBERS_MOST:,} members")
            member.pax_headers = {}  # applied already: not kept for each of thousands of members
            members.append(member)
            capped.headers_from = tar.offset  # the next member's headers
        capped.headers_from = None
        if DATA_FILTER:
            tar.extractall(folder, members, filter="data")
        else:
            for member in members:
                member.mode = 0o755 if member.isdir() else 0o644
                member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
            tar.extractall(folder, members)
    return sum(member.isfile() for member in members)


def scratch_prefix(target):
    return f".{Path(target).name}-extracting-"


def remove_abandoned_scratch(target):
    """Folders left by an extraction that was killed: no process holds their lock (called under folder_lock, under
    which a run makes its scratch folder and locks it). Where no lock can be held (Windows), none is told abandoned."""
    for folder in Path(target).parent.glob(scratch_prefix(target) + "*") if os.name == "posix" else []:
        try:  # another user's folder, or one its run removed meanwhile, is left as it is
            handle = lock(folder, wait=False) if folder.is_dir() and not folder.is_symlink() else None
        except OSError:
            continue
        if handle is not None:
            shutil.rmtree(folder, ignore_errors=True)
            os.close(handle)


def download_and_extract(url, md5, target, progress=True):
    """Download url (.tgz), unless the archive is already there, and extract it so that target appears whole or not
    at all: an archive not downloaded now is known by its MD5 first; extracted into a scratch folder beside target,
    locked while this run writes it; its files counted and checked; renamed into place. An archive that is not the
    release, or cannot be extracted, is moved aside (docs/data.md#imagenette); where the disk fails (full, read-only),
    it is kept for the next run."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    archive, aside = target.with_name(target.name + ".tgz"), target.with_name(target.name + ".tgz.refused")
    found = None if archive.exists() else download(url, md5, archive, progress)
    source = f"the archive downloaded from {shown_url(url)}" if found else f"the archive {archive}"
    with folder_lock(target.parent):
        remove_abandoned_scratch(target)
        scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(target), dir=target.parent))
        handle = lock(scratch)  # another run, in another container too, leaves it alone while this one writes it
    try:
        found = found or md5_of(archive)
        if found != md5:
            raise UserError(f"its MD5 is {found}, not {md5}")
        files = extract(archive, scratch, target.name)
        extracted = scratch / target.name
        if extracted.is_symlink() or not extracted.is_dir():
            raise UserError(f"it holds no folder {target.name}")
        written = sum(len(names) for _, _, names in os.walk(extracted))
        if written != files:
            raise UserError(f"{written:,} files were written of its {files:,}")
        check_counts(extracted, strict=True, fix="")
        write_manifest(extracted, shown_url(url), found)
        try:
            extracted.rename(target)
        except OSError:
            if not target.is_dir():
                raise  # else another run put its own checked copy there first: this one is not needed
    except (tarfile.TarError, EOFError, OSError, ValueError, ArithmeticError, MemoryError, RecursionError, zlib.error,
            UserError) as error:
        if target.is_dir():  # another run put its checked copy in place, and removed the archive, meanwhile
            return
        if isinstance(error, OSError) and error.errno in DISK_ERRORS:  # the archive is not to blame: kept
            fix = DISK_ERRORS[error.errno]
            raise UserError(f"{source}: the disk of {target.parent} failed while extracting it ({reason(error)}); "
                            f"kept the archive {archive}: {fix} and run again to extract it") from error
        try:
            os.replace(archive, aside)  # not taken again by the next run, kept to be looked at
            moved = f"moved it to {aside}"
        except OSError as why:
            moved = f"it could not be moved aside ({reason(why)}): delete {archive}"
        what = (f"its contents are not the release ({error})" if isinstance(error, UserError) else
                f"could not extract it ({reason(error)})")
        raise UserError(f"{source}: {what}; {moved}: run again to download it anew, or pass --data-dir with a "
                        f"complete copy") from error
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.close(handle)
    archive.unlink(missing_ok=True)  # another run that finished first removed it
