"""The GPU layer: each script on the stand-ins with --device cuda, in fp32 and bf16, beside the same run on the CPU.

It runs only where torch sees a CUDA GPU (marker `gpu`; conftest.py skips it elsewhere and says why; the test
of layout() itself runs everywhere). Each script runs as a user runs it, a process of its own
(tests/batch_counter.py counts the batches the loader hands over), three times at once: --device cpu,
--device cuda, --device cuda --precision bf16. Then:
  - no traceback, exit status 0, the JSON names the GPU;
  - the printed layout is the CPU run's (each line with its numbers and the device's name masked);
  - the loader handed over every batch: the sizes of each pass, counted from the pictures on disk;
  - the numbers that depend on nothing (reference entries of kind "nothing") get the CPU run's verdicts,
    "same" among them: fine-tuning's zero head (logits 0, loss ln 10, no gradient into the body) is
    computed on the GPU.
Beside them: the loader's batches on CUDA (pinned, several workers) bit-equal to the CPU's; a resumed
fine-tuning run on CUDA bit-identical to an uninterrupted one; the benchmark's tiny run on CUDA.
vit_part3_setup.py has no --device: it computes on the CPU wherever it runs, so it has no run here.
Under pytest-xdist the tests of the script runs share one worker (conftest.py), so the runs are made once;
the runs of a test start together, and the other tests go to other workers.
"""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, expected_batch

GPU = pytest.mark.gpu  # every test here but the one of layout() itself

CUDA = torch.device("cuda")
RUNS = (("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "bf16"))  # the CPU run is the reference of the other two
ON_CUDA = [pytest.param(precision, id=precision) for device, precision in RUNS if device == "cuda"]
TIMEOUT = 300  # seconds for one run; on an H200 each takes seconds


# ---------------------------------------------------------------- running scripts as processes

def start(tmp, name, command):
    """A process running command, its output in files (many run at once: pipes could fill)."""
    with open(tmp / f"{name}.out", "w") as out, open(tmp / f"{name}.err", "w") as err:  # the child keeps its copies
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, text=True,
                                   env={**os.environ, "TQDM_DISABLE": "1"})
    return {"process": process, "tmp": tmp, "name": name}


def finish(started):
    """(exit status or 'timed out', stdout, stderr) of a process from start()."""
    process, tmp, name = started["process"], started["tmp"], started["name"]
    try:
        status = process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        status = "timed out"
    return status, (tmp / f"{name}.out").read_text(), (tmp / f"{name}.err").read_text()


def counted_run(tmp, name, script, flags, device, precision):
    """Start `python script flags --device D --precision P --compare --json` under the batch counter."""
    command = [sys.executable, str(ROOT / "tests" / "batch_counter.py"), str(tmp / f"{name}.batches"), script, *flags,
               "--device", device, "--precision", precision, "--compare", "--json", str(tmp / f"{name}.json")]
    return start(tmp, name, command)


def result(started):
    status, out, err = finish(started)
    tmp, name = started["tmp"], started["name"]
    record, batches = tmp / f"{name}.json", tmp / f"{name}.batches"
    return {"status": status, "out": out, "err": err,
            "record": json.loads(record.read_text()) if record.exists() else None,
            "batches": json.loads(batches.read_text()) if batches.exists() else None}


# ---------------------------------------------------------------- the stand-ins and the runs

@pytest.fixture(scope="module")
def places(tmp_path_factory, pictures, tiny_in21k):
    """The checkpoints and data folders of the runs; beans only where `datasets` is installed."""
    from job.standins import beans_folder, vit_classifier

    root = tmp_path_factory.mktemp("gpu-standins")
    found = {"pictures": pictures, "in21k": tiny_in21k, "classifier": vit_classifier(root / "classifier")}
    try:
        found["beans"] = beans_folder(root / "beans")
    except ImportError:
        return found
    found["beans classifier"] = vit_classifier(root / "beans-classifier", image_size=32, processor=True)
    return found


SCRIPTS = {
    "posemb": ("vit_part3_posemb.py", ["--model", "{classifier}", "--data-dir", "{pictures}", "--batch-size", "16"]),
    "fewshot": ("vit_part3_fewshot.py", ["--model", "{in21k}", "--data-dir", "{pictures}", "--pool", "4", "--shots",
                                         "1", "3", "--draws", "2", "--batch-size", "16", "--no-cache"]),
    "finetune": ("vit_part3_finetune.py", ["--model", "{in21k}", "--data-dir", "{pictures}", "--steps", "4",
                                           "--batch-size", "12"]),
    "backbone": ("vit_backbone.py", ["--model", "{beans classifier}", "--data-dir", "{beans}", "--batch-size", "4",
                                     "--probe-epochs", "20", "--no-cache"]),
}


@pytest.fixture(scope="module")
def script_runs(places, tmp_path_factory):
    """{(script, device, precision): result} of every script's three runs, all started at once."""
    tmp = tmp_path_factory.mktemp("gpu-runs")
    started = {}
    for script, (file, flags) in SCRIPTS.items():
        if script == "backbone" and "beans" not in places:
            continue
        filled = [re.sub(r"\{(.+)\}", lambda key: str(places[key.group(1)]), flag) for flag in flags]
        for device, precision in RUNS:
            started[script, device, precision] = counted_run(tmp, f"{script}-{device}-{precision}", file, filled,
                                                             device, precision)
    return {key: result(run) for key, run in started.items()}


def runs_of(script_runs, script, precision):
    """(the CPU run, the CUDA run in this precision) of a script; the backbone's need `datasets`."""
    if script == "backbone":
        pytest.importorskip("datasets", reason="vit_backbone.py reads beans through the datasets library")
    cpu, cuda = script_runs[script, "cpu", "fp32"], script_runs[script, "cuda", precision]
    for device, run in (("cpu", cpu), ("cuda", cuda)):
        assert run["status"] == 0 and run["record"], (device, run["status"], run["err"][-3000:])
    return cpu, cuda


BOTH = pytest.mark.parametrize("precision", ON_CUDA)
EACH_SCRIPT = pytest.mark.parametrize("script", list(SCRIPTS))


@GPU
@EACH_SCRIPT
@BOTH
def test_each_script_runs_on_cuda_without_a_traceback(script_runs, script, precision):
    _, cuda = runs_of(script_runs, script, precision)
    assert "Traceback" not in cuda["out"] + cuda["err"], cuda["err"][-3000:]
    environment = cuda["record"]["environment"]
    assert environment["device"].startswith("GPU: ") and environment["precision"] == precision


NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?")


def layout(stdout):
    """The lines before the comparison, each with its numbers as #, the device as DEVICE, a predicted class (few-shot's
    first validation picture, "-> class tench") as CLASS and runs of spaces as one: what no round-off can change."""
    lines = stdout.split("\n== comparison with the article ==")[0].replace(torch.__version__, "TORCH").splitlines()
    masked = (re.sub(r"-> class .+$", "-> class CLASS", re.sub(r"\b(cpu|cuda)\b", "DEVICE", line)) for line in lines)
    masked = (re.sub(r"TF32 on this device: (yes|no \(all IEEE float32\))", "TF32 on this device: ANSWER", line)
              for line in masked)  # the backbone's float32 line: whether the device has TF32 at all
    return [" ".join(NUMBER.sub("#", line).split()) for line in masked]


def test_the_layout_masks_numbers_the_device_and_a_predicted_class_only():
    cpu = ("== 0. data: 40 pictures; device cpu ==\n  step   5: lr 0.00040  loss 2.30e-01\n"
           "  scores -0.12 -> class tench\n"
           "  float32: rule; TF32 on this device: no (all IEEE float32)\n== comparison with the article ==")
    cuda = ("== 0. data: 40 pictures; device cuda ==\n  step  10: lr 0.00090  loss 1.5e+00\n"
            "  scores +0.2 -> class gas pump\n"
            "  float32: rule; TF32 on this device: yes")
    expected = ["== # data: # pictures; device DEVICE ==", "step #: lr # loss #", "scores # -> class CLASS",
                "float#: rule; TF# on this device: ANSWER"]  # digits inside words are masked too, alike
    assert layout(cpu) == layout(cuda) == expected
    assert layout(cpu) != layout(cuda.replace("loss", "accuracy"))


@GPU
@EACH_SCRIPT
@BOTH
def test_the_printed_layout_is_the_cpu_runs(script_runs, script, precision):
    cpu, cuda = runs_of(script_runs, script, precision)
    assert len(layout(cpu["out"])) > 15
    assert layout(cuda["out"]) == layout(cpu["out"])
    names = [[row["name"] for row in run["record"]["comparison"]] for run in (cpu, cuda)]
    assert names[0] == names[1] and len(names[0]) > 30  # the same numbers, compared in the same order


def sizes(count, batch):
    """The sizes of the batches of one pass over count pictures: full ones, then the rest."""
    return [batch] * (count // batch) + ([count % batch] if count % batch else [])


def pictures_on_disk(folder, split):
    return len(list((Path(folder) / split).glob("*/*.JPEG")))


def expected_passes(script, places):
    """Each pass's batch sizes, in the order the script reads them, from the flags in SCRIPTS and the files."""
    train, val = pictures_on_disk(places["pictures"], "train"), pictures_on_disk(places["pictures"], "val")
    assert train == val == 40
    if script == "posemb":  # the checkpoint's 224, then the four tables at 384: five passes of batch 16
        return [sizes(val, 16)] * 5
    if script == "fewshot":  # the pool (--pool 4 of the 4 per class: all 40), then the validation pictures
        return [sizes(train, 16), sizes(val, 16)]
    # finetune, 4 steps of batch 12: step 1's batch alone (the zero head); the checks' validation pictures (at
    # most 100 per class: all 40), read once and kept on the device for the step-0 check and 4 more; one pass
    # for the 4 steps; the last and the averaged weights on all validation pictures, in one pass
    return [[12], sizes(val, 12), [12] * 4, sizes(val, 12)]


@GPU
@EACH_SCRIPT
@BOTH
def test_the_loader_hands_over_every_batch(script_runs, places, script, precision):
    cpu, cuda = runs_of(script_runs, script, precision)
    if script == "backbone":  # transformers.Trainer's own loader: 12 training pictures, batch 4, 5 epochs
        for run in (cpu, cuda):
            numbers = run["record"]["numbers"]
            logged = [int(name.split()[1]) for name in numbers if re.fullmatch(r"step \d+ eval_loss", name)]
            assert (numbers["training steps"]["value"], numbers["steps per epoch"]["value"]) == (5 * 3, 3)
            assert logged == [10, 15]  # evaluated every 10 steps and after the last: step 15 was taken
        return
    expected = expected_passes(script, places)
    assert cpu["batches"] == expected
    assert cuda["batches"] == expected


def verdicts_of_nothing(record):
    """{name: verdict} of the compared numbers that depend on nothing (arithmetic, the by-hand examples)."""
    return {row["name"]: row["verdict"] for row in record["comparison"] if row["kind"] == "nothing"}


@GPU
@EACH_SCRIPT
@BOTH
def test_numbers_that_depend_on_nothing_are_still_same(script_runs, script, precision):
    cpu, cuda = runs_of(script_runs, script, precision)
    expected, found = verdicts_of_nothing(cpu["record"]), verdicts_of_nothing(cuda["record"])
    same = {name for name, verdict in expected.items() if verdict == "same"}
    assert len(same) >= 14
    assert found == expected
    if script == "finetune":  # computed on the GPU: logits 0 and loss ln 10 with a zero head, no gradient to the body
        on_the_gpu = {"zero head loss", "zero head body gradient norm", "zero head probability", "ln 10",
                      *(f"zero head logits[{k}]" for k in range(1, 11))}
        assert {name for name in on_the_gpu if found[name] == "same"} == on_the_gpu


@GPU
def test_posemb_stretches_the_table_on_cuda_as_the_library_does(script_runs):
    """The script's bicubic stretch (on the host) against the library's interpolate_pos_encoding (on the GPU): the
    article printed 0.0e+00, and the CPU run does; a round-off here would read "differs" on the released weights."""
    cpu, cuda = runs_of(script_runs, "posemb", "fp32")
    assert cpu["record"]["numbers"]["bicubic vs library max diff"]["value"] == 0.0
    assert cuda["record"]["numbers"]["bicubic vs library max diff"]["value"] == 0.0


# ---------------------------------------------------------------- the loader

@GPU
@pytest.mark.parametrize("decoded", [False, True], ids=["paths", "decoded"])  # decoded in the workers, or before
def test_the_loaders_batches_on_cuda_are_pinned_and_equal_the_cpus(pictures, decoded):
    from common.data import list_split, load_rgb, picture_loader, start_loader, to_pixels
    from common.pretrained import ARTICLE_PIXELS

    paths = [path for path, _ in list_split(pictures, "val")]  # 40 pictures, gray and CMYK among them
    pictures_in = [load_rgb(path) for path in paths] if decoded else paths
    rng = np.random.default_rng(0)
    for resolution, batch in ((32, 6), (48, 16), (32, 40)):  # a loader a pass, as the scripts make it
        flips = rng.random(len(paths)) < 0.5
        on_cuda = picture_loader(pictures_in, resolution, batch, CUDA, flips)  # as the scripts make it beside a GPU
        assert on_cuda.pin_memory and on_cuda.num_workers >= min(2, (os.cpu_count() or 1) // 2)
        inline = picture_loader(pictures_in, resolution, batch, torch.device("cpu"), flips, workers=0)
        expected = list(start_loader(inline)[0])
        handed = list(start_loader(on_cuda)[0])
        assert [len(b) for b in handed] == sizes(len(paths), batch) and all(b.is_pinned() for b in handed)
        assert all(torch.equal(a, b) for a, b in zip(expected, handed, strict=True))
        on_device = np.concatenate([to_pixels(b, CUDA, ARTICLE_PIXELS).cpu().numpy() for b in handed])
        on_host = np.concatenate([to_pixels(b, torch.device("cpu"), ARTICLE_PIXELS).numpy() for b in expected])
        assert np.array_equal(on_device, on_host)  # the GPU's arithmetic is the host's, bit for bit
        assert np.allclose(on_device, expected_batch(paths, resolution, flips), rtol=0, atol=1e-6)  # the library's


@GPU
def test_fine_tunings_checks_keep_their_batches_on_the_gpu(pictures):
    """kept_batches() on CUDA (the loader's workers and pinning): the batches the checks read are on the GPU, in the
    checks' batch sizes, and equal to the CPU's."""
    from types import SimpleNamespace

    from common.data import NEW_PASS, list_split
    from common.pretrained import ARTICLE_PIXELS
    from vit_part3_finetune import kept_batches

    items = list_split(pictures, "val")
    kept = {}
    for device in (torch.device("cpu"), CUDA):
        run = SimpleNamespace(device=device, world=1, rank=0, args=SimpleNamespace(resolution=32))
        log = {"loader start-up seconds": 0.0, "passes": {"checks": dict(NEW_PASS)}}
        kept[device.type], labels = kept_batches(items, run, 16, log, ARTICLE_PIXELS)
        assert labels == [label for _, label in items] and log["passes"]["checks"]["pictures"] == 0
        assert (log["loader workers"] > 0) is (device.type == "cuda")
    assert all(batch.device.type == "cuda" for batch in kept["cuda"])
    assert all(torch.equal(a, b.cpu()) for a, b in zip(kept["cpu"], kept["cuda"], strict=True))
    assert [len(batch) for batch in kept["cuda"]] == sizes(len(items), 16)


# ---------------------------------------------------------------- fine-tuning's resume

def tune(tmp, name, data, model, precision, *extra):
    """`python vit_part3_finetune.py` on CUDA, 6 steps of batch 8, saving to tmp/name and writing tmp/name.json."""
    return ["vit_part3_finetune.py", "--model", str(model), "--data-dir", str(data), "--steps", "6",
            "--batch-size", "8",
            "--device", "cuda", "--precision", precision, "--save-dir", str(tmp / name), "--json",
            str(tmp / f"{name}.json"), *extra]


def tuned(tmp, runs, python=(sys.executable,)):
    """Run the tune() commands {name: argv} at once; each must end with status 0 and no traceback."""
    started = {name: start(tmp, name, [*python, *argv]) for name, argv in runs.items()}
    for name, run in started.items():
        status, out, err = finish(run)
        assert status == 0 and "Traceback" not in err, (name, err[-3000:])
        yield name, out


def final_state(tmp, name):
    """(weights, average, the numbers it printed but its timings) at the end of run `name`."""
    import vit_part3_finetune as finetune
    from common.files import read_checkpoint

    state = read_checkpoint(tmp / name / finetune.CHECKPOINT, finetune.CHECKPOINT_FORMAT, "vit_part3_finetune.py")
    numbers = json.loads((tmp / f"{name}.json").read_text())["numbers"]
    return state["model"], state["average"], {key: n["value"] for key, n in numbers.items() if "seconds" not in key}


def same_state(first, second):
    weights = all(torch.equal(a[name], b[name]) for a, b in zip(first[:2], second[:2], strict=True) for name in a)
    return weights and first[2] == second[2]


DETERMINISTIC = ("import os, runpy, sys; os.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'; import torch; "
                 "torch.use_deterministic_algorithms(True); sys.argv = sys.argv[1:]; "
                 "runpy.run_path(sys.argv[0], run_name='__main__')")


def under_deterministic_algorithms(tmp, data, model, precision):
    """For the failure's message: do a whole and a resumed run agree under torch.use_deterministic_algorithms(True)?"""
    python = (sys.executable, "-c", DETERMINISTIC)
    try:
        dict(tuned(tmp, {"d-whole": tune(tmp, "d-whole", data, model, precision),
                         "d-parts": tune(tmp, "d-parts", data, model, precision, "--pause-at", "3")}, python))
        dict(tuned(tmp, {"d-parts": tune(tmp, "d-parts", data, model, precision, "--resume")}, python))
    except AssertionError as failed:
        return f"under torch.use_deterministic_algorithms(True) a run failed: {str(failed)[-600:]}"
    agree = same_state(final_state(tmp, "d-whole"), final_state(tmp, "d-parts"))
    return f"under torch.use_deterministic_algorithms(True) they {'agree' if agree else 'differ too'}"


@GPU
@BOTH
def test_a_resumed_run_on_cuda_ends_bit_for_bit_like_an_uninterrupted_one(pictures, tiny_in21k, tmp_path, precision):
    """As tests/test_finetune.py's on the CPU: paused after step 3 and resumed, it ends with the weights, the average
    and every number of an uninterrupted run. A second uninterrupted run tells the GPU's own round-off from resume's."""
    first = {name: tune(tmp_path, name, pictures, tiny_in21k, precision, *extra)
             for name, extra in (("whole", []), ("again", []), ("parts", ["--pause-at", "3"]))}
    assert "paused after step 3 of 6" in dict(tuned(tmp_path, first))["parts"]
    out = dict(tuned(tmp_path, {"parts": tune(tmp_path, "parts", pictures, tiny_in21k, precision, "--resume")}))
    assert "resumed from" in out["parts"] and "step   6:" in out["parts"]
    whole, again, resumed = (final_state(tmp_path, name) for name in ("whole", "again", "parts"))
    assert len(whole[2]) > 30
    if not same_state(whole, resumed):
        repeatable = ("two uninterrupted runs agree" if same_state(whole, again) else
                      "two uninterrupted runs differ as well: the GPU's kernels are not deterministic here")
        pytest.fail(f"the resumed run differs from the uninterrupted one; {repeatable}; "
                    f"{under_deterministic_algorithms(tmp_path, pictures, tiny_in21k, precision)}")


# ---------------------------------------------------------------- the benchmark, and the device itself

@GPU
@BOTH
def test_the_benchmarks_tiny_run_on_cuda(tmp_path, precision):
    from test_benchmark import assert_loader_lines

    out = tmp_path / "figures.json"
    status, stdout, err = finish(start(tmp_path, "benchmark", [
        sys.executable, "benchmarks/throughput.py", "--size", "tiny", "--batch-size", "4", "--repeats", "1",
        "--pictures", "8", "--loader-pictures", "12", "--workers", "2", "--device", "cuda", "--precision", precision,
        "--json", str(out)]))
    assert status == 0 and "Traceback" not in err, err[-3000:]
    figures = json.loads(out.read_text())
    assert figures["device"].startswith("GPU: ") and figures["precision"] == precision
    assert set(figures["model-only"]) == {"224 sdpa", "224 eager", "384 sdpa", "384 eager"}
    fast_bf16 = torch.cuda.get_device_capability(0) >= (8, 0)  # bf16 matrix units: Ampere and later
    assert set(figures["roofline GFLOP/s"]) == ({"fp32", "bf16"} if fast_bf16 else {"fp32"})
    assert all(math.isfinite(v["pictures/s"]) and v["pictures/s"] > 0 for v in figures["model-only"].values())
    assert 0 < figures["training peak GB"] < torch.cuda.get_device_properties(0).total_memory / 1e9
    lines = stdout.strip().splitlines()
    assert lines[-1].startswith("end-to-end / model-only at 224: ")
    assert float(lines[-1].rsplit(" ", 1)[1]) == pytest.approx(figures["end-to-end / model-only"], abs=0.005)
    assert_loader_lines(lines[-5:-1], figures, workers=2)


@GPU
def test_auto_and_cuda_pick_the_gpu():
    from common.run import pick_device

    assert pick_device("auto") == pick_device("cuda") == CUDA
