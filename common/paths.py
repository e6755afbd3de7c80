"""Where the scripts keep what they download and compute: the checkout's data/ (git-ignored but the reference numbers)."""
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
IMAGENETTE_DIR = DATA_DIR / "imagenette2-160"  # the release's archive extracts to this folder
FEATURE_CACHE_DIR = DATA_DIR / "features"  # few-shot's and the backbone's frozen features (common/feature_cache.py)
