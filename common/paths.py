"""Where the scripts keep what they download and compute: the checkout's data/ (git-ignored but the reference
numbers), or the folder VIT_PART3_DATA names (the tests' own, so that they never write into the checkout)."""
import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("VIT_PART3_DATA") or CHECKOUT / "data").expanduser().resolve()  # the job's
# scripts run in the checkout: a relative path means the folder it names from where the job started
IMAGENETTE_DIR = DATA_DIR / "imagenette2-160"  # the release's archive extracts to this folder
FEATURE_CACHE_DIR = DATA_DIR / "features"  # few-shot's and the backbone's frozen features (common/features.py)
BEANS = "AI-Lab-Makerere/beans"  # the backbone's dataset, in the Hugging Face cache or a local copy (--data-dir)
BEANS_MB = 180  # its parquet files, about: the size the job and the backbone's line on a missing copy state
BEANS_SPLITS = ("train", "validation")  # the splits the backbone reads
