"""vit_part3_finetune.py: the zero head, the logged steps, the average, and runs that must give equal weights (the
learning rate of every step: tests/test_finetune_maths.py)."""
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from argparse import Namespace

import numpy as np
import pytest
import torch
from conftest import ARTICLE, ROOT, article_block, compare, library_pixels
from PIL import Image

import figures.finetune
import vit_part3_finetune as finetune
from common import files, start_and_end
from common.data import NEW_PASS
from common.pretrained import load_pretrained
from compare.verdicts import load_reference


def test_report_steps_scale_with_the_run():
    assert finetune.report_steps(300) == [0, 5, 10, 25, 50, 100, 150, 200, 250, 300]
    assert finetune.report_steps(30) == [0, 1, 2, 5, 10, 15, 20, 25, 30]  # 25 x 30/300 = 2.5 rounds to 2


def test_step_pictures_walk_through_shuffled_passes():
    count, batch = 10, 4
    steps = [finetune.step_pictures(s, batch, count, seed=0) for s in (1, 2, 3, 4, 5)]
    order = np.concatenate([indices for indices, _ in steps])
    assert sorted(order[:10]) == list(range(10)) and sorted(order[10:20]) == list(range(10))  # each pass once
    assert not np.array_equal(order[:10], order[10:20])  # a new order for each pass
    # one step of 8 is two steps of 4: the batch depends on the positions only
    double, flips = finetune.step_pictures(1, 8, count, seed=0)
    assert np.array_equal(double, order[:8]) and np.array_equal(flips, np.concatenate([steps[0][1], steps[1][1]]))
    assert not np.array_equal(finetune.step_pictures(1, 8, count, seed=1)[0], double)


def test_update_average_by_hand():
    model = torch.nn.Linear(1, 1, bias=False)
    average = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(average.weight)
    for w in (1.0, 2.0):
        torch.nn.init.constant_(model.weight, w)
        finetune.update_average(average, model, 0.99)
    assert average.weight.item() == pytest.approx(0.99 * 0.01 + 0.01 * 2.0)  # 0.01, then 0.0299


def test_run_statistics_by_hand():
    stats = finetune.run_statistics([4.0, 3.0, 2.0, 1.0], [0.5, 2.0, 3.0, 1.5], 1.0, norm_window=2, loss_window=1)
    assert stats == (3, 1.25, 2.25, 4.0, 1.0)  # clipped steps, median norms first and last, mean losses


def test_head_gradient_by_hand_equals_autograd():
    generator = torch.Generator().manual_seed(0)
    y = torch.randn(6, 5, generator=generator)
    head = torch.nn.Linear(5, 3)
    labels = torch.tensor([0, 1, 2, 2, 1, 0])
    logits = head(y)
    torch.nn.functional.cross_entropy(logits, labels).backward()
    assert torch.allclose(finetune.head_gradient_by_hand(y, logits.detach(), labels), head.weight.grad, atol=1e-6)


def classifier(checkpoint, resolution=224):
    """The stand-in checkpoint with a zero head of 10 classes, as the script builds it."""
    from transformers import ViTForImageClassification

    return finetune.build_classifier(load_pretrained(ViTForImageClassification, str(checkpoint),
                                                     output_loading_info=True), 10, resolution)


def test_zero_head_gives_ln_10_and_no_gradient_to_the_body(tiny_in21k):
    model, pre_logits = classifier(tiny_in21k)
    assert pre_logits == (32, 32) and model.vit.pooler is None
    assert finetune.zero_head(model) == 32 * 10 + 10
    pixels = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    step = finetune.head_step(model, pixels, torch.tensor([0, 3, 5, 9]))
    assert step["loss"] == pytest.approx(math.log(10), abs=1e-6)
    assert step["body norm"] == 0.0
    assert step["head autograd"].norm() > 0
    assert torch.allclose(step["head by hand"], step["head autograd"], atol=1e-6)


def test_the_zero_head_step_in_micro_batches_is_the_batchs_step(tiny_in21k):
    """--accum-steps 4 in section 1: four passes of 2 pictures give the batch's loss and gradients (so the peak
    memory is a micro-batch's and the printed numbers the article's arithmetic)."""
    model, _ = classifier(tiny_in21k)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))  # a head that learns
    pixels = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 3, 5, 9, 1, 1, 2, 7])
    whole, parts = (finetune.head_step(model, pixels, labels, passes) for passes in (1, 4))
    assert parts["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert torch.allclose(parts["logits"], whole["logits"], atol=1e-5)
    assert torch.allclose(parts["head autograd"], whole["head autograd"], atol=1e-6)
    assert torch.allclose(parts["head by hand"], parts["head autograd"], atol=1e-6)
    assert parts["body norm"] == pytest.approx(whole["body norm"], rel=1e-5) and whole["body norm"] > 0


def test_one_pass_gives_each_models_accuracy_and_the_checks_read_the_kept_batches(tiny_in21k, pictures):
    """accuracies(): one pass, each batch through both models, each model's accuracy as a model run alone on every
    picture gives it. kept_batches() reads the checks' pictures once, in the checks' batches; a check reads those,
    twice with the same result, each check's timing added to the checks' total."""
    from types import SimpleNamespace

    from common.data import list_split, picture_loader, start_loader

    models = []
    for seed in (1, 2):
        model, _ = classifier(tiny_in21k)
        with torch.no_grad():
            model.classifier.weight.normal_(0, 1, generator=torch.Generator().manual_seed(seed))
        models.append(model.eval())
    items = list_split(pictures, "val")
    labels = np.array([label for _, label in items])
    pixels = torch.from_numpy(library_pixels([path for path, _ in items], 224))
    with torch.no_grad():
        by_hand = [100 * np.mean(m(pixel_values=pixels).logits.argmax(1).numpy() == labels) for m in models]
    assert by_hand[0] != by_hand[1]  # the two heads are told apart
    from common.pretrained import ARTICLE_PIXELS

    run = SimpleNamespace(args=SimpleNamespace(resolution=224), device=torch.device("cpu"), autocast=None, world=1,
                          rank=0)
    batches, _ = start_loader(picture_loader([path for path, _ in items], 224, 16, run.device))
    timing = dict(NEW_PASS)
    counts = finetune.accuracies(models, batches, list(labels), run, 16, "both", timing, ARTICLE_PIXELS)
    assert [100 * right / of for right, of in counts] == pytest.approx(by_hand, abs=1e-9)
    assert timing["pictures"] == len(items)

    log = {"loader start-up seconds": 0.0, "passes": {"checks": dict(NEW_PASS)}}
    kept, shared = finetune.kept_batches(items, run, 16, log, ARTICLE_PIXELS)
    checks = log["passes"]["checks"]
    assert [len(batch) for batch in kept] == [16, 16, 8] and checks["pictures"] == 0
    assert shared == list(labels)
    for k in (1, 2):
        right, of = finetune.accuracies([models[0]], kept, shared, run, 16, "check", checks, ARTICLE_PIXELS)[0]
        assert 100 * right / of == pytest.approx(by_hand[0], abs=1e-9)  # the running total, checks, added to
        assert checks["pictures"] == k * len(items)


def test_reading_the_checks_pictures_counts_as_the_checks_wait(tiny_in21k, pictures, tmp_path, capsys, monkeypatch):
    """The checks' pictures are read before the first step; that time is the checks' (seconds and wait)."""
    real_read = finetune.kept_batches

    def slow_read(items, run, batch_size, log, pixels):
        kept = real_read(items, run, batch_size, log, pixels)
        log["passes"]["checks"]["seconds"] += 1000
        log["passes"]["checks"]["waiting seconds"] += 1000
        return kept

    monkeypatch.setattr(finetune, "kept_batches", slow_read)
    status, _ = run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=2) + ["--json", str(tmp_path / "a.json")],
                         capsys)
    checks = json.loads((tmp_path / "a.json").read_text())["passes"]["checks"]
    assert status == 0 and checks["waiting seconds"] >= 1000 and checks["seconds"] >= checks["waiting seconds"]
    assert checks["pictures"] == 3 * 40  # steps 0, 1 and 2 checked the 40; the reading adds none


@pytest.mark.parametrize("together,status,how", [
    (False, 0, "sys.exit"),  # one process, or torchrun's processes stopped before they met
    (False, 2, "sys.exit"),
    (True, 0, "os._exit"),  # all finished their sections: leave at once, output flushed
    (True, 1, "os._exit"),  # a section could not run, everything printed and written
])
def test_leave_skips_the_interpreters_finalization_only_once_all_processes_are_done(together, status, how,
                                                                                   monkeypatch):
    calls, flushed = [], []

    class Left(Exception):
        pass

    def leaving(name):
        def exit_with(code):
            calls.append((name, code))
            raise Left
        return exit_with

    monkeypatch.setattr(start_and_end.sys, "exit", leaving("sys.exit"))
    monkeypatch.setattr(start_and_end.os, "_exit", leaving("os._exit"))
    monkeypatch.setattr(start_and_end.sys.stdout, "flush", lambda: flushed.append("stdout"), raising=False)
    monkeypatch.setitem(start_and_end.LEAVING, "together", together)
    with pytest.raises(Left):
        start_and_end.leave(status)
    assert calls == [(how, status)] and ("stdout" in flushed) is (how == "os._exit")


def test_resolution_384_stretches_the_table_with_the_official_rule(tiny_in21k):
    model, _ = classifier(tiny_in21k, 384)
    assert model.vit.embeddings.position_embeddings.shape == (1, 577, 32)
    logits = model(pixel_values=torch.zeros(1, 3, 384, 384), interpolate_pos_encoding=True).logits
    assert logits.shape == (1, 10)


def read_checkpoint(path):
    return files.read_checkpoint(path, finetune.CHECKPOINT_FORMAT, "vit_part3_finetune.py")


def run_main(argv, capsys):
    """The script's main() in this process; (exit status, stdout)."""
    status = finetune.main(argv)
    return status, capsys.readouterr().out


def common_flags(model, data, save_dir, steps=4, batch=8):
    return ["--model", str(model), "--data-dir", str(data), "--steps", str(steps), "--batch-size", str(batch),
            "--device", "cpu", "--save-dir", str(save_dir)]


def final_weights(save_dir):
    state = read_checkpoint(save_dir / finetune.CHECKPOINT)
    return state["model"], state["average"]


def assert_same_weights(first, second, atol):
    for a, b in zip(first, second, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert torch.allclose(a[name], b[name], atol=atol, rtol=0), name


def test_resumed_run_ends_like_an_uninterrupted_one(tiny_in21k, pictures, tmp_path, capsys):
    whole = tmp_path / "whole"
    status, _ = run_main(common_flags(tiny_in21k, pictures, whole, steps=6) + ["--json", str(tmp_path / "a.json")],
                         capsys)
    assert status == 0
    parts = tmp_path / "parts"
    paused = ["--pause-at", "3", "--json", str(tmp_path / "paused.json"), "--plots", str(tmp_path / "figures")]
    status, out = run_main(common_flags(tiny_in21k, pictures, parts, steps=6) + paused, capsys)
    assert status == 0 and "paused after step 3 of 6" in out
    curves = json.loads((tmp_path / "paused.json").read_text())["series"]  # a paused run's figure: its steps so far
    assert len(curves["training loss"]) == len(curves["gradient norm"]) == 3
    assert curves["learning rate"] == [0.003 * t / 1 if t < 1 else 0.0015 * (1 + math.cos(math.pi * (t - 1) / 5))
                                       for t in range(3)]  # warm-up of round(0.6) = 1 step, then cosine over 5
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "figures" / figures.finetune.FILE).stat().st_size > 0
    status, out = run_main(common_flags(tiny_in21k, pictures, parts, steps=6) + ["--resume", "--json",
                                                                                  str(tmp_path / "b.json")], capsys)
    assert status == 0 and "resumed from" in out and "step   6:" in out
    for a, b in zip(final_weights(whole), final_weights(parts), strict=True):
        assert all(torch.equal(a[name], b[name]) for name in a)
    first, second = (json.loads((tmp_path / f"{x}.json").read_text())["numbers"] for x in "ab")
    timeless = [key for key in first if "seconds" not in key]
    assert len(timeless) > 30
    assert {k: first[k]["value"] for k in timeless} == {k: second[k]["value"] for k in timeless}


def test_under_bf16_the_head_gradients_norms_agree_when_their_difference_is_0(tiny_in21k, pictures, capsys):
    """--precision bf16: the gradient by hand is a bf16 tensor; its norm, taken in bf16, said 1.8125 beside autograd's
    1.8149 with a max |difference| of 0."""
    status, out = run_main(["--model", str(tiny_in21k), "--data-dir", str(pictures), "--steps", "1", "--batch-size",
                            "8", "--device", "cpu", "--precision", "bf16"], capsys)
    norms = re.search(r"norm ([\d.]+); autograd: ([\d.]+); max \|difference\| ([\d.e+-]+)", out)
    assert status == 0 and norms, out
    assert float(norms[3]) > 0 or norms[1] == norms[2], norms[0]


def rewritten(path):
    """The file's last byte changed, its size and times put back as they were (what cp -p of another copy leaves)."""
    stat, data = path.stat(), bytearray(path.read_bytes())
    data[-1] ^= 1  # in the last tensor's values: the file still loads
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


CHANGED_INPUTS = {  # changed under the same paths between a pause and --resume: each was continued, two runs spliced
    "a training picture's bytes": lambda data, model: Image.new("RGB", (160, 160), "olive").save(
        next((data / "train" / "n01440764").iterdir()), "JPEG"),
    "the weight file's bytes, size and time kept": lambda data, model: rewritten(model / "model.safetensors"),
    "the config": lambda data, model: (model / "config.json").write_text(json.dumps(
        {**json.loads((model / "config.json").read_text()), "layer_norm_eps": 1e-6})),
}


@pytest.mark.parametrize("change", CHANGED_INPUTS)
def test_resume_refuses_other_pictures_or_checkpoint_files(change, tiny_in21k, pictures, tmp_path, capsys):
    data, model = shutil.copytree(pictures, tmp_path / "nette"), shutil.copytree(tiny_in21k, tmp_path / "model")
    flags = common_flags(model, data, tmp_path / "run", steps=3)
    assert run_main(flags + ["--pause-at", "1"], capsys)[0] == 0
    CHANGED_INPUTS[change](data, model)
    status, out = run_main(flags + ["--resume"], capsys)
    picture = min((data / "train" / "n01440764").iterdir()).relative_to(data)
    said = (f"its picture {picture} under --data-dir is not the one it read" if change.startswith("a training picture")
            else f"the files of --model {model} are not those it read")
    assert status == 1 and f"was made with other settings ({said}); pass the same flags, or a new --save-dir" in out


def test_a_stop_after_the_last_step_says_to_resume(tiny_in21k, pictures, tmp_path, capsys, monkeypatch):
    """SIGTERM while the final passes run: the last step is saved, so the line says --resume finishes in seconds
    (the same command without it would train every step again)."""
    from common.start_and_end import Terminated, guarded

    def stopped(*args, **parts):
        raise Terminated

    monkeypatch.setattr(finetune, "finish", stopped)
    status = guarded(lambda: finetune.main(common_flags(tiny_in21k, pictures, tmp_path, steps=2)))
    err = capsys.readouterr().err
    assert status == 143 and f"saved {tmp_path / finetune.CHECKPOINT} at step 2: add --resume to finish" in err
    assert err.rstrip().endswith("stopped by SIGTERM") and read_checkpoint(tmp_path / finetune.CHECKPOINT)["step"] == 2


def test_resume_refuses_other_settings(tiny_in21k, pictures, tmp_path, capsys):
    run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=2), capsys)
    status, out = run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=3) + ["--resume"], capsys)
    assert status == 1 and "made with other settings (steps 2 -> 3)" in out
    status, out = run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=2) + ["--resume", "--check-per-class",
                                                                                     "1"], capsys)
    assert status == 1 and "made with other settings (checked per class None -> 1)" in out
    status, out = run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=2) + ["--resume", "--per-class", "1"],
                           capsys)  # its pictures differ because of it: not a picture "not the one it read"
    assert status == 1 and "made with other settings (per class None -> 1); pass the same flags" in out
    status, out = run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=2) + ["--resume", "--check-per-class",
                                                                                     "100"], capsys)
    assert status == 0 and "resumed from" in out  # the article's 100, said, is the default's run
    status, out = run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=2) + ["--resume", "--pause-at", "1"],
                           capsys)  # the checkpoint is at step 2: no pause at step 1 can be kept any more
    assert status == 1 and f"--pause-at 1: {tmp_path / finetune.CHECKPOINT} is at step 2 already" in out


def test_a_class_that_holds_fewer_than_the_check_is_printed_as_a_span(tiny_in21k, tmp_path, capsys):
    """Step 0's line counts what it checked: a class of 2 validation pictures, the others 4, checked 3 a class, is
    "(29 pictures, 2 to 3 per class)", not a mean floored to 2."""
    from job.standins import imagenette_folder

    data = imagenette_folder(tmp_path / "nette", per_class=4)
    for path in sorted((data / "val" / "n01440764").iterdir())[2:]:
        path.unlink()
    status, out = run_main(common_flags(tiny_in21k, data, tmp_path / "run", steps=1) + ["--check-per-class", "3",
                                                                                         "--resolution", "32"], capsys)
    assert status == 0 and "  step   0: validation accuracy (29 pictures, 2 to 3 per class) " in out


def test_a_checkpoint_of_other_settings_in_the_jobs_folder_says_what_the_job_can_do(tiny_in21k, pictures, tmp_path,
                                                                                     capsys, monkeypatch):
    """In the job, which sets --save-dir and --resume itself, "pass the same flags, or a new --save-dir" cannot be
    done: the line says to move the checkpoint away, after which the same job command starts afresh."""
    run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=2), capsys)
    monkeypatch.setenv("VIT_PART3_IN_JOB", "1")
    status, out = run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=3) + ["--resume"], capsys)
    assert status == 1 and ("made with other settings (steps 2 -> 3); move it away: the job's same command then "
                            "starts fine-tuning afresh") in out


def test_another_check_before_the_data_loads_counts_no_pictures():
    """The data not loaded (a run offline): the classes are unknown, so the difference names no count of pictures."""
    differences = finetune.check_differences(Namespace(check_per_class=10, per_class=None), None)
    assert differences["checked pictures"]["why"] == ("--check-per-class 10: pictures checked (the first 10 of each "
                                                      "class), the article's 1,000")


RELEASE_VAL = [387, 395, 357, 386, 409, 394, 389, 419, 399, 390]  # the release's validation pictures of each class
SHARES_400 = ("--check-per-class 400: classes of 357 to 400 checked pictures, so the zero head's step 0 is the first "
              "class's share of them, not 100 / classes")


@pytest.mark.parametrize("per_class,held,differences,step_0", [
    (None, RELEASE_VAL, {}, (10.0, "same")),
    (100, RELEASE_VAL, {}, (10.0, "same")),  # the article's, said
    (10, RELEASE_VAL, {"checked pictures": {
        "flag": "--check-per-class 10",
        "why": "--check-per-class 10: 100 pictures checked (the first 10 of each class), the article's 1,000"}},
     (10.0, "same")),
    (200, RELEASE_VAL, {"checked pictures": {
        "flag": "--check-per-class 200",
        "why": "--check-per-class 200: 2,000 pictures checked (the first 200 of each class), the article's 1,000"}},
     (10.0, "same")),
    ((10, 5), [5] * 10, {"checked pictures": {  # --per-class 5 caps it: 5 a class checked
        "flag": "--check-per-class 10",
        "why": "--check-per-class 10: 50 pictures checked (the first 5 of each class), the article's 1,000"}},
     (10.0, "same")),
    (7, [6] * 10, {"checked pictures": {  # every class holds 6: 6 of each checked, step 0 still 100 / 10
        "flag": "--check-per-class 7",
        "why": "--check-per-class 7: 60 pictures checked (the first 7 of each class, all of a class that holds fewer: "
               "6 a class), the article's 1,000"}},
     (10.0, "same")),
    # 400 of the release's classes of 357 to 419: 387 + 395 + 357 + 386 + 400 + 394 + 389 + 400 + 399 + 390 = 3,897
    # checked, the first class's 387 of them right at step 0
    (400, RELEASE_VAL, {"checked pictures": {
        "flag": "--check-per-class 400",
        "why": "--check-per-class 400: 3,897 pictures checked (the first 400 of each class, all of a class that holds "
               "fewer: 357 to 400 a class), the article's 1,000"},
        "checked shares": {"flag": "--check-per-class 400", "why": SHARES_400}},
     (100 * 387 / 3897, "not comparable")),
    # the default 100 of a copy whose third class holds 57: 100 x 9 + 57 = 957 checked, the first class's 100 right
    (None, [387, 395, 57, 386, 409, 394, 389, 419, 399, 390], {"checked pictures": {
        "flag": "--data-dir copy",
        "why": "--data-dir copy: 957 pictures checked (the first 100 of each class, all of a class that holds fewer: "
               "57 to 100 a class), the article's 1,000"},
        "checked shares": {"flag": "--data-dir copy", "why": "--data-dir copy: classes of 57 to 100 checked pictures, "
                           "so the zero head's step 0 is the first class's share of them, not 100 / classes"}},
     (100 * 100 / 957, "not comparable")),
], ids=["default", "the article's 100", "10", "200", "capped by --per-class", "classes that hold fewer, equally",
        "classes that hold fewer, unequally", "a copy with a class under the default"])
def test_checking_other_pictures_leaves_only_the_zero_heads_accuracy_comparable(per_class, held, differences, step_0):
    """Another check moves every checked accuracy and the counts (not comparable), but not step 0's while every class
    has the same count checked: the zero head ties every class and argmax takes the first, so on N pictures of each
    of 10 classes it is 100 / 10 = 10.0 exactly, judged as on the article's 1,000 (no sampling interval). Classes
    that hold fewer than N are checked whole: on unequal counts step 0 is the first class's share, moved by the flag,
    and not comparable. The training's numbers keep their verdicts."""
    per_class, cap = per_class if isinstance(per_class, tuple) else (per_class, None)
    data = {"classes": 10, "val": [(f"{label}/{k}.JPEG", label) for label, count in enumerate(held)
                                   for k in range(count)]}
    args = Namespace(check_per_class=per_class, per_class=cap, data_dir="copy")
    assert finetune.check_differences(args, data) == differences
    numbers = {"step 0 validation": {"value": step_0[0]}, "step 5 accuracy": {"value": 97.0},
               "monitor pictures": {"value": 100.0}, "step 5 loss": {"value": 2.3}, "mean loss last": {"value": 0.1},
               "average accuracy": {"value": 98.0}}
    rows = {row["name"]: row for row in compare(numbers, load_reference("finetune"), differences)}
    assert rows["step 0 validation"]["verdict"] == step_0[1] and "interval" not in rows["step 0 validation"]
    if differences:
        assert rows["step 5 accuracy"]["verdict"] == rows["monitor pictures"]["verdict"] == "not comparable"
        assert rows["step 5 accuracy"]["flags"] == [differences["checked pictures"]["flag"]]
    if step_0[1] == "not comparable":
        assert rows["step 0 validation"]["flags"] == [differences["checked shares"]["flag"]]
        assert rows["step 0 validation"]["why"] == differences["checked shares"]["why"]
    if per_class == 10 and not cap:
        numbers["step 0 validation"] = {"value": 16.0}  # not the zero head's: no sample's band may call it close
        assert {row["name"]: row for row in compare(numbers, load_reference("finetune"), differences)}[
            "step 0 validation"]["verdict"] == "differs"
    # what the checks do not touch (the training, the final pass over every validation picture) keeps its verdict
    assert rows["step 5 loss"]["verdict"] == rows["mean loss last"]["verdict"] == "varies"
    assert rows["average accuracy"]["verdict"] == "varies"


def same_training_numbers(first_json, second_json, rel):
    """The logged loss and gradient norm (before clipping, so a wrong scale shows) of every step agree."""
    first, second = (json.loads(path.read_text())["numbers"] for path in (first_json, second_json))
    logged = [key for key in first if key.endswith((" loss", " norm"))]
    return len(logged) >= 6 and all(second[key]["value"] == pytest.approx(first[key]["value"], rel=rel)
                                    for key in logged)


def test_unreadable_checkpoints_and_bad_numbers_are_one_line(tiny_in21k, pictures, tmp_path, capsys):
    (tmp_path / finetune.CHECKPOINT).write_bytes(b"not a checkpoint")
    status, out = run_main(common_flags(tiny_in21k, pictures, tmp_path, steps=2) + ["--resume"], capsys)
    assert status == 1 and "is truncated or not a checkpoint of this script" in out
    for flag in (["--steps", "0"], ["--save-every", "0"], ["--resolution", "8"], ["--batch-size", "-1"]):
        with pytest.raises(SystemExit) as stopped:
            finetune.main(common_flags(tiny_in21k, pictures, tmp_path) + flag)
        assert stopped.value.code == 2
    assert "is not a whole number of at least 1" in capsys.readouterr().err


def test_accumulation_equals_the_full_batch(tiny_in21k, pictures, tmp_path, capsys):
    run_main(common_flags(tiny_in21k, pictures, tmp_path / "full", steps=3) + ["--json", str(tmp_path / "a.json")],
             capsys)
    run_main(common_flags(tiny_in21k, pictures, tmp_path / "accum", steps=3) + ["--accum-steps", "4", "--json",
                                                                                 str(tmp_path / "b.json")], capsys)
    assert_same_weights(final_weights(tmp_path / "full"), final_weights(tmp_path / "accum"), atol=1e-6)
    assert same_training_numbers(tmp_path / "a.json", tmp_path / "b.json", rel=1e-5)


def test_two_processes_equal_one(tiny_in21k, pictures, tmp_path, capsys):
    run_main(common_flags(tiny_in21k, pictures, tmp_path / "one", steps=3) + ["--json", str(tmp_path / "a.json")],
             capsys)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "vit_part3_finetune.py", *common_flags(tiny_in21k, pictures, tmp_path / "two", steps=3),
               "--json", str(tmp_path / "b.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "batch 8 = 2 process(es) x 1 accumulation step(s) x 4 pictures" in run.stdout
    assert run.stdout.count("== 2. fine-tuning") == 1  # one process speaks
    assert_same_weights(final_weights(tmp_path / "one"), final_weights(tmp_path / "two"), atol=1e-5)
    assert same_training_numbers(tmp_path / "a.json", tmp_path / "b.json", rel=1e-4)


def test_a_refusal_under_torchrun_is_printed_once(tiny_in21k, pictures):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "vit_part3_finetune.py", "--model", str(tiny_in21k), "--data-dir", str(pictures), "--batch-size", "3"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=240,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode != 0
    assert (run.stdout + run.stderr).count("error: --batch-size 3 does not split into 2 process(es)") == 1


def test_a_diverging_run_stops_with_the_step(tiny_in21k, pictures, tmp_path, capsys):
    flags = common_flags(tiny_in21k, pictures, tmp_path, steps=20) + ["--lr", "1e38", "--save-every", "1"]
    status, out = run_main(flags, capsys)
    stopped = re.search(r"the training loss is (nan|inf) at step (\d+)", out)
    assert status == 1 and stopped
    kept = read_checkpoint(tmp_path / finetune.CHECKPOINT)
    assert kept["step"] == int(stopped.group(2)) - 1
    assert all(torch.isfinite(w).all() for w in kept["model"].values())


def numbers_as_hash(text):
    return re.sub(r"-?\d[\d,]*(\.\d+)?(e[-+]\d+)?", "#", text)


@pytest.mark.skipif(not ARTICLE.exists(), reason="the article is not beside the checkout")
def test_script_end_to_end_on_stand_ins(tiny_in21k, pictures, tmp_path):
    """The article's lines; the batches the loader hands over; --save-dir's two folders, which from_pretrained and
    pipeline("image-classification") load, the pipeline predicting the validation pictures as the script counted."""
    sizes = tmp_path / "batches.json"  # the sizes of the batches the loader hands over, pass by pass
    command = [sys.executable, "tests/batch_counter.py", str(sizes), "vit_part3_finetune.py", "--model",
               str(tiny_in21k), "--data-dir", str(pictures), "--steps", "6", "--batch-size", "8", "--compare",
               "--plots", str(tmp_path), "--save-dir", str(tmp_path / "run"), "--json", str(tmp_path / "run.json")]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = [numbers_as_hash(text) for text in run.stdout.splitlines()]
    # Section 1 prints the article's lines, numbers aside; sections 0 and 2 its layout.
    for text in article_block("== 1. step 0 with the zero head")[1:]:
        expected = numbers_as_hash(text).replace("#M other", "# other")  # a tiny body is counted in full
        assert expected in printed, expected
    # the article's step line, with the part of the time the run waited for pictures beside its seconds
    step_line = numbers_as_hash(article_block("== 2. fine-tuning")[2]).replace(" s]", " s, # s waiting for pictures]")
    assert sum(text == step_line for text in printed) == 6
    passes = next(text for text in printed if text.startswith("  passes over pictures"))
    assert passes.count("s waiting for pictures]") == 3  # training, the checks, both weights on all pictures
    # step 1's batch (section 1); the 40 validation pictures read once for the 7 checks; the 6 steps; both final
    # weights in one pass over the 40
    assert json.loads(sizes.read_text()) == [[8], [8] * 5, [8] * 6, [8] * 5]
    for text in article_block("== 2. fine-tuning")[-2:] + article_block("== 0. data")[2:]:
        assert numbers_as_hash(text) in printed, text
    assert "(of 86 article numbers)" in run.stdout
    from transformers import ViTForImageClassification, pipeline

    from common.data import list_split

    numbers, items = json.loads((tmp_path / "run.json").read_text())["numbers"], list_split(pictures, "val")
    for folder, counted in ((finetune.SAVED_AVERAGE, "average accuracy"), (finetune.SAVED_LAST, "last accuracy")):
        names = ViTForImageClassification.from_pretrained(tmp_path / "run" / folder).config.id2label
        assert [names[k] for k in range(10)] == [name for _, name, _ in finetune.CLASSES]
        classify = pipeline("image-classification", model=str(tmp_path / "run" / folder), device="cpu")
        right = sum(guess[0]["label"] == names[label]
                    for guess, (_, label) in zip(classify([str(path) for path, _ in items], top_k=1), items,
                                                 strict=True))
        assert (right, len(items)) == (numbers[counted]["right"], numbers[counted]["of"]), folder
    assert not [path.name for path in (tmp_path / "run").iterdir() if path.name.startswith(".tmp-")]


def test_script_without_the_checkpoint_says_so(pictures):
    run = subprocess.run([sys.executable, "vit_part3_finetune.py", "--data-dir", str(pictures)], cwd=ROOT,
                         capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    lines = [text for text in run.stdout.splitlines() if "cannot run section" in text]
    titles = [text.split('"')[1] for text in lines]
    assert titles == ["0. data and model", "1. step 0 with the zero head", "2. fine-tuning"]
    assert all("checkpoint google/vit-base-patch16-224-in21k is not in the local" in text for text in lines)


def test_the_random_head_for_comparison_is_normal_with_the_articles_std():
    """random_head(): weights of mean 0 and std 0.02 (the article's line: 'a random head (normal, std 0.02)').

    On n = 768,000 weights the sample variance s^2 satisfies (n - 1) s^2 / 0.02^2 ~ chi2(n - 1): its 1e-6 and 1 - 1e-6
    quantiles (scipy) bound s, about 0.02 +- 0.4%; the mean lies within 5 sigma / sqrt(n) of 0. The bias stays 0."""
    from scipy import stats

    model = torch.nn.Module()
    model.classifier = torch.nn.Linear(768, 1000)
    torch.nn.init.zeros_(model.classifier.bias)
    finetune.random_head(model, seed=0)
    weights = model.classifier.weight.detach().numpy().astype(np.float64).ravel()
    n, std = weights.size, 0.02
    low, high = (std * math.sqrt(stats.chi2.ppf(q, n - 1) / (n - 1)) for q in (1e-6, 1 - 1e-6))
    assert low < np.std(weights, ddof=1) < high and 0.0198 < low < high < 0.0202
    assert abs(np.mean(weights)) < 5 * std / math.sqrt(n)
    assert stats.kstest(weights, stats.norm(0, std).cdf).pvalue > 1e-6  # normal, not merely of that spread
    assert not model.classifier.bias.any()
