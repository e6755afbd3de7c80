"""python tests/batch_counter.py SIZES.json SCRIPT [FLAGS...]: SCRIPT run as `python SCRIPT FLAGS` runs it, and
the size of every batch that a pass of common.data (start_loader()) hands over written to SIZES.json when it
exits.

SIZES.json holds one list per pass (a call of start_loader), in the order of the calls: [[16, 16, 8], ...].
Only the main process counts: the loader's worker processes build the batches, the main process receives them.
"""
import atexit
import json
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for common/

from common import data as loader

PASSES = []


def counted(batches):
    """The batches, the size of each appended to a new pass's list."""
    sizes = []
    PASSES.append(sizes)

    def each():
        for batch in batches:
            sizes.append(len(batch))
            yield batch

    return each()


def main():
    sizes_file, script, *flags = sys.argv[1:]
    start_loader = loader.start_loader

    def counted_pass(pass_loader, *timing):
        batches, seconds = start_loader(pass_loader, *timing)
        return counted(batches), seconds

    loader.start_loader = counted_pass  # before the script imports it by name
    atexit.register(lambda: Path(sizes_file).write_text(json.dumps(PASSES)))
    sys.argv = [script, *flags]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
