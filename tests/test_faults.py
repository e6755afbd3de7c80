"""Faults: a scheduler's SIGTERM, a full disk, a shared cache, damaged or foreign files.

Each row of the table names a fault, makes it happen to a script run as the shell would run it
(guarded(main)), and checks the one line it ends in, the exit status, what survived (the good
checkpoint, the printed results, a good file already there) and that no temporary file is left.
A full disk is simulated by the temporary files of common/files.py refusing to grow (ENOSPC), which is
what the system does: the writer cannot tell the difference.
"""
import errno
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, libraries_mapped, script_output, wait_until
from PIL import Image

import vit_part3_fewshot as fewshot
import vit_part3_finetune as finetune
import vit_part3_setup as setup
from common import files
from common.data import IMAGENETTE_WNIDS
from common.features import cached
from common.start_and_end import UserError, guarded
from job.imagenette_archive import download_and_extract, scratch_prefix
from job.standins import imagenette_folder

ENOSPC = os.strerror(errno.ENOSPC)  # "No space left on device"


class FullFile:
    """A file that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, f, room):
        self._f, self._room = f, room

    def write(self, data):
        self._room -= len(data)
        if self._room < 0:
            raise OSError(errno.ENOSPC, ENOSPC)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(name, room=0): from now on, files whose name holds `name` fail after `room` bytes."""
    full = {}

    def temporary(*args, **kwargs):  # the writer's open() of its temporary file
        f = open(*args, **kwargs)  # noqa: SIM115 - the writer closes it
        room = next((room for name, room in full.items() if name in Path(f.name).name), None)
        return f if room is None else FullFile(f, room)

    monkeypatch.setattr(files, "open", temporary, raising=False)
    return lambda name, room=0: full.update({name: room})


def leftovers(folder):
    """Temporary files of the writer under folder."""
    return [p for p in Path(folder).rglob(f"{files.TEMP_PREFIX}*")]


def run(main, argv, capsys, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    return script_output(lambda a: guarded(lambda: main(a)), argv, capsys)


def read_checkpoint(path):
    return files.read_checkpoint(path, finetune.CHECKPOINT_FORMAT, "vit_part3_finetune.py")


def tune_flags(model, data, save_dir, steps=6):
    return ["--model", str(model), "--data-dir", str(data), "--steps", str(steps), "--batch-size", "8", "--device",
            "cpu", "--save-dir", str(save_dir)]


def signal_at_step(monkeypatch, step, signum=signal.SIGTERM):
    """The process receives signum while it computes `step` (as a scheduler's stop arrives mid-step): at the step's
    learning rate, which the loop asks for once a step."""
    real, calls = finetune.lr_at, []

    def lr_at(*args):
        calls.append(1)
        if len(calls) == step:
            os.kill(os.getpid(), signum)
        return real(*args)

    monkeypatch.setattr(finetune, "lr_at", lr_at)


# ---------------------------------------------------------------- 1. SIGTERM

def test_sigterm_saves_the_step_and_resume_ends_like_an_uninterrupted_run(tiny_in21k, pictures, tmp_path, capsys,
                                                                          monkeypatch):
    status, _, _ = run(finetune.main, tune_flags(tiny_in21k, pictures, tmp_path / "whole"), capsys, monkeypatch)
    assert status == 0
    with monkeypatch.context() as patched:
        signal_at_step(patched, 3)
        status, out, err = run(finetune.main, tune_flags(tiny_in21k, pictures, tmp_path / "cut"), capsys, monkeypatch)
    saved = tmp_path / "cut" / finetune.CHECKPOINT
    assert status == 143 and "Traceback" not in err
    assert f"stopped after step 3 on SIGTERM; saved {saved}: add --resume to continue" in err
    assert read_checkpoint(saved)["step"] == 3 and "step   5:" not in out
    status, out, _ = run(finetune.main, tune_flags(tiny_in21k, pictures, tmp_path / "cut") + ["--resume"], capsys,
                         monkeypatch)
    assert status == 0 and "resumed from" in out
    whole = read_checkpoint(tmp_path / "whole" / finetune.CHECKPOINT)
    cut = read_checkpoint(saved)
    for key in ("model", "average"):
        assert all(torch.equal(whole[key][name], cut[key][name]) for name in whole[key])
    assert leftovers(tmp_path) == []


def test_sigterm_outside_training_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr(setup, "section_table1", lambda report: os.kill(os.getpid(), signal.SIGTERM))
    status, _, err = run(setup.main, [], capsys, monkeypatch)
    assert status == 143 and err.strip() == "stopped by SIGTERM"


# ---------------------------------------------------------------- 2., 3. a full disk

def test_a_full_disk_while_saving_keeps_the_last_good_checkpoint(tiny_in21k, pictures, tmp_path, capsys, full_disk,
                                                                  monkeypatch):
    flags = tune_flags(tiny_in21k, pictures, tmp_path, steps=4) + ["--save-every", "2"]
    real_save = finetune.save_checkpoint

    def save_then_fill(*args):  # the disk fills up after the first checkpoint, in the middle of the second
        path = real_save(*args)
        full_disk(finetune.CHECKPOINT, room=5000)
        return path

    monkeypatch.setattr(finetune, "save_checkpoint", save_then_fill)
    status, out, err = run(finetune.main, flags, capsys, monkeypatch)
    assert status == 1 and "Traceback" not in out + err
    line = next(text for text in out.splitlines() if "cannot run section" in text)
    assert f"cannot write the checkpoint {tmp_path / finetune.CHECKPOINT}: {ENOSPC}" in line
    assert read_checkpoint(tmp_path / finetune.CHECKPOINT)["step"] == 2  # the good one, whole
    assert leftovers(tmp_path) == []


def test_a_full_disk_for_the_fine_tuned_model_is_a_warning_after_every_number(tiny_in21k, pictures, tmp_path, capsys,
                                                                              monkeypatch):
    from transformers import PreTrainedModel

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, ENOSPC)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    status, out, err = run(finetune.main, tune_flags(tiny_in21k, pictures, tmp_path, steps=4), capsys, monkeypatch)
    assert status == 0 and "Traceback" not in out + err
    assert "the weight average" in out and "passes over pictures" in out  # the section ran to its end
    assert f"warning: cannot write the fine-tuned model {tmp_path / finetune.SAVED_AVERAGE}: {ENOSPC}" in err
    assert not (tmp_path / finetune.SAVED_AVERAGE).exists() and leftovers(tmp_path) == []


def test_a_full_disk_for_json_prints_every_number_first_and_keeps_the_old_file(tmp_path, capsys, full_disk,
                                                                                 monkeypatch):
    target = tmp_path / "setup.json"
    target.write_text('{"good": "an earlier run"}')
    full_disk("setup.json")
    status, out, err = run(setup.main, ["--json", str(target)], capsys, monkeypatch)
    assert status == 1 and "Traceback" not in err
    assert "ViT-B/16 at 224: grid 14x14" in out and "85.8M" in out  # the results came first
    assert f"error: cannot write the --json file {target}: {ENOSPC}; every number is printed above" in err
    assert target.read_text() == '{"good": "an earlier run"}' and leftovers(tmp_path) == []


# ---------------------------------------------------------------- 4., 5. the feature cache

def few_shot_flags(model, data):
    return ["--model", str(model), "--data-dir", str(data), "--pool", "2", "--shots", "1", "--draws", "1",
            "--batch-size", "8", "--device", "cpu"]


def test_a_feature_cache_that_cannot_be_written_is_a_warning(tiny_in21k, pictures, tmp_path, capsys,
                                                                       full_disk, monkeypatch):
    monkeypatch.setattr(fewshot, "FEATURE_CACHE_DIR", tmp_path / "cache")
    full_disk(".npz")
    status, out, err = run(fewshot.main, few_shot_flags(tiny_in21k, pictures), capsys, monkeypatch)
    assert status == 0 and "features computed" in out and "1-shot" in out
    assert f"cannot write the feature cache {tmp_path / 'cache'}" in err and ENOSPC in err
    assert "the run goes on without caching the features" in err and "Traceback" not in err
    assert not list((tmp_path / "cache").glob("*"))


def test_a_feature_cache_that_cannot_be_read_is_a_warning(tiny_in21k, pictures, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fewshot, "FEATURE_CACHE_DIR", tmp_path / "cache")
    assert run(fewshot.main, few_shot_flags(tiny_in21k, pictures), capsys, monkeypatch)[0] == 0
    unreadable = []  # each entry becomes a folder, which cannot be read (nor replaced) as a file
    for entry in (tmp_path / "cache").glob("*.npz"):
        entry.unlink()
        entry.mkdir()
        unreadable.append(entry)
    status, out, err = run(fewshot.main, few_shot_flags(tiny_in21k, pictures), capsys, monkeypatch)
    assert unreadable and status == 0 and "features computed" in out
    assert "cannot read the cached features" in err and "Traceback" not in err
    assert "cannot write the feature cache" in err and leftovers(tmp_path) == []


def test_two_runs_filling_the_same_cache_at_once(tmp_path):
    path, arrays = tmp_path / "val-abc.npz", {"pre-logits": np.ones((4, 3)), "class token": np.zeros((4, 3))}
    problems, warnings = [], []

    def fill():
        try:
            for _ in range(30):
                cached(lambda: arrays, (path.name, "the same description"), dict.fromkeys(arrays, 4), path.parent,
                       warnings.append)
                path.unlink(missing_ok=True)  # the other run finds it gone and writes again
        except Exception as error:  # noqa: BLE001 - any exception is the failure this test looks for
            problems.append(error)

    threads = [threading.Thread(target=fill) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == [] and [w for w in warnings if "cannot write" in w] == []
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------- 6. a decompression bomb

def test_a_decompression_bomb_is_named(tiny_in21k, tmp_path, capsys, monkeypatch):
    data = imagenette_folder(tmp_path / "nette", per_class=2)
    bomb = data / "val" / IMAGENETTE_WNIDS[3] / "huge.png"
    Image.new("1", (15_000, 15_000)).save(bomb)  # 225 million pixels in a few kB
    status, out, err = run(fewshot.main, few_shot_flags(tiny_in21k, data) + ["--no-cache"], capsys, monkeypatch)
    line = next(text for text in out.splitlines() if "cannot run section" in text)
    assert status == 1 and f"cannot read picture {bomb}: it is too large to decode safely" in line
    assert "Traceback" not in err


@pytest.mark.parametrize("first,second,seconds_between,stops_at_once", [
    (signal.SIGTERM, signal.SIGTERM, 0.1, False),  # one stop delivered twice: by systemd/SLURM and by reproduce.py
    (signal.SIGTERM, signal.SIGTERM, 5.0, True),   # a second request
    (signal.SIGINT, signal.SIGINT, 0.1, True),     # Ctrl-C twice: at once
    (signal.SIGINT, signal.SIGTERM, 0.1, True),
])
def test_a_second_signal_stops_at_once_unless_it_repeats_the_first_sigterm(first, second, seconds_between,
                                                                           stops_at_once, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(finetune.time, "monotonic", lambda: clock[0])
    with finetune.stop_between_steps() as stop:
        signal.raise_signal(first)
        clock[0] += seconds_between
        if stops_at_once:
            with pytest.raises(KeyboardInterrupt):  # Terminated is one
                signal.raise_signal(second)
        else:
            signal.raise_signal(second)
    assert stop["asked"] == {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}[first]


def test_a_checks_picture_damaged_before_a_resume_stops_it_before_any_step(tiny_in21k, tmp_path, capsys,
                                                                            monkeypatch):
    """A check picture damaged between a pause and --resume is named before any step: --resume finds it changed."""
    data = imagenette_folder(tmp_path / "nette", per_class=2)
    flags = tune_flags(tiny_in21k, data, tmp_path / "run", steps=4)
    status, _, _ = run(finetune.main, flags + ["--pause-at", "2"], capsys, monkeypatch)
    assert status == 0
    damaged = min((data / "val" / IMAGENETTE_WNIDS[5]).iterdir())
    damaged.write_bytes(b"not a picture")
    steps, real_lr = [], finetune.lr_at
    monkeypatch.setattr(finetune, "lr_at", lambda *args: steps.append(1) or real_lr(*args))
    status, out, err = run(finetune.main, flags + ["--resume"], capsys, monkeypatch)
    named = f"its picture {damaged.relative_to(data)} under --data-dir is not the one it read"
    assert status == 1 and named in out and "Traceback" not in err
    assert steps == [] and read_checkpoint(tmp_path / "run" / finetune.CHECKPOINT)["step"] == 2


# ---------------------------------------------------------------- 7., 8. foreign and damaged checkpoints

def flip_a_bit_in_the_largest_tensor(path, record=None):
    """One bit in the middle of the largest stored tensor, or of the record named (the zip entry's data, past its
    local header)."""
    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda info: (info.filename.endswith(record or "\0"), info.file_size))
    data = bytearray(path.read_bytes())
    name_length, extra_length = np.frombuffer(data[entry.header_offset + 26:entry.header_offset + 30], "<u2")
    start = entry.header_offset + 30 + int(name_length) + int(extra_length)
    data[start + entry.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


def without_key(path, key):
    """The checkpoint written again, in its format, without key: a file this script did not write whole."""
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint[key]
    torch.save(checkpoint, path)


def edited(path, key, value):
    """The checkpoint loaded, one part replaced, and saved again with torch.save: its checksums hold."""
    torch.save({**torch.load(path, weights_only=True), key: value}, path)


@pytest.mark.parametrize("damage,expected", [
    (lambda path: torch.save({"weights": torch.ones(3)}, path), "is a torch file but not a checkpoint of this"),
    (flip_a_bit_in_the_largest_tensor, "has changed since it was written"),
    (lambda path: flip_a_bit_in_the_largest_tensor(path, "/data.pkl"), "has changed since it was written"),
    (lambda path: path.write_bytes(path.read_bytes()[:1000]), "is truncated or not a checkpoint of this script"),
    (lambda path: without_key(path, "rng"), "lacks its rng"),
    # edited and saved again: each a traceback before
    (lambda path: edited(path, "step", "x"), "holds a step or a part of another type than this script writes"),
    (lambda path: edited(path, "log", []), "holds a step or a part of another type than this script writes"),
    (lambda path: edited(path, "settings", None), "holds a step or a part of another type than this script writes"),
    (lambda path: edited(path, "model", {}), "holds weights of another model than --model's"),
], ids=["foreign torch file", "one flipped bit", "one flipped bit of the pickle", "truncated", "a key removed",
        "a step of text", "a log of a list", "no settings", "no weights"])
def test_resume_refuses_a_foreign_or_damaged_checkpoint(damage, expected, tiny_in21k, pictures, tmp_path, capsys,
                                                        monkeypatch):
    flags = tune_flags(tiny_in21k, pictures, tmp_path, steps=2)
    assert run(finetune.main, flags + ["--pause-at", "1"], capsys, monkeypatch)[0] == 0
    damage(tmp_path / finetune.CHECKPOINT)
    status, out, err = run(finetune.main, flags + ["--resume"], capsys, monkeypatch)
    line = next(text for text in out.splitlines() if "cannot run section" in text)
    assert status == 1 and expected in line and str(tmp_path / finetune.CHECKPOINT) in line
    assert "Traceback" not in err and "step   2:" not in out


SAVE_DIR_FAULTS = [
    # another fine-tuning holds --save-dir: it replaced this one's checkpoint, unsaid
    ("held", [], 2, "another vit_part3_finetune.py is running there: wait for it to end, or pass another --save-dir"),
    # a run killed while it wrote its checkpoint left a temporary file as large as one, which nothing removed
    ("killed mid-write", [], 0, None),
    # the same folder named with a / (a shell's completion) or from another folder: refused, blaming its files
    ("model with a /", ["--resume"], 0, None),
    # a checkpoint made before the folder's real path was recorded: its --model as typed, from the folder above it
    ("model as typed", ["--resume"], 0, None),
]


@pytest.mark.parametrize("fault,flags,status,said", SAVE_DIR_FAULTS, ids=[row[0] for row in SAVE_DIR_FAULTS])
def test_save_dir_faults(fault, flags, status, said, tiny_in21k, pictures, tmp_path, capsys, monkeypatch):
    fcntl = pytest.importorskip("fcntl")
    save_dir = tmp_path / "run"
    assert run(finetune.main, tune_flags(tiny_in21k, pictures, save_dir, steps=2) + ["--pause-at", "1"], capsys,
               monkeypatch)[0] == 0
    model = f"{tiny_in21k}/" if fault == "model with a /" else tiny_in21k
    if fault == "model as typed":
        checkpoint = torch.load(save_dir / finetune.CHECKPOINT, weights_only=True)
        made, inputs = checkpoint["settings"], json.loads(checkpoint["settings"]["inputs"])
        made.update(model=tiny_in21k.name, inputs=json.dumps({**inputs, "model": tiny_in21k.name}))
        torch.save(checkpoint, save_dir / finetune.CHECKPOINT)
        monkeypatch.chdir(tiny_in21k.parent)
    left = save_dir / f"{files.TEMP_PREFIX}{finetune.CHECKPOINT}-0123456789abcdef"
    left.write_bytes(b"half a checkpoint")
    with open(save_dir / ".finetune.lock", "a") as holder:  # as another run holds it
        if fault == "held":
            fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, out, err = run(finetune.main, tune_flags(model, pictures, save_dir, steps=2) + flags, capsys, monkeypatch)
    assert code == status and "Traceback" not in err, out[-1500:] + err[-1500:]
    assert said is None or said in err
    assert left.exists() is (fault == "held")  # removed by the run that holds the folder, not by one refused
    assert read_checkpoint(save_dir / finetune.CHECKPOINT)["step"] == (1 if fault == "held" else 2)


# ---------------------------------------------------------------- 9. a wrong archive, an abandoned extraction

def archive_of(folder):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return buffer.getvalue()


def test_an_archive_with_the_wrong_counts_is_moved_aside_and_a_killed_extraction_cleaned(tmp_path):
    """A run killed while it extracted left its scratch folder, whose lock died with it: removed."""
    mirror = tmp_path / "mirror.tgz"
    mirror.write_bytes(archive_of(imagenette_folder(tmp_path / "src" / "imagenette2-160", per_class=1)))
    target = tmp_path / "data" / "imagenette2-160"
    target.parent.mkdir()
    abandoned = target.parent / f"{scratch_prefix(target)}x1y2"
    (abandoned / "imagenette2-160").mkdir(parents=True)
    killed = subprocess.run([sys.executable, "-c", ("import os, sys; from job.imagenette_archive import lock; "
                             "lock(sys.argv[1]); os.kill(os.getpid(), 9)"), str(abandoned)], cwd=ROOT, check=False)
    assert killed.returncode == -9  # killed while it held the folder's lock, as a run killed mid-extraction
    with pytest.raises(UserError) as refused:
        download_and_extract(mirror.as_uri(), hashlib.md5(mirror.read_bytes()).hexdigest(), target, progress=False)
    message = str(refused.value)
    assert "found 10 of 9,469 training, 10 of 3,925 validation pictures" in message
    assert f"moved it to {target.parent / 'imagenette2-160.tgz.refused'}: run again to download it anew" in message
    assert "delete the folder" not in message  # the scratch folder the old message named is gone already
    assert os.listdir(target.parent) == ["imagenette2-160.tgz.refused"]  # no scratch folder, no half target


def test_the_writer_never_costs_the_good_file(tmp_path, full_disk):
    target = tmp_path / "results.json"
    files.write_text(target, "good")
    full_disk("results.json", room=2)
    with pytest.raises(UserError, match=f"cannot write the file {target}: {ENOSPC}"):
        files.write_text(target, "a longer text that does not fit")
    assert target.read_text() == "good" and leftovers(tmp_path) == []
    shutil.rmtree(tmp_path)


def test_sigterm_under_torchrun_stops_every_process_at_one_step(tiny_in21k, pictures, tmp_path):
    """SIGTERM to torchrun, which passes it to its processes: all stop after the same step, the first saves once."""
    import time

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "vit_part3_finetune.py", *tune_flags(tiny_in21k, pictures, tmp_path, steps=200), "--save-every", "1"]
    job = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 200
    while not (tmp_path / finetune.CHECKPOINT).exists() and job.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    # torchrun's own agent prints a traceback of its SignalException; none comes from the script's processes
    assert job.returncode != 0 and "vit_part3_finetune.py\", line" not in err, err[-3000:]
    stopped = [text for text in err.splitlines() if "on SIGTERM; saved" in text]
    assert len(stopped) == 1, err[-3000:]
    step = read_checkpoint(tmp_path / finetune.CHECKPOINT)["step"]
    assert f"stopped after step {step} on SIGTERM" in stopped[0] and step < 200
    assert leftovers(tmp_path) == []


def test_a_torchrun_process_killed_mid_run_is_one_line_in_the_other(tiny_in21k, pictures, tmp_path):
    """SIGKILL to one of torchrun's processes (the system's out-of-memory killer): the other's next exchange with it
    fails, which it says in one line, no traceback; the last checkpoint stays readable. torchrun waits 5 s before it
    ends the other process itself, so that the failed exchange, not torchrun's SIGTERM, comes first."""
    import time

    import psutil

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--monitor-interval", "5", "vit_part3_finetune.py",
               *tune_flags(tiny_in21k, pictures, tmp_path, steps=200), "--save-every", "1"]
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"})
    deadline = time.time() + 200
    while not (tmp_path / finetune.CHECKPOINT).exists() and job.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    second = [child for child in psutil.Process(job.pid).children(recursive=True)
              if child.environ().get("RANK") == "1"]
    assert len(second) == 1
    second[0].kill()
    _, err = job.communicate(timeout=120)
    assert job.returncode != 0 and "vit_part3_finetune.py\", line" not in err, err[-3000:]
    said = [text for text in err.splitlines() if text.startswith("error: another torchrun process ended")]
    assert len(said) == 1 and "by peer" in said[0] and "adding --resume" in said[0], err[-3000:]
    assert read_checkpoint(tmp_path / finetune.CHECKPOINT)["step"] < 200


def test_sigterm_after_the_reader_of_its_output_is_gone_still_saves_the_step(tiny_in21k, pictures, tmp_path):
    """A job killed at once leaves its script writing to pipes nobody reads, then sends it SIGTERM: the script must
    save the step in flight (not only the last periodic checkpoint) rather than die of a broken pipe."""
    command = [sys.executable, "vit_part3_finetune.py", *tune_flags(tiny_in21k, pictures, tmp_path, steps=200),
               "--save-every", "50"]
    run = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"})
    for line in run.stdout:  # step 3 is logged: the loop runs (200 steps log 0, 3, 7, 17, ...)
        if line.startswith(b"  step   3:"):
            break
    run.stdout.close()  # the job's end: nobody reads the script's output any more
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=300) == 143
    step = read_checkpoint(tmp_path / finetune.CHECKPOINT)["step"]
    assert 3 <= step < 50 and leftovers(tmp_path) == []  # step 3 itself when SIGTERM beats its save_or_stop


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads which libraries a process loaded in /proc")
@pytest.mark.parametrize("moment,signum,said", [("at its first line", signal.SIGINT, "interrupted"),
                                                ("while torch loads", signal.SIGINT, "interrupted"),
                                                ("while torch loads", signal.SIGTERM, "stopped by SIGTERM")])
def test_ctrl_c_or_sigterm_while_a_script_loads_torch_is_one_line(moment, signum, said):
    """A Ctrl-C from a script's first line on (torch, transformers loading) ends as a later one: one line, status 130.
    The moment is set by what the script has done, not by a time: the script starts with SIGINT blocked, so that the
    first one is delivered exactly when its first line unblocks it, or the Ctrl-C waits for torch's library to be
    mapped (a timed one was lost on a loaded machine, the script's first line not yet run). A scheduler's SIGTERM
    then is one line and 143 too (it ended the process silently)."""
    held = {signal.SIGINT} if moment == "at its first line" else set()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)  # the script inherits it
    try:
        run = subprocess.Popen([sys.executable, "vit_part3_setup.py"], cwd=Path(__file__).resolve().parent.parent,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if moment == "while torch loads":
        wait_until(lambda: libraries_mapped(run.pid, "libtorch"), run)
    run.send_signal(signum)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signum and err.strip().splitlines()[-1:] == [said] and "Traceback" not in err, err


def test_a_beans_file_replaced_with_its_modification_time_kept_is_read_anew(tmp_path):
    """cp -p or rsync -a of another copy over a parquet file keeps its time: the library's own Arrow cache, keyed by
    path and time, would give the old pictures; the features' key is made from them, so it would not see it."""
    import pyarrow.parquet as pq

    import vit_backbone as beans
    from job.standins import beans_folder

    copy = beans_folder(tmp_path / "beans", {"train": 2, "validation": 1})
    path = min((copy / "data").glob("train*.parquet"))
    before = beans.data_digests({"train": beans.read_beans(str(copy))["train"]})
    table = pq.read_table(path)
    times = os.stat(path)
    pq.write_table(table.slice(1), path)  # one picture fewer, the time put back
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    after = beans.read_beans(str(copy))["train"]
    assert len(after) == table.num_rows - 1
    assert beans.data_digests({"train": after}) != before


def test_a_second_beans_copy_is_read_as_itself_not_from_the_cache_of_the_first(tmp_path):
    """Two local copies of beans, both called beans, one after the other in one Hugging Face cache: each is read
    with its own pictures (the library keys a folder's Arrow cache by its name and layout, not its files)."""
    import vit_backbone as beans
    from job.standins import beans_folder

    small = beans_folder(tmp_path / "one" / "beans", {"train": 2, "validation": 1})
    large = beans_folder(tmp_path / "two" / "beans", {"train": 3, "validation": 2})
    assert len(beans.read_beans(str(small))["train"]) == 6
    loaded = beans.read_beans(str(large))
    assert (len(loaded["train"]), len(loaded["validation"])) == (9, 6)
    assert loaded["names"] == ["angular_leaf_spot", "bean_rust", "healthy"]
