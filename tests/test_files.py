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
