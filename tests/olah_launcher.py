"""olah, a Hugging Face Hub mirror server, offline on 127.0.0.1, serving the git repositories under a folder as the
Hub serves its own: `python tests/olah_launcher.py PORT MIRRORS WORK` (tests/local_servers.py starts it).

olah 0.5's offline mirror answers four requests otherwise than the Hub; each is patched before it starts, each
falling back to olah's own answer for a repository it does not hold:
- /api/{type}/{id} without a revision: the Hub answers for the default branch, olah 401 "Repository not found";
- a file the repository lacks (transformers 5 asks for processor_config.json): the Hub answers 404 with
  X-Error-Code EntryNotFound, on which the libraries fall back; olah 401 to a HEAD and 500 to a GET;
- the siblings of /api/{type}/{id}: the Hub gives each file's size, git blob id and LFS sha256, olah the name alone.
"""
import sys
from pathlib import Path

import olah.server
import olah.server_api_routes
import olah.server_file_routes
from olah.errors import error_entry_not_found, error_revision_not_found
from olah.mirror.repos import LocalMirrorRepo
from olah.server_mirror import has_local_mirror, load_local_mirror_payload

original = {"latest": olah.server_api_routes.get_latest_commit,
            "resolve": olah.server_file_routes.resolve_requested_commit,
            "get_file": LocalMirrorRepo.get_file, "get_meta": LocalMirrorRepo.get_meta}


class Silent:
    def warning(self, *args, **kwargs):
        pass


async def latest_commit(app, repo, authorization):
    """No revision: the default branch of a repository held here."""
    if has_local_mirror(app, repo):
        return "main"
    return await original["latest"](app, repo, authorization)


def has_revision(repository, revision):
    try:
        repository._git_repo.commit(revision)
    except Exception:  # noqa: BLE001 - GitPython raises several kinds for an unknown revision
        return None
    return True


async def resolve_commit(app, repo, revision, authorization, *args, **kwargs):
    """A file that a repository held here lacks: 404 EntryNotFound (an unknown revision: 404 RevisionNotFound)."""
    if has_local_mirror(app, repo):
        if load_local_mirror_payload(app, repo, lambda repository: has_revision(repository, revision), Silent()):
            return None, error_entry_not_found()
        return None, error_revision_not_found(revision)
    return await original["resolve"](app, repo, revision, authorization, *args, **kwargs)


def get_file(self, commit_hash, path):
    """None for a path the commit lacks, before olah's own reads it (a KeyError there: 500)."""
    try:
        tree = self._git_repo.commit(commit_hash).tree
    except Exception:  # noqa: BLE001
        return None
    return original["get_file"](self, commit_hash, path) if self._contain_path(path, tree) else None


def get_meta(self, commit_hash):
    """The siblings with their size, git blob id and LFS sha256, as the Hub's ?blobs=true."""
    meta = original["get_meta"](self, commit_hash)
    if meta is None:
        return None
    tree = self._git_repo.commit(commit_hash).tree
    siblings = []
    for sibling in meta["siblings"]:
        info = self._get_path_info(tree[sibling["rfilename"]])
        entry = {"rfilename": sibling["rfilename"], "size": info["size"], "blobId": info["oid"]}
        if "lfs" in info:
            entry["lfs"] = {"sha256": info["lfs"]["oid"], "size": info["lfs"]["size"],
                            "pointerSize": info["lfs"]["pointerSize"]}
        siblings.append(entry)
    return {**meta, "siblings": siblings}


def main(port, mirrors, work):
    """olah's configuration, every path in work (its default ./repos, ./logs and ~/.olah are not used), upstream a
    name that cannot resolve, then olah's own command line."""
    work = Path(work)
    config = work / "olah.toml"
    config.write_text(f"""[basic]
host = "127.0.0.1"
port = {port}
repos-path = "{work / 'repos'}"
mirrors-path = ["{mirrors}"]
mirror-scheme = "http"
mirror-netloc = "127.0.0.1:{port}"
mirror-lfs-netloc = "127.0.0.1:{port}"
hf-netloc = "huggingface.invalid"
hf-lfs-netloc = "cdn-lfs.huggingface.invalid"

[accessibility]
offline = true
""")
    olah.server_api_routes.get_latest_commit = latest_commit
    olah.server_file_routes.resolve_requested_commit = resolve_commit
    LocalMirrorRepo.get_file = get_file
    LocalMirrorRepo.get_meta = get_meta
    sys.argv = ["olah-cli", "--config", str(config), "--log-path", str(work / "logs")]
    olah.server.main()


if __name__ == "__main__":
    main(*sys.argv[1:])
