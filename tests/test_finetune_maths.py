"""vit_part3_finetune.py's maths: the learning rate of each step, the zero head, the stretched table of the classifier
and the training step itself (clipping, accumulation, torchrun's averaging, the Polyak average), against the
article's logged values, values worked out by hand and torch.optim; pure functions and tiny models only.

The script's runs on stand-ins and its other functions by hand: tests/test_finetune.py.
"""
import contextlib
import copy
import math
import re
import signal
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_vit

import vit_part3_finetune as finetune
from common.data import NEW_PASS
from common.files import read_checkpoint
from common.pretrained import ARTICLE_PIXELS
from common.run import Report, values
from common.start_and_end import Terminated, UserError
from compare.record import named
from compare.verdicts import flag_differences, load_reference
from vit_part3_posemb import position_tables

# The article's logged learning rates of the 300-step run (step: lr as printed).
ARTICLE_LRS = {5: "0.00040", 10: "0.00090", 25: "0.00240", 50: "0.00296", 100: "0.00254", 150: "0.00178",
               200: "0.00092", 250: "0.00026", 300: "0.00000"}


def article_lr(step):
    """The LR of step s = 1..300 by the article's loop, g['lr'] = lr_at(step - 1): 0.003 t / 30 for t = s - 1 < 30,
    then 0.0015 (1 + cos(pi (t - 30) / 270))."""
    t = step - 1
    return 0.003 * t / 30 if t < 30 else 0.0015 * (1 + math.cos(math.pi * (t - 30) / 270))


# ---------------------------------------------------------------- the learning rate of every step

@pytest.mark.parametrize("text, printed", [
    (finetune.millions(85.79), "85.8M"), (finetune.millions(0.012345), "12,345"),  # ViT-B's body; a stand-in's
    (finetune.zero_or_3g(0.0), "0.0"), (finetune.zero_or_3g(0.123456), "0.123"),
    (finetune.zero_or_3g(5.61e-7), "5.61e-07")])
def test_the_body_and_its_gradient_print_as_the_article_prints_them(text, printed):
    assert text == printed


def test_lr_at_every_logged_step_is_the_articles():
    assert finetune.warmup_steps(300) == 30
    assert {s: f"{finetune.lr_at(s - 1, 0.003, 300):.5f}" for s in ARTICLE_LRS} == ARTICLE_LRS  # the article's call


def test_lr_at_every_step_of_the_300():
    """Warm-up by hand; the cosine part against torch's CosineAnnealingLR (T_max 270) stepped once per step."""
    lrs = [finetune.lr_at(s - 1, 0.003, 300) for s in range(1, 301)]
    assert lrs[0] == 0.0  # step 1 applies lr_at(0) of the article's loop
    assert lrs[:31] == pytest.approx([0.003 * t / 30 for t in range(31)], rel=1e-12, abs=0)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.003)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=270, eta_min=0.0)
    by_torch = []
    for _ in range(270):  # steps 31..300: 0 .. 269 finished steps of the decay
        by_torch.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs[30:] == pytest.approx(by_torch, rel=1e-9, abs=1e-15)
    assert lrs == pytest.approx([article_lr(s) for s in range(1, 301)], rel=1e-12, abs=1e-18)


# ---------------------------------------------------------------- the classifier: the zero head, the stretched table

def test_the_zero_head_is_weight_and_bias_exactly_0_so_every_logit_is_exactly_0():
    model = SimpleNamespace(classifier=torch.nn.Linear(8, 10))  # zero_head() reads model.classifier only
    assert finetune.zero_head(model) == 8 * 10 + 10
    assert torch.equal(model.classifier.weight, torch.zeros(10, 8))
    assert torch.equal(model.classifier.bias, torch.zeros(10))
    features = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.classifier(features), torch.zeros(3, 10))


def test_the_classifier_built_for_fine_tuning_gives_logits_of_exactly_0():
    model, _ = finetune.build_classifier((tiny_vit(), {}), 10, 12)
    assert torch.equal(model.classifier.weight, torch.zeros(10, 4))
    assert torch.equal(model.classifier.bias, torch.zeros(10))
    with torch.no_grad():
        logits = model(pixel_values=torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(0))).logits
    assert torch.equal(logits, torch.zeros(2, 10))


def test_the_fine_tuned_classifier_stretches_its_table_row_major():
    """build_classifier() at a higher resolution: the same [R/2, C/2] rows in the model's own table."""
    model = tiny_vit(image_size=12, patch_size=4)  # a 3x3 grid
    with torch.no_grad():
        rows = [[7.0, 7.0, 7.0, 7.0]] + [[r, c, 0.0, 1.0] for r in range(3) for c in range(3)]
        model.vit.embeddings.position_embeddings.copy_(torch.tensor([rows]))
    model, _ = finetune.build_classifier((model, {}), 10, 20)  # 20 px / 4 = a 5x5 grid
    table = model.vit.embeddings.position_embeddings.detach()[0]
    assert table.shape == (26, 4)
    assert table[0].tolist() == [7.0, 7.0, 7.0, 7.0]
    expected = torch.tensor([[R / 2, C / 2, 0.0, 1.0] for R in range(5) for C in range(5)])
    assert torch.allclose(table[1:], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n_new", [24, 12])  # 384 and 192 pixels: a stretch and a shrink of the 14x14 grid
def test_the_fine_tuning_stretch_is_the_derived_bilinear_loop(n_new):
    """scipy.ndimage.zoom(order=1), the official call, against the loop posemb derives by hand."""
    table = np.random.default_rng(0).standard_normal((1 + 14 * 14, 6))
    np.testing.assert_allclose(finetune.stretched_table(table, n_new), position_tables(table, n_new)["2D bilinear"],
                               rtol=0, atol=1e-12)


# ---------------------------------------------------------------- the run's steps, pictures, statistics and setup

def test_scaled_steps_are_at_least_1():
    assert finetune.scaled(5, 10) == 1  # 5 x 10/300 = 0.17 rounds to 0: at least 1
    assert (finetune.scaled(50, 30), finetune.scaled(300, 300)) == (5, 300)


def test_each_pass_flips_about_half_its_pictures_each_by_its_own_draw():
    for step in (1, 2):  # two whole passes of 2000 pictures
        flips = finetune.step_pictures(step, 2000, 2000, seed=0)[1]
        assert 0.45 < flips.mean() < 0.55


def test_clipping_counts_the_norms_above_the_cap_and_the_windows_are_the_runs_ends():
    """A norm of exactly 1 is not clipped: min(1, 1/||g||) = 1. Windows of 2: the first and the last two steps."""
    stats = finetune.run_statistics([5.0, 4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 0.5, 1.5, 4.0], 1.0, norm_window=2,
                                    loss_window=2)
    assert stats == (3, 1.5, 2.75, 4.5, 1.5)  # clipped steps, median norms first and last, mean losses


def test_the_body_gradient_norm_leaves_out_the_head_and_what_got_no_gradient():
    model = torch.nn.Module()
    model.body, model.unused, model.classifier = torch.nn.Linear(2, 1), torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    model.body.weight.grad, model.body.bias.grad = torch.tensor([[3.0, 0.0]]), torch.tensor([4.0])
    model.classifier.weight.grad, model.classifier.bias.grad = torch.tensor([[100.0]]), torch.tensor([100.0])
    assert finetune.body_gradient_norm(model) == 5.0  # sqrt(9 + 0 + 16)


def test_micro_batches_weigh_each_part_by_its_share_so_the_losses_add_up_to_the_batchs():
    logits = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.tensor([0, 2, 1, 1, 0])
    parts = list(finetune.micro_batches(logits, labels, 2))
    assert [y.tolist() for _, y, _ in parts] == [[0, 2, 1], [1, 0]]
    assert [weight for _, _, weight in parts] == pytest.approx([3 / 5, 2 / 5])
    total = sum(F.cross_entropy(x, y) * weight for x, y, weight in parts)
    assert total.item() == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-12)


def test_each_process_takes_its_contiguous_share_of_the_steps_batch():
    batch = (np.arange(8) * 10, np.arange(8) % 3 == 0)
    shares = [finetune.process_share(batch, rank, 4) for rank in range(4)]
    assert [indices.tolist() for indices, _ in shares] == [[0, 10], [20, 30], [40, 50], [60, 70]]
    assert [flips.tolist() for _, flips in shares] == [[True, False], [False, True], [False, False], [True, False]]


NOT_LOADED = UserError("no pictures")  # as tried() gives section 0's load that failed


def all_differences(run, prepared=NOT_LOADED):
    """The setup's differences as compare/record.py's judged() makes them: the flags', then the script's own;
    prepared: section 0's (data, model, pixels), or a UserError when they could not be loaded."""
    known = flag_differences(run.args, finetune.ARTICLE_FLAGS)
    return {**known, **finetune.setup_differences(prepared, run, known)}


def test_a_shorter_run_removes_the_article_steps_it_never_logs():
    """30 steps log 0, 1, 2, 5, 10, 15, 20, 25, 30: the article's rows of its other steps are not comparable."""
    run = SimpleNamespace(args=SimpleNamespace(steps=30, batch_size=32, lr=0.003, resolution=224, precision="fp32",
                                               per_class=None, data_dir=None, check_per_class=None,
                                               model=finetune.MODEL))
    differences = all_differences(run)
    removed = differences["steps"]["removes"]
    assert "step 250 loss" in removed and "step 300 norm" in removed and "step 0 validation" not in removed
    assert not [name for name in removed if name.split()[1] in ("1", "2", "5", "10", "15", "20", "25", "30")]
    assert "mean loss first" not in removed and "data set" not in differences
    reference = [name for name in load_reference("finetune") if re.fullmatch(r"step (\d+) .*", name)
                 and int(name.split()[1]) not in (0, 1, 2, 5, 10, 15, 20, 25, 30)]
    assert removed == reference  # every article row of those steps, in the article's order


def test_the_pictures_the_sections_loaded_are_the_setups_difference_and_no_sample():
    """--per-class 8 of Imagenette: the training and validation pictures the run used, 80 of 9,469 and 80 of 3,925,
    the first 8 of each class by name: a part of the set, not a random sample of it (no n of N to judge by)."""
    args = SimpleNamespace(steps=300, batch_size=32, lr=0.003, resolution=224, precision="fp32", per_class=8,
                           data_dir=None, check_per_class=None, model=finetune.MODEL)
    data = {"train": [("a picture", 0)] * 80, "val": [("a picture", 0)] * 80, "classes": 10}
    differences = all_differences(SimpleNamespace(args=args), (data, "the model", ARTICLE_PIXELS))
    assert differences["training pictures"] == {"flag": "--per-class 8", "why": "--per-class 8: 80 of 9,469 training "
                                                                               "pictures (the first 8 of each class)"}
    assert differences["validation pictures"]["why"].startswith("--per-class 8: 80 of 3,925 validation pictures")
    assert "n" not in differences["validation pictures"]


def test_fine_tuning_on_another_data_set_is_not_the_articles_setup(tmp_path):
    """--data-dir with other classes than Imagenette's: the difference names that folder, not the default one."""
    for split in ("train", "val"):
        (tmp_path / "flowers" / split / "rose").mkdir(parents=True)
    args = SimpleNamespace(steps=300, batch_size=32, lr=0.003, resolution=224, precision="fp32", per_class=None,
                           data_dir=str(tmp_path / "flowers"), check_per_class=None, model=finetune.MODEL)
    assert all_differences(SimpleNamespace(args=args))["data set"]["flag"] == f"--data-dir {tmp_path / 'flowers'}"


# ---------------------------------------------------------------- the training loop, on a tiny classifier

class TinyClassifier(torch.nn.Module):
    """A linear layer called as the training step calls a ViT; it records, per pass, whether DDP's no_sync() held."""

    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Linear(3, 4)
        self.waiting, self.passes, self.modes = False, [], []

    def forward(self, pixel_values, interpolate_pos_encoding):
        self.passes.append(self.waiting)
        self.modes.append(self.training)
        return SimpleNamespace(logits=self.classifier(pixel_values))

    @contextlib.contextmanager
    def no_sync(self):
        self.waiting = True
        try:
            yield
        finally:
            self.waiting = False


# (rank, --save-dir, step, asked to stop, the write fails) -> what end_of_step does, in order, and how it ends; 2
# processes, a checkpoint due every 10 steps and at step 300. A stop between two due steps: the first process writes
# while the other waits in a second sum (torchrun stops every worker once one ends).
END_OF_STEP = [
    (0, "d", 10, False, False, ["write", "sum 2"], None),
    (0, "d", 3, False, False, ["sum 2"], None),
    (1, "d", 10, False, False, ["sum 2"], None),
    (0, "d", 3, True, False, ["sum 2", "write", "sum 1"], KeyboardInterrupt),
    (1, "d", 3, True, False, ["sum 2", "sum 1"], KeyboardInterrupt),
    (0, "d", 10, True, False, ["write", "sum 2"], KeyboardInterrupt),  # written once
    (0, "d", 300, True, False, ["write", "sum 2"], KeyboardInterrupt),
    (0, None, 3, True, False, ["sum 2"], KeyboardInterrupt),
    (0, "d", 10, False, True, ["write", "sum 2"], UserError),
    (1, "d", 10, False, True, ["sum 2"], UserError),
    (0, "d", 3, True, True, ["sum 2", "write", "sum 1"], UserError),
    (1, "d", 3, True, True, ["sum 2", "sum 1"], UserError),
]


@pytest.mark.parametrize("rank, save_dir, step, asked, fails, events, ends", END_OF_STEP)
def test_a_steps_end_agrees_in_one_sum_and_a_stop_waits_for_the_write(rank, save_dir, step, asked, fails, events,
                                                                       ends, monkeypatch):
    done = []

    def write_checkpoint(args, checkpoint):
        done.append("write")
        return (None, UserError("disk full")) if fails else ("d/checkpoint.pt", None)

    def sum_over_processes(values, run):  # over both processes: a signal, and the first's write when it wrote
        done.append(f"sum {len(values) if isinstance(values, tuple) else 1}")
        wrote = save_dir and step % 10 == 0 or step == 300  # at a due step, then at a stop
        return (float(asked), float(fails and wrote)) if isinstance(values, tuple) else float(fails)

    monkeypatch.setattr(finetune, "write_checkpoint", write_checkpoint)
    monkeypatch.setattr(finetune, "sum_over_processes", sum_over_processes)
    run = SimpleNamespace(rank=rank, world=2, args=SimpleNamespace(save_dir=save_dir, save_every=10))
    stop = {"asked": "Ctrl-C" if asked and rank == 0 else None}
    with pytest.raises(ends) if ends else contextlib.nullcontext():
        finetune.end_of_step(run, stop, step, 300, lambda step: {"step": step})
    assert done == events


def step_batch():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 3, generator=generator) * 3, torch.tensor([0, 3, 1, 1, 2, 0])


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the learning rate of each step it takes."""

    def __init__(self, params, **settings):
        super().__init__(params, **settings)
        self.applied = []

    def step(self, closure=None):
        self.applied.append(self.param_groups[0]["lr"])
        return super().step(closure)


def train(monkeypatch, model, optimizer, batches, labels, steps, accum_steps=1, world=1, lr=None, start=0, rows=(),
          save_dir=None, save_every=50, rank=0, signal_at=None):
    """finetune.train() on these batches (already the model's inputs), its checks replaced; with lr, every step's LR is
    lr; from step start + 1, a resumed log's rows given; signal_at: (step, signal) raised as that step's pictures
    come. Returns its log (the loss and gradient norm of each step), its report, and the average. Each check must see
    the model in eval mode, in batches of the pictures of one forward pass; the batches are asked for steps start + 1
    .. steps; the model is wrapped in DDP under torchrun only."""
    def step_batches(items, first, last, run, log, made):
        assert (first, last) == (start + 1, steps)
        for step, pixels in enumerate(batches, first):
            if signal_at and step == signal_at[0]:
                signal.raise_signal(signal_at[1])
            yield pixels, labels

    def accuracies(models, pictures, labels_, run, batch_size, desc, timing, pixels):
        assert not any(model.training for model in models)  # a check is an evaluation: no dropout
        assert batch_size == len(labels) // (world * accum_steps)
        return [(1, 10)]  # 10.0%, its counts kept

    wrapped = []
    monkeypatch.setattr(finetune, "step_batches", step_batches)
    monkeypatch.setattr(finetune, "accuracies", accuracies)
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda model: wrapped.append(model) or model)
    if lr is not None:
        monkeypatch.setattr(finetune, "lr_at", lambda step, base_lr, total_steps: lr)
    args = SimpleNamespace(lr=0.003, steps=steps, batch_size=len(labels), accum_steps=accum_steps, seed=0,
                           save_dir=save_dir, save_every=save_every, resolution=224, model="tiny", per_class=None,
                           precision="fp32", check_per_class=None)
    run = SimpleNamespace(args=args, device=torch.device("cpu"), rank=rank, world=world,
                          autocast=contextlib.nullcontext())
    log = {"losses": [], "norms": [], "rows": list(rows), "seconds": 0.0, "loader workers": 0,
           "loader start-up seconds": 0.0, "passes": {"training": dict(NEW_PASS), "checks": dict(NEW_PASS)}}
    average = copy.deepcopy(model)
    report = Report("finetune", quiet=True)
    try:
        finetune.train(run, report, data={"train": [(None, int(label)) for label in labels]}, model=model,
                       average=average, optimizer=optimizer, log=log, check_batches=([], []),
                       micro=len(labels) // (world * accum_steps), steps=(start, steps), pixels=ARTICLE_PIXELS,
                       run_inputs=None)
    finally:
        assert wrapped == ([model] if world > 1 else [])  # DDP under torchrun, the model itself alone
    return log, report, average


def saved_steps(monkeypatch, tmp_path):
    """The steps whose checkpoint finetune.train() writes, each checked to go to tmp_path/checkpoint.pt."""
    steps = []

    def save(path, checkpoint, version):
        assert path == tmp_path / finetune.CHECKPOINT and version == finetune.CHECKPOINT_FORMAT
        steps.append(checkpoint["step"])
        return path

    monkeypatch.setattr(finetune, "save_checkpoint", save)
    return steps


@pytest.mark.parametrize("rank,expected", [(0, [2, 4, 5]), (1, [])])
def test_the_first_process_saves_every_save_every_steps_and_at_the_last(monkeypatch, tmp_path, rank, expected):
    model, (pixels, labels) = TinyClassifier(), step_batch()
    steps = saved_steps(monkeypatch, tmp_path)
    train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels] * 5, labels, 5, lr=0.1,
          save_dir=tmp_path, save_every=2, rank=rank)
    assert steps == expected


def test_a_checkpoint_that_cannot_be_written_stops_the_run_with_its_reason(monkeypatch, tmp_path):
    def full(path, checkpoint, version):
        raise UserError(f"cannot write the checkpoint {path}: no space left on device")

    monkeypatch.setattr(finetune, "save_checkpoint", full)
    model, (pixels, labels) = TinyClassifier(), step_batch()
    with pytest.raises(UserError, match="no space left on device"):
        train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels] * 3, labels, 3, lr=0.1,
              save_dir=tmp_path, save_every=1)


@pytest.mark.parametrize("signum,stops", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_during_a_step_saves_that_step_then_stops(monkeypatch, tmp_path, capsys, signum, stops):
    """The signal comes as step 2's pictures do: step 2 is finished, saved, and the run stops (143 or 130)."""
    model, (pixels, labels) = TinyClassifier(), step_batch()
    steps = saved_steps(monkeypatch, tmp_path)
    with pytest.raises(stops):
        train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels] * 5, labels, 5, lr=0.1,
              save_dir=tmp_path, signal_at=(2, signum))
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    assert steps == [2] and (f"stopped after step 2 on {name}; saved {tmp_path / finetune.CHECKPOINT}: add --resume "
                             f"to continue") in capsys.readouterr().err


@pytest.mark.parametrize("accum_steps", [1, 3])
def test_a_training_step_is_one_sgd_step_on_the_clipped_mean_gradient(accum_steps, monkeypatch):
    """By hand with autograd: the batch's mean loss, its gradient's global norm g, the gradient times min(1, 1/g);
    the first step of SGD with momentum moves each weight by -lr x that. Gradients left from before do not count."""
    torch.manual_seed(0)
    model, (pixels, labels) = TinyClassifier(), step_batch()
    by_hand = copy.deepcopy(model)
    loss = F.cross_entropy(by_hand(pixel_values=pixels, interpolate_pos_encoding=True).logits, labels)
    loss.backward()
    norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in by_hand.parameters()))
    assert norm > 1  # so that clipping acts
    expected = [p.detach() - 0.002 * p.grad / norm for p in by_hand.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=99.0, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    history, _, _ = train(monkeypatch, model, optimizer, [pixels], labels, 1, accum_steps, lr=0.002)
    assert history["losses"] == pytest.approx([loss.item()], rel=1e-6)
    assert history["norms"] == pytest.approx([norm], rel=1e-6)
    for p, e in zip(model.parameters(), expected, strict=True):
        assert torch.allclose(p.detach(), e, rtol=0, atol=1e-7)
    assert optimizer.param_groups[0]["lr"] == 0.002


def test_the_training_loop_applies_and_logs_lr_at_of_each_step(monkeypatch):
    """train() over the 300 steps, its checks and checkpoints replaced: the LR it applies at each step is the
    article's of that step, and the LR its logged lines print is the article's."""
    model = TinyClassifier()
    optimizer = RecordingSGD(model.parameters(), lr=1.0, momentum=0.9)
    pixels, labels = step_batch()
    history, report, _ = train(monkeypatch, model, optimizer, [pixels] * 300, labels, 300)
    assert optimizer.applied == pytest.approx([article_lr(s) for s in range(1, 301)], rel=1e-12, abs=1e-18)
    logged = {int(line.split(":")[0].split()[1]): line.split("lr ")[1].split()[0]
              for line in report.lines if line.startswith("  step ") and " lr " in line}
    assert logged == ARTICLE_LRS
    assert [row["step"] for row in history["rows"]] == [5, 10, 25, 50, 100, 150, 200, 250, 300]  # kept for a resume
    assert model.modes == [True] * 300  # every step trains in training mode (dropout), after each check's eval


def test_the_loop_keeps_the_polyak_average_of_the_weights(monkeypatch):
    """Two steps: the average is 0.99 (0.99 w0 + 0.01 w1) + 0.01 w2, w_k the weights after step k (w0 the start)."""
    model, (pixels, labels) = TinyClassifier(), step_batch()
    weights = [[p.detach().clone() for p in model.parameters()]]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    real_step = optimizer.step

    def step(closure=None):
        real_step(closure)
        weights.append([p.detach().clone() for p in model.parameters()])

    optimizer.step = step
    _, _, average = train(monkeypatch, model, optimizer, [pixels] * 2, labels, 2, lr=0.1)
    for averaged, w0, w1, w2 in zip(average.parameters(), *weights, strict=True):
        assert torch.allclose(averaged, 0.99 * (0.99 * w0 + 0.01 * w1) + 0.01 * w2, rtol=0, atol=1e-7)


def test_a_step_whose_loss_is_not_finite_changes_no_weight(monkeypatch):
    model, (pixels, labels) = TinyClassifier(), step_batch()
    before = [p.detach().clone() for p in model.parameters()]
    pixels[0, 0] = float("nan")
    with pytest.raises(UserError, match="the training loss is nan at step 1"):
        train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels], labels, 1, lr=0.1)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_a_step_whose_loss_is_finite_but_whose_gradient_overflows_changes_no_weight(monkeypatch):
    """Pictures of about 1e19: the loss, about 2e19, is a float32; the squares of the weights' gradients, about 1e38
    each, add up past float32's 3.4e38, so the norm is inf: the step is refused before it is applied, naming it."""
    model, (pixels, labels) = TinyClassifier(), step_batch()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(UserError, match="the training gradient norm is inf at step 1"):
        train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels * 1e19], labels, 1, lr=0.1)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_diverged_run_names_the_last_good_checkpoint_only_when_there_is_one(monkeypatch, tmp_path, checkpoint):
    model, (pixels, labels) = TinyClassifier(), step_batch()
    pixels[0, 0] = float("nan")
    if checkpoint:
        (tmp_path / finetune.CHECKPOINT).write_bytes(b"a checkpoint of step 1")
    with pytest.raises(UserError) as stopped:
        train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels], labels, 1, lr=0.1,
              save_dir=str(tmp_path))
    assert ("the last good checkpoint is" in str(stopped.value)) is checkpoint


def test_a_resumed_run_prints_its_logged_rows_again_then_continues(monkeypatch):
    """Resumed after step 5 of 6: the step-5 row as it was logged (its numbers recorded under step 5), then step 6."""
    model, (pixels, labels) = TinyClassifier(), step_batch()
    row = {"step": 5, "lr": 0.002, "loss": 1.25, "norm": 0.5, "accuracy": (4, 10), "seconds": 9.0,
           "waiting seconds": 1.0}  # the check's counts, right of checked, as the checkpoint keeps them
    history, report, _ = train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels], labels, 6,
                               lr=0.1, start=5, rows=[row])
    assert report.lines[0] == ("  step   5: lr 0.00200  loss 1.2500  gradient norm before clipping   0.500  validation "
                               " 40.0%   [9 s, 1.0 s waiting for pictures]")
    assert {name: value for name, value in values(report).items() if name.startswith("step 5 ")} == {
        f"step 5 {key}": 40.0 if key == "accuracy" else value for key, value in row.items() if key != "step"}
    assert (named(report.script, report.given)[0]["step 5 accuracy"]["right"],
            named(report.script, report.given)[0]["step 5 accuracy"]["of"]) == (4, 10)
    assert len(history["losses"]) == 1 and [r["step"] for r in history["rows"]] == [5, 6]


def test_under_torchrun_the_gradients_are_averaged_once_after_the_last_pass(monkeypatch):
    """2 processes, 3 passes: passes 1 and 2 inside DDP's no_sync(), the last one not; the loss is the sum over the
    processes (here two with the same share) divided by 2."""
    monkeypatch.setattr(finetune, "sum_over_processes", lambda values, run: (
        tuple(2 * float(value) for value in values) if isinstance(values, tuple) else 2 * float(values)))
    model, (pixels, labels) = TinyClassifier(), step_batch()
    expected = F.cross_entropy(model.classifier(pixels), labels).item()
    history, _, _ = train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels], labels, 1, 3,
                       world=2, lr=0.1)
    assert model.passes == [True, True, False]
    assert history["losses"] == pytest.approx([expected], rel=1e-6)
    model.passes.clear()
    train(monkeypatch, model, torch.optim.SGD(model.parameters(), lr=0.1), [pixels], labels, 1, 3, lr=0.1)
    assert model.passes == [False, False, False]  # one process: nothing to synchronise


def test_a_training_step_at_another_resolution_reads_the_stretched_table(monkeypatch):
    """The tiny ViT of 12 px fine-tuned at 20 px: the zero head's loss is ln 10."""
    model, _ = finetune.build_classifier((tiny_vit(), {}), 10, 20)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pixels = torch.randn(2, 3, 20, 20, generator=torch.Generator().manual_seed(0))
    history, _, _ = train(monkeypatch, model, optimizer, [pixels], torch.tensor([1, 7]), 1, lr=0.002)
    assert history["losses"] == pytest.approx([math.log(10)], abs=1e-6) and history["norms"][0] > 0


def test_a_checkpoint_keeps_torchs_rng_and_resume_sets_it_back(tmp_path):
    """save_checkpoint() adds torch's RNG states to the state; read back, set_rng_states() sets them, so the resumed
    run draws what the uninterrupted one drew next."""
    saved = torch.nn.Linear(2, 3)
    torch.manual_seed(7)
    finetune.save_checkpoint(tmp_path / "c.pt", {"model": saved.state_dict(), "settings": {"lr": 1.0}}, "v1")
    drawn_next = torch.rand(3)
    torch.manual_seed(99)  # the interrupted run drew on
    state = read_checkpoint(tmp_path / "c.pt", "v1", "a test")
    finetune.set_rng_states(state["rng"])
    assert sorted(state) == ["model", "rng", "settings"]
    assert torch.equal(state["model"]["weight"], saved.weight) and torch.equal(torch.rand(3), drawn_next)


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

    assert finetune.loaded(model) == ["the model"]
    with pytest.raises(UserError) as problem:
        finetune.loaded(data, checkpoint, model)
    assert problem.value.args == ("no data here; pass --data-dir", "no checkpoint here; pass --model",
                                  "no processor either")
    assert str(problem.value) == ("no data here; pass --data-dir; also no checkpoint here; pass --model; also no "
                                  "processor either")
    assert calls == ["model", "data", "checkpoint", "model"]  # each tried, in turn, even after a failure
