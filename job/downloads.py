"""What reproduce.py's scripts download: each piece's size and host, whether it is here, and the room on the disks.

A piece is here when the job was given a local copy or the caches the scripts read hold it; otherwise
it is downloaded when its host answers, and a script that needs it cannot run when it does not (or
HF_HUB_OFFLINE=1 forbids it).
"""
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from huggingface_hub import constants, is_offline_mode, snapshot_download
from huggingface_hub.constants import ENDPOINT as HF_ENDPOINT
from huggingface_hub.errors import LocalEntryNotFoundError

from common import data, paths
from common.paths import BEANS, BEANS_MB, BEANS_SPLITS
from common.pretrained import HUB_ENDPOINT, HubTrouble, ask_hub, cached_weight_file, shown_url
from common.start_and_end import UserError
from job.imagenette_archive import ARCHIVE_MB, URL_VARIABLE, request_for, shown_host, timeout_seconds
from job.imagenette_archive import URL as IMAGENETTE_URL

VIT, IN21K, RESNET = "google/vit-base-patch16-224", "google/vit-base-patch16-224-in21k", "microsoft/resnet-50"
IMAGENETTE = "Imagenette"
HUB = shown_host(HF_ENDPOINT)  # huggingface.co, or the mirror HF_ENDPOINT names
ARCHIVE_URL = (os.environ.get(URL_VARIABLE) or IMAGENETTE_URL).partition("#")[0]  # the release's, or its mirror's
# (size in MB of 10^6 bytes, MB on disk at most, where it comes from)
PIECES = {VIT: (346, 346, HUB), IN21K: (346, 346, HUB),
          IMAGENETTE: (ARCHIVE_MB, 2 * ARCHIVE_MB, shown_host(ARCHIVE_URL)),  # the archive and its extraction
          BEANS: (BEANS_MB, 2 * BEANS_MB, HUB),  # the parquet files and the library's Arrow copy
          RESNET: (100, 100, HUB)}


def hf_home():
    return Path(constants.HF_HOME)


def piece_is_here(piece, args):
    """A checkpoint or dataset in a local copy the job was given (--models, --imagenette, --beans), or in the caches
    the scripts read (for beans, the cache's snapshot of its files, which the script reads when offline)."""
    if piece == IMAGENETTE:
        return bool(args.imagenette) or data.DEFAULT_DIR.is_dir()
    if piece == BEANS:
        if args.beans:
            return True
        snapshot = beans_snapshot()
        return snapshot is not None and all(any(snapshot.rglob(f"{split}*.parquet")) for split in BEANS_SPLITS)
    if args.models and (Path(args.models) / piece).is_dir():
        return True
    return cached_weight_file(piece) is not None


def beans_snapshot():
    """The Hugging Face cache's snapshot of beans' files (what the backbone reads without --data-dir), or None."""
    try:
        return Path(snapshot_download(BEANS, repo_type="dataset", local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def check_copies(args):
    """The local copies given to reproduce.py, --models, --imagenette and --beans, must be what they say."""
    if args.models:
        models = Path(args.models)
        if not models.is_dir():
            raise UserError(f"--models {args.models} is not a folder: pass a folder of checkpoints laid out by their "
                            f"Hub ids ({models / VIT}/, {models / IN21K}/)")
        present = [name for name in (VIT, IN21K) if (models / name).exists()]
        if not present:
            raise UserError(f"--models {args.models} holds neither {VIT}/ nor {IN21K}/: lay the checkpoints out by "
                            f"their Hub ids, e.g. {models / VIT}/config.json")
        for name in present:
            if not (models / name / "config.json").is_file():
                raise UserError(f"--models {args.models}: {models / name} has no config.json: pass checkpoints "
                                f"saved with save_pretrained (or a snapshot from the Hub)")
    if args.imagenette and not all((Path(args.imagenette) / split).is_dir() for split in ("train", "val")):
        given = Path(args.imagenette)
        what = "is a file, not a folder" if given.exists() and not given.is_dir() else "has no train/ and val/ folders"
        raise UserError(f"--imagenette {args.imagenette} {what}: pass a folder in Imagenette's layout, "
                        f"{{train,val}}/<class>/*.JPEG (e.g. imagenette2-160/)")
    if args.imagenette:
        try:
            data.check_counts(args.imagenette, strict=False)  # the layout: a partial copy is the scripts' to say
        except UserError as problem:
            raise UserError(f"--imagenette {args.imagenette}: {problem}") from problem
    if args.beans:
        names = [path.name for path in Path(args.beans).rglob("*.parquet")] if Path(args.beans).is_dir() else []
        if not all(any(name.startswith(split) for name in names) for split in ("train", "validation")):
            raise UserError(f"--beans {args.beans} has no parquet files of the train and validation splits: pass a "
                            f"copy of {BEANS}'s files (README.md, data/train-*.parquet, data/validation-*.parquet)")


def weights_mb(piece, models):
    """The MB of a checkpoint's weights: the local copy's or the cached file's, else its download size."""
    local = Path(models) / piece if models else None
    weights = (cached_weight_file(str(local)) if local and local.is_dir() else None) or cached_weight_file(piece)
    return Path(weights).stat().st_size / 1e6 if weights else PIECES[piece][0]


def reachable(url):
    """Does the server of url answer, through the proxies the environment names? Any HTTP answer means it is there."""
    try:
        urllib.request.urlopen(request_for(url, method="HEAD"), timeout=timeout_seconds()).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def hub_reachable(name, repo_type="model"):
    """Whether name can be downloaded now (ask_hub); a server in trouble counts as one that cannot be reached, so
    that the job plans without it and a check of a folder's files says it could not check them."""
    try:
        return ask_hub(name, repo_type)[0] is not None
    except HubTrouble:
        return False


def answering(pieces):
    """{piece: whether its download can start}: the Hub's (or its mirror's) by the scripts' own rule
    (common/pretrained.py), asked once; the archive's when its server answers (never with HF_HUB_OFFLINE=1)."""
    answers = {}
    hub = sorted(piece for piece in pieces if piece != IMAGENETTE)
    if hub:
        answers = dict.fromkeys(hub, hub_reachable(hub[0], "dataset" if hub[0] == BEANS else "model"))
    if IMAGENETTE in pieces:
        answers[IMAGENETTE] = not is_offline_mode() and reachable(ARCHIVE_URL)
    return answers


def fetch_line(pieces):
    if not pieces:
        return "to download: nothing, the checkpoints and datasets the job needs are here"
    return ("to download, once (the scripts keep them in the caches): "
            + ", ".join(f"{piece} ({PIECES[piece][0]} MB)" for piece in pieces)
            + f"; {mb_text(sum(PIECES[piece][0] for piece in pieces))} in all")


def mirror_line(pieces):
    """Where the pieces come from, when a variable names a mirror (HF_ENDPOINT, VIT_PART3_IMAGENETTE_URL), else None."""
    named = []
    if HF_ENDPOINT != HUB_ENDPOINT and set(pieces) - {IMAGENETTE}:
        named.append(f"the Hub's files from the mirror {shown_url(HF_ENDPOINT)} (HF_ENDPOINT)")
    if os.environ.get(URL_VARIABLE) and IMAGENETTE in pieces:
        named.append(f"Imagenette's archive from {shown_url(ARCHIVE_URL)} ({URL_VARIABLE})")
    return f"from mirrors: {' and '.join(named)}" if named else None


def lacks_text(pieces, offline):
    """What a script lacks, why it cannot be fetched, and the fix: said before the job, and on the page."""
    named = " and ".join(f"{piece} ({PIECES[piece][0]} MB)" for piece in pieces)
    hosts = " and ".join(sorted({PIECES[piece][2] for piece in pieces}))
    why = "HF_HUB_OFFLINE=1 forbids downloads" if offline else f"{hosts} cannot be reached"
    fixes = [{IMAGENETTE: "--imagenette DIR", BEANS: "--beans DIR"}.get(piece, f"--models DIR (with DIR/{piece}/)")
             for piece in pieces]
    return (f"{named} {'is' if len(pieces) == 1 else 'are'} not here and {why}: pass {' and '.join(fixes)}, or run "
            f"once online")


def room(pieces):
    """{folder: MB} the pieces take once downloaded: Imagenette in the data folder (common/paths.py), the rest in the
    caches."""
    need = {}
    for piece in pieces:
        folder = paths.DATA_DIR if piece == IMAGENETTE else hf_home()
        need[folder] = need.get(folder, 0) + PIECES[piece][1]
    return need


def mb_text(mb):
    return f"{mb / 1000:.1f} GB" if mb >= 1000 else f"{mb:.0f} MB"


def disk_line(need):
    """One line on the room {folder: MB} needs and each disk has; UserError when a disk has too little."""
    by_disk = {}
    for folder, mb in need.items():
        place = Path(folder).resolve()
        while not place.exists():
            place = place.parent
        entry = by_disk.setdefault(place.stat().st_dev, {"folders": [], "mb": 0, "free": shutil.disk_usage(place).free})
        entry["folders"].append(str(folder))
        entry["mb"] += mb
    parts = []
    for entry in by_disk.values():
        free_mb = entry["free"] / 1e6
        where = ", ".join(entry["folders"][:-1]) + " and " * (len(entry["folders"]) > 1) + entry["folders"][-1]
        if entry["mb"] > free_mb:
            raise UserError(f"not enough room on the disk of {where}: the job needs about {mb_text(entry['mb'])} "
                            f"there and {mb_text(free_mb)} is free; free space, or set HF_HOME (the caches) or OUT "
                            f"to another disk")
        parts.append(f"about {mb_text(entry['mb'])} needed in {where}, {mb_text(free_mb)} free")
    return f"disk: {'; '.join(parts)}: room enough" if parts else "disk: nothing to download or save"
