"""Every test runs offline, against an empty Hugging Face cache of its own.

HF_HUB_OFFLINE and the cache paths are read when huggingface_hub is imported, so they are set here,
before any test module imports it.

Under pytest-xdist (`pytest -n N`), each of the N workers runs torch on its share of the cores, so
that workers x threads do not exceed them: torch.set_num_threads here, OMP_NUM_THREADS and
MKL_NUM_THREADS for the scripts the tests start as subprocesses. The tests that share an expensive
session fixture (the stand-in runs) are grouped onto one worker (--dist loadgroup), so that it is
built once, not once per worker. Tests marked `gpu` run only where torch sees a CUDA GPU.
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

_cache = tempfile.mkdtemp(prefix="vit-part3-hf-")
atexit.register(shutil.rmtree, _cache, ignore_errors=True)  # each session's (and xdist worker's) cache goes with it
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = _cache
os.environ["HF_HUB_CACHE"] = os.path.join(_cache, "hub")
os.environ["VIT_PART3_DATA"] = os.path.join(_cache, "data")  # downloads and caches (common/paths.py), not data/
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for _variable in ("NO_PROXY", "no_proxy"):  # the servers on 127.0.0.1 are asked directly, whatever proxy is set
    os.environ[_variable] = "127.0.0.1,localhost"

try:  # the datasets library's log handler keeps the sys.stderr of its first import: here, the session's. First
    # imported in a test with capsys, it would keep that test's stream, closed after it, and a later test's log line
    # would print "--- Logging error ---" and a traceback (an order of tests that xdist made).
    import datasets  # noqa: F401
except ImportError:  # vit_backbone.py's tests need it; the others run without
    pass


def usable_cores():
    """The cores this process may run on (a container's or taskset's share), not all the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def threads_per_worker(cores, workers):
    """torch threads for each of `workers` parallel test processes: workers x threads <= cores, at least 1."""
    return max(1, cores // max(1, workers))


XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))  # set in each worker by pytest-xdist
if XDIST_WORKERS:
    THREADS = threads_per_worker(usable_cores(), XDIST_WORKERS)
    _given = os.environ.get("OMP_NUM_THREADS", "")
    if _given.isdigit() and int(_given) > 0:  # a lower limit set by the person running the tests is kept
        THREADS = min(THREADS, int(_given))
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # read by torch in the subprocesses the tests start
        os.environ[variable] = str(THREADS)
    import torch

    torch.set_num_threads(THREADS)

# Fixtures that run the scripts on stand-ins, once per process: the tests that use one share an xdist worker.
SHARED_RUNS = {"standins": "standins", "weight_runs": "standins", "beans_standins": "standins",
               "backbone_runs": "standins", "four_runs": "standins", "script_runs": "gpu-runs",
               "trained_miniature": "miniature", "servers": "hub", "jobs": "hub", "job_standins": "reproduce",
               "job": "reproduce"}


def cuda_available():
    import torch

    return torch.cuda.is_available()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group markers
def pytest_collection_modifyitems(config, items):
    """Group the tests of the shared stand-in runs; the GPU layer runs where CUDA is, and is skipped elsewhere."""
    no_gpu = pytest.mark.skip(reason="the GPU layer needs a CUDA GPU: torch.cuda.is_available() is False here")
    for item in items:
        groups = {SHARED_RUNS[name] for name in getattr(item, "fixturenames", ()) if name in SHARED_RUNS}
        for group in groups:
            item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("gpu") and not cuda_available():
            item.add_marker(no_gpu)


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def checkout_files():
    """{path: (size, mtime)} of the checkout's files, but git's, Python's bytecode, ruff's cache and a virtual
    environment's."""
    files = {}
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in (".git", "__pycache__", ".ruff_cache")
                         and not (Path(folder) / name / "pyvenv.cfg").exists()]
        for name in names:
            stat = os.stat(os.path.join(folder, name))
            files[os.path.relpath(os.path.join(folder, name), ROOT)] = (stat.st_size, stat.st_mtime_ns)
    return files


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller, before any test (xdist's workers too)
        session.config.checkout_before = checkout_files()


def pytest_sessionfinish(session, exitstatus):
    """No test writes into the checkout: a file added, changed or removed there fails the run, named."""
    before = getattr(session.config, "checkout_before", None)
    if before is None:
        return
    after = checkout_files()
    touched = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    if touched:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"FAILED: the tests wrote into the checkout: {', '.join(touched[:10])}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    from job.standins import imagenette_folder

    return imagenette_folder(tmp_path_factory.mktemp("data") / "nette", per_class=4)


@pytest.fixture(scope="session")
def tiny_in21k(tmp_path_factory):
    """A tiny ViT in the layout of the ImageNet-21k releases (with the pre-logits layer), saved to disk."""
    from job.standins import vit_in21k

    return vit_in21k(tmp_path_factory.mktemp("vit21k"))


def library_pixels(pictures, resolution):
    """The checkpoints' image processor, transformers' ViTImageProcessorPil (resize to R x R, bilinear, then
    (x/255 - 0.5) / 0.5), of the pictures (paths or PIL images): float32 (N, 3, R, R)."""
    from PIL import Image
    from transformers import ViTImageProcessorPil

    from common.data import load_rgb

    images = [picture if isinstance(picture, Image.Image) else load_rgb(picture) for picture in pictures]
    processor = ViTImageProcessorPil(size={"height": resolution, "width": resolution})
    return processor(images=images, return_tensors="np")["pixel_values"]


def expected_batch(paths, resolution, flips):
    """The library's processor, picture by picture, mirrored where told (compare within 1e-6: float32 rounding)."""
    import numpy as np

    expected = library_pixels(paths, resolution)
    return np.stack([np.flip(a, axis=2) if flip else a  # axis 2: left-right
                     for a, flip in zip(expected, flips, strict=True)])


def tiny_vit(image_size=12, patch_size=4, hidden_size=4):
    """A ViTForImageClassification of random weights, built in memory (no file, no download)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=hidden_size, num_hidden_layers=1, intermediate_size=8, num_attention_heads=1,
                       image_size=image_size, patch_size=patch_size)
    return ViTForImageClassification(config).eval()


def libraries_mapped(pid, name):
    """Whether the process has loaded a shared library whose file name holds `name` (Linux's /proc)."""
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def wait_until(condition, started):
    """Poll until condition() holds while the process runs, however slow a loaded machine makes it."""
    import time

    while started.poll() is None and not condition():
        time.sleep(0.01)


def script_output(main, argv, capsys):
    """(exit status, stdout, stderr) of a script's main(argv) run in this process; argparse exits count too."""
    try:
        status = main(argv)
    except SystemExit as stopped:
        status = stopped.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def without_a_gpu(command):
    """command run in a process of its own in which CUDA sees no GPU (CUDA_VISIBLE_DEVICES empty): a machine
    without one, on any machine, GPU or not; torch.cuda.is_available() is really False there, not patched."""
    return subprocess.run(command, cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True,
                          text=True, check=False, timeout=120)


# ---------------------------------------------------------------- the weight-dependent scripts on stand-ins

@pytest.fixture(scope="session")
def standins(tmp_path_factory):
    """Two of each checkpoint with different random weights, and a folder with 12 pictures per class."""
    from job.standins import imagenette_folder, vit_classifier, vit_in21k

    root = tmp_path_factory.mktemp("standins")
    return {"data": imagenette_folder(root / "nette", per_class=12),
            "classifier": [vit_classifier(root / f"classifier-{seed}", seed=seed) for seed in (0, 1)],
            "in21k": [vit_in21k(root / f"in21k-{seed}", seed=seed) for seed in (0, 1)]}


@pytest.fixture(scope="session")
def weight_runs(standins, tmp_path_factory):
    """The JSON of posemb, fewshot and finetune, each on both stand-ins: {script: [record, record]}."""
    import json

    import vit_part3_fewshot
    import vit_part3_finetune
    import vit_part3_posemb

    out = tmp_path_factory.mktemp("runs")
    data = str(standins["data"])
    # On the CPU wherever the tests run: the two stand-ins' numbers are told apart by their values, and CUDA's
    # runs in this process would fork the loader's workers after CUDA started (the GPU layer, test_gpu.py, runs them).
    flags = {"posemb": (vit_part3_posemb.main, "classifier", ["--batch-size", "16", "--device", "cpu"]),
             "fewshot": (vit_part3_fewshot.main, "in21k", ["--no-cache", "--device", "cpu"]),
             "finetune": (vit_part3_finetune.main, "in21k",
                          ["--resolution", "32", "--batch-size", "8", "--device", "cpu"])}
    records = {}
    for script, (main, kind, extra) in flags.items():
        records[script] = []
        for seed, model in enumerate(standins[kind]):
            path = out / f"{script}-{seed}.json"
            status = main(["--model", str(model), "--data-dir", data, *extra, "--compare", "--json", str(path)])
            assert status == 0, script
            records[script].append(json.loads(path.read_text()))
    return records


# ---------------------------------------------------------------- the backbone script on stand-ins

BACKBONE_ARTICLE = ROOT.parent / "shared" / "article" / "vit-as-backbone.txt"
BACKBONE_FLAGS = ["--batch-size", "4", "--probe-epochs", "20", "--device", "cpu"]  # 15 steps: an evaluation at 10


@pytest.fixture(scope="session")
def beans_standins(tmp_path_factory):
    """A beans-shaped dataset in the Hub's layout and two 32-px classifiers (with their image processor)."""
    from job.standins import beans_folder, vit_classifier

    root = tmp_path_factory.mktemp("beans-standins")
    return {"data": beans_folder(root / "beans"),
            "models": [vit_classifier(root / f"classifier-{seed}", seed=seed, image_size=32, processor=True)
                       for seed in (0, 1)]}


@pytest.fixture(scope="session")
def backbone_runs(beans_standins, tmp_path_factory):
    """The backbone script's JSON: the first stand-in twice (features computed, then read from the cache), then
    the second stand-in; with --compare, and --plots and --save-dir on the first run."""
    import json

    import vit_backbone

    out = tmp_path_factory.mktemp("backbone-runs")
    saved, vit_backbone.FEATURE_CACHE_DIR = vit_backbone.FEATURE_CACHE_DIR, out / "features"
    records = []
    try:
        for k, model in enumerate([beans_standins["models"][0], *beans_standins["models"]]):
            path = out / f"backbone-{k}.json"
            extra = ["--plots", str(out / "figures"), "--save-dir", str(out / "saved")] if k == 0 else []
            status = vit_backbone.main(["--model", str(model), "--data-dir", str(beans_standins["data"]),
                                        *BACKBONE_FLAGS, *extra, "--compare", "--json", str(path)])
            assert status == 0
            records.append(json.loads(path.read_text()))
    finally:
        vit_backbone.FEATURE_CACHE_DIR = saved
    return {"records": records, "figures": out / "figures", "cache": out / "features", "saved": out / "saved"}


def compare(numbers, reference, differences=None):
    """Each reference entry's row under the setup differences, as judge() makes them (compare/verdicts.py), for a
    reference a test holds or makes (a stand-in taken as the article)."""
    from compare.verdicts import number_row

    return [number_row(name, entry, numbers.get(name), differences or {}) for name, entry in reference.items()]
