"""vit_backbone.py's beans dataset: a dataset neither cached nor reachable is one line that says why and the fixes;
what made a local copy."""
import pytest

import vit_backbone as beans
from common.start_and_end import UserError
from compare.marks import STANDIN_MARK, made_here


@pytest.mark.parametrize("why", ["HF_HUB_OFFLINE=1 forbids downloads", "the Hugging Face Hub cannot be reached"])
def test_a_dataset_neither_cached_nor_reachable_says_why_and_the_fixes(monkeypatch, why):
    """The cache's snapshot is asked for through the library (snapshot_download, local files only): the tests' cache
    is empty. No library setting is switched on the way."""
    import datasets
    from huggingface_hub import constants

    settings = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    monkeypatch.setattr(beans, "ask_hub", lambda name, repo_type: (None, why))
    with pytest.raises(UserError) as error:
        beans.from_hub("nobody/no-such-dataset")
    assert str(error.value) == (f"dataset nobody/no-such-dataset is not in the local Hugging Face cache and {why}: "
                                f"connect to the internet once to download it (about 180 MB) into the Hugging Face "
                                f"cache, or pass --data-dir with a local copy of its files")
    assert (constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE) == settings


def test_a_local_copy_says_what_made_it(tmp_path):
    """A folder job/standins.py made carries its mark, which the backbone's setup difference "data set" names
    (tests/test_backbone.py); it reads as beans all the same."""
    from job.standins import beans_folder

    folder = beans_folder(tmp_path / "beans", {"train": 1, "validation": 1})
    assert "job/standins.py" in made_here(str(folder)) and len(beans.read_beans(str(folder))["train"]) == 3
    (folder / STANDIN_MARK).unlink()
    assert made_here(str(folder)) is None


@pytest.mark.parametrize("card", ["---\nconfigs: [\n---\n", "---\n\tname: beans\n---\n"])  # YAML's errors
def test_the_card_is_not_read_the_parquet_files_name_the_classes(tmp_path, card):
    """The splits and class names come from the parquet files' own schema: a README.md card whose front matter the
    datasets library cannot parse was a traceback."""
    from job.standins import beans_folder

    folder = beans_folder(tmp_path / "beans", {"train": 1, "validation": 1})
    (folder / "README.md").write_text(card)
    read = beans.read_beans(str(folder))
    assert len(read["train"]) == 3 and read["names"] == ["angular_leaf_spot", "bean_rust", "healthy"]


def test_a_copy_is_beans_only_when_its_files_bytes_are_the_published_ones(tmp_path, monkeypatch):
    """By the bytes of its parquet files, against what huggingface.co published for the dataset (recorded once
    online); never read: it cannot be checked."""
    import hashlib
    import json

    from common import paths
    from job.standins import beans_folder

    monkeypatch.setattr(paths, "DATA_DIR", tmp_path / "data")
    folder = beans_folder(tmp_path / "beans", {"train": 1, "validation": 1})
    files = {f"data/{split}-00000-of-00001.parquet": hashlib.sha256(
        (folder / "data" / f"{split}-00000-of-00001.parquet").read_bytes()).hexdigest() for split in beans.BEANS_SPLITS}
    assert "whose files cannot be checked: their hashes were never read from huggingface.co" in \
        beans.unlike_the_published_beans(folder, "a copy")

    def record(hashes):
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / "published_hashes.json").write_text(json.dumps(
            {f"datasets/{beans.BEANS}": {"files": hashes}}))

    record(files)
    assert beans.unlike_the_published_beans(folder, "a copy") is None
    record({**files, "data/train-00000-of-00001.parquet": "0" * 64})
    assert beans.unlike_the_published_beans(folder, "a copy") == (
        f"a copy whose data/train-00000-of-00001.parquet is not the one huggingface.co publishes for {beans.BEANS}")
