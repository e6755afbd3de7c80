"""The two articles in miniature, offline: a small ViT trained here on generated pictures, then the whole job on it,
on several seeds, and the articles' conclusions judged on the miniature itself.

    python job/miniature.py DIR                # seeds 0, 1, 2: pictures, training, the job, DIR/report.md
    python job/miniature.py DIR --seed 1000    # another seed set: 1000, 1001, 1002
    python job/miniature.py DIR --seeds 5      # five seeds

The articles' conclusions are about where things are: position rows stretched in 2D keep a ViT working at a
higher resolution, a zero head sends nothing into the body, a few steps of fine-tuning sort the pictures before
the loss moves. So the pictures here have classes decided by WHERE a bright blob is:

  - Imagenette's layout (imagenette/{train,val}/<wnid>/*.JPEG, 160 x 160 px): the height is cut into 5 bands,
    and class k (Imagenette's k-th WordNet id) has its blob in band k // 2, in the middle half of the width for
    even k, out at the left or right side for odd k (fine-tuning flips pictures: a flip keeps the class);
  - beans' layout (beans/README.md, beans/data/<split>-*.parquet, as job/standins.py writes it): class k
    (angular_leaf_spot, bean_rust, healthy) has its blob in the k-th third of the picture's height, a cut
    the Imagenette bands do not make.

A ViT of 4 layers of width 64 (patch 8 at 64 px: an 8 x 8 grid, as the article's 14 x 14 at 224) is trained
from scratch on pictures drawn afresh (not the folders' own), with two heads at once: a 1000-way head on the
class token (Imagenette's classes at their ImageNet-1k indices) and a pre-logits layer with a head of its own.
It is saved with save_pretrained under the Hub ids the scripts load (DIR/seed-<s>/models/google/...), then
reproduce.py runs the five scripts on it offline, into DIR/seed-<s>/results. Each seed draws its own pictures,
its own training and the scripts' draws (--seed); the seeds train side by side, then their jobs run, each a
process of one thread (run_seeds).

Against the articles' numbers the miniature is not comparable (its checkpoint and pictures are its own). On the
miniature each conclusion is judged on its own numbers (compare/verdicts.py, judge(..., own=True)): it holds when
it holds on every seed, fails when it fails on every seed, and is undecided otherwise (docs/miniature.md).

Each step is done once: a second call continues the job (the same command, reproduce.py's resume rule).
"""
import os
import sys

if __name__ == "__main__":  # run as a file: the repository root, not job/, is where modules are found
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from common.start_and_end import before_torch_loads

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the scripts' too: small matrices, one thread (one_thread())
    before_torch_loads()

import argparse
import contextlib
import json
import math
import shlex
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
from PIL import Image

from common.data import CLASSES, resized_rgb, to_pixels
from common.files import write_text
from common.pretrained import ARTICLE_PIXELS
from common.run import check_output, nonempty_path, positive_int, script_parser, seed_number
from common.start_and_end import Terminated, UserError, guarded, say
from compare.marks import MINIATURE_MARK
from compare.record import git_commit
from compare.verdicts import judge, load_reference
from job.child_process import StopRequests, start_script
from job.page import cell, read_record
from job.scripts import SCRIPTS, script_file
from job.standins import (
    BEANS_CARD,
    BEANS_CLASSES,
    IN21K,
    IN21K_CONFIG,
    VIT,
    hub_processor,
    write_beans,
    write_imagenette,
)
from job.standins import (
    vit_config as standin_config,
)

# ---------------------------------------------------------------- the pictures
PICTURE_SIDE = 160          # pixels on a side, Imagenette-160's short side; the scripts resize to their resolution
BANDS = 5                   # Imagenette's 10 classes: class k's blob is in band k // 2 of 5 across the height, and
                            # for even k in the middle half of the width, for odd k out at a side (a flip keeps it)
BEANS_BANDS = 3             # beans' 3 classes: class k's blob is in the k-th horizontal third
BLOB_SIGMA = (5.0, 10.0)    # the blob's Gaussian radius in pixels, drawn per picture: no one size to memorise
BLOB_MARGIN = 12            # the blob's centre keeps this far inside its region, so its class is never in doubt,
                            # at 64 px too (4.8 px inside)
IMAGENETTE_COUNTS = {"train": 60, "val": 300}  # pictures of each class in each split written to disk: 3,000 to
                                                # tell accuracies near 100% apart by a few tenths of a point
BEANS_COUNTS = {"train": 40, "validation": 20, "test": 10}  # pictures of each class in each split

# ---------------------------------------------------------------- the ViT and its training
IMAGE_SIZE = 64             # the checkpoint's resolution (the article's 224)
PATCH_SIZE = 8              # an 8 x 8 grid of patches (the article's 14 x 14)
WIDTH = 64                  # hidden size (ViT-B: 768)
LAYERS = 4                  # transformer blocks (ViT-B: 12)
HEADS = 4                   # attention heads of width 16
MLP_WIDTH = 128             # the MLP's inner width, twice the width (ViT-B: 4 times): quicker
TRAIN_PICTURES = 4000       # pictures drawn for training (seed TRAIN_SEED), none of them in the folders
STEPS = 450                 # AdamW steps of TRAIN_BATCH pictures: with 4,000 pictures, 0 to 6 errors in the 2,000
                            # posemb reads at 64 px (2,000 pictures and 300 steps: up to 8), so accuracies near 100%
                            # compare
TRAIN_BATCH = 64
LEARNING_RATE = 2e-3        # peak, after a warm-up of WARMUP_STEPS, then cosine to 0
WARMUP_STEPS = 40
WEIGHT_DECAY = 0.05
SEEDS = 3                   # --seeds: each number of the model measured on this many independent seeds
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # this process's
PROCESSES = CORES + 1       # trainings and jobs at once, one thread each: on 2 cores, 3 seeds' trainings
POLL_SECONDS = 0.2          # how often run_seeds looks for a process that ended

# ---------------------------------------------------------------- the job
MINIATURE = Path(__file__).resolve()
REPRODUCE = MINIATURE.parent.parent / "reproduce.py"
HIGHER_RESOLUTION = 120     # posemb's --resolution: a 15 x 15 grid, 1.9 x the 8 x 8 (the article: 24 x 24,
                            # 1.7 x 14 x 14;
                            # 112 would give 14 x 14, and the page would set the stretched grid beside the article's
                            # unstretched one of the same name)
# Each script's flags on the miniature, the article's recipe otherwise: the checkpoint's own resolution, posemb's
# five passes over 200 validation pictures a class (2,000 of the 3,000: its 15 x 15 grid is its longest work), and
# the backbone's learning rate for a head of width 64 (docs/miniature.md).
JOB_EXTRA = [f"posemb=--resolution {HIGHER_RESOLUTION} --per-class 200",
             f"fewshot=--resolution {IMAGE_SIZE} --no-cache",
             f"finetune=--resolution {IMAGE_SIZE}",
             "backbone=--lr 1e-3 --no-cache"]


# ---------------------------------------------------------------- pictures

def blob_centre(rng, box):
    """A centre drawn inside box (left, top, right, bottom), BLOB_MARGIN inside its edges."""
    left, top, right, bottom = box
    return (rng.uniform(left + BLOB_MARGIN, right - BLOB_MARGIN), rng.uniform(top + BLOB_MARGIN, bottom - BLOB_MARGIN))


def imagenette_box(rng, label, side=PICTURE_SIDE):
    """(left, top, right, bottom) of class `label`'s region: its band, the middle half or (drawn) a side's quarter."""
    band, at_a_side = divmod(label, 2)
    top, bottom, quarter = band * side / BANDS, (band + 1) * side / BANDS, side / 4
    if not at_a_side:
        return (quarter, top, side - quarter, bottom)
    return (0, top, quarter, bottom) if rng.random() < 0.5 else (side - quarter, top, side, bottom)


def band_box(label, side=PICTURE_SIDE):
    return (0, label * side / BEANS_BANDS, side, (label + 1) * side / BEANS_BANDS)


def blob_picture(rng, centre, side=PICTURE_SIDE):
    """A dim background of smooth random colour and noise, with one bright blob at centre: uint8 (side, side, 3)."""
    coarse = rng.uniform(0, 110, size=(6, 6, 3)).astype(np.float32)
    background = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((side, side), Image.BICUBIC), np.float32)
    sigma, axis = rng.uniform(*BLOB_SIGMA), np.arange(side, dtype=np.float32)
    across, down = (np.exp(-(axis - at) ** 2 / (2 * sigma ** 2)) for at in centre)  # a Gaussian is separable
    blob = (down[:, None] * across[None, :])[..., None]
    colour = rng.uniform(200, 255, size=3)  # bright in every channel, its hue drawn
    picture = background * (1 - blob) + colour * blob + rng.integers(-12, 13, size=(side, side, 3), dtype=np.int8)
    return np.clip(picture, 0, 255).astype(np.uint8)


def imagenette_picture(rng, label):
    """(picture, blob centre) of Imagenette's class `label`."""
    centre = blob_centre(rng, imagenette_box(rng, label))
    return blob_picture(rng, centre), centre


def beans_picture(rng, label, side=PICTURE_SIDE):
    centre = blob_centre(rng, band_box(label, side))
    return blob_picture(rng, centre, side), centre


def recipe():
    """The line of a mark that names what made its folder: a folder of another recipe is not continued."""
    counts = ["/".join(map(str, split.values())) for split in (IMAGENETTE_COUNTS, BEANS_COUNTS)]
    return (f"recipe: blobs of radius {BLOB_SIGMA[0]:g} to {BLOB_SIGMA[1]:g} px, {BLOB_MARGIN} px inside their "
            f"regions; {counts[0]} Imagenette and {counts[1]} beans pictures a class; a ViT of {LAYERS} layers of "
            f"width {WIDTH} at {IMAGE_SIZE} px, {TRAIN_PICTURES} pictures, {STEPS} steps of {TRAIN_BATCH} at "
            f"{LEARNING_RATE:g}")


def mark(folder):
    """folder, with the mark that makes the page say first what a run on it is (job/page.py), and its recipe."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MINIATURE_MARK).write_text("Generated by job/miniature.py: a ViT trained here on generated pictures "
                                         "whose class is where a blob is. Its numbers are its own; the articles' "
                                         f"do not apply, their conclusions do.\n{recipe()}\n")
    return folder


def other_recipe(root):
    """The marked folders under root made by another recipe (an earlier version of this file): none is continued."""
    return sorted(path.parent for path in Path(root).glob(f"seed-*/**/{MINIATURE_MARK}")
                  if recipe() not in path.read_text(errors="replace").splitlines())


def imagenette_folder(root, counts=None, seed=0):
    """root/{train,val}/<wnid>/<wnid>_<i>.JPEG, 160 x 160 px, each class's blob in its region (Imagenette's layout)."""
    rng = np.random.default_rng(seed)
    wnids = [wnid for wnid, _, _ in CLASSES]
    return mark(write_imagenette(root, wnids, counts or IMAGENETTE_COUNTS, lambda split, label, i: (
        f"{wnids[label]}_{i:04d}", Image.fromarray(imagenette_picture(rng, label)[0]))))


def beans_folder(root, counts=None, seed=0, side=PICTURE_SIDE):
    """AI-Lab-Makerere/beans's files as job/standins.py's beans_folder writes them (README.md, one parquet file a
    split), class k's blob in the k-th third of the height."""
    import datasets

    datasets.disable_progress_bars()  # a bar a split, for files of a second each
    rng = np.random.default_rng(seed)
    pictures = {split: [(label, Image.fromarray(beans_picture(rng, label, side)[0]))
                        for label in range(len(BEANS_CLASSES)) for _ in range(count)]
                for split, count in (counts or BEANS_COUNTS).items()}
    return mark(write_beans(root, pictures, BEANS_CARD.replace("(stand-in)", "(miniature)")))


# ---------------------------------------------------------------- the ViT

def vit_config(num_labels=1000):
    return standin_config("tiny", num_labels, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, hidden_size=WIDTH,
                          num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=MLP_WIDTH,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def sincos_rows(grid, width):
    """The 2D sine-cosine table (MAE's) of a grid x grid: a smooth start for the learned position rows, as the
    article's rows are smooth after 300M pictures (a few thousand leave random rows rough)."""
    quarter = width // 4
    frequencies = 1.0 / 10000 ** (np.arange(quarter) / quarter)
    rows, columns = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    parts = [f(axis.reshape(-1, 1) * frequencies) for axis in (rows, columns) for f in (np.sin, np.cos)]
    return np.concatenate(parts, axis=1).astype(np.float32)


def training_pictures(count, seed):
    """(uint8 (count, IMAGE_SIZE, IMAGE_SIZE, 3), Imagenette labels): drawn as the folders' pictures, resized as the
    scripts resize them (common/data.py)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CLASSES), size=count)
    pictures = np.stack([resized_rgb(Image.fromarray(imagenette_picture(rng, label)[0]), IMAGE_SIZE)
                         for label in labels])
    return pictures, labels


@contextlib.contextmanager
def one_thread():
    """torch on one thread meanwhile, as it was after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train(pictures, labels, steps=STEPS, seed=0, say=print):
    """(classifier, pre-logits layer) trained together: a 1000-way head on the class token, and a pre-logits
    layer (tanh of a dense layer on the class token, the ImageNet-21k release's) with a 10-way head of its own."""
    import torch
    import torch.nn.functional as F
    from transformers import ViTForImageClassification
    from transformers.models.vit.modeling_vit import ViTPooler

    torch.manual_seed(seed)
    model = ViTForImageClassification(vit_config())
    with torch.no_grad():
        grid = IMAGE_SIZE // PATCH_SIZE
        model.vit.embeddings.position_embeddings[0, 1:] = torch.from_numpy(sincos_rows(grid, WIDTH))
    pre_logits = ViTPooler(model.config)
    pre_logits_head = torch.nn.Linear(WIDTH, len(CLASSES))
    imagenet_index = torch.tensor([index for _, _, index in CLASSES])
    parameters = [*model.parameters(), *pre_logits.parameters(), *pre_logits_head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1, (step + 1) / WARMUP_STEPS) * 0.5 * (
        1 + math.cos(math.pi * min(1, step / steps))))
    generator = np.random.default_rng(seed)
    pictures, labels = torch.from_numpy(pictures), torch.from_numpy(labels)
    model.train()
    with one_thread():  # small matrices: one thread works, two mostly wait on each other
        for step in range(steps):
            batch = torch.from_numpy(generator.choice(len(labels), min(TRAIN_BATCH, len(labels)), replace=False))
            pixels = to_pixels(pictures[batch], torch.device("cpu"), ARTICLE_PIXELS)
            hidden = model.vit(pixel_values=pixels).last_hidden_state
            logits = model.classifier(hidden[:, 0])
            loss = F.cross_entropy(logits, imagenet_index[labels[batch]]) + F.cross_entropy(
                pre_logits_head(pre_logits(hidden)), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            if step % 50 == 0 or step == steps - 1:
                accuracy = (logits.argmax(1) == imagenet_index[labels[batch]]).float().mean()
                say(f"step {step:4d}: loss {loss.item():.3f}, batch accuracy {100 * accuracy:.0f}%")
    return model.eval(), pre_logits.eval()


def save_checkpoints(models, classifier, pre_logits):
    """The two checkpoints in the Hub's layout under the ids the scripts load: the classifier with the Hub's image
    processor file (its size ours), and the body with its pre-logits layer and no head, its config.json holding the
    fields of the ImageNet-21k release's (so no labels), as job/standins.py writes them."""
    from transformers import ViTModel

    vit, in21k = Path(models) / VIT, Path(models) / IN21K
    classifier.save_pretrained(vit)
    hub_processor(vit, IMAGE_SIZE)
    body = ViTModel(classifier.config, add_pooling_layer=True)
    body.load_state_dict({**classifier.vit.state_dict(),
                          **{f"pooler.{key}": value for key, value in pre_logits.state_dict().items()}})
    body.save_pretrained(in21k)
    sizes = {key: getattr(body.config, key) for key in IN21K_CONFIG if key not in ("architectures",
                                                                                   "transformers_version")}
    (in21k / "config.json").write_text(json.dumps({**IN21K_CONFIG, **sizes}, indent=2, sort_keys=True))
    return {"vit": mark(vit), "in21k": mark(in21k)}  # marked last: a mark says its folder is whole


def job_flags(root, seed=0):
    """reproduce.py's flags for the miniature in root: its copies, the CPU, each script's flags (JOB_EXTRA) and the
    seed of the scripts that draw (few-shot's shots, fine-tuning's order and flips, the backbone's head)."""
    root = Path(root)
    extra = [f"{item} --seed {seed}" if item.split("=")[0] in ("fewshot", "finetune", "backbone") else item
             for item in JOB_EXTRA]
    return ["--models", str(root / "models"), "--imagenette", str(root / "imagenette"), "--beans",
            str(root / "beans"), "--device", "cpu", *[token for item in extra for token in ("--extra", item)]]


def build_pictures(root, seed=0, say=print):
    """The Imagenette and beans folders in root, once (beans is written last: its mark says both are whole)."""
    root = Path(root)
    if not (root / "beans" / MINIATURE_MARK).is_file():
        say(f"pictures: {root / 'imagenette'} and {root / 'beans'}, each class where its blob is")
        imagenette_folder(root / "imagenette", seed=[seed, 0])
        beans_folder(root / "beans", seed=[seed, 1])


def build_checkpoints(root, seed=0, say=print):
    """The miniature ViT trained and saved in root/models, once (the ImageNet-21k body is saved last)."""
    models = Path(root) / "models"
    if (models / IN21K / MINIATURE_MARK).is_file():
        return
    say(f"training a ViT of {LAYERS} layers of width {WIDTH}, patch {PATCH_SIZE} at {IMAGE_SIZE} px, on "
        f"{TRAIN_PICTURES} generated pictures for {STEPS} steps of {TRAIN_BATCH}")
    classifier, pre_logits = train(*training_pictures(TRAIN_PICTURES, [seed, 2]), seed=seed, say=say)
    save_checkpoints(models, classifier, pre_logits)


# ---------------------------------------------------------------- the seeds and their verdicts

OWN = {"report.md", "miniature.json"}  # what DIR holds beside its seed-<s> folders


def seed_folder(root, seed):
    return Path(root) / f"seed-{seed}"


def foreign_files(root):
    """The names in root that are not the miniature's (seed-<s> folders, its page and record): another job's files."""
    root = Path(root)
    if not root.is_dir():
        return [root.name] if root.exists() else []
    return sorted(path.name for path in root.iterdir() if path.name not in OWN and not (
        path.is_dir() and path.name.startswith("seed-") and path.name[5:].isdigit()))


def seed_verdicts(root, seed):
    """{script: [own=True conclusion rows]} of one seed's job (a script with no record: its conclusions not run)."""
    rows = {}
    for script in SCRIPTS:
        record = read_record(seed_folder(root, seed) / "results" / f"{script}.json")
        rows[script] = judge(script, record["numbers"] if record else {},
                             record.get("setup differences", {}) if record else {}, own=True)[1]
    return rows


def across_seeds(rows):
    """The miniature's verdict on one conclusion from its own verdict on each seed's run (own=True rows): holds when
    it holds on every seed, fails when it fails on every seed, not run when a seed did not run it, else undecided."""
    words = {row["verdict"] for row in rows}
    return "not run" if "not run" in words else words.pop() if len(words) == 1 and words <= {"holds", "fails"} \
        else "undecided"


def combined(root, seeds):
    """[{script, says, article, verdict, depends, seeds: {seed: {verdict, evidence}}}] of every conclusion: the
    miniature's verdict across the seeds (across_seeds), and whether it reads a number of the model or its
    pictures (depends), not arithmetic alone."""
    each = {seed: seed_verdicts(root, seed) for seed in seeds}
    rows = []
    for script, first in each[seeds[0]].items():
        reference = load_reference(script)
        for k, row in enumerate(first):
            per_seed = {seed: each[seed][script][k] for seed in seeds}
            rows.append({"script": script, "says": row["says"], "article": row["article"],
                         "verdict": across_seeds(per_seed.values()),
                         "depends": any(reference[name]["kind"] != "nothing" for name in row["reads"]),
                         "seeds": {seed: {"verdict": one["verdict"], "evidence": one["evidence"],
                                          **({"pictures": one["pictures"]} if one.get("pictures") else {})}
                                   for seed, one in per_seed.items()}})
    return rows


def counts_line(rows):
    """'20 hold, 6 fail, 8 undecided, 0 not run (of 34; ...)' of the combined rows."""
    found = {word: sum(row["verdict"] == word for row in rows) for word in ("holds", "fails", "undecided", "not run")}
    decided = [row for row in rows if row["verdict"] in ("holds", "fails")]
    return (f"{found['holds']} hold, {found['fails']} fail, {found['undecided']} undecided, {found['not run']} not run "
            f"(of {len(rows)} conclusions; decided {len(decided)}, {sum(row['depends'] for row in decided)} of them on "
            f"numbers of the model or its pictures, the others arithmetic)")


def write_results(root, seeds, rows):
    """DIR/miniature.json (the combined verdicts, each seed's) and DIR/report.md (them as a page); their paths."""
    record = {"seeds": list(seeds), "commit": git_commit(), "counts": counts_line(rows), "conclusions": rows}
    lines = ["# The articles' conclusions on the miniature", "",
             (f"A ViT trained here on generated pictures whose class is where a blob is (job/miniature.py), on seeds "
              f"{', '.join(map(str, seeds))}. Against the articles' numbers every number of the model is not "
              f"comparable (its checkpoint and pictures are its own: each seed's page, seed-<s>/results/report.md). "
              f"On the miniature, each conclusion is judged on its own numbers, each accuracy a sample of its "
              f"generated pictures (Clopper-Pearson): it holds when it holds on every seed, fails when it fails on "
              f"every seed, and is undecided otherwise (docs/miniature.md)."), "",
             f"On the miniature: {counts_line(rows)}.", "",
             "| script | conclusion | on the miniature | " + " | ".join(f"seed {seed}" for seed in seeds) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in seeds) + " |"]
    for row in rows:
        cells = [f"{one['verdict']}: {one['evidence']}" for one in row["seeds"].values()]
        lines.append(f"| {script_file(row['script'])} | {cell(row['says'])} | {row['verdict']} | "
                     + " | ".join(map(cell, cells)) + " |")
    json_path = write_text(Path(root) / "miniature.json", json.dumps(record, indent=1), what="the miniature's record")
    return json_path, write_text(Path(root) / "report.md", "\n".join(lines) + "\n", what="the miniature's page")


def prepare(root, seed, say=print):
    """One seed's pictures and trained ViT in DIR/seed-<s>, each line named by the seed (run_seeds' child)."""
    def told(text):
        say(f"seed {seed}: {text}")

    build_pictures(seed_folder(root, seed), seed, told)
    build_checkpoints(seed_folder(root, seed), seed, told)
    return 0


def started(root, seed, its_job, env, say):
    """(process, its log or None, when it started): the seed's job (reproduce.py, its lines in DIR/seed-<s>/job.log),
    or its pictures and training (this script again, --prepare)."""
    if not its_job:
        command = [sys.executable, str(MINIATURE), str(root), "--seed", str(seed), "--prepare"]
        return start_script(command, env), None, time.perf_counter()
    folder = seed_folder(root, seed)
    log = open(folder / "job.log", "wb")  # noqa: SIM115 - open while the job runs
    process = start_script([sys.executable, str(REPRODUCE), str(folder / "results"), *job_flags(folder, seed)], env,
                           stdout=log, stderr=subprocess.STDOUT)
    say(f"seed {seed}: the job runs, its lines in {folder / 'job.log'}")
    return process, log, time.perf_counter()


def run_seeds(root, seeds, say=print):
    """Each seed's pictures and ViT (this script again, --prepare), then its job (reproduce.py), each a process of
    its own and of one thread, at most PROCESSES at once, a job before the next training; the jobs' statuses (a seed
    whose training failed: its status). Ctrl-C and SIGTERM are noted (StopRequests) and acted on between polls, so
    that no process started goes unseen: each one still running is sent SIGTERM and waited for."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    untrained, trained, running, statuses = list(seeds), [], {}, {}  # running: {seed: (process, job log, start)}
    with StopRequests() as stops:
        try:
            while (untrained or trained or running) and not stops.asked:
                while len(running) < PROCESSES and (untrained or trained) and not stops.asked:
                    its_job = bool(trained)  # a trained seed's job goes first
                    seed = (trained or untrained).pop(0)
                    running[seed] = started(root, seed, its_job, env, say)
                time.sleep(POLL_SECONDS)
                for seed, (process, log, begun) in list(running.items()):
                    status = process.poll()
                    if status is None:
                        continue
                    del running[seed]
                    if log is None and status == 0:
                        trained.append(seed)
                        continue
                    statuses[seed] = status
                    if log is None:
                        say(f"seed {seed}: its pictures and training ended with status {status} (its lines above)")
                    else:
                        log.close()
                        said = [text for text in Path(log.name).read_text(errors="replace").splitlines()
                                if text.startswith("error: ")]  # a refusal's own words, its fix, relayed
                        say(f"seed {seed}: the job ended with status {status} after "
                            f"{time.perf_counter() - begun:.0f} s" + (f"; it said: {said[-1]}" if said else ""))
        finally:  # each process still running (a stop, or an error here) saves and stops; the same command resumes
            for process, _, _ in running.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process, log, _ in running.values():
                process.wait()
                if log is not None:
                    log.close()
    if stops.asked:
        say(f"stopped: each seed's pictures, trained ViT and finished scripts are kept; the same command continues: "
            f"{shlex.join(['python', sys.argv[0], *sys.argv[1:]])}")
        raise KeyboardInterrupt if stops.asked[0] == signal.SIGINT else Terminated
    return statuses


def main(argv=None):
    parser = script_parser(__doc__)
    parser.add_argument("directory", type=nonempty_path, help="where each seed's pictures, ViT and job go "
                                                              "(DIR/seed-<s>), and the miniature's page, DIR/report.md")
    parser.add_argument("--seed", type=seed_number, default=0, help="the first seed (default: %(default)s)")
    parser.add_argument("--seeds", type=positive_int, default=SEEDS,
                        help="seeds, from --seed on, each a whole miniature (default: %(default)s)")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)  # run_seeds' child: one seed's
    args = parser.parse_args(argv)                                                  # pictures and ViT, no more
    root = Path(args.directory).expanduser()
    seeds = list(range(args.seed, args.seed + args.seeds))
    if seeds[-1] > 2**32 - 1:
        raise UserError(f"--seed {args.seed} --seeds {args.seeds} reaches seed {seeds[-1]}, past the last seed numpy "
                        f"and torch take ({2**32 - 1})")
    foreign = foreign_files(root)
    if foreign:
        raise UserError(f"{root} holds {', '.join(foreign[:3])}, which are not the miniature's: give a new or empty "
                        f"folder (the miniature writes DIR/seed-<s>/, DIR/report.md and DIR/miniature.json)")
    made_otherwise = other_recipe(root)
    if made_otherwise:
        raise UserError(f"{made_otherwise[0]} was made by another version of job/miniature.py (its {MINIATURE_MARK} "
                        f"names another recipe): give a new or empty folder, which this one fills from nothing")
    check_output(root, "DIRECTORY", folder=True)
    if args.prepare:
        return prepare(root, args.seed, say)
    from transformers.utils import logging

    logging.set_verbosity_error()  # the library's note that torchvision would serve the processor faster
    root.mkdir(parents=True, exist_ok=True)
    say(f"the miniature in {root}, seeds {', '.join(map(str, seeds))}: a ViT trained here on generated pictures; its "
        f"numbers are its own, the articles' do not apply (docs/miniature.md)")
    statuses = run_seeds(root, seeds, say)
    rows = combined(root, seeds)
    json_path, page = write_results(root, seeds, rows)
    print("\nthe articles' conclusions on the miniature (each on every seed; docs/miniature.md):")
    for row in rows:
        print(f"  {row['verdict']}: {row['says']}")
    print(f"on the miniature: {counts_line(rows)}")
    print(f"page: {page}; record: {json_path}; "
          f"each seed's own page: {seed_folder(root, seeds[0]) / 'results' / 'report.md'}")
    failed = [seed for seed, status in statuses.items() if status]
    if failed:
        again = shlex.join(["python", sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
        print(f"seed(s) {', '.join(map(str, failed))} did not finish (the lines above say which step and why; a "
              f"job's last lines are in DIR/seed-<s>/job.log): do what they say, then the same command continues: "
              f"{again}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
