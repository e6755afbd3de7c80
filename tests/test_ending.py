"""job/ending.py: the job's last lines give a command that runs from the folder the job was started in."""
import json
import os
import shlex

import pytest
from conftest import ROOT

import reproduce
from job import ending


@pytest.mark.parametrize("folder,shown", [
    (ROOT, "reproduce.py"),                                   # the checkout: as the README types it
    (ROOT.parent, os.path.join(ROOT.name, "reproduce.py")),   # above it: the path from there
    ("tmp", str(ROOT / "reproduce.py")),                      # elsewhere: the whole path
])
def test_the_command_that_continues_the_job_runs_where_it_was_started(folder, shown, tmp_path, monkeypatch):
    monkeypatch.delenv(ending.STANDINS_COMMAND, raising=False)
    monkeypatch.chdir(tmp_path if folder == "tmp" else folder)
    command = ending.job_command(["--quick", "my results"])
    assert command == f"python {shown} --quick 'my results'"
    assert (tmp_path if folder == "tmp" else folder).joinpath(shlex.split(command)[1]).resolve() == \
        ROOT / "reproduce.py"


@pytest.mark.parametrize("argv,continued", [  # what continues a job started with argv
    (["out", "--force"], ["out"]),  # it would set the results just made aside again, and start over
    (["--forc", "out", "--quick"], ["out", "--quick"]),  # argparse takes the abbreviation
    (["out", "--strict"], ["out", "--strict"]),  # kept, but where the next line says to drop it
])
def test_the_command_that_continues_a_job_drops_force(argv, continued, monkeypatch):
    monkeypatch.delenv(ending.STANDINS_COMMAND, raising=False)
    assert shlex.split(ending.job_command(argv))[2:] == continued
    assert shlex.split(reproduce.stopped_line(15, argv).split(": ", 1)[1])[2:] == continued


def test_the_line_on_strict_shows_the_command_without_it(monkeypatch):
    monkeypatch.delenv(ending.STANDINS_COMMAND, raising=False)
    line = ending.next_line({"setup": {"sections": (4, 4)}}, 1, ["out", "--strict", "--force"], offline=False)
    assert line.startswith("status 1: --strict and a number differs")
    assert shlex.split(line.split("without --strict the same job ends 0: ")[1])[2:] == ["out"]


DO_WHAT_IT_SAYS = ("next: do what each line above says (a flag it names goes in --extra 'SCRIPT=FLAGS'); then this "
                   "command, with it, runs what did not finish")


@pytest.mark.parametrize("lacking,offline,said", [
    (["posemb", "finetune"], False, "next: once what is named above is here, the same command runs what did not"),
    (["posemb", "finetune"], True, "next: with HF_HUB_OFFLINE unset and the Hub reachable, or with the local copies"),
    (["posemb"], False, DO_WHAT_IT_SAYS),  # fine-tuning's loss was not finite: the same command fails the same way
    (["posemb"], True, DO_WHAT_IT_SAYS),  # ... offline too
])
def test_the_next_line_asks_for_the_pieces_only_when_they_are_what_is_missing(lacking, offline, said, monkeypatch):
    monkeypatch.delenv(ending.STANDINS_COMMAND, raising=False)
    rows = {"setup": {"sections": (4, 4)}, "posemb": {"sections": (0, 4)}, "finetune": {"sections": (2, 3)}}
    assert ending.next_line(rows, 1, ["out"], offline=offline, lacking=lacking).splitlines()[-1].startswith(said)


def test_a_job_that_job_standins_started_is_continued_by_its_command(monkeypatch):
    monkeypatch.setenv(ending.STANDINS_COMMAND, "python job/standins.py /tmp/demo")
    assert ending.job_command(["/tmp/demo/results", "--models", "/tmp/demo/models"]) == \
        "python job/standins.py /tmp/demo"
    assert reproduce.stopped_line(2, []).endswith("the same command continues the job: "
                                                  "python job/standins.py /tmp/demo")


def test_the_default_out_is_the_checkouts_results_wherever_the_job_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert reproduce.parse_flags([]).out == str(ROOT / "results")


STANDINS = {"stand-ins": ["/tmp/demo/models/google/vit-base-patch16-224"]}  # a record of a run on stand-ins


@pytest.mark.parametrize("records,said", [  # the scripts named are those the page names first
    ({"setup": {"numbers": {}}, "posemb": None}, []),
    ({"setup": {"numbers": {}}, "posemb": STANDINS},
     [("the numbers of vit_part3_posemb.py mean nothing: it ran on generated stand-ins (checkpoints of random weights, "
       "generated pictures), which show that the job runs, not what the articles found")]),
    # only the beans folder was a stand-in: the line said that every script ran on stand-ins
    ({"setup": {"numbers": {}}, "posemb": {"numbers": {}}, "fewshot": {"numbers": {}}, "finetune": {"numbers": {}},
      "backbone": STANDINS},
     [("the numbers of vit_backbone.py mean nothing: it ran on generated stand-ins (checkpoints of random weights, "
       "generated pictures), which show that the job runs, not what the articles found")]),
    ({"setup": {"numbers": {}}, "posemb": STANDINS, "fewshot": STANDINS, "finetune": STANDINS, "backbone": STANDINS},
     [("the numbers of vit_part3_posemb.py, vit_part3_fewshot.py, vit_part3_finetune.py, vit_backbone.py mean "
       "nothing: they ran on generated stand-ins (checkpoints of random weights, generated pictures), which show that "
       "the job runs, not what the articles found")]),
])
def test_a_job_on_stand_ins_says_under_its_table_that_its_numbers_mean_nothing(records, said):
    assert ending.standins_line(records) == said


def test_the_jobs_last_lines_count_the_articles_conclusions_of_every_script():
    """setup's record holds the article's own numbers: its 18 conclusions hold; a script with no record has its
    conclusions not run, the others' too."""
    from compare.verdicts import REFERENCE_DIR, load_reference

    numbers = {name: {"value": float(entry["article"].replace(",", ""))}
               for name, entry in load_reference("setup").items()}
    records = {"setup": {"numbers": numbers}, "posemb": None, "fewshot": None, "finetune": None, "backbone": None}
    total = sum(len(json.loads((REFERENCE_DIR / f"conclusions_{script}.json").read_text())["conclusions"])
                for script in records)
    assert ending.conclusions_line(records) == [
        (f"the articles' conclusions: 18 hold, 0 fail, 0 undecided, {total - 18} not run, 0 not comparable (of {total} "
        f"conclusions); each on the page, first")]


def test_a_job_on_the_miniature_says_under_its_table_that_its_numbers_are_its_own(tmp_path):
    from compare.marks import MINIATURE_MARK

    (tmp_path / MINIATURE_MARK).write_text("made by job/miniature.py")
    records = {"setup": {"numbers": {}, "flags": {}}, "posemb": {"numbers": {}, "flags": {"model": str(tmp_path)}}}
    assert ending.standins_line(records) == [
        ("these numbers are the miniature's own (a ViT trained here on generated pictures, job/miniature.py): the "
        "articles' numbers do not apply; the conclusions above are what carries over")]
    records["posemb"]["flags"]["model"] = str(tmp_path / "elsewhere")
    assert ending.standins_line(records) == []
