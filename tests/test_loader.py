"""common/data.py: a pass a loader, its batches in order and flipped as told, its worker processes the script's own
children, ending with the pass; decoded pictures shared, not copied, with the workers."""
import multiprocessing
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, expected_batch

from common.pretrained import ARTICLE_PIXELS
from common.start_and_end import UserError


@pytest.mark.parametrize("decoded", [False, True])  # paths decoded in the workers; pictures decoded once beforehand
@pytest.mark.parametrize("workers", [0, 1, 2])  # inline; one worker process; two
def test_a_pass_keeps_the_order_and_flips_what_it_is_told(pictures, workers, decoded):
    from common.data import list_split, load_rgb, picture_loader, start_loader, to_pixels

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]  # 10 pictures, gray and CMYK among them
    flips = np.arange(10) % 3 == 0
    pictures = [load_rgb(path) for path in paths] if decoded else paths
    loader = picture_loader(pictures, 32, 4, torch.device("cpu"), flips, workers=workers)
    batches = list(start_loader(loader)[0])
    assert [len(b) for b in batches] == [4, 4, 2] and batches[0].dtype == torch.uint8
    batches = [to_pixels(batch, torch.device("cpu"), ARTICLE_PIXELS).numpy() for batch in batches]
    assert np.abs(np.concatenate(batches) - expected_batch(paths, 32, flips)).max() < 1e-6


def test_each_pass_reads_its_own_resolution_flips_and_pictures_and_its_workers_end_with_it(pictures):
    """posemb's rows (224, then 384), few-shot's sets: a loader a pass, which may take some of the pictures
    (indices); its worker processes end when the pass ends, or when it is dropped unfinished."""
    from common.data import list_split, load_rgb, picture_loader, start_loader, to_pixels

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]
    decoded = [load_rgb(path) for path in paths]
    cpu, before = torch.device("cpu"), set(multiprocessing.active_children())
    rng = np.random.default_rng(0)
    for resolution, batch_size, indices in ((32, 4, range(10)), (48, 3, [9, 0, 4]), (32, 10, range(10))):
        flips = rng.random(len(indices)) < 0.5
        batches, _ = start_loader(picture_loader(decoded, resolution, batch_size, cpu, flips, indices, workers=2))
        assert len(set(multiprocessing.active_children()) - before) == 2  # the pass's own workers, started
        read = np.concatenate([to_pixels(b, cpu, ARTICLE_PIXELS).numpy() for b in batches])
        expected = expected_batch([paths[i] for i in indices], resolution, flips)
        assert np.abs(read - expected).max() < 1e-6
        assert set(multiprocessing.active_children()) <= before  # ended with the pass
    batches, _ = start_loader(picture_loader(decoded, 32, 4, cpu, workers=2))
    next(batches)  # a pass left unfinished, as a run that stops early leaves it
    del batches
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("workers,timing", [(0, None), (2, None), (0, {"waiting seconds": 0.0, "pictures": 0})])
def test_a_picture_a_worker_cannot_read_is_one_line_naming_it(pictures, tmp_path, workers, timing):
    """Timed or not (a pass whose batches count their pictures): the batch that holds it is its UserError."""
    from common.data import list_split, picture_loader, start_loader

    bad = tmp_path / "broken.JPEG"
    bad.write_bytes(b"not a jpeg")
    paths = [path for path, _ in list_split(pictures, "val", per_class=1)][:5] + [bad]
    before = set(multiprocessing.active_children())
    with pytest.raises(UserError) as problem:
        list(start_loader(picture_loader(paths, 32, 2, torch.device("cpu"), workers=workers), timing)[0])
    assert set(multiprocessing.active_children()) <= before  # the failed pass's workers ended with it
    assert str(problem.value).startswith(f"cannot read picture {bad}: ") and "\n" not in str(problem.value)


def test_workers_outlive_a_ctrl_c(pictures):
    """The terminal sends Ctrl-C to every process; fine-tuning then finishes its step, checks included, and saves."""
    import os
    import signal
    import time

    from common.data import list_split, picture_loader, start_loader

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]
    before = set(multiprocessing.active_children())
    batches, _ = start_loader(picture_loader(paths, 32, 1, torch.device("cpu"), workers=2))  # each worker runs
    for worker in set(multiprocessing.active_children()) - before:
        os.kill(worker.pid, signal.SIGINT)
    time.sleep(0.5)
    assert sum(len(batch) for batch in batches) == 10


def test_a_pass_leaves_the_global_random_state_as_it_was(pictures):
    """Fine-tuning saves torch's RNG state in its checkpoints: reading batches must not move it."""
    from common.data import list_split, picture_loader, start_loader

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]
    state = torch.get_rng_state()
    for workers in (0, 2):
        list(start_loader(picture_loader(paths, 32, 4, torch.device("cpu"), workers=workers))[0])
    assert torch.equal(torch.get_rng_state(), state)


ORPHAN = """
import sys, time, torch
from common.data import list_split
from common.data import picture_loader, start_loader
paths = [path for path, _ in list_split(sys.argv[1], "val", per_class=1)]
batches, _ = start_loader(picture_loader(paths, 32, 4, torch.device("cpu"), workers=2))
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the processes' tree (psutil, Linux)")
def test_the_workers_are_the_scripts_children_and_end_when_it_is_killed(pictures):
    """No fork of this process, whose libraries run threads (Python 3.12 on warns that the child may deadlock): the
    workers are spawned, the script's own children, and a script killed at once (SIGKILL, the OOM killer), here while
    its workers start, leaves no process behind to hold its output's pipes open."""
    import psutil

    script = subprocess.Popen([sys.executable, "-c", ORPHAN, str(pictures)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert script.stdout.readline() == "started\n"
        descendants = psutil.Process(script.pid).children(recursive=True)
        workers = [child for child in descendants if child.ppid() == script.pid and "spawn_main" in " ".join(
            child.cmdline())]
        assert len(workers) == 2
    finally:
        script.kill()
        script.wait()
    _, alive = psutil.wait_procs(descendants, timeout=120)  # a bound for a loaded machine, not a timing
    assert not alive, alive


def test_decoded_pictures_reach_the_workers_as_one_tensor_in_shared_memory(pictures):
    """Not pickled for each worker (posemb's 3,925 decoded pictures are 0.4 GB, beside a GPU up to 8 workers): what a
    worker receives names each picture's place in one uint8 tensor in shared memory, the same tensor for every worker,
    and reads the same pictures from it; a path stays a path."""
    import pickle

    from PIL import Image

    from common.data import Pictures, list_split, load_rgb

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]  # gray and CMYK among them: RGB once decoded
    decoded = [load_rgb(path) for path in paths]
    dataset = Pictures([*decoded, paths[0]])
    first, second = dataset.__getstate__(), dataset.__getstate__()  # two workers' share
    pixels = first["shared"][0]
    assert pixels.is_shared() and pixels.dtype == torch.uint8 and pixels.data_ptr() == second["shared"][0].data_ptr()
    assert pixels.numel() == sum(3 * picture.width * picture.height for picture in decoded)
    assert (not any(isinstance(picture, Image.Image) for picture in first["pictures"])
            and first["pictures"][-1] == paths[0])
    worker = pickle.loads(pickle.dumps(dataset))  # as a worker unpickles it (here the tensor is copied, not shared)
    for index in range(len(dataset)):
        for key in ((index, 32, False), (index, 48, True)):
            assert np.array_equal(worker[key], Pictures([*decoded, paths[0]])[key])


def test_a_worker_runs_the_scripts_top_lines_without_transformers():
    """A DataLoader worker (spawn) runs the script's top lines again, as __mp_main__: they load neither transformers
    nor datasets, which would add seconds to every worker's start. Setup runs no loader."""
    scripts = ["vit_part3_posemb.py", "vit_part3_fewshot.py", "vit_part3_finetune.py", "vit_backbone.py"]
    code = ("import runpy, sys\n"
            "for script in sys.argv[1:]:\n"
            "    runpy.run_path(script, run_name='__mp_main__')\n"
            "print(sorted(name for name in ('transformers', 'datasets') if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, *scripts], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr[-2000:])
