"""common/: device picking and precision, batches of pictures, checkpoint errors, the report."""
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, expected_batch

from common.checkpoints import check_model_flag, load_pretrained
from common.device import pick_device
from common.errors import UserError
from common.output import Report
from common.run import loaded
from common.start import guarded


def test_auto_device_is_one_that_exists():
    assert pick_device("auto").type in ("cuda", "mps", "cpu")
    assert pick_device("cpu") == torch.device("cpu")


def without_a_gpu(command):
    """command run in a process of its own in which CUDA sees no GPU (CUDA_VISIBLE_DEVICES empty): a machine
    without one, on any machine, GPU or not; torch.cuda.is_available() is really False there, not patched."""
    return subprocess.run(command, cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True,
                          text=True, check=False, timeout=120)


def test_missing_gpu_is_a_one_line_error():
    code = "import torch\nfrom common.device import pick_device\nprint(torch.cuda.is_available())\npick_device('cuda')"
    run = without_a_gpu([sys.executable, "-c", code])
    assert run.stdout == "False\n" and run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1].startswith("common.errors.UserError: --device cuda: ")


def test_unknown_device_is_a_one_line_error():
    with pytest.raises(UserError, match="unknown device"):
        pick_device("tpu")


def test_guarded_turns_a_user_error_into_exit_2(capsys):
    def main():
        raise UserError("no such thing; do this instead")

    assert guarded(main) == 2
    assert capsys.readouterr().err.strip() == "error: no such thing; do this instead"


SPEAKS = [
    ({}, True),
    ({"RANK": "1"}, True),  # a RANK exported by a cluster's job, not torchrun's: the one process still speaks
    ({"RANK": "0", "WORLD_SIZE": "2"}, True),
    ({"RANK": "1", "WORLD_SIZE": "2"}, False),  # torchrun's second process: the first speaks for it
]


@pytest.mark.parametrize("environment,speaks", SPEAKS)
def test_a_user_error_is_said_once_under_torchrun_and_always_outside_it(environment, speaks, monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)

    def main():
        raise UserError("--json x: cannot be written")

    assert guarded(main) == 2
    assert capsys.readouterr().err == ("error: --json x: cannot be written\n" if speaks else "")


@pytest.mark.parametrize("environment,speaks", SPEAKS)
def test_only_the_process_that_speaks_draws_progress_bars(environment, speaks):
    """tqdm reads TQDM_DISABLE once, when it is imported (by torch, at a script's start): before_torch_loads() sets it
    first, as a script's first line does."""
    code = ("from common.start import before_torch_loads; before_torch_loads(); import tqdm; "
            "print(tqdm.tqdm([]).disable)")
    plain = {name: value for name, value in os.environ.items() if name not in ("RANK", "WORLD_SIZE", "TQDM_DISABLE")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**plain, **environment}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.stdout.split() == [str(not speaks)], done.stderr


def test_missing_checkpoint_offline_names_it_and_the_fix():
    from transformers import ViTModel

    with pytest.raises(UserError) as problem:
        load_pretrained(ViTModel, "google/vit-not-a-real-checkpoint")
    message = str(problem.value)
    assert "google/vit-not-a-real-checkpoint" in message and "--model" in message and "\n" not in message


def test_a_directory_without_a_checkpoint_is_reported(tmp_path):
    from transformers import ViTModel

    with pytest.raises(UserError, match="not a saved checkpoint directory"):
        load_pretrained(ViTModel, str(tmp_path))


def test_a_model_flag_is_a_directory_or_a_hub_id_by_the_hubs_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "weights.bin").write_bytes(b"")
    for hub_id in ("google/vit-base-patch16-224", "vit", "a/b", "models/vit"):  # not refused: the Hub is asked later
        check_model_flag(hub_id)
    for path in ("./a", str(tmp_path / "a"), "a/b/c"):
        check_model_flag(path)
    for name, what in [("./nothing", "does not exist"), ("a/b/nothing", "does not exist"),
                       ("google/vit base", "does not exist"),
                       ("./weights.bin", "is a file, not a checkpoint directory")]:
        with pytest.raises(UserError, match=rf"^--model {name}: the directory {what}; pass a saved checkpoint "
                                            rf"directory or a Hub id$"):
            check_model_flag(name)


def test_report_records_what_it_prints(capsys):
    report = Report("test")
    report.line(f"loss {report.num('loss', 2.302585093, '.6f')}, W = {report.nums('W', [[0.625, -0.625]], '.3f')}")
    assert capsys.readouterr().out == "  loss 2.302585, W = [[0.625, -0.625]]\n"
    assert report.numbers["loss"] == {"value": 2.302585093, "text": "2.302585"}
    assert report.numbers["W[1,2]"]["text"] == "-0.625" and report.line_of["W[1,2]"] == 0
    with pytest.raises(ValueError, match="printed twice"):
        report.num("loss", 1.0)


def test_a_template_prints_the_articles_line_and_records_its_fields(capsys):
    report = Report("test")
    numbers = {"grid": 7, "B/16 over B/32 compute": 4.0573, "shape": (197, 768)}
    report.line("grid {grid:>2}x{grid:<2} N, x{B/16 over B/32 compute:.2f}, {shape:d}, {time}, {{-1, 1}}", numbers,
                prefix="ViT-B/32: ", time=report.pass_text("224", {"seconds": 65.2, "waiting seconds": 0.04}))
    assert capsys.readouterr().out == "  grid  7x7  N, x4.06, (197, 768), [65 s, 0.0 s waiting for pictures], {-1, 1}\n"
    assert list(report.numbers) == ["224 seconds", "224 waiting seconds", "ViT-B/32: grid",
                                    "ViT-B/32: B/16 over B/32 compute", "ViT-B/32: shape[1]", "ViT-B/32: shape[2]"]
    assert report.line_of == dict.fromkeys(report.numbers, 0)
    assert report.numbers["ViT-B/32: grid"] == {"value": 7.0, "text": "7"}
    with pytest.raises(KeyError, match="'missing'"):
        report.line("{missing}", numbers)
    report.cannot_run("4. accuracy", UserError("--data-dir x is a file, not a folder of {train,val}/<class>/"))
    assert capsys.readouterr().out.endswith('section "4. accuracy": --data-dir x is a file, not a folder of '
                                            '{train,val}/<class>/\n')  # a reason is text, not a template


def test_loaded_loads_each_in_turn_and_one_error_names_every_problem():
    calls = []

    def model():
        calls.append("model")
        return "the model"

    def data():
        calls.append("data")
        raise UserError("no data here; pass --data-dir")

    def checkpoint():
        calls.append("checkpoint")
        raise UserError("no checkpoint here; pass --model", "no processor either")

    assert loaded(model) == ["the model"]
    with pytest.raises(UserError) as problem:
        loaded(data, checkpoint, model)
    assert problem.value.args == ("no data here; pass --data-dir", "no checkpoint here; pass --model",
                                  "no processor either")
    assert str(problem.value) == ("no data here; pass --data-dir; also no checkpoint here; pass --model; also no "
                                  "processor either")
    assert calls == ["model", "data", "checkpoint", "model"]  # each tried, in turn, even after a failure


def argparse_namespace(**flags):
    import argparse

    return argparse.Namespace(compare=False, json=None, **flags)


def test_script_with_a_missing_device_exits_2():
    run = without_a_gpu([sys.executable, "vit_part3_fewshot.py", "--device", "cuda"])
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith("error: --device cuda: ") and run.stderr.count("\n") == 1, run.stderr


@pytest.mark.parametrize("decoded", [False, True])  # paths decoded in the workers; pictures decoded once beforehand
@pytest.mark.parametrize("workers", [0, 1, 2])  # inline; one worker process; two
def test_a_pass_keeps_the_order_and_flips_what_it_is_told(pictures, workers, decoded):
    from common.imagenette import list_split
    from common.loader import one_pass, start_pass
    from common.pictures import load_all, to_pixels

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]  # 10 pictures, gray and CMYK among them
    flips = np.arange(10) % 3 == 0
    loader = one_pass(load_all(paths) if decoded else paths, 32, 4, torch.device("cpu"), flips, workers=workers)
    batches = list(start_pass(loader)[0])
    assert [len(b) for b in batches] == [4, 4, 2] and batches[0].dtype == torch.uint8
    batches = [to_pixels(batch, torch.device("cpu")).numpy() for batch in batches]
    assert np.abs(np.concatenate(batches) - expected_batch(paths, 32, flips)).max() < 1e-6


def test_each_pass_reads_its_own_resolution_flips_and_pictures_and_its_workers_end_with_it(pictures):
    """posemb's rows (224, then 384), few-shot's sets: a loader a pass, which may take some of the pictures
    (indices); its worker processes end when the pass ends, or when it is dropped unfinished."""
    from common.imagenette import list_split
    from common.loader import one_pass, start_pass
    from common.pictures import load_all, to_pixels

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]
    decoded, cpu, before = load_all(paths), torch.device("cpu"), set(multiprocessing.active_children())
    rng = np.random.default_rng(0)
    for resolution, batch_size, indices in ((32, 4, range(10)), (48, 3, [9, 0, 4]), (32, 10, range(10))):
        flips = rng.random(len(indices)) < 0.5
        batches, _ = start_pass(one_pass(decoded, resolution, batch_size, cpu, flips, indices, workers=2))
        assert len(set(multiprocessing.active_children()) - before) == 2  # the pass's own workers, started
        read = np.concatenate([to_pixels(b, cpu).numpy() for b in batches])
        expected = expected_batch([paths[i] for i in indices], resolution, flips)
        assert np.abs(read - expected).max() < 1e-6
        assert set(multiprocessing.active_children()) <= before  # ended with the pass
    batches, _ = start_pass(one_pass(decoded, 32, 4, cpu, workers=2))
    next(batches)  # a pass left unfinished, as a run that stops early leaves it
    del batches
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("workers", [0, 2])
def test_a_picture_a_worker_cannot_read_is_one_line_naming_it(pictures, tmp_path, workers):
    from common.imagenette import list_split
    from common.loader import one_pass, start_pass

    bad = tmp_path / "broken.JPEG"
    bad.write_bytes(b"not a jpeg")
    paths = [path for path, _ in list_split(pictures, "val", per_class=1)][:5] + [bad]
    before = set(multiprocessing.active_children())
    with pytest.raises(UserError) as problem:
        list(start_pass(one_pass(paths, 32, 2, torch.device("cpu"), workers=workers))[0])
    assert set(multiprocessing.active_children()) <= before  # the failed pass's workers ended with it
    assert str(problem.value).startswith(f"cannot read picture {bad}: ") and "\n" not in str(problem.value)


def test_a_script_whose_worker_cannot_read_a_picture_says_so_in_one_line(tiny_in21k, tmp_path, monkeypatch, capsys):
    """As beside a GPU: few-shot's pictures are read by two worker processes, and one of them is broken."""
    import vit_part3_fewshot
    from common import loader
    from job.standins import imagenette_folder

    monkeypatch.setattr(loader, "loader_workers", lambda device: 2)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    children = set(multiprocessing.active_children())  # an earlier test's, if any
    data = imagenette_folder(tmp_path / "nette", per_class=2)
    picture = min((data / "val" / "n01440764").iterdir())
    picture.write_bytes(picture.read_bytes()[:-200])
    status = vit_part3_fewshot.main(["--model", str(tiny_in21k), "--data-dir", str(data), "--pool", "2", "--shots", "1",
                                     "--draws", "1", "--no-cache", "--device", "cpu"])
    out, err = capsys.readouterr()
    refused = [line for line in out.splitlines() if "cannot run section" in line]
    assert status == 1 and refused, out  # each section that needs the features says it
    assert all(f": cannot read picture {picture}: image file is truncated" in line for line in refused), out
    assert "Traceback" not in out + err and "worker process" not in out + err
    # ended with the failed pass (alive, they slowed later tests)
    assert set(multiprocessing.active_children()) <= children


def test_workers_outlive_a_ctrl_c(pictures):
    """The terminal sends Ctrl-C to every process; fine-tuning then finishes its step, checks included, and saves."""
    import os
    import signal
    import time

    from common.imagenette import list_split
    from common.loader import one_pass, start_pass

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]
    before = set(multiprocessing.active_children())
    batches, _ = start_pass(one_pass(paths, 32, 1, torch.device("cpu"), workers=2))  # each worker runs
    for worker in set(multiprocessing.active_children()) - before:
        os.kill(worker.pid, signal.SIGINT)
    time.sleep(0.5)
    assert sum(len(batch) for batch in batches) == 10


def test_a_pass_leaves_the_global_random_state_as_it_was(pictures):
    """Fine-tuning saves torch's RNG state in its checkpoints: reading batches must not move it."""
    from common.imagenette import list_split
    from common.loader import one_pass, start_pass

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]
    state = torch.get_rng_state()
    for workers in (0, 2):
        list(start_pass(one_pass(paths, 32, 4, torch.device("cpu"), workers=workers))[0])
    assert torch.equal(torch.get_rng_state(), state)


ORPHAN = """
import sys, time, torch
from common.imagenette import list_split
from common.loader import one_pass, start_pass
paths = [path for path, _ in list_split(sys.argv[1], "val", per_class=1)]
batches, _ = start_pass(one_pass(paths, 32, 4, torch.device("cpu"), workers=2))
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

    from common.imagenette import list_split
    from common.loader import Pictures
    from common.pictures import load_all

    paths = [path for path, _ in list_split(pictures, "val", per_class=1)]  # gray and CMYK among them: RGB once decoded
    decoded = load_all(paths)
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


@pytest.mark.parametrize("script,own,other", [
    ("vit_part3_posemb", "evaluation passes", ("fine-tun", "optimizer")),
    ("vit_part3_fewshot", "extract the frozen features", ("fine-tun", "optimizer")),
    ("vit_part3_finetune", "per optimizer step", ("evaluation", "features")),
])
def test_each_scripts_batch_size_help_speaks_of_its_own_work(script, own, other, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(script).main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    help_text = text.rsplit("--batch-size BATCH_SIZE ", 1)[1].split(" --precision", 1)[0]
    assert own in help_text and not any(word in help_text for word in other), help_text


def test_every_flag_with_a_default_names_it_in_its_help():
    """--help states each default: the help of a flag that has one carries %(default)s, which argparse fills in."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    silent = []
    for path in [*root.glob("*.py"), *root.glob("common/*.py"), *root.glob("job/*.py"), *root.glob("benchmarks/*.py")]:
        source = path.read_text()
        if "script_parser(" not in source:  # the project's parser, which every script and benchmark uses
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                keywords = {keyword.arg: keyword.value for keyword in node.keywords}
                default = keywords.get("default", ast.Constant(None))
                unset = isinstance(default, ast.Constant) and (default.value is None or default.value is False)
                if not unset and "%(default)" not in ast.get_source_segment(source, keywords.get("help", default)):
                    silent.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not silent, f"flags whose help does not name their default: {silent}"


def test_precision_flags():
    from common.device import set_precision

    cpu = torch.device("cpu")
    with set_precision(cpu, "bf16"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with set_precision(cpu, "fp32"):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(UserError, match="--precision fp16"):
        set_precision(cpu, "fp16")


def test_the_fp32_rule_torch_defaults_is_what_a_fresh_torch_has_and_strict_allows_no_tf32():
    from common.device import FP32_RULES, set_precision

    read = "import torch; print(torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)"
    fresh = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, check=True)
    assert fresh.stdout.split() == [str(flag) for flag in FP32_RULES["torch defaults"]]
    cpu = torch.device("cpu")
    # given back by hand, not by monkeypatch: torch's cuBLAS module answers allow_tf32 through __getattr__, and
    # pytest 9.2's undo deletes an attribute it did not find in the object's __dict__ (AttributeError at teardown)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for precision, rule, expected in (("fp32", "strict", (False, False)), ("fp32", "torch defaults", (False, True)),
                                          ("fp32-strict", "torch defaults", (False, False)),
                                          ("bf16", "strict", (False, False))):
            set_precision(cpu, precision, rule)
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == expected, (precision,
                                                                                                         rule)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_kept_on_linux():
    from common.device import keep_freed_memory

    assert keep_freed_memory()


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


@pytest.mark.parametrize("offline,why", [(True, "HF_HUB_OFFLINE=1 forbids downloads"),
                                         (False, "the Hugging Face Hub cannot be reached")])
def test_a_dataset_neither_cached_nor_reachable_says_why_and_the_fixes(monkeypatch, offline, why):
    import datasets
    from huggingface_hub import constants

    from common import beans

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(beans, "hub_reachable", lambda name, repo_type: False)
    with pytest.raises(UserError) as error:
        beans.from_hub("nobody/no-such-dataset")
    assert str(error.value) == (f"dataset nobody/no-such-dataset is not in the local Hugging Face cache and {why}: "
                                f"connect to the internet once to download it (about 180 MB) into the Hugging Face "
                                f"cache, or pass --data-dir with a local copy of its files")
    assert (constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE) == (offline, offline)  # switched back


def test_a_script_that_could_not_run_a_section_ends_on_each_reason_once_and_the_command_to_run(tmp_path):
    """Run from another folder, offline, without the checkpoint or the pictures: the last lines name each missing
    thing once (three sections lack the checkpoint, one also the pictures) and the command as typed, which works
    from that folder."""
    script = str(ROOT / "vit_part3_posemb.py")
    done = subprocess.run([sys.executable, script, "--per-class", "5"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    last = done.stderr.strip().splitlines()[-4:]
    assert done.returncode == 1 and last[0] == ("3 section(s) could not run (2. the position table, 3. cosine "
                                                "similarity, 4. accuracy at both resolutions):"), done.stderr
    assert last[1].startswith("  checkpoint google/vit-base-patch16-224 is not in the local Hugging Face cache")
    assert last[2].startswith(f"  Imagenette is not in {os.environ['VIT_PART3_DATA']}/imagenette2-160")
    assert last[3] == f"next: do what each line above says, then python {script} --per-class 5 runs every section"


def test_inside_the_job_a_script_leaves_the_command_to_run_next_to_the_job(monkeypatch):
    """Each reason once, in order; the next command only outside reproduce.py, whose own last line gives the job's."""
    from common.run import IN_JOB, closing_lines

    could_not_run = [("2. a", UserError("no checkpoint", "no pictures")), ("3. b", UserError("no checkpoint"))]
    reasons = ["\n2 section(s) could not run (2. a, 3. b):", "  no checkpoint", "  no pictures"]
    monkeypatch.setenv(IN_JOB, "1")
    assert closing_lines(could_not_run) == reasons
    monkeypatch.delenv(IN_JOB)
    assert closing_lines(could_not_run) == [*reasons, ("next: do what each line above says, then the same command "
                                                      "runs every section")]
