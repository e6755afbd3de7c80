"""Real servers on 127.0.0.1 for the download tests, in place of the Hugging Face Hub and the archive's host.

- olah, a Hugging Face Hub mirror server that users deploy, serves git repositories built from the stand-ins under
  the articles' ids (its two answers that differ from the Hub's patched: tests/olah_launcher.py).
- A server of the tests' own serves a generated archive in imagenette2-160's layout and counts, honours HTTP Range
  requests, passes every other request on to olah, and fails as a test tells it: a connection dropped half-way, an
  error status, or silence. It records each request, so that a test can tell what was downloaded.

Every wait here is bounded, and the servers stop with the test session.
"""
import hashlib
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
STALL_SECONDS = 120  # a silent answer ends by then at the latest (the clients' time-outs are far shorter)
TRICKLE_SECONDS = 0.05  # a trickle's pause between two bytes, 20 bytes a second, for at most STALL_SECONDS
ARCHIVE_PATH = "/fast-ai-imageclas/imagenette2-160.tgz"


class Faulty(ThreadingHTTPServer):
    """The tests' own server: files it holds, else olah's answers; faults: [{"path": part of the path, "kind":
    "drop" | "status" | "stall" | "trickle" (a byte each TRICKLE_SECONDS) | "slow headers" (so, the status line and
    headers) | "redirect" (302, or "code", to "to": the same path unless given, no Location where None) | "range" (206
    with the bytes from "first" on, whatever was asked; no Content-Range where None) | "headers" (the answer's
    "headers" set to these) | "body" (another "body" under the answer's headers) | "json" (its JSON with the keys of
    "set" set), "code": the status, "times": how many requests it hits}]."""
    daemon_threads = True

    def __init__(self, upstream=None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.upstream, self.files, self.faults, self.requests = upstream, {}, [], []
        self.ranges = True  # False: a server that ignores Range requests
        self.lengths = True  # False: a server that says no Content-Length of its files (and closes to end one)
        self.authorization = None  # the Authorization header every request must carry, else 401
        self.stop = threading.Event()
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def fault_for(self, path):
        with self.lock:
            for fault in self.faults:
                if fault["path"] in path and fault.get("times", 1) > 0:
                    fault["times"] = fault.get("times", 1) - 1
                    return fault
        return None

    def close(self):
        self.stop.set()
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet: the tests read self.server.requests
        pass

    def do_HEAD(self):
        self.answer(body=False)

    def do_GET(self):
        self.answer(body=True)

    def answer(self, body):
        server = self.server
        server.requests.append((self.command, self.path, self.headers.get("Range")))
        fault = server.fault_for(self.path)
        if server.authorization and self.headers.get("Authorization") != server.authorization:
            fault = {"kind": "status", "code": 401}
        if fault and fault["kind"] == "stall":
            server.stop.wait(STALL_SECONDS)
            self.close_connection = True
            return
        if fault and fault["kind"] == "slow headers":
            self.trickle(f"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n{'X-Padding: x' * 400}\r\n\r\n".encode())
            return
        if fault and fault["kind"] == "redirect":
            self.send_response(fault.get("code", 302))
            if fault.get("to", self.path) is not None:
                self.send_header("Location", fault.get("to", self.path))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if fault and fault["kind"] == "status":
            self.send_response(fault["code"])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self.path.split("?")[0]
        if fault and fault["kind"] == "range":
            status, headers, content = ranged(server.files[path], f"bytes={fault['first'] or 0}-")
            if fault["first"] is None:
                headers = [(name, value) for name, value in headers if name != "Content-Range"]
        elif path in server.files:
            status, headers, content = ranged(server.files[path], server.ranges and self.headers.get("Range"))
        else:
            status, headers, content = self.from_upstream(body)
        if fault and fault["kind"] == "headers":  # a hostile mirror's: names of its own choosing
            headers = [(name, value) for name, value in headers if name.lower() not in map(str.lower, fault["headers"])]
            headers += list(fault["headers"].items())
        if fault and fault["kind"] in ("body", "json"):  # another body, or the JSON one with fault["set"]'s keys set
            content = fault["body"] if fault["kind"] == "body" else json.dumps({**json.loads(content), **fault["set"]})
            content = content.encode() if isinstance(content, str) else content
            headers = [(name, value) for name, value in headers if name != "Content-Length"]
            headers.append(("Content-Length", str(len(content))))
        if path in server.files and not server.lengths:
            headers = [(name, value) for name, value in headers if name != "Content-Length"]
            self.close_connection = True  # the end of the body is the end of the connection
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if not body:
            return
        if fault and fault["kind"] == "trickle":  # the whole length announced, then a byte at a time
            self.trickle(content)
            return
        if fault and fault["kind"] == "drop":  # the whole length announced, half of it sent, then the line is cut
            self.wfile.write(content[: len(content) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(content)

    def trickle(self, data):
        """data a byte each TRICKLE_SECONDS, for STALL_SECONDS at most, then the connection closed."""
        for byte in data[: int(STALL_SECONDS / TRICKLE_SECONDS)]:
            if self.server.stop.wait(TRICKLE_SECONDS):
                break
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:  # the client gave up
                break
        self.close_connection = True

    def from_upstream(self, body):
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        headers = {name: value for name, value in self.headers.items() if name.lower() not in ("host", "connection")}
        upstream.request(self.command, self.path, headers=headers)
        response = upstream.getresponse()
        content = response.read()
        upstream.close()
        passed = [(name, value) for name, value in response.getheaders()
                  if name.lower() not in ("transfer-encoding", "connection", "content-length", "content-encoding")]
        length = response.getheader("Content-Length") if not body or self.command == "HEAD" else None
        passed.append(("Content-Length", length if length is not None else str(len(content))))
        return response.status, passed, content


def ranged(content, asked):
    """(status, headers, body) of a file for a request with the Range header `asked` (bytes=N- only)."""
    if asked and asked.startswith("bytes=") and asked.endswith("-"):
        start = int(asked[len("bytes="):-1])
        if start >= len(content):
            return 416, [("Content-Range", f"bytes */{len(content)}"), ("Content-Length", "0")], b""
        return 206, [("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}"),
                     ("Content-Length", str(len(content) - start))], content[start:]
    return 200, [("Content-Length", str(len(content))), ("Accept-Ranges", "bytes")], content


# ---------------------------------------------------------------- Imagenette's archive

def imagenette_archive():
    """(bytes, MD5) of a .tgz in imagenette2-160's layout and counts (9,469 training and 3,925 validation pictures
    in the ten WordNet-id folders), each class's pictures one generated 160-px JPEG: a few MB."""
    import numpy as np
    from PIL import Image

    from common.data import CLASSES, SPLIT_COUNTS

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for k, (wnid, _, _) in enumerate(CLASSES):
            rng = np.random.default_rng(k)
            pixels = np.clip(25 * k + rng.integers(0, 60, (160, 200, 3)), 0, 255).astype(np.uint8)
            encoded = io.BytesIO()
            Image.fromarray(pixels).save(encoded, format="JPEG", quality=75)
            jpeg = encoded.getvalue()
            for split, total in SPLIT_COUNTS.items():
                count = total // 10 + (k < total % 10)
                for i in range(count):
                    member = tarfile.TarInfo(f"imagenette2-160/{split}/{wnid}/{wnid}_{i:05d}.JPEG")
                    member.size, member.mode = len(jpeg), 0o644
                    tar.addfile(member, io.BytesIO(jpeg))
    data = buffer.getvalue()
    return data, hashlib.md5(data).hexdigest()


# ---------------------------------------------------------------- olah

LFS = (".safetensors", ".bin", ".parquet")  # what the Hub stores with git LFS


def git_repository(folder, source):
    """A git repository at folder, branch main, one commit of the files in source (not the stand-ins' mark): its
    large files as git LFS pointers with their objects in .git/lfs, as git-lfs leaves them and olah reads them."""
    from job.standins import MARK

    git = ["git", "-C", str(folder), "-c", "user.name=tests", "-c", "user.email=tests@127.0.0.1",
           "-c", "commit.gpgsign=false"]
    folder.mkdir(parents=True)
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    for path in sorted(Path(source).rglob("*")):
        if path.is_dir() or path.name == MARK:
            continue
        target = folder / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        content = path.read_bytes()
        if path.suffix in LFS:
            oid = hashlib.sha256(content).hexdigest()
            stored = folder / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
            stored.parent.mkdir(parents=True, exist_ok=True)
            stored.write_bytes(content)
            content = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(content)}\n".encode()
        target.write_bytes(content)
    (folder / ".gitattributes").write_text("".join(f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n"
                                                   for suffix in LFS))
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "stand-in"], check=True)


def tiny_resnet(directory):
    """microsoft/resnet-50's layout (a ResNetModel's config and weights), four stages of one narrow block."""
    import torch
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])).save_pretrained(
        directory)
    return Path(directory)


HUB_IDS = {"vit": "models/google/vit-base-patch16-224", "in21k": "models/google/vit-base-patch16-224-in21k",
           "resnet": "models/microsoft/resnet-50", "beans": "datasets/AI-Lab-Makerere/beans"}


def hub_repositories(root):
    """root/mirrors/{models,datasets}/<id>: the articles' checkpoints and beans as stand-ins (random weights, generated
    pictures) in git repositories, the layout olah serves."""
    from job.standins import beans_folder, vit_classifier, vit_in21k

    built = root / "built"
    sources = {"vit": vit_classifier(built / "vit", image_size=48, processor=True),
               "in21k": vit_in21k(built / "in21k", processor=True), "resnet": tiny_resnet(built / "resnet"),
               "beans": beans_folder(built / "beans")}
    for name, source in sources.items():
        git_repository(root / "mirrors" / HUB_IDS[name], source)
    return root / "mirrors"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_olah(mirrors, work):
    """olah on 127.0.0.1, offline, serving the repositories under mirrors/{models,datasets}/: (process, port)."""
    port = free_port()
    log = open(work / "olah.log", "w")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen([sys.executable, str(HERE / "olah_launcher.py"), str(port), str(mirrors), str(work)],
                               cwd=work, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HOME": str(work)})
    deadline = time.monotonic() + 120  # a loaded machine starts it slowly; a broken one fails the fixture
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"olah ended at its start: {(work / 'olah.log').read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/models/google/vit-base-patch16-224/revision/main",
                                   timeout=5).close()
            return process, port
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"olah did not answer within 120 s: {(work / 'olah.log').read_text()[-2000:]}")


def stop(process):
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def environment(hub_url, archive_url, home):
    """os.environ for a process that downloads from the local servers into empty caches under home, online."""
    env = {name: value for name, value in os.environ.items() if name not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                                             "HF_DATASETS_OFFLINE")}
    return {**env, "HF_ENDPOINT": hub_url, "VIT_PART3_IMAGENETTE_URL": archive_url, "HF_HOME": str(home / "hf"),
            "HF_HUB_CACHE": str(home / "hf" / "hub"), "VIT_PART3_DATA": str(home / "data"),
            "HF_HUB_DOWNLOAD_TIMEOUT": "30", "HF_HUB_ETAG_TIMEOUT": "30"}
