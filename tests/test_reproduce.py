"""reproduce.py: the five scripts as one resumable job, on stand-ins the tests build.

One job is shared by the tests that need scripts to run (they take most of this file's time): run
offline with nothing, then with the stand-ins, stopped by SIGTERM during the third script, then the
same command to the end. The variants (a second call, a JSON removed, a SIGKILL of the job's process
group) run on copies of its folder. Everything else calls the job's pure functions with inputs whose
answers are worked out here by hand.
"""
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, libraries_mapped, wait_until

import reproduce
import vit_backbone
import vit_part3_fewshot
import vit_part3_finetune
import vit_part3_posemb
import vit_part3_setup
from common import start_and_end
from common.files import TEMP_PREFIX
from common.run import ScriptParser
from common.start_and_end import Terminated, UserError, guarded
from compare.record import RECORD_FORMAT
from job import child_process, commands, downloads, ending, environment, resuming, standins
from job.scripts import PAGE_WRITES_MB, SCRIPTS
from job.time_estimate import clock, estimate_seconds

MODULES = {"setup": vit_part3_setup, "posemb": vit_part3_posemb, "fewshot": vit_part3_fewshot,
           "finetune": vit_part3_finetune, "backbone": vit_backbone}
NAMES = {"setup": "vit_part3_setup.py", "posemb": "vit_part3_posemb.py", "fewshot": "vit_part3_fewshot.py",
         "finetune": "vit_part3_finetune.py", "backbone": "vit_backbone.py"}
VIT, IN21K = "google/vit-base-patch16-224", "google/vit-base-patch16-224-in21k"
VERDICTS = ["same", "close", "differs", "undecided", "varies", "not comparable", "not run"]


def sections_of(module):
    """How many sections the script's main() runs: its functions named section_*, found by inspect (the job reads
    them from the source)."""
    return sum(name.startswith("section_") and function.__module__ == module.__name__
               for name, function in inspect.getmembers(module, inspect.isfunction))


@pytest.fixture(scope="module")
def job_standins(tmp_path_factory):
    """What `python job/standins.py DIR` builds: checkpoints laid out by Hub id, Imagenette- and beans-shaped
    folders."""
    return standins.job_inputs(tmp_path_factory.mktemp("reproduce-job_standins"))


def job_flags(job_standins):
    """The local copies and what makes each script fast on them (standins.JOB_EXTRA), as the stand-ins' job has."""
    return standins.job_flags(job_standins)


def reproduce_run(out, flags, python=()):
    done = subprocess.run([sys.executable, *python, "reproduce.py", str(out), *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    return done.returncode, done.stdout, done.stderr


# reproduce.py run as `python reproduce.py` runs it, each script it starts said with the job's threads at that moment
COUNTING_THREADS = """import os, runpy, sys
from job.environment import one_thread
one_thread()  # reproduce.py's first step, before numpy loads: this wrapper loads it first
import job.child_process as child_process
start_script = child_process.start_script
def counted(*args, **kwargs):
    if os.path.isdir("/proc/self/task"):  # Linux's list of a process's threads
        print(f"job threads: {len(os.listdir('/proc/self/task'))}", file=sys.stderr, flush=True)
    return start_script(*args, **kwargs)
child_process.start_script = counted
sys.argv = sys.argv[1:]
runpy.run_path("reproduce.py", run_name="__main__")
"""


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
            "after stop": after_stop, "finished": reproduce_run(out, flags, ["-c", COUNTING_THREADS])}


def verdict_counts_of(record):
    """Each verdict's count from the comparison the script itself wrote into its JSON (--compare)."""
    return [sum(row["verdict"] == word for row in record["comparison"]) for word in VERDICTS]


def table_rows(stdout):
    """{script file: [cells]} of the final table's lines."""
    rows = {}
    for text in stdout.splitlines():
        cells = [cell.strip() for cell in text.split(" | ")]
        if len(cells) == 10 and cells[0] in NAMES.values():
            rows[cells[0]] = cells
    return rows


def no_temporary_files(folder):
    return not [path for path in Path(folder).rglob(f"{TEMP_PREFIX}*")]


def test_under_dist_loadgroup_the_tests_of_the_job_are_one_group(request, job_standins):
    """The tests of the job share it only on one worker: xdist marks each test's id with its group (conftest's
    SHARED_RUNS). pytest 9.2 with pytest-xdist 3.8 lost the mark (pytest-xdist#1386), and each worker built the job
    (the suite took 400 s)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by `pytest -n N --dist loadgroup`")
    assert request.node.nodeid.endswith("@reproduce")


# ---------------------------------------------------------------- the whole job, stopped and continued

def test_sigterm_during_the_third_script_stops_the_job_with_one_line(job):
    status, _, err = job["stopped"]
    assert status == 143 and "[1/5] vit_part3_setup.py: skipped" in err  # run offline before, with the same command
    continues = shlex.join(["python", "reproduce.py", str(job["out"]), *job["flags"]])
    stopped = [text for text in err.splitlines() if text.startswith("stopped by SIGTERM")]
    assert stopped == [("stopped by SIGTERM during vit_part3_fewshot.py, which saved nothing; the same command "
                        f"continues the job: {continues}")]
    assert sorted(job["after stop"]) == ["posemb.json", "reproduce.json", "setup.json"]  # none half-written
    assert "Traceback" not in err


def test_the_same_command_then_finishes_with_the_first_two_skipped(job):
    status, out, err = job["finished"]
    assert status == 0, err[-3000:]
    for index, script in enumerate(["setup", "posemb"], 1):
        assert f"[{index}/5] {NAMES[script]}: skipped, its JSON in OUT is complete" in err
        assert (job["out"] / f"{script}.json").read_bytes() == job["after stop"][f"{script}.json"]
    for index, script in enumerate(["fewshot", "finetune", "backbone"], 3):  # --extra: no estimate
        assert re.search(rf"^\[{index}/5\] {NAMES[script]} \.\.\.$", err, re.MULTILINE)
        assert re.search(rf"^{NAMES[script]}: \d+\.\d s \(its process's wall time\), \d+ of \d+ sections; ", out,
                         re.MULTILINE)
    assert ("time: not estimated, --extra changes the work of vit_part3_fewshot.py, vit_part3_finetune.py, "
            "vit_backbone.py") in err and "left in the job" not in err
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
        sections = sections_of(module)
        cells = [*rows[NAMES[script]][1:8], rows[NAMES[script]][8].split(" [")[0]]  # a footnote says why not run
        assert cells == [f"{sections} of {sections}", *map(str, verdict_counts_of(record))]
        log = (folder / "logs" / f"{script}.log").read_bytes()
        assert log and b"\r" not in log  # each progress bar's final state, not its redraws
    page = (folder / "report.md").read_text()
    assert f"page: {folder / 'report.md'}" in out.splitlines() and "next:" not in out
    assert all(f"## {name}" in page for name in NAMES.values()) and "Not run" not in page
    assert (folder / "finetune-run" / "checkpoint.pt").is_file()


def test_the_page_of_a_job_on_stand_ins_says_first_that_its_numbers_mean_nothing(job):
    paragraphs = (job["out"] / "report.md").read_text().split("\n\n")
    assert paragraphs[0] == "# The two articles' numbers, reproduced"
    assert paragraphs[1].startswith("**The numbers of vit_part3_posemb.py, vit_part3_fewshot.py, "
                                    "vit_part3_finetune.py, vit_backbone.py mean nothing**: they ran on generated "
                                    "stand-ins")


def test_the_page_names_paths_inside_out_relative_to_it_and_flags_a_user_can_type(job, tmp_path):
    """A folder copied elsewhere reads the same; `--resume True` is no flag."""
    page = (job["out"] / "report.md").read_text()
    assert str(job["out"]) not in page
    flags = next(text for text in page.splitlines() if text.startswith("- flags: `--model") and "--save-dir" in text)
    assert "--save-dir finetune-run " in flags and "--plots figures" in flags and " True" not in flags


def test_every_file_of_the_job_has_the_mode_the_umask_gives(job):
    umask = os.umask(0)
    os.umask(umask)
    modes = {str(path.relative_to(job["out"])): oct(path.stat().st_mode & 0o777)
             for path in job["out"].rglob("*") if path.is_file()}
    assert len(modes) > 15 and set(modes.values()) == {oct(0o666 & ~umask)}, modes


def test_the_disk_estimate_counts_every_file_the_job_wrote(job):
    """Measured on the stand-ins: what OUT holds after the whole job is at most what its first call said it needs."""
    _, _, err = job["offline"]
    _, _, stopped = job["stopped"]
    said = re.search(r"^disk: about (\d+) MB needed in (\S+), ", stopped, re.MULTILINE)
    assert said and said[2] == str(job["out"])
    written = sum(path.stat().st_size for path in job["out"].rglob("*") if path.is_file())
    assert written / 1e6 <= int(said[1]) + 1  # the offline call's setup.json was written before it
    offline = re.search(r"^disk: about (\d+) MB needed in (\S+), ", err, re.MULTILINE)  # setup's files and the page
    assert offline and int(offline[1]) == SCRIPTS["setup"]["writes MB"] + PAGE_WRITES_MB


def test_the_job_draws_the_figures_of_its_page(job):
    pytest.importorskip("matplotlib")
    from PIL import Image

    page = (job["out"] / "report.md").read_text()
    linked = re.findall(r"\]\(figures/([^)]+\.png)\)", page)
    assert {"posemb_cosine_similarity.png", "posemb_accuracy.png", "fewshot_accuracy.png", "finetune_curves.png",
            "backbone_curves.png", "backbone_feature_maps.png"} == set(linked)
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
    assert " ... about " not in err and "time: " not in err  # nothing to run, nothing measured
    after = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert out / ".reproduce.lock" not in before and out / ".reproduce.lock" not in after  # removed as each job ended
    assert after == before
    assert all(cells[9].startswith("skipped (") for cells in table_rows(stdout).values())


@pytest.mark.parametrize("page", ["", "# an older job's page\n"], ids=["emptied", "another run's, put back"])
def test_a_page_that_names_not_the_runs_of_the_jsons_is_built_again(job, tmp_path, page):
    """A page newer than every JSON but not theirs (an older page copied back, an emptied one): never announced as
    this run's; the job builds it again from the JSONs (helper-23's hunt)."""
    out = shutil.copytree(job["out"], tmp_path / "results")
    (out / "report.md").write_text(page)
    status, _, err = reproduce_run(out, job["flags"])
    assert status == 0, err[-3000:]
    runs = [json.loads((out / f"{script}.json").read_text())["environment"]["started"] for script in NAMES]
    assert all(f"- run: started {run}, " in (out / "report.md").read_text() for run in runs)


def test_sigterm_while_the_page_is_built_says_the_same_command_continues(job, tmp_path, monkeypatch, capsys):
    out = shutil.copytree(job["out"], tmp_path / "results")
    os.utime(out / "posemb.json")  # newer than the page: it is built again

    def stopped(folder, say):
        raise Terminated

    monkeypatch.setattr(reproduce, "build", stopped)
    assert guarded(lambda: reproduce.main([str(out), *job["flags"]])) == 143
    command = shlex.join(["python", "reproduce.py", str(out), *job["flags"]])
    assert capsys.readouterr().err.splitlines()[-1] == ("stopped by SIGTERM; the same command continues the job: "
                                                        f"{command}")


def test_a_force_job_stopped_at_its_first_script_has_set_every_result_aside(tmp_path, monkeypatch, capsys):
    """The command that continues a stopped job has no --force: the results of the scripts the stopped job had not
    reached, and fine-tuning's checkpoint, must be set aside already, or that command would skip and resume them."""
    out = tmp_path / "out"
    out.mkdir()
    for script in NAMES:
        (out / f"{script}.json").write_text("{}")
    resuming.write_manifest(out, {"finetune checkpoint": {"command": ["python"], "code": "x", "inputs": "y"}})

    def stopped(command, cwd, log_path, stop, lock, say):  # SIGTERM while setup runs
        stop.asked.append(signal.SIGTERM)
        return 143, 0.5, True

    monkeypatch.setattr(reproduce, "run_logged", stopped)
    assert guarded(lambda: reproduce.main([str(out), "--force", "--device", "cpu"])) == 143
    assert capsys.readouterr().err.splitlines()[-1].startswith("stopped by SIGTERM during vit_part3_setup.py")
    assert sorted(path.name for path in out.glob("*.json")) == ["reproduce.json"]
    assert sorted(path.name for path in (out / "logs").glob("*.previous.json")) == sorted(
        f"{script}.previous.json" for script in NAMES)
    assert "finetune checkpoint" not in json.loads((out / "reproduce.json").read_text())


def test_a_page_that_cannot_be_written_still_ends_with_the_reasons_and_what_to_do(job, tmp_path, monkeypatch, capsys):
    """OUT full while the page is written: the table, then why the page is missing and the command that writes it,
    status 1 (it returned at the error, without the footnotes and the next line)."""
    out = shutil.copytree(job["out"], tmp_path / "results")
    os.utime(out / "posemb.json")  # newer than the page: it is built again

    def full(folder, say):
        raise reproduce.UserError(f"cannot write report {folder / 'report.md'}: No space left on device")

    monkeypatch.setattr(reproduce, "build", full)
    assert guarded(lambda: reproduce.main([str(out), *job["flags"]])) == 1
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert f"page: not written: cannot write report {out / 'report.md'}: No space left on device" in lines
    assert lines[-1] == f"next: once {out} can be written, python -m job.page {out} writes the page"


def test_one_json_removed_only_that_script_runs_again_and_fine_tuning_resumes(job, tmp_path):
    out = shutil.copytree(job["out"], tmp_path / "results")
    removed = json.loads((out / "finetune.json").read_text())
    trained = json.loads((out / "reproduce.json").read_text())["finetune"]["seconds"]
    (out / "finetune.json").unlink()
    status, printed, err = reproduce_run(out, job["flags"])
    assert status == 0, err[-3000:]
    # its time: the run that trained and the one that finished from its checkpoint, together, on every clock
    total = json.loads((out / "reproduce.json").read_text())["finetune"]["seconds"]
    assert total > trained and (f"vit_part3_finetune.py: {clock(total)} (its processes' wall time, resumed after a "
                                "stop), ") in printed
    started = re.findall(r"^\[(\d)/5\] (\S+) \.\.\.", err, re.MULTILINE)
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
    assert "AI-Lab-Makerere/beans (180 MB)" in next(text for text in lines
                                                    if text.startswith("cannot run vit_backbone"))
    rows = table_rows(out)
    assert rows["vit_part3_setup.py"][1] == f"{sections_of(vit_part3_setup)} of {sections_of(vit_part3_setup)}"
    for script in needs:
        assert rows[NAMES[script]][1] == f"0 of {sections_of(MODULES[script])}"
    assert job["after offline"]["json"] == ["reproduce.json", "setup.json"]


def test_offline_the_last_lines_say_why_each_script_did_not_finish_and_the_command_to_run_next(job):
    """The reason for exit status 1 is the last thing at the terminal: each script's footnote in the words it was
    refused with before the job, then the run that works offline, then the same command to run next."""
    status, out, err = job["offline"]
    command = shlex.join(["python", "reproduce.py", str(job["out"]), "--device", "cpu"])
    last = out.rstrip().splitlines()[-6:]
    assert status == 1 and last[-1].startswith("next: with HF_HUB_OFFLINE unset") and last[-1].endswith(command)
    assert last[-2].startswith("offline meanwhile: python job/miniature.py DIR judges the articles' conclusions")
    rows = table_rows(out)
    for k, script in enumerate(("posemb", "fewshot", "finetune", "backbone"), 1):
        why = next(text for text in err.splitlines() if text.startswith(f"cannot run {NAMES[script]}: "))
        assert last[k - 1] == f"[{k}] {NAMES[script]}: not run: {why.split(': ', 1)[1]}"
        assert rows[NAMES[script]][8].endswith(f" [{k}]")  # the table's "not run" cell points to it


def test_one_clock_the_terminal_the_jobs_record_and_the_page_show_the_same_seconds(job):
    _, out, _ = job["finished"]
    record = json.loads((job["out"] / "reproduce.json").read_text())
    page = (job["out"] / "report.md").read_text()
    for script in ("fewshot", "finetune", "backbone"):  # the scripts this call ran
        seconds = record[script]["seconds"]
        said = re.search(rf"^{NAMES[script]}: ([\d.]+) s \(its process's wall time\)", out, re.MULTILINE)[1]
        assert float(said) == seconds and table_rows(out)[NAMES[script]][9].startswith(f"{seconds:.1f} s")
        summary = page.split(f"| {NAMES[script]} | ", 1)[1].split("\n", 1)[0]
        assert f" | {seconds:.1f} s" in summary and f", {seconds:.1f} s" in page.split(f"## {NAMES[script]}", 1)[1]


def test_offline_the_page_says_what_each_script_lacks_and_the_command_that_runs_it(job):
    page = job["after offline"]["page"]
    command = shlex.join(["python", "reproduce.py", str(job["out"]), "--device", "cpu"])
    for script, checkpoint in {"posemb": VIT, "fewshot": IN21K, "finetune": IN21K, "backbone": VIT}.items():
        paragraph = page.split(f"## {NAMES[script]}\n\n", 1)[1].split("\n", 1)[0]
        assert paragraph.startswith(f"Not run: {checkpoint} (346 MB) and ") and "HF_HUB_OFFLINE=1 forbids" in paragraph
        assert paragraph.endswith(f"Then the job's command runs it: `{command}`")


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
        assert set(commands.SET_BY_THE_JOB) - {"--plots"} <= flags, script
        assert ({"--device", "--precision", "--data-dir", "--plots"} <= flags) is (script != "setup"), script
        assert ending.section_count(script) == sections_of(module), script


# ---------------------------------------------------------------- the pieces, by hand

def namespace(**flags):
    base = {"quick": False, "device": None, "precision": None, "models": None, "imagenette": None, "beans": None,
            "force": False, "strict": False, "extra": {script: [] for script in NAMES}}
    return Namespace(**{**base, **flags})


def test_the_check_of_extra_moves_the_jobs_outputs_aside_but_not_the_pictures_kept_in_out(tmp_path):
    """--extra's check runs each command with its outputs in a scratch folder: pictures or a model kept inside OUT
    were moved there too, and refused as missing."""
    out = tmp_path / "out"
    args = namespace(imagenette=str(out / "nette"), models=str(out / "models"), extra={
        **{script: [] for script in NAMES}, "posemb": ["--per-class", "2"]})
    (out / "models" / VIT).mkdir(parents=True)
    moved = reproduce.outputs_moved(reproduce.script_command("posemb", args, out), out, "/scratch")
    assert moved[2:] == ["--model", str(out / "models" / VIT), "--data-dir", str(out / "nette"), "--per-class", "2",
                         "--json", "/scratch/posemb.json", "--plots", "/scratch/figures", "--compare"]
    given = ["python", "vit_backbone.py", f"--save-dir={out}/tuned", f"--save={out}/tuned", "--save-dir", f"{out}/t"]
    assert reproduce.outputs_moved(given, out, "/scratch")[2:] == [
        "--save-dir=/scratch/tuned", "--save=/scratch/tuned", "--save-dir", "/scratch/t"]


def test_the_backbones_save_dir_is_the_users_to_give_in_extra(tmp_path, monkeypatch):
    """The job sets fine-tuning's --save-dir (OUT/finetune-run), not the backbone's: its model is saved where asked,
    from where the job was started (the scripts run in the checkout)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    extra = reproduce.extra_flags(["backbone=--save-dir tuned --save-dir ~/runs"])
    assert extra["backbone"] == ["--save-dir", str(tmp_path / "tuned"), "--save-dir", str(tmp_path / "home" / "runs")]


def test_a_place_in_extra_is_read_from_where_the_job_was_started(tmp_path, monkeypatch):
    """--extra 'fewshot=--data-dir nette' names the folder beside the user, as OUT and --models do (the scripts run in
    the checkout, where it named nothing); a place there in the checkout alone is the checkout's, as the scripts read
    it (the job's key is then the same from any folder); a Hub id, or a place not there, is passed on as written."""
    (tmp_path / "nette").mkdir()
    (tmp_path / "models" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    extra = reproduce.extra_flags(["fewshot=--data-dir nette --shots 1", "posemb=--model models/mine",
                                   "backbone=--model google/vit-base-patch16-224 --data-dir elsewhere",
                                   "finetune=--data-dir ''",  # refused by the script's check: not the folder here
                                   "setup=--model=models/mine --data=nette --mod nette",  # as argparse reads them
                                   "fewshot=--model docs"])  # not beside the user: the checkout's

    assert extra["fewshot"] == ["--data-dir", str(tmp_path / "nette"), "--shots", "1", "--model", str(ROOT / "docs")]
    assert extra["posemb"] == ["--model", str(tmp_path / "models" / "mine")]
    assert extra["setup"] == [f"--model={tmp_path / 'models' / 'mine'}", f"--data={tmp_path / 'nette'}", "--mod",
                              str(tmp_path / "nette")]
    assert extra["backbone"] == ["--model", "google/vit-base-patch16-224", "--data-dir", "elsewhere"]
    assert extra["finetune"] == ["--data-dir", ""]


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
        "vit_part3_posemb.py", "--per-class", "5", "--data-dir", "/data/nette", "--device", "cpu", "--precision",
        "bf16", "--json", str(out / "posemb.json"), *outputs]
    assert reproduce.script_command("fewshot", args, out) == python + [
        "vit_part3_fewshot.py", "--per-class", "10", "--model", str(models / IN21K), "--data-dir", "/data/nette",
        "--device", "cpu", "--precision", "bf16", "--no-cache", "--json", str(out / "fewshot.json"), *outputs]
    assert reproduce.script_command("finetune", args, out, resume=True) == python + [
        "vit_part3_finetune.py", "--pause-at", "5", "--check-per-class", "5", "--model", str(models / IN21K),
        "--data-dir", "/data/nette", "--device", "cpu", "--precision", "bf16", "--save-dir", str(out / "finetune-run"),
        "--resume", "--json", str(out / "finetune.json"), *outputs]
    assert reproduce.script_command("backbone", namespace(beans="/data/beans"), out) == python + [
        "vit_backbone.py", "--data-dir", "/data/beans", "--json", str(out / "backbone.json"), *outputs]


def test_fine_tuning_continues_a_run_paused_with_the_same_flags_but_not_the_quick_check(tmp_path):
    """--pause-at aside, a paused run and its continuation are one run; the quick check, which checks 50 of the
    1,000 pictures, is not continued by the full job (its step-0 and step-5 rows would be of the smaller sample)."""
    out = tmp_path / "out"
    quick = reproduce.script_command("finetune", namespace(quick=True), out)
    full = reproduce.script_command("finetune", namespace(), out)
    assert resuming.checkpoint_key(quick, out) != resuming.checkpoint_key(full, out) == [
        "python", "vit_part3_finetune.py", "--save-dir", "OUT/finetune-run", "--json", "OUT/finetune.json",
        "--plots", "OUT/figures", "--compare"]
    for paused in (["--pause-at=2"], ["--pause-at", "7"], ["--pause", "4"], ["--pau=3"]):  # as argparse reads them
        command = reproduce.script_command("finetune", namespace(extra={"finetune": paused}), out)
        assert resuming.checkpoint_key(command, out) == resuming.checkpoint_key(full, out)


def test_the_estimate_scales_the_readme_times_then_corrects_them_by_the_finished_scripts():
    reference = {"gflops": 100, "seconds": {"setup": 10, "posemb": 1000, "fewshot": 200, "finetune": 600,
                                            "backbone": 400}}
    everything = list(NAMES)
    # twice as fast a machine: half of 10 + 1000 + 200 + 600 + 400
    assert estimate_seconds(everything, reference, 200, {}) == pytest.approx(1105)
    # posemb took 750 s where 500 were estimated: what is left, (200 + 600 + 400) / 2, takes 1.5 times as long
    left = ["fewshot", "finetune", "backbone"]
    assert estimate_seconds(left, reference, 200, {"setup": 50, "posemb": 750}) == pytest.approx(900)
    # setup's time is start-up, no measure of the device: it corrects nothing
    assert estimate_seconds(left, reference, 200, {"setup": 50}) == pytest.approx(600)
    assert estimate_seconds(left, reference, None, {}) == pytest.approx(1200)  # nothing measured


def test_offline_a_script_lacking_a_piece_is_named_and_online_each_download_is_listed_once():
    pieces = list(downloads.PIECES)
    nothing_here = dict.fromkeys(pieces, False)
    fetch, cannot = reproduce.plan_pieces(list(NAMES), nothing_here, dict.fromkeys(pieces, False))
    assert fetch == [] and cannot == {"posemb": [VIT, "Imagenette"], "fewshot": [IN21K, "Imagenette"],
                                          "finetune": [IN21K, "Imagenette"], "backbone": [VIT, "AI-Lab-Makerere/beans"]}
    fetch, cannot = reproduce.plan_pieces(list(NAMES), nothing_here, dict.fromkeys(pieces, True))
    assert cannot == {} and fetch == ["microsoft/resnet-50", VIT, "Imagenette", IN21K, "AI-Lab-Makerere/beans"]
    here = {**nothing_here, VIT: True, "Imagenette": True}
    assert reproduce.plan_pieces(["posemb", "fewshot"], here,
                                 dict.fromkeys(pieces, False)) == ([], {"fewshot": [IN21K]})
    given = {"fewshot": {IN21K, "Imagenette"}, "posemb": {"Imagenette"}}  # --extra's --model, --data-dir
    assert reproduce.plan_pieces(["posemb", "fewshot"], nothing_here,
                                 dict.fromkeys(pieces, False), given) == ([], {"posemb": [VIT]})


def test_a_model_or_data_folder_given_in_extra_is_here_for_its_script_alone(tmp_path):
    """Offline, with no --models nor --imagenette: a script whose --extra names its copies runs, the others lack."""
    nette, model = standins.imagenette_folder(tmp_path / "nette", per_class=1), tmp_path / "in21k"
    model.mkdir()
    args = namespace(extra={**{script: [] for script in NAMES},
                            "fewshot": ["--model", str(model), "--data-dir", str(nette)],
                            "finetune": ["--data-dir=" + str(nette)]})
    given = {script: reproduce.given_pieces(script, reproduce.script_command(script, args, tmp_path / "out"))
             for script in NAMES}
    assert given == {"setup": set(), "posemb": set(), "fewshot": {IN21K, "Imagenette"}, "finetune": {"Imagenette"},
                     "backbone": set()}


def test_online_the_plan_lists_the_downloads_with_their_sizes_and_the_room(tmp_path, monkeypatch):
    monkeypatch.setattr(downloads, "is_offline_mode", lambda: False)
    monkeypatch.setattr(downloads, "hub_reachable", lambda name, repo_type: True)
    monkeypatch.setattr(downloads, "reachable", lambda host: True)
    monkeypatch.setattr(downloads, "piece_is_here", lambda piece, args: False)
    lines = reproduce.plan(namespace(), tmp_path, {})[-1]
    # 100 + 346 + 99 + 346 + 180 MB
    assert lines[1] == ("to download, once (the scripts keep them in the caches): microsoft/resnet-50 (100 MB), "
                        f"{VIT} (346 MB), Imagenette (99 MB), {IN21K} (346 MB), AI-Lab-Makerere/beans (180 MB); 1.1 GB "
                        "in all")
    assert re.fullmatch(r"disk: about .* needed in .*: room enough", lines[-1]) and len(lines) == 3


@pytest.mark.parametrize("sections,differs,strict,status", [
    ((4, 4), 0, False, 0), ((4, 4), 3, False, 0), ((4, 4), 3, True, 1), ((3, 4), 0, False, 1), ((0, 4), 0, True, 1)])
def test_the_exit_status(sections, differs, strict, status):
    rows = {"setup": {"sections": (9, 9), "counts": {"differs": 0}},
            "posemb": {"sections": sections, "counts": {"differs": differs}}}
    assert ending.exit_status(rows, strict) == status


# ---------------------------------------------------------------- bad input: one line, before any work

@pytest.fixture
def places(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-config" / VIT).mkdir(parents=True)
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "nette" / "train").mkdir(parents=True)  # no val/
    for split in ("train", "val"):
        (tmp_path / "empty-nette" / split).mkdir(parents=True)  # no class folders
    (tmp_path / "locked" / ".reproduce.lock").mkdir(parents=True)  # a lock file that cannot be opened
    (tmp_path / "cluttered").mkdir()
    (tmp_path / "cluttered" / "finetune-run").write_text("where fine-tuning's --save-dir goes")
    (tmp_path / "cluttered-run" / "finetune-run" / "checkpoint.pt").mkdir(parents=True)
    (tmp_path / "json-folder" / "posemb.json").mkdir(parents=True)
    (tmp_path / "page-folder" / "report.md").mkdir(parents=True)
    (tmp_path / "json-pipe").mkdir()
    os.mkfifo(tmp_path / "json-pipe" / "backbone.json")
    (tmp_path / "record-pipe").mkdir()
    os.mkfifo(tmp_path / "record-pipe" / "reproduce.json")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "reproduce.json").write_text('{"setup": {"seconds": 13')  # cut short
    return {"{empty}": str(tmp_path / "empty"), "{no config}": str(tmp_path / "no-config"),
            "{file}": str(tmp_path / "a-file"), "{missing}": str(tmp_path / "missing"),
            "{half nette}": str(tmp_path / "nette"), "{empty nette}": str(tmp_path / "empty-nette"),
            "{out}": str(tmp_path / "out"), "{locked out}": str(tmp_path / "locked"),
            "{cluttered out}": str(tmp_path / "cluttered"), "{cluttered run}": str(tmp_path / "cluttered-run"),
            "{damaged out}": str(tmp_path / "damaged"),
            **{f"{{{name}}}": str(tmp_path / name)
               for name in ("json-folder", "page-folder", "json-pipe", "record-pipe")}}


BAD = [
    (["--extra", "posemb"], "--extra 'posemb': write SCRIPT=FLAGS with SCRIPT one of setup, posemb"),
    (["--extra", "nosuch=--per-class 2"], "write SCRIPT=FLAGS"),
    (["--extra", "posemb=--per-clss 20"], "--extra for vit_part3_posemb.py: unrecognized arguments: --per-clss 20"),
    (["--extra", "setup=--device cpu"], "--extra for vit_part3_setup.py: unrecognized arguments: --device cpu"),
    (["--extra", "finetune=--json x.json"], "--json is set by reproduce.py itself"),
    (["--extra", "finetune=--resume"], "--resume is set by reproduce.py itself"),
    (["--extra", "finetune=--resu"], "--resu is set by reproduce.py itself"),  # argparse would take it for --resume
    (["--extra", "finetune=--save-dir run"], "--save-dir is set by reproduce.py itself"),
    (["--extra", "posemb=--per-class '20"], "No closing quotation"),
    (["--extra", "posemb=-h"], "the job shows no script's help: python vit_part3_posemb.py -h"),
    (["--extra", "setup=--stepz 3"], "--extra for vit_part3_setup.py: unrecognized arguments: --stepz 3"),
    (["--extra", "finetune=--steps -5"],
     "--extra for vit_part3_finetune.py: argument --steps: '-5' is not a number of"),
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
    # a folder where the lock's file goes: OUT keeps it and gains nothing
    (["{locked out}"], ("the lock file {locked out}/.reproduce.lock cannot be opened (Is a directory): remove it, or "
                        "give this job another OUT")),
    (["{cluttered out}"], "{cluttered out}/finetune-run stands where the job writes its own: move it away"),
    (["{cluttered run}"], "{cluttered run}/finetune-run/checkpoint.pt stands where the job writes its own"),
    (["{json-folder}"], "{json-folder}/posemb.json stands where the job writes its own"),  # found at the script
    (["{page-folder}"], "{page-folder}/report.md stands where the job writes its own"),  # found at the end
    (["{json-pipe}"], "{json-pipe}/backbone.json stands where the job writes its own"),  # its reading never ended
    (["{record-pipe}"], "{record-pipe}/reproduce.json stands where the job writes its own"),
    # the record alone says which results are this command's: unreadable, it is not taken for "nothing done"
    (["{damaged out}"], "{damaged out}/reproduce.json cannot be read (Expecting"),
]


@pytest.mark.parametrize("argv,says", BAD)
def test_a_bad_flag_or_path_is_one_line_before_any_work(places, tmp_path, capsys, argv, says):
    """OUT is the entry's first token where that is a place, else {out}, which does not exist."""
    argv = [places.get(token, token) for token in (argv if argv[0] in places else ["{out}", *argv])]
    for key, value in places.items():
        says = says.replace(key, value)
    before = sorted(tmp_path.rglob("*"))
    try:
        status = guarded(lambda: reproduce.main(argv))
    except SystemExit as stopped:
        status = stopped.code
    err = capsys.readouterr().err
    errors = [text for text in err.splitlines() if text.startswith("error:")]
    assert status == 2 and len(errors) == 1 and says in errors[0], err
    assert "Traceback" not in err and sorted(tmp_path.rglob("*")) == before  # not even OUT, OUT/logs or its lock


@pytest.mark.parametrize("extra,says", [  # argparse's own refusals of --extra: test_bad_inputs ('--steps -5')
    ("posemb=--resolution 40", "--extra for vit_part3_posemb.py: --resolution 40"),  # the checkpoint's patch grid
    ("fewshot=--data-dir /no/such/dir", "--extra for vit_part3_fewshot.py: --data-dir /no/such/dir does not exist"),
])
def test_a_bad_extra_value_is_one_line_before_any_script_runs(job_standins, tmp_path, capsys, extra, says):
    """The values of --extra, and what each script checks of its whole command, are checked before the job: a typo
    found when fine-tuning starts would cost the scripts before it and move its checkpoint aside."""
    out = tmp_path / "out"
    status = guarded(lambda: reproduce.main([str(out), *job_flags(job_standins), "--extra", extra]))
    err = capsys.readouterr().err
    errors = [text for text in err.splitlines() if text.startswith("error:")]
    assert status == 2 and len(errors) == 1 and says in errors[0], err
    assert "[1/5]" not in err and not out.exists()  # no OUT, logs or lock: the refusal left nothing


def test_a_log_keeps_each_progress_bars_final_state_not_its_redraws():
    output = b"loading\n\rbar   0%|  | 0/2\rbar  50%|# | 1/2\rbar 100%|##| 2/2\ndone\r\n\rx 1/3\r      \rsaid\n"
    assert child_process.final_states(output) == b"loading\nbar 100%|##| 2/2\ndone\nsaid\n"


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


def test_a_new_job_waits_for_a_script_its_ended_job_left_running(tmp_path, capsys):
    """The lock outlives the job while a script it started lives (it inherits the lock's file): a new job whose
    lock file names a job that has ended waits for the script, then runs; one whose job runs is refused."""
    pytest.importorskip("fcntl")
    out = tmp_path / "out"
    out.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (out / child_process.LOCK).write_text(f"{gone} {child_process.pid_space()}")  # the job that took it has ended ...
    holds = ("import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
             "print('held', flush=True); time.sleep(2)")
    script = subprocess.Popen([sys.executable, "-c", holds, str(out / child_process.LOCK)], stdout=subprocess.PIPE,
                              text=True)
    assert script.stdout.readline() == "held\n"  # ... and a script of it still runs, 2 s more
    waited = time.perf_counter()
    lock = child_process.only_job_on(out, lambda text: print(text, file=sys.stderr))
    assert lock is not None and time.perf_counter() - waited > 1  # it waited for the script's end
    script.wait(timeout=60)
    assert "a script of an ended job still runs on" in capsys.readouterr().err
    assert (out / child_process.LOCK).read_text() == f"{os.getpid()} {child_process.pid_space()}\n"
    lock.close()


@pytest.mark.parametrize("users,calls,job_has,scripts_get", [(None, 1, "1", None), ("4", 1, "4", "4"),
                                                              (None, 2, "1", None)],
                         ids=["not set: one thread in the job alone", "the user's: kept for both",
                              "set by a first call (a wrapper's, before numpy loads): still the job's alone"])
def test_the_jobs_single_thread_setting_is_its_own(users, calls, job_has, scripts_get, monkeypatch):
    for name in (environment.SET_FOR_THE_JOB, "OPENBLAS_NUM_THREADS"):  # recorded, so that both are undone
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    if users is not None:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", users)
    for _ in range(calls):
        environment.one_thread()
    assert os.environ["OPENBLAS_NUM_THREADS"] == job_has
    given = environment.scripts_environment()
    assert given.get("OPENBLAS_NUM_THREADS") == scripts_get and environment.SET_FOR_THE_JOB not in given


@pytest.mark.parametrize("name,given,scripts_get", [
    ("HF_HOME", "hf", "{cwd}/hf"),  # the scripts run in the checkout: the same folder as the job's
    ("VIT_PART3_DATA", "../data", "{parent}/data"),
    ("HF_DATASETS_CACHE", "~/beans", "{home}/beans"),
    ("HF_HUB_CACHE", "/abs/hub", "/abs/hub"),
    ("XDG_CACHE_HOME", "", ""),  # empty: the libraries' default, kept as given
], ids=["HF_HOME relative", "VIT_PART3_DATA up a folder", "~ expanded", "absolute kept", "empty kept"])
def test_the_scripts_read_the_folders_the_job_reads(name, given, scripts_get, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(name, given)
    expected = scripts_get.format(cwd=tmp_path, parent=tmp_path.parent, home=tmp_path / "home")
    assert environment.scripts_environment()[name] == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_the_job_starts_each_script_from_a_process_of_one_thread(job):
    """No thread pool in the job (numpy's OpenBLAS held to one thread there alone, the speed probed in a process of
    its own): a fork from it copies one thread, and no lock another thread held."""
    _, _, err = job["finished"]
    counts = [line for line in err.splitlines() if line.startswith("job threads: ")]
    assert counts and set(counts) == {"job threads: 1"}, counts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_script_starts_without_a_preexec_fn_ctrl_c_held_and_the_jobs_pid_told(monkeypatch):
    """The job's process has threads (torch's): it forks with no Python to run in the child (no preexec_fn). The child
    starts with SIGINT blocked (its first line unblocks it) and JOB_PID set (it asks for SIGTERM as the job ends); the
    job's own signal mask is as before."""
    popen, calls = subprocess.Popen, []
    monkeypatch.setattr(subprocess, "Popen", lambda *args, **kwargs: calls.append(kwargs) or popen(*args, **kwargs))
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    probe = ("import os; blocked = int(next(line for line in open('/proc/self/status') if line.startswith('SigBlk'))"
             ".split()[1], 16); print(blocked >> (2 - 1) & 1, os.environ['VIT_PART3_JOB_PID'], os.getpgid(0) == "
             "os.getpid())")
    child = child_process.start_script([sys.executable, "-c", probe], dict(os.environ), stdout=subprocess.PIPE,
                                       text=True)
    printed = child.communicate(timeout=120)[0].split()
    assert printed == ["1", str(os.getpid()), "True"] and child.returncode == 0
    assert calls[0].get("preexec_fn") is None
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_no_script_outlives_its_job_killed_with_its_process_group(job, tmp_path):
    """A scheduler's SIGKILL of the job's process group: the script, in a group of its own, is sent SIGTERM as the
    job dies and ends; the lock it held is then free for the next job at once."""
    out = shutil.copytree(job["out"], tmp_path / "results")
    (out / "posemb.json").unlink()  # the job skips setup and runs posemb
    running = subprocess.Popen([sys.executable, "reproduce.py", str(out), *job["flags"]], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    with running.stderr:
        for text in running.stderr:
            if text.startswith("[2/5]"):
                break
        wait_until(lambda: proc_children(running.pid), running)  # vit_part3_posemb.py started
        scripts = proc_children(running.pid)
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
    assert len(scripts) == 1, scripts
    ended = time.monotonic() + 120  # a bound for a loaded machine, not a timing: the script saves nothing here
    while proc_alive(scripts[0]) and time.monotonic() < ended:
        time.sleep(0.05)
    assert not proc_alive(scripts[0]), scripts
    lock = child_process.only_job_on(out, print)  # no wait, no refusal
    assert lock is not None
    lock.close()


def proc_children(pid):
    return [child for child in os.listdir("/proc") if child.isdigit() and proc_parent(child) == pid]


def proc_parent(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def proc_alive(pid):
    """Running or asleep; a zombie has ended (nobody may be there to reap it in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads which libraries a process loaded in /proc")
@pytest.mark.parametrize("moment", ["at its first line", "while torch loads", "while the plan is made"])
def test_ctrl_c_while_the_job_starts_is_one_line(tmp_path, moment):
    """From reproduce.py's first line on, a Ctrl-C is `interrupted` and status 130, never a traceback. The job starts
    with SIGINT blocked, so that the first one is delivered exactly when that line unblocks it; the later ones wait
    for torch's library to be mapped, then for the plan's first line. Before the first line (the interpreter's own
    start) Python's KeyboardInterrupt is all there is: docs/reproduce.md says so."""
    held = {signal.SIGINT} if moment == "at its first line" else set()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)  # the job inherits it
    try:
        started = subprocess.Popen([sys.executable, "reproduce.py", str(tmp_path / "out")], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if moment == "while torch loads":
        wait_until(lambda: libraries_mapped(started.pid, "libtorch"), started)
    elif moment == "while the plan is made":
        assert started.stderr.readline().startswith("reproduce.py: ")
    started.send_signal(signal.SIGINT)
    _, err = started.communicate(timeout=120)
    assert started.returncode == 130 and "Traceback" not in err and err.strip(), err


def test_device_cuda_without_a_gpu_is_refused_before_the_plan(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    assert guarded(lambda: reproduce.main([str(tmp_path / "out"), "--device", "cuda"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cuda" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("json_written,checkpoint,saved", [
    (False, None, "which saved nothing"),                      # a double Ctrl-C: nothing saved
    (False, "before", "which saved nothing"),                  # the checkpoint there is an older run's
    (False, "during", "which saved {out}/finetune-run/checkpoint.pt"),
    (True, "during", "which saved {out}/finetune.json and {out}/finetune-run/checkpoint.pt"),
])
def test_a_stopped_script_is_said_with_what_it_saved(tmp_path, json_written, checkpoint, saved):
    (tmp_path / "finetune-run").mkdir()
    if checkpoint:
        (tmp_path / "finetune-run" / "checkpoint.pt").write_bytes(b"weights")
    started = time.time() + (1 if checkpoint == "before" else -1)
    record = {"numbers": {}} if json_written else None
    assert reproduce.kept_text(tmp_path, "finetune", record, started) == saved.format(out=tmp_path)


def test_the_stand_ins_command_is_usable_from_the_shell():
    done = subprocess.run([sys.executable, "job/standins.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and "the whole job offline on stand-ins" in done.stdout, done.stderr[-2000:]


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
    monkeypatch.setattr(downloads.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 0))
    status = guarded(lambda: reproduce.main([str(tmp_path / "out"), *job_flags(job_standins)]))
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: not enough room on the disk of ") and "0 MB is free" in err
    assert not (tmp_path / "out" / "reproduce.json").exists() and not (tmp_path / "out" / "logs").exists()


# the checkpoint: the weights (1 MB), their average and the momentum, twice while one is saved; then the two saved
# models (model/, model-last/), 1 MB each, written beside any earlier ones
@pytest.mark.parametrize("resumes,files,needed_mb", [
    (True, {}, 6.0 + 2),  # no checkpoint yet
    (True, {"checkpoint.pt": 2.5}, 3.5 + 2),  # resumed: the run's saves overwrite it
    (False, {"checkpoint.pt": 2.5}, 6.0 + 2),  # kept aside: its room stays taken
    (False, {"checkpoint.pt": 2.5, "checkpoint.previous.pt": 1.5}, 6.0 + 2),  # ... beside the one kept before
    (False, {"checkpoint.previous.pt": 1.5}, 6.0 + 2),  # no checkpoint to move: the one kept before stays
])
def test_the_room_for_fine_tunings_checkpoint_counts_what_is_overwritten_and_what_is_kept(tmp_path, resumes, files,
                                                                                          needed_mb):
    models, out = tmp_path / "models", tmp_path / "out"
    (models / IN21K).mkdir(parents=True)
    (models / IN21K / "model.safetensors").write_bytes(bytes(10**6))
    (out / "finetune-run").mkdir(parents=True)
    for name, mb in files.items():
        (out / "finetune-run" / name).write_bytes(bytes(int(mb * 10**6)))
    need = reproduce.room_needed([], out, ["finetune"], namespace(models=str(models)), resumes)
    assert need == {out: pytest.approx(needed_mb + SCRIPTS["finetune"]["writes MB"] + PAGE_WRITES_MB)}


@pytest.mark.parametrize("made_by_this_command,whole,why", [
    (True, True, None),  # resumed
    (False, True, "its checkpoint was made by another command or code (or --force)"),
    (True, False, "its checkpoint is damaged (truncated, unreadable, or changed since it was written)"),  # cut short
])
def test_a_checkpoint_of_another_command_or_damaged_is_kept_aside_not_deleted(tmp_path, capsys, made_by_this_command,
                                                                             whole, why):
    """A whole checkpoint this command made is resumed; one made otherwise (other flags or code) may hold hours of
    training, and a damaged one (cut short) would be refused by --resume on every call of the same command: either is
    moved to checkpoint.previous.pt, with a line saying why, and the run starts afresh; the models its run saved go
    with it (model.previous/ and model-last.previous/, or beside those kept before: model.previous-2/ where a folder
    or a file is there), so that none of them stays beside the new run's checkpoint."""
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    checkpoint = out / "finetune-run" / "checkpoint.pt"
    vit_part3_finetune.save_checkpoint(checkpoint, {"step": 5}, vit_part3_finetune.CHECKPOINT_FORMAT)  # as the script
    for folder in ("model", "model-last", "model.previous"):
        (out / "finetune-run" / folder).mkdir()
        (out / "finetune-run" / folder / "config.json").write_text(folder)
    (out / "finetune-run" / "model-last.previous").write_text("a file where the folder goes")
    saved = checkpoint.read_bytes() if whole else checkpoint.read_bytes()[:1000]
    checkpoint.write_bytes(saved)
    args, keys = namespace(), {"finetune": {"code": "code digest", "inputs": "stamp"}}
    made_by = reproduce.checkpoint_maker(args, out, keys["finetune"])  # its command, code and inputs
    manifest = {"finetune checkpoint": made_by if made_by_this_command else {**made_by, "code": "other code"}}
    command = reproduce.prepare("finetune", args, out, keys, manifest)
    previous = checkpoint.with_name("checkpoint.previous-2.pt")  # the number free for it and its run's models
    assert ("--resume" in command) is (why is None) and checkpoint.is_file() is (why is None)
    assert previous.is_file() is (why is not None) and (why is None or previous.read_bytes() == saved)
    run = out / "finetune-run"
    models = {folder.name: (folder / "config.json").read_text() for folder in run.iterdir() if folder.is_dir()}
    assert models == ({"model": "model", "model-last": "model-last", "model.previous": "model.previous"} if why is None
                      else {"model.previous": "model.previous", "model.previous-2": "model",
                            "model-last.previous-2": "model-last"})  # the ones kept before stay
    assert (run / "model-last.previous").read_text() == "a file where the folder goes"
    said = [text for text in capsys.readouterr().err.splitlines() if "starts afresh" in text]
    afresh = (f"vit_part3_finetune.py starts afresh: {why}; the old ones are kept as {run / 'model.previous-2'}, "
              f"{run / 'model-last.previous-2'}, {previous}")
    assert said == ([] if why is None else [afresh])


@pytest.mark.parametrize("extra,why", [
    ([], ""),  # the quick check's --pause-at 5: the checkpoint at step 5 is resumed
    (["--pause-at", "3"], "its checkpoint is at step 5, past --pause-at 3"),  # --resume refused it on every call
    (["--pause-at=7"], ""),
    (["--pause", "3"], "its checkpoint is at step 5, past --pause-at 3"),  # abbreviated, as argparse takes it
    (["--pau=4"], "its checkpoint is at step 5, past --pause-at 4"),
])
def test_a_checkpoint_past_the_commands_pause_at_starts_fine_tuning_afresh(tmp_path, extra, why):
    out = tmp_path / "out"
    args = namespace(quick=True, extra={**{script: [] for script in NAMES}, "finetune": extra})
    checkpoint = out / "finetune-run" / "checkpoint.pt"
    vit_part3_finetune.save_checkpoint(checkpoint, {"step": 5}, vit_part3_finetune.CHECKPOINT_FORMAT)
    keys = {"finetune": {"code": "code digest", "inputs": "stamp"}}
    manifest = {"finetune checkpoint": reproduce.checkpoint_maker(args, out, keys["finetune"])}
    assert reproduce.why_afresh(args, out, keys["finetune"], manifest) == why


@pytest.mark.parametrize("change", ["a picture rewritten", "a picture added", "the weights rewritten",
                                    "a file beside the pictures", "the folders' modes"])
def test_a_checkpoint_whose_pictures_or_model_changed_starts_fine_tuning_afresh(tmp_path, change):
    """The script's --resume refuses a checkpoint whose pictures or model files changed (it would splice two runs):
    the job, which passes the same flags every time, starts afresh rather than resume it on every call."""
    out, model = tmp_path / "out", tmp_path / "models"
    nette = standins.imagenette_folder(tmp_path / "nette", per_class=1)
    (model / IN21K).mkdir(parents=True)
    (model / IN21K / "model.safetensors").write_bytes(b"weights")
    args = namespace(imagenette=str(nette), models=str(model))
    vit_part3_finetune.save_checkpoint(out / "finetune-run" / "checkpoint.pt", {"step": 5},
                                       vit_part3_finetune.CHECKPOINT_FORMAT)
    key = reproduce.script_keys(args, out)["finetune"]  # as the job's plan makes it
    manifest = {"finetune checkpoint": reproduce.checkpoint_maker(args, out, key)}
    assert reproduce.why_afresh(args, out, key, manifest) == ""
    picture = next((nette / "val").rglob("*.JPEG"))
    if change == "a picture rewritten":  # the same size, another time (set: a coarse clock may not tick)
        mtime = picture.stat().st_mtime_ns
        picture.write_bytes(picture.read_bytes()[:-1] + b"\0")
        os.utime(picture, ns=(mtime + 10**9, mtime + 10**9))
    elif change == "a picture added":
        shutil.copyfile(picture, picture.with_name("new.JPEG"))
    elif change == "the weights rewritten":
        (model / IN21K / "model.safetensors").write_bytes(b"other weights")
    elif change == "a file beside the pictures":  # no picture: the script reads the same, and so resumes
        (picture.parent / ".DS_Store").write_bytes(b"")
    else:
        os.chmod(picture.parent, 0o700)
    same = change in ("a file beside the pictures", "the folders' modes")
    key = reproduce.script_keys(args, out)["finetune"]  # the next job's plan
    assert reproduce.why_afresh(args, out, key, manifest) == ("" if same else (
        "a picture under its --data-dir or a file of its --model changed since its checkpoint was made"))


def test_the_stamp_of_fine_tunings_inputs_is_taken_again_after_it_ran(tmp_path, monkeypatch, capsys):
    """Fine-tuning may download what it reads (its weights, the pictures) as it starts: the stamp the next job
    compares is taken after it ran, or that job would set a good checkpoint aside."""
    out, models = tmp_path / "out", tmp_path / "models"
    (models / IN21K).mkdir(parents=True)
    (models / IN21K / "config.json").write_text("{}")
    nette = standins.imagenette_folder(tmp_path / "nette", per_class=1)
    ran = {}

    def run(command, cwd, log_path, stop, lock, say):  # fine-tuning downloads its weights, the others fail at once
        if command[1] == "vit_part3_finetune.py":
            ran["before"] = resuming.inputs_stamp("finetune", command)
            (models / IN21K / "model.safetensors").write_bytes(b"downloaded weights")
            ran["after"] = resuming.inputs_stamp("finetune", command)
        return 1, 0.1, True

    monkeypatch.setattr(reproduce, "run_logged", run)
    reproduce.main([str(out), "--models", str(models), "--imagenette", str(nette), "--device", "cpu"])
    capsys.readouterr()
    stamp = json.loads((out / "reproduce.json").read_text())["finetune checkpoint"]["inputs"]
    assert stamp == ran["after"] != ran["before"]


@pytest.mark.parametrize("change,runs_again", [
    ("a picture rewritten", {"posemb", "fewshot", "finetune"}),  # every picture under --data-dir, either split
    ("a picture removed", {"posemb", "fewshot", "finetune"}),
    ("the ViT's weights rewritten", {"posemb", "backbone"}),
    ("in21k's config rewritten", {"fewshot", "finetune"}),
    ("an in21k shard rewritten", {"fewshot", "finetune"}),  # a sharded checkpoint's weights
    ("a beans file rewritten", {"backbone"}),
    ("a file beside the pictures", set()),  # no picture: each script reads the same
    ("a file beside beans' files", set()),  # neither its README.md nor a split's parquet file
])
def test_a_done_script_runs_again_when_a_file_it_reads_changed_in_place(tmp_path, change, runs_again):
    """A script's key holds the stamp of the files it reads (by real path, size and time): a picture or a checkpoint
    changed under the same path runs again the scripts that read it, and only those."""
    nette, models = standins.imagenette_folder(tmp_path / "nette", per_class=1), tmp_path / "models"
    beans = standins.beans_folder(tmp_path / "beans", per_class={"train": 1, "validation": 1})
    for name, weights in ((VIT, ["model.safetensors"]), (IN21K, ["model-00001-of-00002.safetensors",
                                                                 "model-00002-of-00002.safetensors"])):
        (models / name).mkdir(parents=True)
        for file in weights:
            (models / name / file).write_bytes(b"weights")
        (models / name / "config.json").write_text("{}")
    args = namespace(imagenette=str(nette), models=str(models), beans=str(beans))
    before = reproduce.script_keys(args, tmp_path / "out")
    picture = next((nette / "train").rglob("*.JPEG"))
    later = time.time_ns() + 10**9  # set: a coarse clock may not tick between the two stamps
    changed = {"a picture rewritten": picture, "the ViT's weights rewritten": models / VIT / "model.safetensors",
               "in21k's config rewritten": models / IN21K / "config.json",
               "an in21k shard rewritten": models / IN21K / "model-00002-of-00002.safetensors",
               "a beans file rewritten": next(beans.rglob("validation*.parquet"))}.get(change)
    if changed:
        changed.write_bytes(changed.read_bytes() + b"\0")
        os.utime(changed, ns=(later, later))
    elif change == "a picture removed":
        picture.unlink()
    elif change == "a file beside beans' files":
        (beans / ".DS_Store").write_bytes(b"")
    else:
        (picture.parent / ".DS_Store").write_bytes(b"")
    after = reproduce.script_keys(args, tmp_path / "out")
    assert {script for script in NAMES if after[script] != before[script]} == runs_again
    assert all(after[script]["inputs"] for script in NAMES if script != "setup")  # stamped, not None


def test_the_articles_image_processor_fetched_later_runs_again_the_backbone_alone(tmp_path, monkeypatch):
    """The backbone's AutoImageProcessor fetches google/vit-base-patch16-224's preprocessor_config.json into the
    cache's snapshot after posemb ran; posemb makes the article's pixels without it: its stamp keeps it out, or the
    next identical job would run posemb again."""
    from huggingface_hub import constants

    revision = "a" * 40
    repo = tmp_path / "hub" / "models--google--vit-base-patch16-224"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for file in ("config.json", "model.safetensors"):
        (snapshot / file).write_text("{}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    args = namespace(imagenette=str(standins.imagenette_folder(tmp_path / "nette", per_class=1)))
    before = reproduce.script_keys(args, tmp_path / "out")
    (snapshot / "preprocessor_config.json").write_text("{}")
    after = reproduce.script_keys(args, tmp_path / "out")
    assert {script for script in NAMES if after[script] != before[script]} == {"backbone"}


@pytest.mark.parametrize("script", ["fewshot", "finetune"])  # fine-tuning's line on its checkpoint is another
@pytest.mark.parametrize("case,why", [
    ("command", "its command changed since its JSON was made"),
    ("code", "its code or the libraries changed since its JSON was made"),
    ("inputs", "a file it reads (a picture, its data set or its checkpoint) changed since its JSON was made"),
    ("no inputs", "its JSON was made by an earlier version of the job"),  # its key had no stamp of them
    ("edited", "its JSON was changed since it was written"),
    ("could not run", "a section of it could not run"),
    ("unreadable", "its JSON cannot be read"),
    ("first run", None),  # no earlier entry: nothing to say
])
def test_a_script_that_runs_again_says_why_and_where_its_earlier_json_is_kept(tmp_path, capsys, script, case, why):
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    record = {"format": RECORD_FORMAT, "script": script, "numbers": {},
              "could_not_run": [{"section": "2. accuracy", "why": "offline"}]}
    (out / f"{script}.json").write_text("{}" if case == "unreadable" else json.dumps(record))
    key = {"command": ["python", NAMES[script]], "code": "abc", "inputs": "def"}
    made = {**key, **({case: "other"} if case in key else {})}
    if case == "no inputs":
        del made["inputs"]
    entry = {"key": made, "json": resuming.file_digest(out / f"{script}.json") if case != "edited" else "another"}
    manifest = {} if case == "first run" else {script: entry}
    reproduce.prepare(script, namespace(), out, {script: key}, manifest)
    said = [line for line in capsys.readouterr().err.splitlines() if "runs again" in line]
    kept = out / "logs" / f"{script}.previous.json"
    assert said == ([f"{NAMES[script]} runs again: {why}; that JSON is kept as {kept}"] if why else [])
    assert kept.is_file() and script not in manifest


def test_a_script_that_cannot_run_says_where_its_earlier_json_is_kept(tmp_path, monkeypatch, capsys):
    """Offline with nothing: posemb cannot run, and its JSON of another command is set aside, said to be."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "posemb.json").write_text("{}")
    monkeypatch.setattr(reproduce, "run_logged", lambda *args: (1, 0.1, True))  # setup, the one that runs, fails
    reproduce.main([str(out), "--device", "cpu"])
    kept = out / "logs" / "posemb.previous.json"
    assert f"vit_part3_posemb.py cannot run: its earlier JSON is kept as {kept}" in capsys.readouterr().err
    assert kept.is_file()


@pytest.mark.parametrize("kept_before,kept", [
    ([], "logs/posemb.previous.json"),
    (["logs/posemb.previous.json"], "logs/posemb.previous-2.json"),  # it replaced the one kept before, unsaid
    (["logs/posemb.previous.json/"], "logs/posemb.previous-2.json"),  # a folder there: the job refused to start
    (["logs/posemb.previous.json", "logs/posemb.previous-2.json"], "logs/posemb.previous-3.json"),
    (["finetune-run/checkpoint.previous.pt"], "finetune-run/checkpoint.previous-2.pt"),  # hours of training lost
])
def test_a_file_set_aside_never_replaces_one_set_aside_before(tmp_path, capsys, kept_before, kept):
    out = tmp_path / "out"
    script = kept.split("/")[0] == "logs" and "posemb" or "finetune"
    moved = out / ("posemb.json" if script == "posemb" else "finetune-run/checkpoint.pt")
    (out / "logs").mkdir(parents=True)
    moved.parent.mkdir(exist_ok=True)
    moved.write_text("this job's")
    for name in kept_before:
        (out / name).mkdir() if name.endswith("/") else (out / name).write_text(name)
    key = {"command": ["python", NAMES[script]], "code": "abc", "inputs": "def"}
    manifest = {script: {"key": {**key, "code": "other"}, "json": resuming.file_digest(moved)}}
    reproduce.prepare(script, namespace(), out, {script: key}, manifest)
    assert (out / kept).read_text() == "this job's" and f"kept as {out / kept}" in capsys.readouterr().err
    assert all((out / name).is_dir() if name.endswith("/") else (out / name).read_text() == name
               for name in kept_before)


def test_a_checkpoint_and_the_models_of_its_run_are_kept_aside_with_one_number(tmp_path):
    """A first run paused (its checkpoint alone kept aside), then a second whole one: its checkpoint and models go
    aside with one number, not its models beside the first run's checkpoint."""
    run = tmp_path / "finetune-run"
    run.mkdir()
    (run / "checkpoint.previous.pt").write_text("the first run's")
    (run / "checkpoint.pt").write_text("the second run's")
    for folder in ("model", "model-last"):
        (run / folder).mkdir()
    kept = reproduce.keep_aside(run)
    assert [path.name for path in kept] == ["model.previous-2", "model-last.previous-2", "checkpoint.previous-2.pt"]
    assert (run / "checkpoint.previous.pt").read_text() == "the first run's"
    assert (run / "checkpoint.previous-2.pt").read_text() == "the second run's" and reproduce.keep_aside(run) == []


@pytest.mark.parametrize("status,ended", [
    (1, "it ended with exit status 1"),
    (-9, "it was killed by SIGKILL (the system's out-of-memory killer sends SIGKILL)"),  # "exit status -9" before
], ids=["failed", "killed"])
def test_a_script_that_wrote_no_json_is_said_to_have_failed_or_been_killed(status, ended, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(reproduce, "run_logged", lambda *args: (status, 0.1, True))  # setup, the one that runs
    reproduce.main([str(out), "--device", "cpu"])
    assert json.loads((out / "reproduce.json").read_text())["not run"]["setup"] == (
        f"{ended} and wrote no JSON (logs/setup.log)")


@pytest.mark.parametrize("model", ["/no/such/vit", "no/such/vit/here", "./typo"])
def test_the_stamp_of_a_model_that_is_not_there_is_no_traceback(model):
    """A --model in --extra that names nothing (its script says so in one line): the job's stamp is None, not the Hub
    library's validation error of the name, hours into the job."""
    assert resuming.inputs_stamp("finetune", ["python", "vit_part3_finetune.py", "--model", model]) is None


def test_models_of_an_earlier_run_without_its_checkpoint_are_kept_aside_as_fine_tuning_starts_afresh(tmp_path, capsys):
    """No checkpoint in OUT/finetune-run (removed by hand), but the models of an earlier run: moved aside, so that a
    fresh run that pauses leaves no earlier model beside its checkpoint."""
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "finetune-run" / "model").mkdir(parents=True)
    key = {"code": "code digest", "inputs": "stamp"}
    command = reproduce.prepare("finetune", namespace(), out, {"finetune": key}, {})
    assert "--resume" not in command and not (out / "finetune-run" / "model").exists()
    kept = out / "finetune-run" / "model.previous"
    assert kept.is_dir() and capsys.readouterr().err.splitlines()[-1] == (
        f"vit_part3_finetune.py starts afresh: there is no checkpoint; the old one is kept as {kept}")


def test_a_paused_fine_tunings_note_says_the_full_job_runs_it_whole():
    """The quick check's fine-tuning, paused after step 5 on 50 checked pictures, is not continued by the full job
    (its checks are another sample): the note under the table says what the full job does."""
    paused = ("  paused after step 5 of 300; saved OUT/finetune-run/checkpoint.pt: add --resume and a later "
              "--pause-at (or none) to continue")
    record = {"printed": ["  step   5: ...", paused]}
    assert ending.paused(record) == (" (paused after step 5 of 300: its later rows are not run; the job's same command "
                                     "without --quick, which pauses it (or the --pause-at of its --extra), runs the "
                                     "whole fine-tuning)")  # the user typed no --pause-at: --quick gives it
    assert ending.paused({"printed": ["  step 300: ..."]}) == ""


def test_a_ctrl_c_forwarded_as_a_script_starts_is_one_line_not_a_traceback(tmp_path, capfd):
    """A Ctrl-C that came while the job started a script is passed on at once, before the interpreter has run the
    script's first line: held back until that line handles it, it ends the script in one line with status 130."""
    stop = child_process.StopRequests()
    stop.asked.append(signal.SIGINT)
    status, _, _ = child_process.run_logged([sys.executable, "vit_part3_setup.py"], ROOT, tmp_path / "setup.log",
                                            stop, None, print)
    err = capfd.readouterr().err
    assert status == 130 and err.strip() == "interrupted", err


def read_only_mounts():
    """Whether a process here can mount a folder read-only in a mount namespace of its own (root, or user
    namespaces): the one read-only OUT/figures that root, who writes through any file mode, cannot write to."""
    try:
        return subprocess.run(["unshare", "--mount", "--map-root-user", "true"], capture_output=True, timeout=60,
                              check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not read_only_mounts(), reason="unshare cannot make a mount namespace here")
def test_a_read_only_out_figures_is_refused_before_any_script_runs(tmp_path):
    """A figure of an earlier run is removed before its script runs again (move_stale): found then, a read-only
    OUT/figures ended the job after setup had run, with no table."""
    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    read_only = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    done = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", read_only, "sh", str(out / "figures"),
                           sys.executable, "reproduce.py", str(out), "--device", "cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "[1/5]" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"error: OUT {out / 'figures'} cannot be written (Read-only file "
                                                     f"system): choose a place you can write to")
    assert not (out / "setup.json").exists()


# ---------------------------------------------------------------- the lock's file, its handles, OUT/figures (issue 45)

def no_resource_warning(action):
    """action()'s result; fails if an unclosed file, pipe or process was left behind (collected here)."""
    import gc
    import warnings

    gc.collect()  # an earlier test's leftovers are not this action's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        result = action()
        gc.collect()
    left = [str(warning.message) for warning in caught if issubclass(warning.category, ResourceWarning)]
    assert not left, left
    return result


def test_a_log_that_cannot_be_written_is_one_warning_and_said_so_after_the_run(tmp_path, capfd):
    """A full disk or a file where OUT/logs goes: the run goes on, one warning, and the job is told the log is not
    there (its footnote named logs/<script>.log all the same)."""
    (tmp_path / "logs").write_text("a file where the folder goes")
    command = [sys.executable, "-c", "print('out')"]
    status, _, logged = child_process.run_logged(command, ROOT, tmp_path / "logs" / "a.log",
                                                 child_process.StopRequests(), None, print)
    assert status == 0 and not logged
    warnings = [line for line in capfd.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: cannot write the log {tmp_path / 'logs' / 'a.log'}")


def test_run_logged_closes_the_scripts_pipes(tmp_path, capfd):
    command = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"]
    status, _, logged = no_resource_warning(lambda: child_process.run_logged(command, ROOT, tmp_path / "a.log",
                                                                             child_process.StopRequests(), None, print))
    assert status == 0 and logged and (tmp_path / "a.log").read_bytes() in (b"out\nerr\n", b"err\nout\n")
    assert capfd.readouterr().out == "out\n"


CHECKED_SCRIPTS = {  # a stand-in script's main(argv), as first_refusal's process runs it
    "passes": "import os\nfrom common.start_and_end import UserError\ndef main(argv):\n    if os.environ.get("
              "'VIT_PART3_CHECK_ONLY') != '1':\n        raise UserError('asked to run, not to check')\n",
    "user error": "from common.start_and_end import UserError\ndef main(argv):\n"
                  "    raise UserError(f'--x {argv[0]}: no')\n",
    "argparse": "import argparse\ndef main(argv):\n    argparse.ArgumentParser().parse_args(argv)\n",
    "text exit": "import sys\ndef main(argv):\n    sys.exit('error: --x 3: no')\n",
    "empty text exit": "import sys\ndef main(argv):\n    sys.exit('')\n",
    "bug": "def main(argv):\n    return {}['a key']\n",
    "abrupt": "import os\ndef main(argv):\n    os._exit(3)\n",
    "at import": "import sys\nsys.exit(2)\n",
    "sets the environment": "import os\ndef main(argv):\n    os.environ['VIT_PART3_CHECK_ONLY'] = '0'\n",
    "half a line": "import os\ndef main(argv):\n    os.write(1, b'progress')\n",  # past Python's stdout
    "interrupts its job": "import os, pathlib, signal, time\ndef main(argv):\n    pathlib.Path(__file__)"
                          ".with_suffix('.pid').write_text(str(os.getpid()))\n    os.kill(os.getppid(), "
                          "signal.SIGALRM)\n    time.sleep(120)\n",  # SIGALRM: the test's Ctrl-C
}
CHECKS = [  # (the scripts checked in turn, the refusal first_refusal returns)
    (["passes", "passes"], None),
    (["passes", "user error", "abrupt"], ("b", "--x 3: no")),
    (["argparse"], ("a", "argparse.py: error: unrecognized arguments: 3")),  # as argparse ends the script alone
    (["text exit"], ("a", "--x 3: no")),
    (["empty text exit"], ("a", "exit status 1")),
    (["bug", "passes"], ("a", "KeyError: 'a key'")),
    (["passes", "abrupt", "passes"], ("b", "exit status 3")),
    (["at import"], ("a", "exit status 2")),
    (["sets the environment", "passes"], None),
    (["passes", "half a line"], None),
]


def checked(tmp_path, scripts):
    """first_refusal's commands for the stand-in scripts, named a, b, ... in turn."""
    for name, text in CHECKED_SCRIPTS.items():
        (tmp_path / f"{name}.py").write_text(text)
    return {chr(ord("a") + k): [sys.executable, str(tmp_path / f"{script}.py"), "3"]
            for k, script in enumerate(scripts)}


@pytest.mark.parametrize("scripts,refused", CHECKS, ids=[" then ".join(scripts) for scripts, _ in CHECKS])
def test_the_checks_run_in_turn_in_one_process_and_the_first_refusal_is_the_answer(tmp_path, scripts, refused):
    """Each command as `python script flags` would end, its last line the reason; those after a refusal not run;
    the checker's pipes closed however it ends."""
    commands = checked(tmp_path, scripts)
    assert no_resource_warning(lambda: child_process.first_refusal(commands, ROOT)) == refused


def test_the_jobs_check_of_the_five_scripts_loads_no_model_class_of_transformers(job_standins, tmp_path):
    """The check imports every script in one process before each job: a model class of transformers (seconds to load)
    loads where a section uses it, not where a script's top lines or its flags are read."""
    args = reproduce.parse_flags([str(tmp_path / "out"), *job_flags(job_standins)])
    commands = {script: reproduce.script_command(script, args, tmp_path / "out") for script in SCRIPTS}
    code = ("import sys\nfrom job.child_process import check_in_turn\ncheck_in_turn()\n"
            "print(sorted(name for name in sys.modules if name in ('transformers.modeling_utils', "
            "'transformers.integrations.integration_utils')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, input=json.dumps(commands), capture_output=True,
                          text=True, timeout=300, check=False, env={**os.environ, start_and_end.CHECK_ONLY: "1"})
    assert done.returncode == 0 and done.stdout.strip().endswith("null\n[]"), (done.stdout, done.stderr[-2000:])


def test_a_checker_that_cannot_start_is_its_own_last_line(tmp_path):
    commands = checked(tmp_path, ["passes"])
    assert child_process.first_refusal(commands, tmp_path) == ("a", "ModuleNotFoundError: No module named 'job'")


def test_a_job_interrupted_while_it_checks_stops_the_checker_and_closes_its_pipes(tmp_path):
    """A Ctrl-C (here SIGALRM, sent by the check itself) while first_refusal waits on its checker."""
    commands = checked(tmp_path, ["interrupts its job"])

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        no_resource_warning(lambda: pytest.raises(KeyboardInterrupt, child_process.first_refusal, commands, ROOT))
    finally:
        signal.signal(signal.SIGALRM, previous)
    checker = int((tmp_path / "interrupts its job.pid").read_text())
    assert not psutil.pid_exists(checker)  # killed and waited for


@pytest.mark.parametrize("ending", ["ends", "refuses", "stopped"])
def test_a_job_removes_its_lock_file_however_it_ends_and_closes_it(tmp_path, monkeypatch, capsys, ending):
    pytest.importorskip("fcntl")
    out = tmp_path / "out"
    seen = []

    def run_job(args, argv, folder, lock):
        seen.append((folder / child_process.LOCK).read_text())  # held while the job runs, naming it
        if ending == "refuses":
            raise reproduce.UserError("a line")
        if ending == "stopped":
            raise Terminated
        return 0

    monkeypatch.setattr(reproduce, "run_job", run_job)
    status = no_resource_warning(lambda: guarded(lambda: reproduce.main([str(out), "--quick", "--device", "cpu"])))
    assert status == {"ends": 0, "refuses": 2, "stopped": 143}[ending]
    assert seen == [f"{os.getpid()} {child_process.pid_space()}\n"] and not (out / child_process.LOCK).exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's device of a full disk")
def test_a_lock_file_that_cannot_be_written_is_one_line_and_removed(tmp_path):
    """A full disk (the lock's file a link to /dev/full, where every write fails): the job's pid cannot go in; one
    line, not a traceback, and no empty lock file left for the next job to wonder about."""
    pytest.importorskip("fcntl")
    (tmp_path / child_process.LOCK).symlink_to("/dev/full")
    with pytest.raises(UserError, match=f"cannot write the lock file {tmp_path / child_process.LOCK} "):
        child_process.only_job_on(tmp_path, print)
    assert not os.path.lexists(tmp_path / child_process.LOCK)


@pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="a pipe's signal is POSIX's")
def test_a_job_whose_reader_is_gone_ends_quietly(tmp_path):
    """`python reproduce.py OUT | head -1`, head gone: the job's next line finds no reader and the job ends as cat
    does (SIGPIPE), not in a BrokenPipeError's traceback; its script is told to stop and saves what it can."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "reproduce.py", str(tmp_path / "out"), "--device", "cpu"], cwd=ROOT,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=600, check=False)
    finally:
        os.close(write)
    assert done.returncode == -signal.SIGPIPE and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_job_leaves_the_lock_file_while_a_script_of_it_runs(tmp_path):
    """The script holds the lock till it ends (it inherited the file): the file stays for a new job to wait on."""
    fcntl = pytest.importorskip("fcntl")
    lock = child_process.only_job_on(tmp_path, print)
    script = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], pass_fds=[lock.fileno()])
    lock.scripts.append(script)
    try:
        lock.close()
        with open(tmp_path / child_process.LOCK, "a") as other, pytest.raises(OSError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # still locked, by the script
    finally:
        script.kill()
        script.wait()
    again = child_process.only_job_on(tmp_path, print)  # the script has ended: taken at once
    again.close()
    assert not (tmp_path / child_process.LOCK).exists()


@pytest.mark.parametrize("named,alive", [
    ("{gone} {here}", False),  # an ended job of this machine: a script of it is waited for
    ("{gone} another-host/4026531836", True),  # a job of another container or host sharing OUT: its number means
    ("{gone} {here_host}/4026531999", True),   # nothing here; refused, not waited for as "an ended job"
    ("{me} {here}", False),  # this process: a requeued job given its old number
    ("12 34 56", True), ("", True),  # not a lock file this job writes: taken as running
])
def test_a_lock_file_names_where_its_process_number_means_something(tmp_path, named, alive):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()  # no process here has its number now
    here = child_process.pid_space()
    (tmp_path / child_process.LOCK).write_text(named.format(gone=gone, here=here, here_host=here.split("/")[0],
                                                            me=os.getpid()))
    assert child_process.job_is_alive(tmp_path / child_process.LOCK) is alive


def test_a_job_never_removes_a_lock_file_that_is_not_its_own(tmp_path):
    pytest.importorskip("fcntl")
    first = child_process.only_job_on(tmp_path, print)
    (tmp_path / child_process.LOCK).unlink()  # removed by hand while the first job runs; a second job takes its own
    second = child_process.only_job_on(tmp_path, print)
    first.close()
    assert (tmp_path / child_process.LOCK).read_text() == f"{os.getpid()} {child_process.pid_space()}\n"  # the second's
    second.close()
    assert not (tmp_path / child_process.LOCK).exists()


def test_a_job_that_opened_the_lock_file_its_ending_holder_removes_takes_the_new_one(tmp_path, monkeypatch):
    """The holder removes its file, then frees the lock: a job that opened that file in between gets the lock of a
    file no longer in OUT, so it opens the file there anew and locks that, as a third job would."""
    pytest.importorskip("fcntl")
    holder = child_process.only_job_on(tmp_path, print)
    opened = []

    def opening(path, mode):
        handle = open(path, mode)  # noqa: SIM115 - only_job_on keeps it
        opened.append(os.fstat(handle.fileno()).st_ino)
        if len(opened) == 1:
            holder.close()  # the holder ends between this job's open and its flock
        return handle

    monkeypatch.setattr(child_process, "open", opening, raising=False)
    lock = child_process.only_job_on(tmp_path, print)
    assert len(opened) == 2 and child_process.is_locked_file(tmp_path / child_process.LOCK, lock.handle)
    assert os.stat(tmp_path / child_process.LOCK).st_ino == opened[1]
    lock.close()


def test_a_script_run_again_leaves_no_figure_of_its_earlier_run(job, tmp_path):
    """Before a script runs again (or is found unable to run), its JSON goes to logs/ and its figures in OUT/figures
    go, and the page that reported them goes to logs/ too (a job stopped then left it showing them): the page built
    next links only the figures drawn from the JSON it reports."""
    pytest.importorskip("matplotlib")
    from job.page import build

    out = shutil.copytree(job["out"], tmp_path / "results")
    posemb = {"posemb_cosine_similarity.png", "posemb_accuracy.png"}
    assert posemb <= {path.name for path in (out / "figures").iterdir()}
    reproduce.move_stale(out, "posemb", resuming.read_manifest(out))
    left = {path.name for path in (out / "figures").iterdir()}
    assert not posemb & left and "fewshot_accuracy.png" in left and (out / "logs" / "posemb.previous.json").is_file()
    assert not (out / "report.md").exists() and (out / "logs" / "report.previous.md").is_file()
    build(out, say=lambda text: None)
    linked = set(re.findall(r"\]\(figures/([^)]+\.png)\)", (out / "report.md").read_text()))
    assert {"fewshot_accuracy.png", "finetune_curves.png", "backbone_curves.png",
            "backbone_feature_maps.png"} == linked
