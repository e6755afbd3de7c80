"""The backbone article's beans dataset, from the Hugging Face cache (downloaded once) or a local copy of its files
(README.md, data/<split>-*.parquet)."""
from pathlib import Path

import numpy as np

from common.paths import made_here
from common.pretrained import ask_hub, hub_download
from common.run import nonempty_path
from common.start_and_end import UserError

DATASET = "AI-Lab-Makerere/beans"
MEGABYTES = 180  # its parquet files, about: the size the job and the refusal below state
SPLITS = ("train", "validation")


def local_copy(path):
    """A local copy must be a folder holding the parquet files of the train and validation splits: the path, ~ expanded
    (argparse's type of --data-dir)."""
    path = nonempty_path(path)
    folder = Path(path)
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise UserError(f"--data-dir {path} {what}: pass a local copy of {DATASET}'s files "
                        f"(README.md and data/train-*.parquet, data/validation-*.parquet)")
    names = [file.name for file in folder.rglob("*.parquet")]
    missing = [split for split in SPLITS if not any(name.startswith(split) for name in names)]
    if missing:
        raise UserError(f"--data-dir {path} has no parquet file for the split(s) {', '.join(missing)}: pass a local "
                        f"copy of {DATASET}'s files (data/train-*.parquet, data/validation-*.parquet)")
    return path


def from_hub(name):
    """The folder of the dataset's files of the train and validation splits (and its card), downloaded from the Hub,
    or the mirror HF_ENDPOINT names, into the Hugging Face cache, each with a bar; when it cannot be reached, the
    cache's snapshot of them (snapshot_download(local_files_only=True)). Not cached, one line with the fixes."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    info, why = ask_hub(name, "dataset")
    if info is not None:
        for file in sorted(sibling.rfilename for sibling in info.siblings or []):
            if file == "README.md" or (file.endswith(".parquet") and Path(file).name.startswith(SPLITS)):
                hub_download(name, file, "dataset")
    try:
        snapshot = Path(snapshot_download(name, repo_type="dataset", local_files_only=True))
    except LocalEntryNotFoundError:
        snapshot = None
    if snapshot is None or not all(any(snapshot.rglob(f"{split}*.parquet")) for split in SPLITS):
        why = why or "the Hub's copy has no parquet file of the train or the validation split"
        raise UserError(f"dataset {name} is not in the local Hugging Face cache and {why}: connect to the internet "
                        f"once to download it (about {MEGABYTES} MB) into the Hugging Face cache, or pass --data-dir "
                        f"with a local copy of its files")
    return snapshot


def split_files(folder):
    """{split: [its parquet files]} in folder (a local copy, or the cache's snapshot)."""
    return {split: sorted(str(path) for path in Path(folder).expanduser().rglob(f"{split}*.parquet"))
            for split in SPLITS}


def from_folder(folder, where):
    """The dataset's parquet files in folder (a local copy, or the cache's snapshot), read as its splits."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    folder = Path(folder).expanduser()
    files = split_files(folder)  # the files named, not the folder: the library keys its Arrow cache by them
    try:
        return load_dataset(str(folder), data_files=files)
    except (OSError, ValueError, DatasetGenerationError) as error:
        raise UserError(f"{where}: cannot read it as {DATASET} ({str(error).splitlines()[0][:160]})") from error


def first_per_class(split, per_class):
    """The first per_class pictures of each class, in the split's order."""
    labels = np.array(split["labels"])
    keep = np.sort(np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in np.unique(labels)]))
    return split.select(keep.tolist(), keep_in_memory=True)


def load(data_dir=None, per_class=None):
    """{"train", "validation": datasets.Dataset as stored (not shuffled), "names": the class names, "made here": what
    job/standins.py or job/miniature.py made of --data-dir (common/paths.py's made_here), or None, "folder":
    the copy's or the cache's snapshot of the Hub's files}."""
    folder = Path(data_dir).expanduser() if data_dir else from_hub(DATASET)
    dataset = from_folder(folder, f"--data-dir {data_dir}" if data_dir else DATASET)
    where = data_dir or DATASET
    for split in SPLITS:
        if split not in dataset:
            raise UserError(f"{where} has no {split} split: pass a complete copy of {DATASET}")
        if not {"image", "labels"} <= set(dataset[split].column_names):
            raise UserError(f"{where}: the {split} split lacks the columns image and labels of {DATASET}")
    names = getattr(dataset["train"].features["labels"], "names", None)
    if not names:
        raise UserError(f"{where}: its labels column has no class names (a ClassLabel), unlike {DATASET}")
    splits = {split: dataset[split] for split in SPLITS}
    if per_class:
        splits = {split: first_per_class(data, per_class) for split, data in splits.items()}
    return {**splits, "names": list(names), "made here": made_here(data_dir) if data_dir else None, "folder": folder}


def unlike_the_published(folder, what):
    """Why the folder's parquet files of the train and validation splits are not the ones huggingface.co publishes
    for the dataset, by their bytes (compare/published_files.py), or None when they are."""
    from compare import published_files

    files = [str(Path(path).relative_to(folder)) for paths in split_files(folder).values() for path in paths]
    return published_files.unlike_the_published(folder, DATASET, files, what, "dataset")
