"""reproduce.py: the five scripts as one resumable job, on stand-ins the tests build.

One job is shared by the tests that need scripts to run (they take most of this file's time): run
offline with nothing, then with the stand-ins, stopped by SIGTERM during the third script, then the
same command to the end. The variants (a second call, a JSON removed) run on copies of its folder. Everything else calls the job's pure
functions with inputs whose answers are worked out here by hand.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from conftest import ROOT

import reproduce
import vit_backbone
import vit_part3_fewshot
import vit_part3_finetune
import vit_part3_posemb
import vit_part3_setup
from common.cli import ScriptParser
from common.files import TEMP_PREFIX
from common.run import guarded
from common.standins import beans_folder, imagenette_folder, vit_classifier, vit_in21k

pytestmark = pytest.mark.xdist_group("reproduce")  # one worker runs the module and its shared job

MODULES = {"setup": vit_part3_setup, "posemb": vit_part3_posemb, "fewshot": vit_part3_fewshot,
           "finetune": vit_part3_finetune, "backbone": vit_backbone}
NAMES = {"setup": "vit_part3_setup.py", "posemb": "vit_part3_posemb.py", "fewshot": "vit_part3_fewshot.py",
         "finetune": "vit_part3_finetune.py", "backbone": "vit_backbone.py"}
VIT, IN21K = "google/vit-base-patch16-224", "google/vit-base-patch16-224-in21k"
VERDICTS = ["same", "close", "differs", "varies", "not comparable", "not run"]
# What makes each script fast on stand-ins (conftest's flags; fewshot draws 1 and 2 shots from 4 pictures a class,
# the backbone trains one epoch), and no feature cache in the repository's data/.
EXTRA = ["--extra", "posemb=--batch-size 16", "--extra", "fewshot=--no-cache --shots 1 2",
         "--extra", "finetune=--resolution 32 --steps 6 --batch-size 8",
         "--extra", "backbone=--batch-size 4 --probe-epochs 20 --epochs 1 --no-cache"]


@pytest.fixture(scope="module")
def job_standins(tmp_path_factory):
    """Checkpoints laid out by Hub id (a 48-px classifier, the smallest posemb's neighbours allow, serves posemb and
    the backbone), an Imagenette-shaped folder and a beans-shaped one."""
    root = tmp_path_factory.mktemp("reproduce-job_standins")
    vit_classifier(root / "models" / VIT, image_size=48, processor=True)
    vit_in21k(root / "models" / IN21K)
    return {"models": root / "models", "nette": imagenette_folder(root / "nette", per_class=4),
            "beans": beans_folder(root / "beans")}


def job_flags(job_standins):
    return ["--models", str(job_standins["models"]), "--imagenette", str(job_standins["nette"]), "--beans",
            str(job_standins["beans"]), "--device", "cpu", *EXTRA]


def reproduce_run(out, flags):
    done = subprocess.run([sys.executable, "reproduce.py", str(out), *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def job(job_standins, tmp_path_factory):
    """One job as a reader meets it: offline with nothing (setup runs, the four others are named), then with the
    stand-ins, stopped by SIGTERM as the third script starts, then the same command to the end."""
    out = tmp_path_factory.mktemp("job") / "results"
    offline = reproduce_run(out, ["--device", "cpu"])  # conftest: HF_HUB_OFFLINE=1 and an empty Hugging Face cache
    after_offline = {"json": sorted(path.name for path in out.glob("*.json")), "page": (out / "report.md").read_text()}
    flags = job_flags(job_standins)
    with open(out.parent / "stopped.out", "w+") as stdout:
        running = subprocess.Popen([sys.executable, "reproduce.py", str(out), *flags], cwd=ROOT, stdout=stdout,
                                   stderr=subprocess.PIPE, text=True)
        seen = []
        for text in running.stderr:
            seen.append(text)
            if text.startswith("[3/5]"):
                running.send_signal(signal.SIGTERM)
                break
        seen += running.stderr.readlines()
        status = running.wait(timeout=300)
        stdout.seek(0)
        stopped = (status, stdout.read(), "".join(seen))
    after_stop = {path.name: path.read_bytes() for path in out.glob("*.json")}
    return {"out": out, "flags": flags, "offline": offline, "after offline": after_offline, "stopped": stopped,
            "after stop": after_stop, "finished": reproduce_run(out, flags)}


def verdict_counts_of(record):
    """Each verdict's count from the comparison the script itself wrote into its JSON (--compare)."""
    return [sum(row["verdict"] == word for row in record["comparison"]) for word in VERDICTS]


def table_rows(stdout):
    """{script file: [cells]} of the final table's lines."""
    rows = {}
    for text in stdout.splitlines():
        cells = [cell.strip() for cell in text.split(" | ")]
        if len(cells) == 9 and cells[0] in NAMES.values():
            rows[cells[0]] = cells
    return rows


def no_temporary_files(folder):
    return not [path for path in Path(folder).rglob(f"{TEMP_PREFIX}*")]


# ---------------------------------------------------------------- the whole job, stopped and continued

def test_sigterm_during_the_third_script_stops_the_job_with_one_line(job):
    status, _, err = job["stopped"]
    assert status == 143 and "[1/5] vit_part3_setup.py: skipped" in err  # run offline before, with the same command
    continues = shlex.join(["python", "reproduce.py", str(job["out"]), *job["flags"]])
    stopped = [text for text in err.splitlines() if text.startswith("stopped by SIGTERM")]
    assert stopped == [("stopped by SIGTERM during vit_part3_fewshot.py, after it saved what it could; the same "
                        f"command continues the job: {continues}")]
    assert sorted(job["after stop"]) == ["posemb.json", "reproduce.json", "setup.json"]  # none half-written
    assert "Traceback" not in err


def test_the_same_command_then_finishes_with_the_first_two_skipped(job):
    status, out, err = job["finished"]
    assert status == 0, err[-3000:]
    for index, script in enumerate(["setup", "posemb"], 1):
        assert f"[{index}/5] {NAMES[script]}: skipped, its JSON in OUT is complete" in err
        assert (job["out"] / f"{script}.json").read_bytes() == job["after stop"][f"{script}.json"]
    for index, script in enumerate(["fewshot", "finetune", "backbone"], 3):
        assert re.search(rf"^\[{index}/5\] {NAMES[script]} \.\.\. about .* left in the job \(estimate\)$", err, re.MULTILINE)
        assert re.search(rf"^{NAMES[script]}: \d+ s, \d+ of \d+ sections; ", out, re.MULTILINE)
    assert no_temporary_files(job["out"])


def test_the_whole_job_gives_five_json_files_the_page_and_the_table(job):
    _, out, _ = job["finished"]
    folder = job["out"]
    rows = table_rows(out)
    assert list(rows) == list(NAMES.values())
    for script, module in MODULES.items():
        record = json.loads((folder / f"{script}.json").read_text())
        assert record["script"] == script and record["flags"]["compare"]
        assert not record["could_not_run"]
        sections = len(module.SECTIONS)
        assert rows[NAMES[script]][1:8] == [f"{sections} of {sections}", *map(str, verdict_counts_of(record))]
        assert (folder / "logs" / f"{script}.log").stat().st_size > 0
    page = (folder / "report.md").read_text()
    assert out.rstrip().endswith(f"page: {folder / 'report.md'}")
    assert all(f"## {name}" in page for name in NAMES.values()) and "Not run." not in page
    assert (folder / "finetune-run" / "checkpoint.pt").is_file()


def test_the_job_draws_the_figures_of_its_page(job):
    pytest.importorskip("matplotlib")
    from PIL import Image

    page = (job["out"] / "report.md").read_text()
    linked = re.findall(r"\]\(figures/([^)]+\.png)\)", page)
    assert {"posemb_cosine_similarity.png", "posemb_accuracy.png", "fewshot_accuracy.png",
            "finetune_curves.png"} <= set(linked)
    for name in linked:
        with Image.open(job["out"] / "figures" / name) as picture:
            picture.verify()
            assert picture.format == "PNG"


def test_a_second_call_skips_all_five(job, tmp_path):
    out = shutil.copytree(job["out"], tmp_path / "results")
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    status, stdout, err = reproduce_run(out, job["flags"])
    assert status == 0, err[-3000:]
    for index, name in enumerate(NAMES.values(), 1):
        assert f"[{index}/5] {name}: skipped" in err
    assert " ... about " not in err and "time: about" not in err  # nothing to run, nothing measured
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before
    assert all(cells[8].startswith("skipped (") for cells in table_rows(stdout).values())


def test_one_json_removed_only_that_script_runs_again_and_fine_tuning_resumes(job, tmp_path):
    out = shutil.copytree(job["out"], tmp_path / "results")
    removed = json.loads((out / "finetune.json").read_text())
    (out / "finetune.json").unlink()
    status, _, err = reproduce_run(out, job["flags"])
    assert status == 0, err[-3000:]
    started = re.findall(r"^\[(\d)/5\] (\S+) \.\.\. about", err, re.MULTILINE)
    assert started == [("4", "vit_part3_finetune.py")]
    assert sum(": skipped, its JSON" in text for text in err.splitlines()) == 4
    again = json.loads((out / "finetune.json").read_text())
    assert again["flags"]["resume"] and not removed["flags"]["resume"]
    assert "resumed from" in (out / "logs" / "finetune.log").read_text()
    # the resumed run ends with the uninterrupted run's numbers: the logged steps and both final accuracies
    trained = [name for name in removed["numbers"] if re.fullmatch(r"step \d+ (lr|loss|norm|accuracy)", name)]
    for name in trained + ["step 0 validation", "average accuracy", "last accuracy"]:
        assert again["numbers"][name]["value"] == removed["numbers"][name]["value"], name


def test_offline_with_nothing_setup_runs_and_the_four_others_are_named_once(job):
    status, out, err = job["offline"]
    assert status == 1
    lines = (out + err).splitlines()
    needs = {"posemb": VIT, "fewshot": IN21K, "finetune": IN21K, "backbone": VIT}
    for script, checkpoint in needs.items():
        named = [text for text in lines if text.startswith(f"cannot run {NAMES[script]}:")]
        assert len(named) == 1 and f"{checkpoint} (346 MB)" in named[0] and "HF_HUB_OFFLINE=1" in named[0], named
    assert "AI-Lab-Makerere/beans (180 MB)" in next(text for text in lines if text.startswith("cannot run vit_backbone"))
    rows = table_rows(out)
    assert rows["vit_part3_setup.py"][1] == f"{len(vit_part3_setup.SECTIONS)} of {len(vit_part3_setup.SECTIONS)}"
    for script in needs:
        assert rows[NAMES[script]][1] == f"0 of {len(MODULES[script].SECTIONS)}"
    assert job["after offline"]["json"] == ["reproduce.json", "setup.json"]
    assert job["after offline"]["page"].count("Not run.") == 4


# ---------------------------------------------------------------- one source of truth (the README's tables:
# tests/test_readme.py)

def test_the_flags_and_sections_the_job_knows_are_the_scripts_own(monkeypatch):
    class Parsed(Exception):
        pass

    def capture(parser, argv=None, namespace=None):
        raise Parsed(parser)

    monkeypatch.setattr(ScriptParser, "parse_args", capture)
    for script, module in MODULES.items():
        with pytest.raises(Parsed) as parsed:
            module.main([])
        flags = {flag for flag in parsed.value.args[0]._option_string_actions if flag.startswith("--")}
        assert reproduce.SCRIPT_FLAGS[script] == flags - {"--help"}, script
        assert reproduce.SECTION_COUNTS[script] == len(module.SECTIONS), script


# ---------------------------------------------------------------- the pieces, by hand

def namespace(**flags):
    base = {"quick": False, "device": None, "precision": None, "models": None, "imagenette": None, "beans": None,
            "force": False, "strict": False, "extra": {script: [] for script in NAMES}}
    return Namespace(**{**base, **flags})


def test_each_script_gets_its_flags(tmp_path):
    models = tmp_path / "models"
    (models / IN21K).mkdir(parents=True)  # no copy of google/vit-base-patch16-224: posemb and backbone keep their own
    out = tmp_path / "out"
    args = namespace(quick=True, device="cpu", precision="bf16", models=str(models), imagenette="/data/nette",
                     beans="/data/beans", extra={**{s: [] for s in NAMES}, "fewshot": ["--no-cache"]})
    python, outputs = [sys.executable], ["--plots", str(out / "figures"), "--compare"]
    assert reproduce.script_command("setup", args, out) == python + ["vit_part3_setup.py", "--json",
                                                                      str(out / "setup.json"), "--compare"]
    assert reproduce.script_command("posemb", args, out) == python + [
        "vit_part3_posemb.py", "--per-class", "20", "--data-dir", "/data/nette", "--device", "cpu", "--precision",
        "bf16", "--json", str(out / "posemb.json"), *outputs]
    assert reproduce.script_command("fewshot", args, out) == python + [
        "vit_part3_fewshot.py", "--per-class", "20", "--model", str(models / IN21K), "--data-dir", "/data/nette",
        "--device", "cpu", "--precision", "bf16", "--no-cache", "--json", str(out / "fewshot.json"), *outputs]
    assert reproduce.script_command("finetune", args, out, resume=True) == python + [
        "vit_part3_finetune.py", "--pause-at", "1", "--model", str(models / IN21K), "--data-dir", "/data/nette",
        "--device", "cpu", "--precision", "bf16", "--save-dir", str(out / "finetune-run"), "--resume", "--json",
        str(out / "finetune.json"), *outputs]
    assert reproduce.script_command("backbone", namespace(beans="/data/beans"), out) == python + [
        "vit_backbone.py", "--data-dir", "/data/beans", "--json", str(out / "backbone.json"), *outputs]


def test_a_quick_check_of_fine_tuning_is_continued_by_the_full_run(tmp_path):
    """--pause-at aside, the quick and the full fine-tuning are one run: the full job resumes the quick one's step."""
    out = tmp_path / "out"
    quick = reproduce.script_command("finetune", namespace(quick=True), out)
    full = reproduce.script_command("finetune", namespace(), out)
    assert reproduce.command_key(quick, out) != reproduce.command_key(full, out)
    assert reproduce.checkpoint_key(quick, out) == reproduce.checkpoint_key(full, out) == [
        "python", "vit_part3_finetune.py", "--save-dir", "OUT/finetune-run", "--json", "OUT/finetune.json",
        "--plots", "OUT/figures", "--compare"]
    extra = {"finetune": ["--pause-at=2"]}  # the flag's other spelling, through --extra
    assert reproduce.checkpoint_key(reproduce.script_command("finetune", namespace(extra=extra), out), out) == \
        reproduce.checkpoint_key(full, out)


@pytest.mark.parametrize("change,complete", [
    (None, True),
    ("could not run", False),      # a section could not run: it runs again
    ("other command", False),      # made with other flags
    ("other code", False),         # made by other code
    ("rewritten", False),          # another run wrote over the JSON since
    ("no manifest", False),        # a JSON from the manual commands: the job cannot know what made it
])
def test_a_script_is_skipped_only_when_its_json_is_complete_and_made_by_the_same_command_and_code(
        tmp_path, change, complete):
    record = {"script": "posemb", "numbers": {}, "could_not_run": []}
    if change == "could not run":
        record["could_not_run"] = [{"section": "4. accuracy", "why": "offline"}]
    path = tmp_path / "posemb.json"
    path.write_text(json.dumps(record))
    key = {"command": ["python", "vit_part3_posemb.py", "--compare"], "code": "abc"}
    import hashlib

    entry = {"key": dict(key), "json": hashlib.sha256(path.read_bytes()).hexdigest()}
    if change == "other command":
        entry["key"]["command"] = ["python", "vit_part3_posemb.py", "--per-class", "20", "--compare"]
    if change == "other code":
        entry["key"]["code"] = "abd"
    if change == "rewritten":
        path.write_text(json.dumps(record) + " ")
    manifest = {} if change == "no manifest" else {"posemb": entry}
    assert reproduce.is_complete(tmp_path, "posemb", key, manifest) is complete


def test_the_code_of_a_script_follows_its_imports():
    posemb = {str(path.relative_to(ROOT)) for path in reproduce.code_files("posemb")}
    assert {"vit_part3_posemb.py", "common/position_table.py", "common/loader.py", "common/files.py"} <= posemb
    assert not {"common/standins.py", "common/reproduction_page.py", "vit_part3_setup.py"} & posemb
    setup = {str(path.relative_to(ROOT)) for path in reproduce.code_files("setup")}
    assert {"common/compute.py", "common/schedules.py"} <= setup and "common/position_table.py" not in setup


def test_the_estimate_scales_the_readme_times_then_corrects_them_by_the_finished_scripts():
    reference = {"gflops": 100, "seconds": {"setup": 10, "posemb": 1000, "fewshot": 200, "finetune": 600,
                                            "backbone": 400}}
    everything = list(NAMES)
    # twice as fast a machine: half of 10 + 1000 + 200 + 600 + 400
    assert reproduce.estimate_seconds(everything, reference, 200, {}) == pytest.approx(1105)
    # posemb took 750 s where 500 were estimated: what is left, (200 + 600 + 400) / 2, takes 1.5 times as long
    left = ["fewshot", "finetune", "backbone"]
    assert reproduce.estimate_seconds(left, reference, 200, {"setup": 50, "posemb": 750}) == pytest.approx(900)
    # setup's time is start-up, no measure of the device: it corrects nothing
    assert reproduce.estimate_seconds(left, reference, 200, {"setup": 50}) == pytest.approx(600)
    assert reproduce.estimate_seconds(left, reference, None, {}) == pytest.approx(1200)  # nothing measured


def test_offline_a_script_lacking_a_piece_is_named_and_online_each_download_is_listed_once():
    pieces = list(reproduce.PIECES)
    nothing_here = dict.fromkeys(pieces, False)
    downloads, cannot = reproduce.plan_pieces(list(NAMES), nothing_here, dict.fromkeys(pieces, False))
    assert downloads == [] and cannot == {"posemb": [VIT, "Imagenette"], "fewshot": [IN21K, "Imagenette"],
                                          "finetune": [IN21K, "Imagenette"], "backbone": [VIT, "AI-Lab-Makerere/beans"]}
    downloads, cannot = reproduce.plan_pieces(list(NAMES), nothing_here, dict.fromkeys(pieces, True))
    assert cannot == {} and downloads == ["microsoft/resnet-50", VIT, "Imagenette", IN21K, "AI-Lab-Makerere/beans"]
    here = {**nothing_here, VIT: True, "Imagenette": True}
    assert reproduce.plan_pieces(["posemb", "fewshot"], here, dict.fromkeys(pieces, False)) == ([], {"fewshot": [IN21K]})


def test_online_the_plan_lists_the_downloads_with_their_sizes_and_the_room(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reproduce, "hub_offline", lambda: False)
    monkeypatch.setattr(reproduce, "reachable", lambda host: True)
    monkeypatch.setattr(reproduce, "piece_is_here", lambda piece, args: False)
    reproduce.plan(namespace(), tmp_path, {})
    err = capsys.readouterr().err
    # 100 + 346 + 94 + 346 + 180 MB
    assert ("to download, once (the scripts keep them in the caches): microsoft/resnet-50 (100 MB), "
            f"{VIT} (346 MB), Imagenette (94 MB), {IN21K} (346 MB), AI-Lab-Makerere/beans (180 MB); 1.1 GB in all") in err
    assert re.search(r"^disk: about .* needed in .*: room enough$", err, re.MULTILINE)


@pytest.mark.parametrize("sections,differs,strict,status", [
    ((4, 4), 0, False, 0), ((4, 4), 3, False, 0), ((4, 4), 3, True, 1), ((3, 4), 0, False, 1), ((0, 4), 0, True, 1)])
def test_the_exit_status(sections, differs, strict, status):
    rows = {"setup": {"sections": (9, 9), "counts": {"differs": 0}},
            "posemb": {"sections": sections, "counts": {"differs": differs}}}
    assert reproduce.exit_status(rows, strict) == status


# ---------------------------------------------------------------- bad input: one line, before any work

@pytest.fixture
def places(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-config" / VIT).mkdir(parents=True)
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "nette" / "train").mkdir(parents=True)  # no val/
    for split in ("train", "val"):
        (tmp_path / "empty-nette" / split).mkdir(parents=True)  # no class folders
    return {"{empty}": str(tmp_path / "empty"), "{no config}": str(tmp_path / "no-config"),
            "{file}": str(tmp_path / "a-file"), "{missing}": str(tmp_path / "missing"),
            "{half nette}": str(tmp_path / "nette"), "{empty nette}": str(tmp_path / "empty-nette"),
            "{out}": str(tmp_path / "out")}


BAD = [
    (["--extra", "posemb"], "--extra 'posemb': write SCRIPT=FLAGS with SCRIPT one of setup, posemb"),
    (["--extra", "nosuch=--per-class 2"], "write SCRIPT=FLAGS"),
    (["--extra", "posemb=--per-clas 20"], "vit_part3_posemb.py has no flag --per-clas"),
    (["--extra", "setup=--device cpu"], "vit_part3_setup.py has no flag --device"),
    (["--extra", "finetune=--json x.json"], "--json is set by reproduce.py itself"),
    (["--extra", "finetune=--resume"], "--resume is set by reproduce.py itself"),
    (["--extra", "posemb=--per-class '20"], "No closing quotation"),
    (["--extra", "posemb=-h"], "vit_part3_posemb.py has no flag -h"),
    (["--models", "{missing}"], "--models {missing} is not a folder"),
    (["--models", "{file}"], "--models {file} is not a folder"),
    (["--models", "{empty}"], f"holds neither {VIT}/ nor {IN21K}/"),
    (["--models", "{no config}"], "has no config.json"),
    (["--imagenette", "{missing}"], "--imagenette {missing} has no train/ and val/ folders"),
    (["--imagenette", "{half nette}"], "--imagenette {half nette} has no train/ and val/ folders"),
    (["--imagenette", "{empty nette}"], "--imagenette {empty nette}: no class folders in {empty nette}/train"),
    (["--beans", "{empty}"], "--beans {empty} has no parquet files"),
    (["--beans", "{file}"], "--beans {file} has no parquet files"),
    (["--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    (["--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
    (["--quick", "two", "folders"], "unrecognized arguments: two folders"),
    (["--precision", "tf32", "--device", "cpu"], "--precision tf32 exists on NVIDIA GPUs only"),
]


@pytest.mark.parametrize("argv,says", BAD)
def test_a_bad_flag_or_path_is_one_line_before_any_work(places, capsys, argv, says):
    argv = [places.get(token, token) for token in argv]
    for key, value in places.items():
        says = says.replace(key, value)
    try:
        status = guarded(lambda: reproduce.main([places["{out}"], *argv]))
    except SystemExit as stopped:
        status = stopped.code
    err = capsys.readouterr().err
    errors = [text for text in err.splitlines() if text.startswith("error:")]
    assert status == 2 and len(errors) == 1 and says in errors[0], err
    assert "Traceback" not in err and not list(Path(places["{out}"]).glob("*.json"))


@pytest.mark.parametrize("extra,says", [
    ("finetune=--steps abc", "--extra for vit_part3_finetune.py: argument --steps: 'abc' is not a whole number"),
    ("fewshot=--shots 60", "--shots 60 is more than the pool of 50 per class"),
    ("posemb=--resolution 40", "--resolution 40"),  # the checkpoint's patch grid is checked too
])
def test_a_bad_extra_value_is_one_line_before_any_script_runs(job_standins, tmp_path, capsys, extra, says):
    """The values of --extra, and what each script checks of its whole command, are checked before the job: a typo
    found when fine-tuning starts would cost the scripts before it and move its checkpoint aside."""
    out = tmp_path / "out"
    status = guarded(lambda: reproduce.main([str(out), *job_flags(job_standins), "--extra", extra]))
    err = capsys.readouterr().err
    errors = [text for text in err.splitlines() if text.startswith("error:")]
    assert status == 2 and len(errors) == 1 and says in errors[0], err
    assert "[1/5]" not in err and not list(out.glob("*.json")) and not list((out / "logs").iterdir())


def test_a_second_job_on_the_same_out_is_one_line(tmp_path, capsys):
    fcntl = pytest.importorskip("fcntl")
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    with open(out / ".reproduce.lock", "a") as held:  # the first job
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert guarded(lambda: reproduce.main([str(out), "--quick"])) == 2
    assert capsys.readouterr().err.strip() == (f"error: another reproduce.py is running on {out}: wait for it, or "
                                               f"give this one another OUT")
    assert not (out / "reproduce.json").exists()


@pytest.mark.parametrize("files,stale", [
    ({}, True),                                          # no page yet
    ({"report.md": 1, "posemb.json": 2}, True),          # a JSON newer than the page: it was never built from it
    ({"posemb.json": 1, "report.md": 2}, False),
    ({"report.md": 2}, False),
])
def test_the_page_is_built_again_when_a_json_is_newer(tmp_path, files, stale):
    for name, second in files.items():
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, ns=(second * 10**9, second * 10**9))
    assert reproduce.page_is_stale(tmp_path / "report.md", tmp_path) is stale


def test_out_that_is_a_file_is_refused(places, capsys):
    assert guarded(lambda: reproduce.main([places["{file}"]])) == 2
    assert capsys.readouterr().err.strip() == (f"error: OUT {places['{file}']} is a file, not a folder: pass a folder, "
                                               f"which is created if needed")


def test_too_little_room_on_the_disk_is_refused_before_any_work(job_standins, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reproduce.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 0))
    status = guarded(lambda: reproduce.main([str(tmp_path / "out"), *job_flags(job_standins)]))
    err = capsys.readouterr().err
    assert status == 2 and "error: not enough room on the disk of " in err and "0 MB is free" in err
    assert not (tmp_path / "out" / "reproduce.json").exists() and not list((tmp_path / "out" / "logs").iterdir())


@pytest.mark.parametrize("resumes,files,needed_mb", [
    (True, {}, 6.0),  # no checkpoint yet: the weights (1 MB), their average and the momentum, twice while one is saved
    (True, {"checkpoint.pt": 2.5}, 3.5),  # resumed: the run's saves overwrite it
    (False, {"checkpoint.pt": 2.5}, 6.0),  # kept aside: its room stays taken
    (False, {"checkpoint.pt": 2.5, "checkpoint.previous.pt": 1.5}, 4.5),  # ... in the place of the one kept before
    (False, {"checkpoint.previous.pt": 1.5}, 6.0),  # no checkpoint to move: the one kept before stays
])
def test_the_room_for_fine_tunings_checkpoint_counts_what_is_overwritten_and_what_is_kept(tmp_path, resumes, files,
                                                                                          needed_mb):
    models, out = tmp_path / "models", tmp_path / "out"
    (models / IN21K).mkdir(parents=True)
    (models / IN21K / "model.safetensors").write_bytes(bytes(10**6))
    (out / "finetune-run").mkdir(parents=True)
    for name, mb in files.items():
        (out / "finetune-run" / name).write_bytes(bytes(int(mb * 10**6)))
    need = reproduce.room_needed([], out, True, namespace(models=str(models)), resumes)
    assert need == {out: pytest.approx(needed_mb)}


@pytest.mark.parametrize("made_by_this_command,kept", [(True, False), (False, True)])
def test_a_checkpoint_of_another_command_is_kept_aside_not_deleted(tmp_path, capsys, made_by_this_command, kept):
    """A checkpoint this command made is resumed; one made otherwise (other flags or code) may hold hours of training:
    it is moved to checkpoint.previous.pt, with a line saying so, and the run starts afresh."""
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    checkpoint = out / "finetune-run" / "checkpoint.pt"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"weights")
    args, keys = namespace(), {"finetune": {"code": "code digest"}}
    made_by = {"command": reproduce.checkpoint_key(reproduce.script_command("finetune", args, out), out),
               "code": "code digest"}
    manifest = {"finetune checkpoint": made_by if made_by_this_command else {**made_by, "code": "other code"}}
    command = reproduce.prepare("finetune", args, out, keys, manifest)
    assert ("--resume" in command) is made_by_this_command
    assert checkpoint.is_file() is made_by_this_command
    previous = checkpoint.with_name("checkpoint.previous.pt")
    assert previous.is_file() is kept and (not kept or previous.read_bytes() == b"weights")
    assert ("starts afresh" in capsys.readouterr().err) is kept
