"""Every test runs offline, against an empty Hugging Face cache of its own.

HF_HUB_OFFLINE and the cache paths are read when huggingface_hub is imported, so they are set here,
before any test module imports it.
"""
import os
import sys
import tempfile
from pathlib import Path

import pytest

_cache = tempfile.mkdtemp(prefix="vit-part3-hf-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = _cache
os.environ["HF_HUB_CACHE"] = os.path.join(_cache, "hub")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ARTICLE = ROOT.parent / "shared" / "article" / "vit-explained-part3.txt"


def article_block(start):
    """The logged lines of the article's block whose header starts with `start`, header included."""
    lines, inside = [], False
    for text_line in ARTICLE.read_text().splitlines():
        if text_line.startswith(start):
            inside = True
        elif inside and not text_line.startswith("  "):
            break
        if inside:
            lines.append(text_line)
    return lines


@pytest.fixture(scope="session")
def pictures(tmp_path_factory):
    """An Imagenette-shaped folder: 4 generated pictures per class and split (grayscale and CMYK among them)."""
    from common.standins import imagenette_folder

    return imagenette_folder(tmp_path_factory.mktemp("data") / "nette", per_class=4)


@pytest.fixture(scope="session")
def tiny_in21k(tmp_path_factory):
    """A tiny ViT in the layout of the ImageNet-21k releases (with the pre-logits layer), saved to disk."""
    from common.standins import vit_in21k

    return vit_in21k(tmp_path_factory.mktemp("vit21k"))


def script_output(main, argv, capsys):
    """(exit status, stdout, stderr) of a script's main(argv) run in this process; argparse exits count too."""
    try:
        status = main(argv)
    except SystemExit as stopped:
        status = stopped.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err
