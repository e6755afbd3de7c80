"""The Imagenette archive's download, against a real HTTP server on 127.0.0.1 (tests/local_servers.py): checked by its
MD5, continued with a Range request after a dropped connection, and each fault of the network or the disk one line
with nothing half-written kept. The Hub's downloads: tests/test_first_contact.py."""
import errno
import gzip
import hashlib
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

import pytest
from local_servers import STALL_SECONDS, Faulty
from test_faults import ENOSPC, FullFile

from common import data as imagenette
from common.pretrained import DownloadError, shown_url
from common.start_and_end import UserError
from compare import data_set
from job import imagenette_archive
from job.downloads import reachable
from job.imagenette_archive import MEMBER_BYTES_MOST, archive_source, download, download_and_extract

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
    server.authorization = None
    return server


@pytest.fixture
def elsewhere():
    """A second server, another host to the client (a port of its own): where the first one redirects."""
    running = Faulty()
    running.files["/file.bin"] = CONTENT
    yield running
    running.close()


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
    ({"kind": "redirect", "times": 20}, True,
     "answered 302 Found: it redirects in a loop or more than 10 times: check VIT_PART3_IMAGENETTE_URL"),
    ({"kind": "redirect", "to": "file:///etc/hostname"}, True, ("answered 302 Found: it redirects to "
                                                               "file:///etc/hostname, not an http or https URL: check "
                                                               "VIT_PART3_IMAGENETTE_URL")),
    ({"kind": "redirect", "code": 301, "to": "ftp://u:SECRET@127.0.0.1:9/x.tgz"}, True,
     ("answered 301 Moved Permanently: it redirects to ftp://***@127.0.0.1:9/x.tgz, not an http or https URL: check "
      "VIT_PART3_IMAGENETTE_URL")),
    ({"kind": "redirect", "to": None}, True,
     "answered 302 Found: it names no Location to go to: check VIT_PART3_IMAGENETTE_URL"),
    ({"kind": "status", "code": 304}, True,
     "answered 304 Not Modified: it names no Location to go to: check VIT_PART3_IMAGENETTE_URL"),
]


@pytest.mark.parametrize("fault,mirror,line", FAULTS,
                         ids=["404 mirror", "404 release", "500", "503", "429", "silence", "redirect loop",
                              "redirect to file", "redirect to ftp", "302 without Location", "304"])
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


ELSEWHERE = [  # (the fault of the host the mirror redirects to, what the one line says after that host's name)
    ({"kind": "status", "code": 500}, f"answered 500 Internal Server Error: {TROUBLE}"),
    ({"kind": "stall"}, "did not answer within 2 s: try again later"),
    ({"kind": "redirect", "to": "ftp://127.0.0.1:9/x.tgz"}, ("answered 302 Found: it redirects to "
                                                            "ftp://127.0.0.1:9/x.tgz, not an http or https URL: "
                                                            "check VIT_PART3_IMAGENETTE_URL")),
]


@pytest.mark.parametrize("fault,line", ELSEWHERE, ids=["500", "silence", "redirect to ftp"])
def test_a_failure_after_a_redirect_names_the_host_that_failed(served, elsewhere, tmp_path, monkeypatch, fault, line):
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", f"{served.url}/file.bin")
    served.faults.append({"path": "/file.bin", "kind": "redirect", "to": f"{elsewhere.url}/file.bin"})
    elsewhere.faults.append({"path": "/file.bin", **fault})
    with pytest.raises(DownloadError) as error:
        download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert str(error.value) == f"127.0.0.1:{elsewhere.server_address[1]} {line}"
    assert os.listdir(tmp_path) == []


def test_a_user_and_password_in_the_url_go_as_basic_authorization_and_never_to_a_redirect(served, elsewhere, tmp_path,
                                                                                         monkeypatch, capfd):
    """urllib would take "alice:s3cr%t@127.0.0.1" for the host's name; the server asks for the header, the password
    percent-decoded, and the host the mirror redirects to asks for the same one and never gets it."""
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", f"{served.url}/file.bin")
    served.authorization = elsewhere.authorization = "Basic YWxpY2U6czNjciV0"  # base64 of "alice:s3cr%t"
    url = f"http://alice:s3cr%25t@127.0.0.1:{served.server_address[1]}/file.bin"
    download(url, MD5, tmp_path / "file.tgz")
    assert (tmp_path / "file.tgz").read_bytes() == CONTENT
    assert reachable(url) and served.requests[-1] == ("HEAD", "/file.bin", None)
    served.faults.append({"path": "/file.bin", "kind": "redirect", "to": f"{elsewhere.url}/file.bin"})
    with pytest.raises(DownloadError) as refused:
        download(url, MD5, tmp_path / "other.tgz")
    assert str(refused.value) == (f"127.0.0.1:{elsewhere.server_address[1]} answered 401 Unauthorized: check "
                                  f"VIT_PART3_IMAGENETTE_URL")
    assert "s3cr" not in "".join(capfd.readouterr()) and elsewhere.requests == [("GET", "/file.bin", None)]


def test_a_user_and_password_in_a_redirects_location_go_to_its_host_as_basic_authorization(served, elsewhere,
                                                                                             tmp_path, capfd):
    """urllib would take "bob:pa%ss@127.0.0.1" of a Location for the next host's name: the credentials go to that
    host alone, as its Authorization header."""
    elsewhere.authorization = "Basic Ym9iOnBhJXNz"  # base64 of "bob:pa%ss"
    port = elsewhere.server_address[1]
    served.faults.append({"path": "/file.bin", "kind": "redirect", "to": f"http://bob:pa%25ss@127.0.0.1:{port}/file.bin"})
    download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert (tmp_path / "file.tgz").read_bytes() == CONTENT
    assert "pa%" not in "".join(capfd.readouterr())


RANGES = [  # (the bytes an earlier run kept, where the server's 206 starts (None: no Content-Range), the one line, or
    # None where the download ends whole)
    (1000, 0, None),  # the whole file, from its start: the part is started over
    (0, 1000, "sent a part of the file (bytes 1000-3145727/3145728) where the bytes from 0 on were asked for"),
    (1000, 500, "sent a part of the file (bytes 500-3145727/3145728) where the bytes from 1,000 on were asked for"),
    (1000, 2000, "sent a part of the file (bytes 2000-3145727/3145728) where the bytes from 1,000 on were asked for"),
    (1000, None, "sent a part of the file (no Content-Range) where the bytes from 1,000 on were asked for"),
]


@pytest.mark.parametrize("kept,first,line", RANGES,
                         ids=["from 0 to a part", "unasked", "before the part's end", "after it", "no Content-Range"])
def test_a_partial_answer_is_appended_only_where_the_part_ends(served, tmp_path, kept, first, line):
    part = tmp_path / "file.tgz.part"
    if kept:
        part.write_bytes(CONTENT[:kept])
    served.faults.append({"path": "/file.bin", "kind": "range", "first": first})
    if line is None:
        download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
        assert os.listdir(tmp_path) == ["file.tgz"] and (tmp_path / "file.tgz").read_bytes() == CONTENT
        return
    with pytest.raises(DownloadError) as refused:
        download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert str(refused.value) == (f"127.0.0.1:{served.server_address[1]} {line}: try again later, or set "
                                  f"VIT_PART3_IMAGENETTE_URL to another mirror")
    assert [path.read_bytes() for path in tmp_path.iterdir()] == ([CONTENT[:kept]] if kept else [])  # as it was


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


def test_a_server_that_trickles_its_headers_ends_in_one_line(served, tmp_path):
    """A byte of the status line and headers at a time, 20 a second: never silent for the time-out, never an answer."""
    served.faults.append({"path": "/file.bin", "kind": "slow headers"})
    started = time.monotonic()
    with pytest.raises(DownloadError) as error:
        download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert time.monotonic() - started < STALL_SECONDS / 4  # else the server's own end, not the rule, stopped it
    assert str(error.value) == f"127.0.0.1:{served.server_address[1]} did not answer within 2 s: try again later"


def test_a_trickling_server_ends_in_one_line_within_twice_the_time_out(served, tmp_path):
    """A server that sends a byte at a time, 20 a second, is never silent for the time-out; the least rate, 10 kB/s
    over HF_HUB_DOWNLOAD_TIMEOUT (2 s here), ends it in one line naming the server, the bytes kept to continue."""
    served.faults.append({"path": "/file.bin", "kind": "trickle"})
    started = time.monotonic()
    with pytest.raises(DownloadError) as error:
        download(f"{served.url}/file.bin", MD5, tmp_path / "file.tgz", progress=False)
    assert time.monotonic() - started < STALL_SECONDS / 4  # else the server's own end, not the rule, stopped it
    assert re.fullmatch(rf"127\.0\.0\.1:{served.server_address[1]} sent \d+ bytes in \d+ s, slower than 10 kB/s: try "
                        rf"again later to continue \(the \d+ bytes so far are kept\), or set VIT_PART3_IMAGENETTE_URL "
                        rf"to another mirror", str(error.value)), str(error.value)
    assert 0 < (tmp_path / "file.tgz.part").stat().st_size < 1000


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
    ("ftp://user:SECRET@127.0.0.1/a.tgz?X-Amz-Signature=SECRET", ("=ftp://***@127.0.0.1/a.tgz?***: not an http, "
                                                                  "https or file URL")),
    ("http://u:SECRET@[::1/a.tgz", "=(a URL that cannot be read): not an http, https or file URL"),
])
def test_a_variable_that_is_no_url_of_an_archive_is_refused(monkeypatch, value, refusal):
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", value)
    with pytest.raises(UserError, match=re.escape(refusal)) as refused:
        archive_source()
    assert "SECRET" not in str(refused.value)


@pytest.mark.parametrize("url,shown", [
    ("https://user:hunter2@s3.example.com/b/a.tgz?X-Amz-Signature=SECRET&X-Amz-Date=1#md5=00",
     "https://***@s3.example.com/b/a.tgz?***#md5=00"),
    ("http://127.0.0.1:8000/imagenette2-160.tgz", "http://127.0.0.1:8000/imagenette2-160.tgz"),
    ("file:///srv/imagenette2-160.tgz", "file:///srv/imagenette2-160.tgz"),
    ("http://[::1", "(a URL that cannot be read)"),
])
def test_a_url_is_shown_without_its_user_password_and_query(url, shown):
    assert shown_url(url) == shown


def test_no_secret_of_a_mirrors_url_leaves_the_run(served, tmp_path, monkeypatch):
    """A presigned URL's query and a user:password are in no line (a failure's, the job's plan) and no record (the
    manifest, which --json and the page read)."""
    from huggingface_hub import constants

    from job import downloads

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(imagenette, "DEFAULT_DIR", tmp_path / "data" / "imagenette2-160")
    served.files["/layout.tgz"] = layout = tgz(*LAYOUT, content=b"")
    lines = []
    for url in (f"{served.url}/missing.tgz?X-Amz-Signature=SECRET", "http://user:SECRET@127.0.0.1:9/x.tgz?a=SECRET",
                f"{served.url}/layout.tgz?X-Amz-Signature=SECRET#md5={hashlib.md5(layout).hexdigest()}"):
        monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", url)
        monkeypatch.setattr(downloads, "ARCHIVE_URL", url.partition("#")[0])
        lines.append(downloads.mirror_line([downloads.IMAGENETTE]))
        try:
            imagenette_archive.download_imagenette()
        except UserError as problem:
            lines.append(str(problem))
    assert len(lines) == 5 and "?***" in lines[1] and "***@127.0.0.1:9" in lines[2]
    manifest = (tmp_path / "data" / "imagenette2-160" / data_set.MANIFEST).read_text()
    assert "layout.tgz?***" in manifest and not [line for line in [*lines, manifest] if "SECRET" in line]


def test_a_mirror_without_a_fragment_is_checked_against_the_releases_md5(monkeypatch):
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", "http://127.0.0.1:9/imagenette2-160.tgz")
    assert archive_source() == ("http://127.0.0.1:9/imagenette2-160.tgz", "e793b78cc4c9e9a4ccc0c1155377a412")


# ---------------------------------------------------------------- hostile archives from a mirror

def entry(name, kind="file", link="", size=0, **pax):
    """A tar member: kind "file" (size zero bytes), "folder", "symlink", "hardlink", "fifo" or "device"; pax: its
    PAX headers."""
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "folder": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                 "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "device": tarfile.CHRTYPE,
                 "pax": tarfile.XHDTYPE, "global pax": tarfile.XGLTYPE}[kind]
    info.linkname, info.size, info.pax_headers, info.devmajor, info.devminor = link, size, pax, 1, 3
    return info


def tgz(*members, content=b"overwritten", negative=False):
    """A .tgz of the members (PAX format); each file holds its size of zeros, the last one `content`, each PAX
    header (kind "pax" or "global pax") its records; negative: the first member's size -1,024 (GNU's base-256)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i, info in enumerate(members):
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):
                records = "".join(record(key, value) for key, value in info.pax_headers.items()).encode()
                info.pax_headers, info.size = {}, len(records)
                tar.addfile(info, io.BytesIO(records))
            elif info.isfile() and i == len(members) - 1:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                tar.addfile(info, io.BytesIO(bytes(info.size)) if info.isfile() else None)
    data = bytearray(buffer.getvalue())
    if negative:  # the size field at 124, in base 256 with 0xff first; the checksum at 148 counted anew
        data[124:136] = b"\xff" + (256**11 - 1024).to_bytes(11, "big")
        data[148:156] = b" " * 8
        data[148:156] = b"%06o\0 " % sum(data[:512])
    return gzip.compress(bytes(data), compresslevel=1)


def record(key, value):
    """One PAX record, "<its length> key=value\\n", the length counting itself."""
    body = f" {key}={value}\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return f"{length}{body}"


TOP = "imagenette2-160"
LAYOUT = [entry(f"{TOP}/{split}/{name}/1.JPEG") for split in ("train", "val") for name in ("a", "b")]  # 2 classes


def cve_2025_4517(outside):
    """The chain that bypasses tarfile's data filter on Python 3.11.4-3.11.12, 3.12.0-3.12.10, 3.13.0-3.13.3: 16
    folders of 247 letters and links to them make a real path longer than PATH_MAX, where os.path.realpath stops
    resolving links and the filter judges the rest by its letters; "escape" then reaches /, and a hard link through
    it brings the outside file in, which the last member writes."""
    long, steps, members, path = "d" * 247, "abcdefghijklmnop", [], TOP
    for step in steps:
        members += [entry(f"{path}/{long}", "folder"), entry(f"{path}/{step}", "symlink", long)]
        path = f"{path}/{long}"
    linkpath = "/".join([TOP, *steps, "l" * 254])
    members += [entry(linkpath, "symlink", "../" * len(steps)),
                entry(f"{TOP}/escape", "symlink", linkpath.split("/", 1)[1] + "/.." * (len(steps) + 1)),
                entry(f"{TOP}/flaglink", "hardlink", f"{TOP}/escape{outside}"), entry(f"{TOP}/flaglink")]
    return members


HOSTILE = [  # (what the archive holds, its members given the outside file's path, what the one line says)
    ("CVE-2025-4517's chain", lambda outside: [*LAYOUT, *cve_2025_4517(outside)], "is a symbolic link"),
    ("the folder a link to .", lambda outside: [entry(TOP, "symlink", "."), *[entry(info.name.split("/", 1)[1])
                                                                           for info in LAYOUT]],
     f"'{TOP}' is a symbolic link"),
    ("a link to a file outside", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", "symlink", outside)],
     "is a symbolic link"),
    ("a hard link to a file outside", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", "hardlink", outside)],
     "is a hard link"),
    ("a name up and out", lambda outside: [*LAYOUT, entry("../outside.JPEG")], f"lies outside {TOP}/"),
    ("an absolute name", lambda outside: [*LAYOUT, entry(f"{outside}.JPEG")], f"lies outside {TOP}/"),
    ("a name up through the folder", lambda outside: [*LAYOUT, entry(f"{TOP}/../../up.JPEG")], f"lies outside {TOP}/"),
    ("another folder beside it", lambda outside: [*LAYOUT, entry("elsewhere/1.JPEG")], f"lies outside {TOP}/"),
    ("a file where the folder goes", lambda outside: [entry(TOP), *LAYOUT], "is a file where the folder goes"),
    ("a FIFO", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", "fifo")], "is a FIFO"),
    ("a device", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", "device")], "is a device"),
    ("NUL in a PAX path", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", path=f"{TOP}/train/a/2\0.JPEG")],
     f"lies outside {TOP}/"),
    ("a 64 GiB sparse member", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", size=1, **{
        "GNU.sparse.map": f"{(64 << 30) - 1},1", "GNU.sparse.size": str(64 << 30),
        "GNU.sparse.name": f"{TOP}/train/a/2.JPEG"}), *LAYOUT[:1]], "is a sparse file"),
    ("a member of zeros past the cap", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG",
                                                                       size=MEMBER_BYTES_MOST + 1), *LAYOUT[:1]],
     f"holds {MEMBER_BYTES_MOST + 1:,} bytes, not 0 to {MEMBER_BYTES_MOST:,}"),
    ("a PAX header of 11 MiB", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", comment="x" * (11 << 20))],
     "a member's headers are longer than 65,536 bytes"),
    ("a file named twice", lambda outside: [*LAYOUT, *LAYOUT[:1]], "4 files were written of its 5"),
    ("3,000 chained PAX headers", lambda outside: [*LAYOUT, *[entry(f"{TOP}/p", "pax", comment="x")] * 3000,
                                                   *LAYOUT[:1]], "a member's headers are longer than 65,536 bytes"),
    ("a time of 1e400", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", mtime="1e400")],
     "has the time inf"),
    ("1,500 nested folders", lambda outside: [*LAYOUT, *[entry(f"{TOP}/" + "/".join("a" * (k + 1)), "folder")
                                                         for k in range(1500)]], "is deeper than 8"),
    ("a sparse map of 1.0 format", lambda outside: [*LAYOUT, entry(f"{TOP}/train/a/2.JPEG", **{
        "GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": f"{TOP}/train/a/2.JPEG",
        "GNU.sparse.realsize": str(64 << 30)})], "a member's headers are longer than 65,536 bytes"),
    ("a global PAX header of 2,000 records", lambda outside: [entry("g", "global pax", **{
        f"k{k}": "v" for k in range(2000)}), *LAYOUT], "has 2,000 PAX records"),
]
# One process per Python loads the libraries the archive's code imports, once; each download_run() is a child forked
# from it, which then imports the project (its folders read from the environment the test gives) and downloads, as a
# script's section does: its status and stderr as `python -c` would give them (sys.exit(text): text, status 1).
WARM = """import json, os, sys, traceback, warnings
import numpy, PIL.Image, torch, transformers, huggingface_hub
kept = warnings.filters[:]  # the child's: Python 3.12 on warns here of a fork beside torch's thread, not there
warnings.filterwarnings("ignore", "This process", DeprecationWarning)
for line in sys.stdin:
    case = json.loads(line)
    child = os.fork()
    if child == 0:
        status = 1
        try:
            warnings.filters[:] = kept
            os.chdir(case["cwd"])
            os.environ.clear()
            os.environ.update(case["environment"])
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            os.dup2(os.open(case["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            from common.start_and_end import UserError
            from job.imagenette_archive import download_imagenette
            try:
                download_imagenette()
            except UserError as problem:
                sys.exit(f"error: {problem}")
            status = 0
        except SystemExit as ended:
            status = 0 if ended.code is None else ended.code if isinstance(ended.code, int) else 1
            if isinstance(ended.code, str):
                print(ended.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(status)
    print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def warm_pythons():
    """{python: its WARM process}, each started by download_run() at its first use, in a process group of its own,
    and ended with the module."""
    started = {}
    yield started
    for process in started.values():
        process.stdin.close()  # its loop ends
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            end_group(process)


def end_group(process):
    """A WARM process killed with the child it forked, which may still run."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def system_python():
    """Debian's /usr/bin/python3 when it is this Python's minor version (the packages this one has fit it): 3.11.2
    on Debian 12, whose tarfile has no filters, so that the checks by hand alone guard it."""
    if not os.path.exists("/usr/bin/python3"):
        return None
    found = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=60, check=False).stdout.strip()
    return "/usr/bin/python3" if found == str(sys.version_info[:2]) else None


PYTHONS = [pytest.param(sys.executable, id="this Python"),
           pytest.param("/usr/bin/python3", id="/usr/bin/python3", marks=pytest.mark.skipif(
               system_python() is None, reason=f"no /usr/bin/python3 of Python {sys.version_info[0]}."
                                               f"{sys.version_info[1]} here"))]


def tree(root, leave_out):
    """{path: its bytes or link} of every file, folder and link under root but leave_out."""
    found = {}
    for folder, folders, files in os.walk(root):
        folders[:] = [name for name in folders if Path(folder, name) != leave_out]
        for path in [Path(folder, name) for name in folders + files]:
            found[str(path)] = (os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file()
                                else "folder")
    return found


def download_run(python, served, archive, home, warm_pythons):
    """download_imagenette() in a process of its own (forked from python's WARM process), as a script's section calls
    it, VIT_PART3_IMAGENETTE_URL naming the archive with its MD5 (a mirror the user trusts): its exit status and
    stderr."""
    from conftest import ROOT

    served.files[f"/hostile/{home.name}.tgz"] = archive
    environment = {name: value for name, value in os.environ.items() if name != "HF_HUB_OFFLINE"}
    environment.update(VIT_PART3_DATA=str(home / "data"),
                       VIT_PART3_IMAGENETTE_URL=f"{served.url}/hostile/{home.name}.tgz#md5={hashlib.md5(archive).hexdigest()}")
    if python not in warm_pythons:
        site = os.pathsep.join(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))
        warm_pythons[python] = subprocess.Popen([python, "-c", WARM], cwd=ROOT, text=True, stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, start_new_session=True,
                                                env={**environment, "PYTHONPATH": f"{ROOT}{os.pathsep}{site}"})
    process, stderr = warm_pythons[python], home.parent / f"{home.name}.stderr"
    process.stdin.write(json.dumps({"cwd": str(home), "environment": environment, "stderr": str(stderr)}) + "\n")
    process.stdin.flush()
    ready, _, _ = select.select([process.stdout], [], [], 300)
    if not ready:  # the next test on this Python starts a new WARM process
        end_group(warm_pythons.pop(python))
        pytest.fail("the download did not end within 300 s")
    return int(process.stdout.readline()), stderr.read_text()


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("holds,members,said", HOSTILE, ids=[case[0] for case in HOSTILE])
def test_a_hostile_archive_writes_nothing_outside_the_data_folder(served, tmp_path, python, holds, members, said,
                                                                    warm_pythons):
    """Through the download path, on each Python: one line naming what the archive holds, exit status 1, no
    traceback, nothing outside data/ changed, no link or folder where the pictures go, the archive moved aside."""
    outside = tmp_path / "outside.txt"
    outside.write_text("original")
    before = tree(tmp_path, tmp_path / "data")
    content = b"200000\n" + b"0\n1\n" * 200_000 if holds == "a sparse map of 1.0 format" else b"overwritten"
    status, stderr = download_run(python, served, tgz(*members(str(outside)), content=content), tmp_path,
                                  warm_pythons)
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip() and
             not line.startswith(f"downloading {TOP}.tgz:")]  # the bar
    assert status == 1 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], stderr
    assert "Traceback" not in stderr and tree(tmp_path, tmp_path / "data") == before
    assert os.listdir(tmp_path / "data") == [f"{TOP}.tgz.refused"], os.listdir(tmp_path / "data")
    assert lines[0].endswith(f"moved it to {tmp_path / 'data' / TOP}.tgz.refused: run again to download it anew, "
                             f"or pass --data-dir with a complete copy")


@pytest.mark.parametrize("python", PYTHONS)
def test_the_archives_folders_and_files_are_extracted_on_each_python(served, tmp_path, python, warm_pythons):
    """The control of the table above: the layout alone extracts, its folder in place, on each Python."""
    status, stderr = download_run(python, served, tgz(*LAYOUT, content=b""), tmp_path, warm_pythons)
    assert status == 0, stderr
    found = sorted(str(path.relative_to(tmp_path / "data")) for path in (tmp_path / "data").rglob("*.JPEG"))
    assert found == sorted(info.name for info in LAYOUT) and os.listdir(tmp_path / "data") == [TOP]


FILTERS = [pytest.param(True, id="data filter", marks=pytest.mark.skipif(
               not hasattr(tarfile, "data_filter"), reason="this Python's tarfile has no filters (3.11.0 to 3.11.3)")),
           pytest.param(False, id="by hand (3.11.0-3.11.3)")]


@pytest.mark.parametrize("filtered", FILTERS)
def test_extraction_gives_the_archives_folders_and_files(tmp_path, monkeypatch, filtered):
    """Without tarfile's filters every file is the current user's, folders 0755 and files 0644, whatever the
    archive says (a folder of mode 000, another user's files)."""
    monkeypatch.setattr(imagenette_archive, "DATA_FILTER", filtered)
    members = [entry("mine/train/a/1.JPEG"), entry("mine/val/a/1.JPEG"), entry("mine/train/b", "folder"),
               entry("mine/train/b/2.JPEG")]
    members[2].mode, members[3].mode = 0o000, 0o4777
    for info in members:
        info.uid, info.gid, info.uname, info.gname = 4242, 4242, "nobody-here", "nobody-here"
    archive = tmp_path / "mine.tgz"
    archive.write_bytes(tgz(*members, content=b"4"))
    assert imagenette_archive.extract(archive, tmp_path / "out", "mine") == 3
    found = sorted((tmp_path / "out").rglob("*"))
    assert [str(path.relative_to(tmp_path / "out")) for path in found] == [
        "mine", "mine/train", "mine/train/a", "mine/train/a/1.JPEG", "mine/train/b", "mine/train/b/2.JPEG", "mine/val",
        "mine/val/a", "mine/val/a/1.JPEG"]
    assert all(path.stat().st_uid == os.getuid() and path.stat().st_gid == os.getgid() for path in found)
    if not filtered:
        assert {str(path.relative_to(tmp_path / "out")): oct(path.stat().st_mode & 0o7777) for path in found
                if path.name in ("b", "2.JPEG")} == {"mine/train/b": "0o755", "mine/train/b/2.JPEG": "0o644"}


@pytest.mark.parametrize("python", PYTHONS)
def test_a_negative_size_is_refused(served, tmp_path, python, warm_pythons):
    """GNU's base-256 size field says -1,024: tarfile would read earlier headers again, round and round."""
    status, stderr = download_run(python, served, tgz(entry(f"{TOP}/train/a/0.JPEG", size=1), *LAYOUT,
                                                      negative=True), tmp_path, warm_pythons)
    assert status == 1 and "holds -1,024 bytes, not 0 to" in stderr and "Traceback" not in stderr, stderr
    assert os.listdir(tmp_path / "data") == [f"{TOP}.tgz.refused"]


def test_more_than_the_caps_in_all_is_refused_before_it_is_written(tmp_path, monkeypatch):
    """Each member under its cap, all of them over the total's: refused, nothing written."""
    monkeypatch.setattr(imagenette_archive, "EXTRACTED_BYTES_MOST", 3)
    archive = tmp_path / "mine.tgz"
    archive.write_bytes(tgz(*[entry(f"mine/train/a/{i}.JPEG", size=1) for i in range(5)]))
    with pytest.raises(UserError, match="it holds more than 3 bytes or 50,000 members"):
        imagenette_archive.extract(archive, tmp_path / "out", "mine")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def test_an_archive_found_in_place_counts_as_the_release_only_by_its_bytes(tmp_path, monkeypatch):
    """An archive already in data/ (another tool's copy) is hashed before it is extracted: with other bytes than the
    release's it is moved aside in one line, its pictures never taken for the release's; with the bytes a mirror's
    #md5= names, its manifest records the MD5 computed, so that its pictures are not the release's."""
    from huggingface_hub import constants

    data, layout = tmp_path / "data", tgz(*LAYOUT, content=b"")
    data.mkdir()
    (data / f"{TOP}.tgz").write_bytes(layout)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(imagenette, "DEFAULT_DIR", data / TOP)
    monkeypatch.delenv("VIT_PART3_IMAGENETTE_URL", raising=False)
    with pytest.raises(UserError) as refused:
        imagenette_archive.download_imagenette()
    found = hashlib.md5(layout).hexdigest()
    assert str(refused.value) == (f"the archive {data / TOP}.tgz: its contents are not the release (its MD5 is "
                                  f"{found}, not {data_set.MD5}); moved it to {data / TOP}.tgz.refused: run again "
                                  f"to download it anew, or pass --data-dir with a complete copy")
    assert os.listdir(data) == [f"{TOP}.tgz.refused"]
    (data / f"{TOP}.tgz").write_bytes(layout)
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", f"http://127.0.0.1:9/{TOP}.tgz#md5={found}")
    imagenette_archive.download_imagenette()
    assert data_set.extracted_from(data / TOP) == found != data_set.MD5


DISK_FAULTS = [  # (the error of a member's write, the system's words for it, whether the archive is kept, what to do)
    (errno.ENOSPC, "No space left on device", True, "free space there"),
    (errno.EDQUOT, "Disk quota exceeded", True, "free space there"),
    (errno.EIO, "Input/output error", True, "check that disk"),
    (errno.EROFS, "Read-only file system", True, "make it writable"),
    (errno.ENAMETOOLONG, "File name too long", False, None),  # the archive's names: refused as before
]


@pytest.mark.parametrize("code,words,kept,fix", DISK_FAULTS, ids=["ENOSPC", "EDQUOT", "EIO", "EROFS", "ENAMETOOLONG"])
def test_a_disk_that_fails_during_extraction_keeps_the_archive_for_the_next_run(served, tmp_path, monkeypatch, code,
                                                                                words, kept, fix):
    """The archive's MD5 is the one asked for: a full, read-only or failing disk is not its fault, so it stays in
    place, no half folder is left, and the next run extracts it without a request to the server."""
    data, layout = tmp_path / "data", tgz(*LAYOUT, content=b"")
    served.files["/layout.tgz"] = layout
    url, md5 = f"{served.url}/layout.tgz", hashlib.md5(layout).hexdigest()

    def failing(*args, **kwargs):
        raise OSError(code, words)

    with monkeypatch.context() as patched, pytest.raises(UserError) as failed:
        patched.setattr(tarfile.TarFile, "makefile", failing)
        download_and_extract(url, md5, data / TOP, progress=False)
    if not kept:
        assert str(failed.value) == (f"the archive downloaded from {url}: could not extract it ({words}); moved it to "
                                     f"{data / TOP}.tgz.refused: run again to download it anew, or pass --data-dir "
                                     f"with a complete copy")
        assert os.listdir(data) == [f"{TOP}.tgz.refused"]
        return
    assert str(failed.value) == (f"the archive downloaded from {url}: the disk of {data} failed while extracting it "
                                 f"({words}); kept the archive {data / TOP}.tgz: {fix} and run again to extract it")
    assert os.listdir(data) == [f"{TOP}.tgz"] and (data / f"{TOP}.tgz").read_bytes() == layout
    served.requests.clear()
    download_and_extract(url, md5, data / TOP, progress=False)
    assert served.requests == [] and os.listdir(data) == [TOP]
    assert sorted(str(path.relative_to(data)) for path in data.rglob("*.JPEG")) == sorted(info.name for info in LAYOUT)


@pytest.mark.parametrize("code,words", [fault[:2] for fault in DISK_FAULTS if fault[2]],
                         ids=["ENOSPC", "EDQUOT", "EIO", "EROFS"])
def test_a_data_folder_that_fails_before_extraction_is_one_line_and_the_archive_is_kept(tmp_path, monkeypatch, code,
                                                                                       words):
    """The scratch folder beside the data folder cannot be made: one line naming the folder, not a traceback; the
    archive already there stays for the next run."""
    from huggingface_hub import constants

    data, layout = tmp_path / "data", tgz(*LAYOUT, content=b"")
    data.mkdir()
    (data / f"{TOP}.tgz").write_bytes(layout)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(imagenette, "DEFAULT_DIR", data / TOP)
    monkeypatch.setenv("VIT_PART3_IMAGENETTE_URL", f"http://127.0.0.1:9/{TOP}.tgz#md5={hashlib.md5(layout).hexdigest()}")

    def failing(*args, **kwargs):
        raise OSError(code, words)

    monkeypatch.setattr(imagenette_archive.tempfile, "mkdtemp", failing)
    with pytest.raises(UserError) as failed:
        imagenette_archive.download_imagenette()
    assert str(failed.value) == (f"Imagenette is not in {data / TOP}, and {data} cannot be written ({words}): free "
                                 f"space there or make it writable, or pass --data-dir")
    assert os.listdir(data) == [f"{TOP}.tgz"]


UNSHARE = ["unshare", "--pid", "--fork", "--kill-child"]


def pid_namespaces():
    """Whether unshare can start a process in a PID namespace of its own here (root, or user namespaces)."""
    try:
        return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not pid_namespaces(), reason="unshare cannot make a PID namespace here (it needs root or user "
                                                 "namespaces)")
def test_a_run_in_another_pid_namespace_never_deletes_a_live_scratch_folder(tmp_path):
    """This process is the first run: it holds its scratch folder's lock, as a run that extracts does. A second run in
    a PID namespace of its own (another container sharing data/), to which this process's number means nothing,
    extracts its copy beside it and deletes only the folder no process holds."""
    from conftest import ROOT

    data, archive = tmp_path / "data", tmp_path / "mine.tgz"
    data.mkdir()
    archive.write_bytes(tgz(*LAYOUT, content=b""))
    prefix = imagenette_archive.scratch_prefix(data / TOP)
    live, abandoned = data / f"{prefix}{os.getpid()}-live", data / f"{prefix}{os.getpid()}-abandoned"
    for folder in (live, abandoned):
        folder.mkdir()
        (folder / "half.JPEG").write_bytes(b"half")
    handle = imagenette_archive.lock(live)
    code = ("import sys; from job.imagenette_archive import download_and_extract; "
            "download_and_extract(sys.argv[1], sys.argv[2], sys.argv[3], progress=False)")
    try:
        done = subprocess.run([*UNSHARE, sys.executable, "-c", code, archive.as_uri(),
                               hashlib.md5(archive.read_bytes()).hexdigest(), str(data / TOP)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    finally:
        os.close(handle)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(data)) == sorted([TOP, live.name]) and (live / "half.JPEG").read_bytes() == b"half"


def test_two_processes_downloading_into_one_folder_take_turns(served, tmp_path):
    """Each waits for the other's download (a lock on the folder): both end with the archive whole, fetched once."""
    from conftest import ROOT

    code = ("import sys; from pathlib import Path; from job.imagenette_archive import download; "
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
    ("rewrite, its size and time put back", "val/a/a_0000.JPEG changed since the project extracted the archive"),
    ("remove", "val/a/a_0000.JPEG was removed since the project extracted the archive"),
    ("add", "val/a/zz.JPEG was added since the project extracted the archive"),
]


def change_times_pass(path, probe):
    """Write probe until its change time is after path's: a file system may take change times from a clock that
    ticks every few milliseconds, and a change within the tick of the manifest's would look as old."""
    for _ in range(1_000_000):  # the clock ticks within milliseconds: a bound, not a wait
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > path.stat().st_ctime_ns:
            return
    raise AssertionError(f"the change times of {probe.parent} never passed that of {path}")


@pytest.mark.parametrize("change,said", CHANGES, ids=[change for change, _ in CHANGES])
def test_a_picture_changed_since_the_extraction_makes_the_folder_another_data_set(tmp_path, change, said):
    target = extracted_copy(tmp_path)
    args = type("Args", (), {"data_dir": str(target), "per_class": None})()
    listed = json.loads((target / data_set.MANIFEST).read_text())
    picture = target / "val" / "a" / "a_0000.JPEG"
    assert listed["pictures"]["val/a/a_0000.JPEG"][2] == hashlib.sha256(picture.read_bytes()).hexdigest()
    assert data_set.changed_pictures(target) is None
    if change.startswith("rewrite"):  # the same size, other bytes, another time (put back: its change time tells)
        change_times_pass(target / data_set.MANIFEST, tmp_path / "probe")
        mtime = picture.stat().st_mtime_ns
        picture.write_bytes(bytes(255 - byte for byte in picture.read_bytes()))
        if change.endswith("put back"):
            os.utime(picture, ns=(mtime, mtime))
    elif change == "remove":
        picture.unlink()
    else:
        (target / "val" / "a" / "zz.JPEG").write_bytes(picture.read_bytes())
    assert data_set.data_differences(args, {})["data set"]["why"] == (
        f"--data-dir {target}: the pictures the project downloaded, but {said}")


def test_a_picture_touched_but_unchanged_is_read_again_and_passes(tmp_path):
    target = extracted_copy(tmp_path)
    picture = target / "train" / "b" / "b_0001.JPEG"
    os.utime(picture, ns=(1, 1))  # another time, the same bytes: hashed again, still the one extracted
    assert data_set.changed_pictures(target) is None
