"""common/files.py: a written file has the mode the umask gives, and is written atomically."""
import os
import sys

import pytest


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_file_has_the_mode_the_umask_gives(tmp_path, umask, mode):
    """Results are for others to read where the umask says so (0644 under 022), not mkstemp's 0600; still atomic."""
    from common.files import TEMP_PREFIX, write_text

    target = tmp_path / "report.md"
    target.write_text("an older file")
    os.chmod(target, 0o600)
    previous = os.umask(umask)
    try:
        write_text(target, "new")
    finally:
        os.umask(previous)
    assert target.stat().st_mode & 0o777 == mode and target.read_text() == "new"
    assert not list(tmp_path.glob(f"{TEMP_PREFIX}*"))


def fill(folder, text="new", fail=None):
    """What a save_pretrained writes, in small: two files, or an error after the first (a full disk)."""
    (folder / "config.json").write_text(text)
    if fail:
        raise fail
    (folder / "model.safetensors").write_text(text)


# (what the writer meets, the error's words, or None when it writes): each leaves a whole folder and no leftovers
FOLDER_FAULTS = [
    (None, None),
    (OSError(28, "No space left on device"), "cannot write the model {target}: No space left on device"),
    (RuntimeError("the library's own error"), "cannot write the model {target}: the library's own error"),
]


@pytest.mark.parametrize("fault,said", FOLDER_FAULTS, ids=["written", "a full disk", "a library's error"])
def test_a_folder_is_written_whole_or_the_old_one_stays(tmp_path, fault, said):
    from common.files import TEMP_PREFIX, write_folder_atomic
    from common.start_and_end import UserError

    target = tmp_path / "model"
    target.mkdir()
    fill(target, "old")
    if fault is None:
        write_folder_atomic(target, fill, what="model")
        assert sorted(p.read_text() for p in target.iterdir()) == ["new", "new"]
    else:
        with pytest.raises(UserError) as refused:
            write_folder_atomic(target, lambda folder: fill(folder, fail=fault), what="model")
        assert str(refused.value) == said.format(target=target)
        assert sorted(p.read_text() for p in target.iterdir()) == ["old", "old"]
    assert not list(tmp_path.glob(f"{TEMP_PREFIX}*"))


def test_a_signal_between_the_folders_renames_leaves_the_old_one_in_place(tmp_path, monkeypatch):
    from common import files

    target = tmp_path / "model"
    target.mkdir()
    fill(target, "old")
    real_replace, calls = os.replace, []

    def replace(source, destination):  # SIGTERM (Terminated, a KeyboardInterrupt) after the old one moved aside
        calls.append(source)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_replace(source, destination)

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        files.write_folder_atomic(target, fill, what="model")
    assert sorted(p.read_text() for p in target.iterdir()) == ["old", "old"]
    assert not list(tmp_path.glob(f"{files.TEMP_PREFIX}*"))


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_a_folder_written_where_none_was_is_made_with_its_parents_its_files_of_the_umasks_mode(tmp_path):
    """A library's writer may make a file 0600 (as safetensors may): every file gets the mode the umask gives."""
    from common.files import write_folder_atomic

    def private(folder):
        fill(folder)
        os.chmod(folder / "model.safetensors", 0o600)

    previous = os.umask(0o022)
    try:
        write_folder_atomic(tmp_path / "run" / "model", private)
    finally:
        os.umask(previous)
    written = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "run" / "model").iterdir()}
    assert written == {"config.json": 0o644, "model.safetensors": 0o644}
