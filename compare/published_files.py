"""Whether a checkpoint's or a dataset's files are the ones huggingface.co publishes, by their bytes: a setup
difference for --compare and --json when they are not (asked only then)."""
import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from common import paths
from common.files import write_text
from common.pretrained import HUB_ENDPOINT, NESTED_PROCESSOR_FILE, PROCESSOR_FILE, WEIGHT_FILES, ask_hub, hub_name
from common.start_and_end import UserError
from compare.marks import made_here


def checkpoint_difference(name, article, flag=None):
    """{"checkpoint": difference} when --model is not the article's checkpoint, {} when it is: its files' bytes (the
    cache's copy of the article's Hub id, or a local folder's: config.json, the weight file and the image processor's
    file when there is one) hash to what huggingface.co publishes for the article's id (published_hashes). Another
    id, a stand-in, the miniature's, files that differ, or files that cannot be checked are a difference, named by
    flag (default: --model name)."""
    flag, folder = flag or f"--model {name}", os.path.expanduser(name)
    if not os.path.isdir(folder):
        if name != article:
            return {"checkpoint": {"flag": flag, "why": f"{flag}: the article's checkpoint is {article}"}}
        folder = cached_snapshot(name)
        unlike = (unlike_the_hubs(folder, article, "the cache's copy") if folder else
                  "its files are not in the Hugging Face cache, so their bytes cannot be checked")
    else:
        unlike = made_here(folder) or unlike_the_hubs(folder, article, "a folder")
    return {"checkpoint": {"flag": flag, "why": f"{flag}: {unlike}, not the article's {article}"}} if unlike else {}


def cached_snapshot(name):
    """The folder of the cache's snapshot of name (its files as the library found them), or None."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(name, "config.json")
    return os.path.dirname(config) if isinstance(config, str) else None


def unlike_the_hubs(folder, repo, what):
    """Why the folder's config.json, weight file or image processor's file is not the one huggingface.co publishes
    for repo, or None when each is, by the bytes: a large (LFS) file by its sha256, a small one by git's blob sha1,
    as the Hub names them. The names of the cache's blobs are never taken for their contents."""
    weights = next((file for file in WEIGHT_FILES if os.path.isfile(os.path.join(folder, file))), None)
    if weights is None:
        return f"{what} without model.safetensors or pytorch_model.bin"
    files = ["config.json", weights, *[file for file in (PROCESSOR_FILE, NESTED_PROCESSOR_FILE)  # its pixels
                                       if os.path.isfile(os.path.join(folder, file))]]
    return unlike_the_published(folder, repo, files, what)


def unlike_the_published(folder, repo, files, what, repo_type="model"):
    """Why one of files (paths relative to folder, as in the repository) is not the one huggingface.co publishes
    for repo, or None when each is, by the bytes: a large (LFS) file by its sha256, a small one by git's blob sha1,
    as the Hub names them."""
    published, why = published_hashes(repo, files, repo_type)
    if published is None:
        return f"{what} whose files cannot be checked: {why}"
    for file in files:
        expected = published.get(file)
        if expected is None or file_hash(os.path.join(folder, file), len(expected)) != expected:
            return f"{what} whose {file} is not the one huggingface.co publishes for {repo}"
    return None


def published_hashes(repo, files, repo_type="model"):
    """({file: the hash huggingface.co publishes for it}, None), or (None, why not): recorded on this machine the
    first time huggingface.co itself answered (DATA_DIR/published_hashes.json, each with where and when it was
    read), else asked now and recorded. A mirror's answer is not taken: it cannot vouch for the article's files."""
    from huggingface_hub import HfApi, constants

    record_path = paths.DATA_DIR / "published_hashes.json"
    key = repo if repo_type == "model" else f"{repo_type}s/{repo}"
    record = read_json(record_path)
    known = record.get(key, {}).get("files", {})
    if all(file in known for file in files):
        return known, None
    if constants.ENDPOINT != HUB_ENDPOINT:
        return None, (f"their hashes were never read from huggingface.co, and {hub_name()} cannot vouch for the "
                      f"article's files")
    info, why = ask_hub(repo, repo_type)
    if info is None:
        return None, f"their hashes were never read from huggingface.co, and {why}: run once online"
    try:
        listing = HfApi().model_info if repo_type == "model" else HfApi().dataset_info
        siblings = listing(repo, revision=info.sha, files_metadata=True,
                           timeout=constants.HF_HUB_ETAG_TIMEOUT).siblings or []
    except Exception:  # noqa: BLE001 - the Hub stopped answering between two calls: it cannot say
        return None, "huggingface.co stopped answering before it listed the files' hashes"
    known = {sibling.rfilename: sibling.lfs.sha256 if sibling.lfs else sibling.blob_id for sibling in siblings
             if sibling.blob_id}
    where = f"{HUB_ENDPOINT}/{'' if repo_type == 'model' else f'{repo_type}s/'}{repo}"
    record[key] = {"files": known, "read from": f"{where} at revision {info.sha}",
                    "read": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with contextlib.suppress(UserError):  # a disk that cannot keep it: asked again next time
        write_text(record_path, json.dumps(record, indent=2, sort_keys=True) + "\n", what="record of hashes")
    return known, None


def file_hash(path, length):
    """The file's sha256 (length 64: the Hub's name of a large file) or git blob sha1 (length 40: of a small one),
    computed once: kept by the file's real path, size, modification and change times and inode in
    DATA_DIR/file_hashes.json (an edit with its size and modification time put back still changes the change time,
    which no user call sets)."""
    real, kept_path = os.path.realpath(path), paths.DATA_DIR / "file_hashes.json"
    stat, kept = os.stat(real), read_json(kept_path)
    key = f"{real} {'sha256' if length == 64 else 'git blob sha1'}"
    when = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
    if kept.get(key, [None])[:4] == when:
        return kept[key][4]
    header = f"blob {stat.st_size}\0".encode()  # git names a file by the sha1 of this header and its bytes
    with open(real, "rb") as f:
        digest = hashlib.file_digest(f, "sha256" if length == 64 else lambda: hashlib.sha1(header))
    kept[key] = [*when, digest.hexdigest()]
    with contextlib.suppress(UserError):  # a disk that cannot keep it: hashed again next time
        write_text(kept_path, json.dumps(kept, indent=1) + "\n", what="record of hashes")
    return kept[key][4]


def read_json(path):
    """The JSON object at path, or {} when there is none or it cannot be read."""
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
