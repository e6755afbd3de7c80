"""job/miniature.py's pieces, small: pictures whose class is where the blob is, checkpoints in the Hub's layout that
the scripts' own loaders read, and the job's flags pointing at them. The whole miniature and its time are
benchmarks/miniature.py's, not a test's."""
import json
import math
import os
import signal

import numpy as np
import pytest
from PIL import Image

from common.data import CLASSES, list_split
from common.start_and_end import Terminated
from compare.marks import MINIATURE_MARK
from job import miniature

os.environ["HF_HUB_OFFLINE"] = "1"  # conftest sets it too: nothing here may reach the Hub


def blob_at(picture):
    """(x, y) of the blob a picture shows, found from its pixels alone: the centre of its brightest pixels."""
    brightness = np.asarray(picture, dtype=np.float32).min(axis=2)  # the blob is bright in every channel
    y, x = np.nonzero(brightness >= np.percentile(brightness, 99.5))
    return x.mean(), y.mean()


# The layout's rule as docs/miniature.md states it, written here: the miniature only draws each blob in its region.
def imagenette_class(centre):
    """Imagenette's class of a blob centred at (x, y): twice its band of 5, plus 1 when it is out at a side."""
    x, y = centre
    side = miniature.PICTURE_SIDE
    return 2 * int(y * 5 // side) + int(abs(x - side / 2) >= side / 4)


def beans_class(centre):
    """Beans' class of a blob centred at (x, y): which third of the height it is in."""
    return int(centre[1] * 3 // miniature.PICTURE_SIDE)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The Imagenette and beans folders, 2 training and 1 validation picture of each class."""
    root = tmp_path_factory.mktemp("miniature")
    miniature.imagenette_folder(root / "imagenette", counts={"train": 2, "val": 1})
    miniature.beans_folder(root / "beans", counts={"train": 2, "validation": 1, "test": 1})
    return root


def test_a_pictures_class_is_where_its_blob_is_and_a_flip_keeps_it():
    rng = np.random.default_rng(7)
    for label in range(len(CLASSES)):
        for _ in range(5):
            picture, centre = miniature.imagenette_picture(rng, label)
            found = blob_at(picture)
            assert imagenette_class(centre) == label
            assert imagenette_class(found) == label, (label, centre, found)
            assert imagenette_class(blob_at(picture[:, ::-1])) == label  # fine-tuning's flips
    for label in range(3):
        picture, centre = miniature.beans_picture(rng, label)
        assert beans_class(blob_at(picture)) == beans_class(centre) == label


def test_the_folders_are_in_imagenettes_and_beans_layouts_and_their_pictures_keep_their_class(folders):
    import vit_backbone as beans

    items = list_split(folders / "imagenette", "val")
    assert len(items) == 10 and {path.parent.name for path, _ in items} == {wnid for wnid, _, _ in CLASSES}
    for path, label in items:  # the loader's label is the folder's class; the JPEG's blob says the same
        assert path.suffix == ".JPEG" and imagenette_class(blob_at(Image.open(path).convert("RGB"))) == label
    data = beans.read_beans(str(folders / "beans"))
    assert data["train"].features["labels"].names == list(miniature.BEANS_CLASSES)
    for row in data["validation"]:
        assert beans_class(blob_at(row["image"].convert("RGB"))) == row["labels"]
    assert all((folders / name / MINIATURE_MARK).is_file() for name in ("imagenette", "beans"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The two checkpoints of a ViT trained for 2 steps on 16 pictures (the layout, not the learning)."""
    models = tmp_path_factory.mktemp("models")
    classifier, pre_logits = miniature.train(*miniature.training_pictures(16, seed=0), steps=2, say=lambda text: None)
    return models, miniature.save_checkpoints(models, classifier, pre_logits), classifier


def test_the_checkpoints_load_as_the_scripts_load_the_hubs(checkpoints):
    import torch
    from transformers import AutoImageProcessor, ViTForImageClassification, ViTModel

    import vit_part3_posemb
    from common.pretrained import load_pretrained

    models, saved, trained = checkpoints
    assert saved["vit"] == models / miniature.VIT and saved["in21k"] == models / miniature.IN21K
    classifier = load_pretrained(ViTForImageClassification, str(saved["vit"]))
    assert classifier.config.num_labels == 1000 and classifier.config.image_size == miniature.IMAGE_SIZE
    vit_part3_posemb.check_resolution(classifier.config, miniature.HIGHER_RESOLUTION)  # 8 x 8 to 15 x 15
    processor = AutoImageProcessor.from_pretrained(saved["vit"])
    assert processor.size["height"] == miniature.IMAGE_SIZE
    body, info = load_pretrained(ViTModel, str(saved["in21k"]), add_pooling_layer=True, output_loading_info=True)
    assert not info["missing_keys"] and "id2label" not in json.loads((saved["in21k"] / "config.json").read_text())
    for name, value in trained.vit.state_dict().items():  # one body, two releases
        assert torch.equal(body.state_dict()[name], value), name
    assert all((saved[key] / MINIATURE_MARK).is_file() for key in saved)


def test_the_jobs_flags_point_at_the_miniature(folders, checkpoints, tmp_path):
    import reproduce

    root = folders
    (root / "models").symlink_to(checkpoints[0], target_is_directory=True)
    args = reproduce.parse_flags([str(tmp_path / "results"), *miniature.job_flags(root)])
    out = tmp_path / "results"
    commands = {script: reproduce.script_command(script, args, out) for script in ("posemb", "fewshot", "finetune",
                                                                                    "backbone")}
    for script, command in commands.items():
        model = miniature.VIT if script in ("posemb", "backbone") else miniature.IN21K
        data = root / ("beans" if script == "backbone" else "imagenette")
        assert command[command.index("--model") + 1] == str((root / "models").resolve() / model)
        assert command[command.index("--data-dir") + 1] == str(data.resolve())
        assert command[command.index("--device") + 1] == "cpu"
    assert commands["posemb"][commands["posemb"].index("--resolution") + 1] == str(miniature.HIGHER_RESOLUTION)


def test_the_page_says_first_that_a_run_on_the_miniature_has_numbers_of_its_own(tmp_path):
    from job import page

    marked, results = miniature.mark(tmp_path / "imagenette"), tmp_path / "results"
    results.mkdir()
    record = {"format": 1, "script": "posemb",
              "flags": {"model": "google/vit-base-patch16-224", "data_dir": str(marked)}, "numbers": {},
              "environment": {}, "printed": [], "series": {}, "passes": {}, "could_not_run": []}
    (results / "posemb.json").write_text(json.dumps(record))
    paragraphs = page.build(results, say=lambda text: None).read_text().split("\n\n")
    assert paragraphs[1].startswith("**A miniature, its numbers its own**: vit_part3_posemb.py ran on a ViT trained "
                                    "here on generated pictures")
    assert "| `vit_part3_posemb.py` | our bilinear loop is SciPy's resize, to float64 round-off | not run; on the " \
           "miniature: not run |" in "\n\n".join(paragraphs)  # each conclusion judged on its own numbers too
    (marked / MINIATURE_MARK).unlink()
    assert "miniature" not in page.build(results, say=lambda text: None).read_text()


# ---------------------------------------------------------------- the command's bad input, refused before training

def foreign_file(root):
    (root / "notes.txt").write_text("another job's")


def old_layout(root):
    (root / "results").mkdir()
    (root / "results" / "reproduce.json").write_text("{}")


def other_recipe(root):  # a seed folder of an earlier job/miniature.py: its mark names no recipe or another
    (root / "seed-0" / "beans").mkdir(parents=True)
    (root / "seed-0" / "beans" / MINIATURE_MARK).write_text("Generated by job/miniature.py: ...\nrecipe: blobs of "
                                                            "radius 5 to 10 px, 6 px inside their regions\n")


BAD_INPUT = [
    (["--seeds", "0"], None, "argument --seeds: '0' is not a whole number of at least 1"),
    (["--seed", "x"], None, "argument --seed: 'x' is not a seed"),
    (["--seed", "-1"], None, "argument --seed: '-1' is not a seed"),
    (["--seed", str(2**32 - 1), "--seeds", "2"], None, "reaches seed 4294967296, past the last seed"),
    ([], foreign_file, "holds notes.txt, which are not the miniature's: give a new or empty folder"),
    ([], old_layout, "holds results, which are not the miniature's"),
    ([], other_recipe, "beans was made by another version of job/miniature.py (its MINIATURE.txt names another"),
]


@pytest.mark.parametrize("flags,prepare,said", BAD_INPUT, ids=[said[:40] for _, _, said in BAD_INPUT])
def test_a_bad_flag_or_folder_is_one_line_before_any_training(flags, prepare, said, tmp_path, capsys):
    from conftest import script_output

    from common.start_and_end import guarded

    root = tmp_path / "mini"
    root.mkdir()
    if prepare:
        prepare(root)
    before = sorted(root.iterdir())
    status, _, err = script_output(lambda argv: guarded(lambda: miniature.main(argv)), [str(root), *flags], capsys)
    assert status == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert sorted(root.iterdir()) == before  # nothing made, nothing trained


def test_a_file_where_the_folder_goes_is_refused(tmp_path, capsys):
    from conftest import script_output

    from common.start_and_end import guarded

    (tmp_path / "mini").write_text("a file")
    status, _, err = script_output(lambda argv: guarded(lambda: miniature.main(argv)), [str(tmp_path / "mini")], capsys)
    assert status == 2 and "holds mini, which are not the miniature's" in err


class Ending:
    """A started process that ends with `status` at its `polls`-th poll."""

    def __init__(self, polls, status):
        self.polls, self.status = polls, status

    def poll(self):
        self.polls -= 1
        return None if self.polls > 0 else self.status

    def send_signal(self, signum):
        self.polls, self.status = 0, 128 + signum

    def wait(self):
        return self.status


def test_the_seeds_train_side_by_side_then_their_jobs_run_and_a_failed_training_is_that_seeds_status(tmp_path,
                                                                                                    monkeypatch):
    """run_seeds with PROCESSES 3 on 4 seeds, each process ending at its own poll: seeds 0 to 2 train at once; a
    trained seed's job starts before the next seed's training; seed 1's training fails, so it gets no job and its
    status is that training's; never more than 3 processes at once."""

    polls = {("train", 0): 2, ("train", 1): 3, ("train", 2): 6, ("train", 3): 2}  # a job ends at its 4th poll
    started, alive = [], []

    def start(command, env, **popen):
        what = "train" if "--prepare" in command else "job"
        seed = int(command[command.index("--seed") + 1] if what == "train" else command[2].rsplit("seed-", 1)[1][0])
        alive[:] = [process for process in alive if process.polls > 0]
        started.append((what, seed, len(alive)))  # what started, and how many processes it joined
        alive.append(Ending(polls.get((what, seed), 4), 1 if (what, seed) == ("train", 1) else 0))
        return alive[-1]

    monkeypatch.setattr(miniature, "start_script", start)
    monkeypatch.setattr(miniature, "PROCESSES", 3)
    monkeypatch.setattr(miniature, "POLL_SECONDS", 0)
    for seed in range(4):
        (tmp_path / f"seed-{seed}").mkdir()
    said = []
    statuses = miniature.run_seeds(tmp_path, [0, 1, 2, 3], said.append)
    assert started == [("train", 0, 0), ("train", 1, 1), ("train", 2, 2), ("job", 0, 2), ("train", 3, 2),
                       ("job", 3, 2), ("job", 2, 1)]
    assert statuses == {0: 0, 1: 1, 2: 0, 3: 0}
    assert "seed 1: its pictures and training ended with status 1 (its lines above)" in said


def test_a_job_that_refused_is_relayed_with_its_own_words(tmp_path, monkeypatch):
    """A seed's job refused in one line (its record edited by hand): the seed's line says that line, its fix
    included, where it said only the status; the job's other lines stay in its log."""
    def start(command, env, **popen):
        if "--prepare" in command:
            return Ending(1, 0)
        popen["stdout"].write(b"[1/5] vit_part3_setup.py ...\n"
                              b"error: OUT/reproduce.json cannot be read (x): restore it\n")
        popen["stdout"].flush()
        return Ending(1, 2)

    monkeypatch.setattr(miniature, "start_script", start)
    monkeypatch.setattr(miniature, "POLL_SECONDS", 0)
    (tmp_path / "seed-0").mkdir()
    said = []
    assert miniature.run_seeds(tmp_path, [0], said.append) == {0: 2}
    assert said[-1].startswith("seed 0: the job ended with status 2 after ")
    assert said[-1].endswith("; it said: error: OUT/reproduce.json cannot be read (x): restore it")


@pytest.mark.parametrize("signum,raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_stop_while_a_training_starts_stops_every_process_started_and_says_how_to_continue(signum, raised, tmp_path,
                                                                                           monkeypatch):
    """Ctrl-C or SIGTERM arriving as the second training starts (start_script lets it in as it returns): both
    trainings started are sent SIGTERM and waited for, no job starts, and the last line says the same command
    continues; then Ctrl-C is KeyboardInterrupt (status 130) and SIGTERM Terminated (143), as guarded() reads them."""

    started = []

    def start(command, env, **popen):
        started.append(Ending(10, 0))
        if len(started) == 2:
            os.kill(os.getpid(), signum)
        return started[-1]

    monkeypatch.setattr(miniature, "start_script", start)
    monkeypatch.setattr(miniature, "PROCESSES", 3)
    monkeypatch.setattr(miniature, "POLL_SECONDS", 0)
    said, before = [], signal.getsignal(signal.SIGINT)  # SIG_IGN where the tests run in the background (`make test &`)
    with pytest.raises(raised):
        miniature.run_seeds(tmp_path, [0, 1, 2], said.append)
    assert [process.status for process in started] == [128 + signal.SIGTERM] * 2
    assert said[-1].startswith("stopped: each seed's pictures, trained ViT and finished scripts are kept; the same "
                               "command continues: ")
    assert signal.getsignal(signal.SIGINT) is before  # the handlers it set for the trainings are taken away


def test_the_seeds_verdicts_combine_on_every_seed_and_the_page_shows_each(tmp_path, monkeypatch):
    """Two seeds' records, one conclusion apart: it holds on one seed and fails on the other, so it is undecided; the
    others agree. The page and the record say so, with each seed's numbers."""
    from compare.verdicts import judge

    def seed_rows(root, seed):
        rows = {"finetune": judge("finetune", {}, own=True)[1]}
        for k, row in enumerate(rows["finetune"]):
            rows["finetune"][k] = {**row, "verdict": "holds", "evidence": f"seed {seed}'s numbers"}
        rows["finetune"][0]["verdict"] = "holds" if seed == 0 else "fails"
        return rows

    monkeypatch.setattr(miniature, "seed_verdicts", seed_rows)
    rows = miniature.combined(tmp_path, [0, 1])
    assert [row["verdict"] for row in rows] == ["undecided"] + ["holds"] * 11
    assert rows[0]["seeds"] == {0: {"verdict": "holds", "evidence": "seed 0's numbers"},
                                1: {"verdict": "fails", "evidence": "seed 1's numbers"}}
    assert rows[1]["depends"] is False and rows[2]["depends"] is True  # no gradient into the body: arithmetic alone
    json_path, page = miniature.write_results(tmp_path, [0, 1], rows)
    assert json.loads(json_path.read_text())["conclusions"][0]["verdict"] == "undecided"
    text = page.read_text()
    assert "| vit_part3_finetune.py | with the zero head the first loss is ln 10: ten equal scores, a probability of " \
           "0.1 each | undecided | holds: seed 0's numbers | fails: seed 1's numbers |" in text
    assert "On the miniature: 11 hold, 0 fail, 1 undecided, 0 not run (of 12 conclusions; decided 11, " in text


# ---------------------------------------------------------------- the maths, broken one piece at a time

@pytest.fixture(scope="module")
def trained_miniature(tmp_path_factory):
    """A miniature ViT trained as job/miniature.py trains it, shorter (150 of its 450 steps, on 1,000 of its 4,000
    pictures: every picture of a batch right by then), its folders of 60 training and 10 validation pictures a class,
    and each script's own verdicts on it with the maths intact."""
    root = tmp_path_factory.mktemp("trained-miniature")
    miniature.imagenette_folder(root / "imagenette", counts={"train": 60, "val": 10}, seed=[0, 0])
    pictures, labels = miniature.training_pictures(1000, [0, 2])
    miniature.save_checkpoints(root / "models", *miniature.train(pictures, labels, steps=150, say=lambda text: None))
    return {"root": root, "intact": {script: own_verdicts(script, root, root / "intact") for script in PIECES_RUN}}


def own_verdicts(script, root, out):
    """{conclusion: verdict} of one script run on the trained miniature, judged on its own numbers."""
    from compare.verdicts import judge

    out.mkdir(parents=True, exist_ok=True)
    main, argv = PIECES_RUN[script]
    path = out / f"{script}.json"
    main([*(token.format(root=root, out=out) for token in argv), "--json", str(path)])
    record = json.loads(path.read_text())
    return {row["says"]: row["verdict"] for row in judge(script, record["numbers"], record["setup differences"],
                                                         own=True)[1]}


def run_main(name):
    def main(argv):
        import importlib

        from common.start_and_end import guarded

        return guarded(lambda: importlib.import_module(name).main(argv))
    return main


IN21K_FLAGS = ["--model", "{root}/models/" + miniature.IN21K, "--data-dir", "{root}/imagenette", "--device", "cpu",
               "--resolution", str(miniature.IMAGE_SIZE)]
PIECES_RUN = {  # each script's run on the trained miniature, the job's flags for it (job/miniature.py's JOB_EXTRA)
    "setup": (run_main("vit_part3_setup"), []),
    "posemb": (run_main("vit_part3_posemb"), ["--model", "{root}/models/" + miniature.VIT, "--data-dir",
                                              "{root}/imagenette", "--device", "cpu", "--resolution",
                                              str(miniature.HIGHER_RESOLUTION)]),
    "fewshot": (run_main("vit_part3_fewshot"), [*IN21K_FLAGS, "--no-cache"]),
    "finetune": (run_main("vit_part3_finetune"), [*IN21K_FLAGS, "--check-per-class", "10", "--pause-at", "5",
                                                  "--save-dir", "{out}/finetune-run"]),
}


def transposed_stretch(monkeypatch):
    import vit_part3_posemb

    loop = vit_part3_posemb.bilinear_resize_loop
    monkeypatch.setattr(vit_part3_posemb, "bilinear_resize_loop", lambda grid, n: loop(grid, n).transpose(1, 0, 2))


def no_warmup(monkeypatch):
    import vit_part3_finetune

    monkeypatch.setattr(vit_part3_finetune, "lr_at", lambda step, lr, steps: lr / 2 * (1 + math.cos(
        math.pi * (step - 1) / steps)))


def random_zero_head(monkeypatch):
    import vit_part3_finetune

    def random(model):
        vit_part3_finetune.random_head(model, 1)
        return model.classifier.weight.numel() + model.classifier.bias.numel()

    monkeypatch.setattr(vit_part3_finetune, "zero_head", random)


def lambda_dropped(monkeypatch):
    import vit_part3_fewshot

    solve = vit_part3_fewshot.closed_form
    monkeypatch.setattr(vit_part3_fewshot, "closed_form",
                        lambda features, labels, classes, lam, bias=True: solve(features, labels, classes, 0.0, bias))


def no_class_token(monkeypatch):
    import vit_part3_setup

    def without(resolution, patch):
        grid = resolution // patch
        return grid, grid * grid, grid * grid, (grid * grid) ** 2

    monkeypatch.setattr(vit_part3_setup, "sequence_shape", without)


# (the piece of the maths, how it is broken, the script that runs it, the conclusions whose verdict on the miniature
# it must change; docs/miniature.md lists the same)
PIECES = [
    ("the 2D stretch", transposed_stretch, "posemb", ["the 1D stretch is a disaster"]),
    ("the warm-up", no_warmup, "finetune", ["while after 5 steps the loss has barely left ln 10"]),
    ("the zero head", random_zero_head, "finetune", ["with the zero head the first loss is ln 10",
                                                     "the zero head sends exactly no gradient"]),
    ("the ridge's lambda", lambda_dropped, "fewshot", ["in the example by hand"]),
    ("the class token's count", no_class_token, "setup", ["the extra over 4 comes from attention"]),
]


@pytest.mark.parametrize("piece,breaking,script,moved", PIECES, ids=[piece for piece, _, _, _ in PIECES])
def test_a_broken_piece_of_the_maths_changes_a_verdict_on_the_miniature(piece, breaking, script, moved,
                                                                       trained_miniature, monkeypatch, tmp_path):
    """Each piece broken alone, the script run again on the same trained miniature: the conclusions that rest on it
    are no longer judged as with the maths intact."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    breaking(monkeypatch)
    broken = own_verdicts(script, trained_miniature["root"], tmp_path)
    intact = trained_miniature["intact"][script]
    changed = [says for says in intact if broken[says] != intact[says]]
    for start in moved:
        says = next(says for says in intact if says.startswith(start))
        assert says in changed, (piece, says, intact[says], broken[says])


def test_the_docs_tables_are_two_runs_of_the_current_rules_and_the_second_seed_set_flips_no_verdict():
    """docs/miniature.md's table is the two seed sets' records beside it (docs/miniature-seeds-<s>.json, each
    written by `python job/miniature.py DIR --seed s`): every current rule, in order; at least 48 decided in each
    (the aim); no conclusion that holds on one seed set fails on the other."""
    from conftest import ROOT

    from compare.verdicts import judge
    from job.page import cell
    from job.scripts import SCRIPTS, script_file

    runs = [json.loads((ROOT / "docs" / f"miniature-seeds-{seed}.json").read_text()) for seed in (0, 1000)]
    rules = [(script, row["says"]) for script in SCRIPTS for row in judge(script, {})[1]]
    for run, seed in zip(runs, (0, 1000), strict=True):
        assert run["seeds"] == [seed, seed + 1, seed + 2]
        assert [(row["script"], row["says"]) for row in run["conclusions"]] == rules
        assert sum(row["verdict"] in ("holds", "fails") for row in run["conclusions"]) >= 48
    first, second = (run["conclusions"] for run in runs)
    pairs = list(zip(first, second, strict=True))
    assert [a["says"] for a, b in pairs if {a["verdict"], b["verdict"]} == {"holds", "fails"}] == []
    doc = (ROOT / "docs" / "miniature.md").read_text()
    for a, b in zip(first, second, strict=True):
        assert f"| {script_file(a['script'])} | {cell(a['says'])} | {a['verdict']} | {b['verdict']} |" in doc, a["says"]
    assert all(f"seeds {', '.join(map(str, run['seeds']))}: {run['counts']}" in doc for run in runs)


@pytest.mark.parametrize("seeds,expected", [
    (["holds", "holds", "holds"], "holds"), (["fails", "fails", "fails"], "fails"),
    (["holds", "fails", "holds"], "undecided"), (["holds", "undecided", "holds"], "undecided"),
    (["undecided"] * 3, "undecided"), (["holds", "not run", "holds"], "not run"),
])
def test_across_seeds_a_conclusion_holds_or_fails_only_when_every_seed_agrees(seeds, expected):
    assert miniature.across_seeds([{"verdict": word} for word in seeds]) == expected
