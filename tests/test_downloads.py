"""The Imagenette archive's download, against a real HTTP server on 127.0.0.1 (tests/local_servers.py): checked by its
MD5, continued with a Range request after a dropped connection, and each fault of the network or the disk one line
with nothing half-written kept. The Hub's downloads: tests/test_first_contact.py."""
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest
from local_servers import Faulty
from test_faults import ENOSPC, FullFile

from common import imagenette, imagenette_archive
from common.errors import UserError
from common.imagenette_archive import DownloadError, archive_source, download, download_and_extract

CONTENT = os.urandom(3 << 20)  # 3 MB: more than one block of the download's loop
MD5 = hashlib.md5(CONTENT).hexdigest()


@pytest.fixture(scope="module")
def server():
    running = Faulty()
    running.files["/file.bin"] = CONTENT
    yield running
    running.close()


@pytest.fixture
def served(server, monkeypatch):
    """The server with no faults and no requests yet; the downloads' time-out 2 s."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 2)
    server.faults.clear()
    server.requests.clear()
    return server


def test_a_download_is_checked_by_its_md5_and_renamed_into_place(served, tmp_path):
    archive = tmp_path / "file.tgz"
    download(f"{served.url}/file.bin", MD5, archive, progress=False)
    assert archive.read_bytes() == CONTENT and sorted(os.listdir(tmp_path)) == ["file.tgz"]


def test_a_dropped_connection_is_continued_with_a_range_request(served, tmp_path):
    archive, part = tmp_path / "file.tgz", tmp_path / "file.tgz.part"
    served.faults.append({"path": "/file.bin", "kind": "drop"})
    with pytest.raises(DownloadError, match=f"the connection to 127.0.0.1:{served.server_address[1]} "
                                            f"closed after [0-9,]+ of 3,145,728 bytes: run again"):
        download(f"{served.url}/file.bin", MD5, archive, progress=False)
    kept = part.stat().st_size
    assert not archive.exists() and 0 < kept < len(CONTENT)  # never taken for the archive
    download(f"{served.url}/file.bin", MD5, archive, progress=False)
    assert served.requests[-1] == ("GET", "/file.bin", f"bytes={kept}-")  # only the rest was asked for
    assert archive.read_bytes() == CONTENT and not part.exists()


def test_a_server_that_ignores_the_range_sends_the_whole_file_again(served, tmp_path):
    archive, part = tmp_path / "file.tgz", tmp_path / "file.tgz.part"
    part.write_bytes(b"not the start of the file")  # a part of something else: the whole file replaces it
    served.ranges = False
    try:
        download(f"{served.url}/file.bin", MD5, archive, progress=False)
    finally:
        served.ranges = True
    assert archive.read_bytes() == CONTENT


TROUBLE = "the server has trouble, try again later"
FAULTS = [  # (the server's fault, VIT_PART3_IMAGENETTE_URL set, what the one line says)
    ({"kind": "status", "code": 404}, True, "answered 404 Not Found: check VIT_PART3_IMAGENETTE_URL"),
    ({"kind": "status", "code": 404}, False, ("answered 404 Not Found: the release may have moved: set "
                                              "VIT_PART3_IMAGENETTE_URL to a copy of it, or pass --data-dir")),
    ({"kind": "status", "code": 500}, True, f"answered 500 Internal Server Error: {TROUBLE}"),
    ({"kind": "status", "code": 503}, True, f"answered 503 Service Unavailable: {TROUBLE}"),
    ({"kind": "status", "code": 429}, True, f"answered 429 Too Many Requests: {TROUBLE}"),
    ({"kind": "stall"}, True, "did not answer within 2 s: try again later"),
]


@pytest.mark.parametrize("fault,mirror,line", FAULTS, ids=["404 mirror", "404 release", "500", "503", "429", "silence"])
def test_a_server_error_or_silence_is_one_line_and_nothing_is_kept(served, tmp_path, monkeypatch, fault, mirror, line):
    if mirror:
        monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", f"{served.url}/file.bin")
    else:
        monkeypatch.delenv("VIT_PART3_IMAGENETTE_URL", raising=False)
    served.faults.append({"path": "/file.bin", **fault})
    with pytest.raises(DownloadError) as error:
        download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert str(error.value) == f"127.0.0.1:{served.server_address[1]} {line}"
    assert os.listdir(tmp_path) == []  # no part


def test_an_error_status_keeps_the_part_an_earlier_run_left(served, tmp_path):
    part = tmp_path / "file.tgz.part"
    part.write_bytes(CONTENT[:1000])
    served.faults.append({"path": "/file.bin", "kind": "status", "code": 503})
    with pytest.raises(DownloadError, match="503"):
        download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert part.read_bytes() == CONTENT[:1000]  # the next run continues it
    download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert served.requests[-1] == ("GET", "/file.bin", "bytes=1000-")


def test_a_part_that_is_already_whole_is_checked_and_taken(served, tmp_path):
    """The server answers 416 to a range past its end: the part holds the whole file, its MD5 decides."""
    (tmp_path / "file.tgz.part").write_bytes(CONTENT)
    download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert served.requests[-1][2] == f"bytes={len(CONTENT)}-" and (tmp_path / "file.tgz").read_bytes() == CONTENT


def test_a_release_cut_short_without_a_length_is_kept_to_continue(served, tmp_path, monkeypatch):
    """A server that says no Content-Length and closes early: the release's own size (ARCHIVE_BYTES) tells the part
    is short, so it is kept, not deleted as the wrong file."""
    monkeypatch.setattr(imagenette_archive, "ARCHIVE_BYTES", len(CONTENT))
    monkeypatch.setattr(imagenette_archive, "MD5", MD5)
    served.lengths = False
    served.faults.append({"path": "/file.bin", "kind": "drop"})
    try:
        with pytest.raises(DownloadError, match="closed after"):
            download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    finally:
        served.lengths = True
    assert 0 < (tmp_path / "file.tgz.part").stat().st_size < len(CONTENT)


def test_a_damaged_file_is_refused_by_its_md5_and_deleted(served, tmp_path):
    served.files["/damaged.bin"] = CONTENT[:-1] + bytes([CONTENT[-1] ^ 1])  # its last byte changed, whatever it was
    with pytest.raises(DownloadError, match=f"is not the release: its MD5 is [0-9a-f]{{32}}, not {MD5}"):
        download(f"{served.url}/damaged.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert os.listdir(tmp_path) == []


def test_a_full_disk_during_the_download_is_one_line_and_removes_the_part(served, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        return FullFile(open(*args, **kwargs), room=1 << 20)

    monkeypatch.setattr(imagenette_archive, "open", full, raising=False)
    part = tmp_path / "file.tgz.part"
    with pytest.raises(UserError, match=f"cannot write the download {part}: {ENOSPC}"):
        download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- the variable naming a mirror
# (the release's layout and counts downloaded, checked and extracted end to end: the job in test_first_contact.py)

@pytest.mark.parametrize("value,refusal", [
    ("http://127.0.0.1:9/a.tgz#sha256=00", "its '#' part must be md5= and the archive's 32 hex digits"),
    ("http://127.0.0.1:9/a.tgz#md5=123", "its '#' part must be md5= and the archive's 32 hex digits"),
    ("/srv/imagenette2-160.tgz", "not an http, https or file URL (a file on disk: file:///srv/imagenette2-160.tgz)"),
    ("ftp://127.0.0.1/a.tgz", "not an http, https or file URL"),
])
def test_a_variable_that_is_no_url_of_an_archive_is_refused(monkeypatch, value, refusal):
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", value)
    with pytest.raises(UserError, match=re.escape(refusal)):
        archive_source()


def test_a_mirror_without_a_fragment_is_checked_against_the_releases_md5(monkeypatch):
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", "http://127.0.0.1:9/imagenette2-160.tgz")
    assert archive_source() == ("http://127.0.0.1:9/imagenette2-160.tgz", "e793b78cc4c9e9a4ccc0c1155377a412")


# ---------------------------------------------------------------- extraction on a Python without tarfile's filters

def tar_of(members):
    """A .tgz of (name, kind) members: "file", "symlink" (to /etc/passwd) or "folder"."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, kind in members:
            member = tarfile.TarInfo(name)
            if kind == "symlink":
                member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
            elif kind == "folder":
                member.type = tarfile.DIRTYPE
            tar.addfile(member, io.BytesIO(b"") if kind == "file" else None)
    return buffer.getvalue()


UNSAFE = [  # (a member the release never holds, as Python 3.11.0 to 3.11.3 would extract it without a filter)
    ("mine/train/a/link.JPEG", "symlink"),
    ("../outside.JPEG", "file"),
    ("{tmp}/absolute.JPEG", "file"),  # inside the test's folder, should a broken check write it
    ("mine/../../up.JPEG", "file"),
]


FILTERS = [pytest.param(True, id="data filter", marks=pytest.mark.skipif(
               not hasattr(tarfile, "data_filter"), reason="this Python's tarfile has no filters (3.11.0 to 3.11.3)")),
           pytest.param(False, id="by hand (3.11.0-3.11.3)")]


@pytest.mark.parametrize("filtered", FILTERS)
@pytest.mark.parametrize("member", UNSAFE, ids=[name for name, _ in UNSAFE])
def test_an_unsafe_member_is_refused_with_and_without_tarfiles_filter(tmp_path, monkeypatch, filtered, member):
    """The archive is otherwise in the layout (val/ too), so that only the member's refusal can stop it; the data
    filter makes an absolute name relative, which lands inside, and the check by hand refuses it."""
    monkeypatch.setattr(imagenette_archive, "DATA_FILTER", filtered)
    name, kind = member[0].format(tmp=tmp_path), member[1]
    data = tar_of([("mine/train/a/1.JPEG", "file"), ("mine/val/a/1.JPEG", "file"), ("mine/train/b/1.JPEG", "file"),
                   ("mine/val/b/1.JPEG", "file"), (name, kind)])
    archive = tmp_path / "in" / "mine.tgz"
    archive.parent.mkdir()
    archive.write_bytes(data)
    target = tmp_path / "data" / "mine"
    if filtered and name.startswith("/"):  # the data filter: "absolute.JPEG" inside the folder, no harm
        download_and_extract(archive.as_uri(), hashlib.md5(data).hexdigest(), target, progress=False)
    else:
        with pytest.raises(UserError, match="could not extract it") as refused:
            download_and_extract(archive.as_uri(), hashlib.md5(data).hexdigest(), target, progress=False)
        assert isinstance(refused.value.__cause__, tarfile.TarError) and not target.exists()
    outside = [tmp_path / "outside.JPEG", tmp_path / "data" / "outside.JPEG", tmp_path / "up.JPEG",
               tmp_path / "data" / "up.JPEG", tmp_path / "absolute.JPEG"]
    assert not any(path.exists() for path in outside)


@pytest.mark.parametrize("filtered", FILTERS)
def test_extraction_gives_the_archives_folders_and_files(tmp_path, monkeypatch, filtered):
    monkeypatch.setattr(imagenette_archive, "DATA_FILTER", filtered)
    archive = tmp_path / "mine.tgz"
    archive.write_bytes(tar_of([("mine/train/a/1.JPEG", "file"), ("mine/val/a/1.JPEG", "file"),
                                ("mine/train/b", "folder"), ("mine/train/b/2.JPEG", "file")]))
    imagenette_archive.extract(archive, tmp_path / "out")
    found = sorted(str(path.relative_to(tmp_path / "out")) for path in (tmp_path / "out").rglob("*"))
    assert found == ["mine", "mine/train", "mine/train/a", "mine/train/a/1.JPEG", "mine/train/b",
                     "mine/train/b/2.JPEG", "mine/val", "mine/val/a", "mine/val/a/1.JPEG"]

def test_two_processes_downloading_into_one_folder_take_turns(served, tmp_path):
    """Each waits for the other's download (a lock on the folder): both end with the archive whole, fetched once."""
    from conftest import ROOT

    code = ("import sys; from pathlib import Path; from common.imagenette_archive import download; "
            "download(sys.argv[1], sys.argv[2], Path(sys.argv[3]), progress=False)")
    command = [sys.executable, "-c", code, f"{served.url}/file.bin", MD5, str(tmp_path / "file.tgz")]
    both = [subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    assert [run.wait(timeout=120) for run in both] == [0, 0], [run.stderr.read() for run in both]
    assert (tmp_path / "file.tgz").read_bytes() == CONTENT and os.listdir(tmp_path) == ["file.tgz"]
    assert [request for request in served.requests if request[0] == "GET"] == [("GET", "/file.bin", None)]


# ---------------------------------------------------------------- the pictures the project extracted, known later

def extracted_copy(tmp_path):
    """A small archive downloaded and extracted as the project does: its folder, with the manifest written."""
    from job.standins import imagenette_folder

    source = imagenette_folder(tmp_path / "src" / "mine", per_class=2, classes=["a", "b"])
    (source / "STAND-IN.txt").unlink()  # a user's pictures, not a stand-in: the manifest alone decides
    archive = tmp_path / "mine.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="mine")
    target = tmp_path / "data" / "mine"
    download_and_extract(archive.as_uri(), hashlib.md5(archive.read_bytes()).hexdigest(), target, progress=False)
    return target


CHANGES = [  # (what is done to one picture after extraction, what the line says)
    ("rewrite", "val/a/a_0000.JPEG changed since the project extracted the archive"),
    ("remove", "val/a/a_0000.JPEG was removed since the project extracted the archive"),
    ("add", "val/a/zz.JPEG was added since the project extracted the archive"),
]


@pytest.mark.parametrize("change,said", CHANGES, ids=[change for change, _ in CHANGES])
def test_a_picture_changed_since_the_extraction_makes_the_folder_another_data_set(tmp_path, change, said):
    target = extracted_copy(tmp_path)
    args = type("Args", (), {"data_dir": str(target), "per_class": None})()
    listed = json.loads((target / imagenette.MANIFEST).read_text())
    picture = target / "val" / "a" / "a_0000.JPEG"
    assert listed["pictures"]["val/a/a_0000.JPEG"][2] == hashlib.sha256(picture.read_bytes()).hexdigest()
    assert imagenette.changed_pictures(target) is None
    if change == "rewrite":  # the same size, other bytes, another time
        picture.write_bytes(bytes(255 - byte for byte in picture.read_bytes()))
    elif change == "remove":
        picture.unlink()
    else:
        (target / "val" / "a" / "zz.JPEG").write_bytes(picture.read_bytes())
    assert imagenette.data_differences(args, {})["data set"]["why"] == (
        f"--data-dir {target}: the pictures the project downloaded, but {said}")


def test_a_picture_touched_but_unchanged_is_read_again_and_passes(tmp_path):
    target = extracted_copy(tmp_path)
    picture = target / "train" / "b" / "b_0001.JPEG"
    os.utime(picture, ns=(1, 1))  # another time, the same bytes: hashed again, still the one extracted
    assert imagenette.changed_pictures(target) is None
