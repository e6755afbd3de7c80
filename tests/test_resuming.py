"""job/resuming.py: what a job counts as done, and what it must have been made by."""
import hashlib
import json
import shutil

import pytest
from conftest import ROOT

from common.start_and_end import UserError
from job import resuming
from job.scripts import SCRIPTS, script_file

NAMES = {script: script_file(script) for script in SCRIPTS}


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
    record = {"format": 1, "script": "posemb", "numbers": {}, "could_not_run": []}
    if change == "could not run":
        record["could_not_run"] = [{"section": "4. accuracy", "why": "offline"}]
    path = tmp_path / "posemb.json"
    path.write_text(json.dumps(record))
    key = {"command": ["python", "vit_part3_posemb.py", "--compare"], "code": "abc"}
    entry = {"key": dict(key), "json": hashlib.sha256(path.read_bytes()).hexdigest()}
    if change == "other command":
        entry["key"]["command"] = ["python", "vit_part3_posemb.py", "--per-class", "20", "--compare"]
    if change == "other code":
        entry["key"]["code"] = "abd"
    if change == "rewritten":
        path.write_text(json.dumps(record) + " ")
    manifest = {} if change == "no manifest" else {"posemb": entry}
    assert resuming.is_complete(tmp_path, "posemb", key, manifest) is complete


@pytest.mark.parametrize("changed,runs_again", [
    ("vit_part3_posemb.py", {"posemb"}),
    ("common/data.py", set(NAMES)),                      # every module of common/ is every script's code
    ("data/reference_fewshot.json", {"fewshot"}),
    ("data/conclusions_setup.json", {"setup"}),            # the page's and the job's conclusions: they were stale
    ("common/nothing_imports_it.py", set(NAMES)),          # a module added
    ("figures/finetune.py", set(NAMES)),                   # a module of figures/: the scripts draw them
])
def test_the_code_of_a_script_is_it_all_of_common_and_figures_and_its_reference(tmp_path, monkeypatch, changed,
                                                                                 runs_again):
    code = [p.relative_to(ROOT).as_posix() for folder in ("common", "figures") for p in (ROOT / folder).rglob("*.py")]
    for path in [*NAMES.values(), *code,
                 *(f"data/{kind}_{script}.json" for script in NAMES for kind in ("reference", "conclusions"))]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    monkeypatch.setattr(resuming, "ROOT", tmp_path)
    before = {script: resuming.code_digest(script) for script in NAMES}
    with open(tmp_path / changed, "a") as f:
        f.write("\n")
    assert {script for script in NAMES if resuming.code_digest(script) != before[script]} == runs_again


@pytest.mark.parametrize("record,named", [
    ([1, 2], "the record"),  # was taken for another version's: every result set aside
    ({"format": 1, "posemb": {"key": {}, "seconds": "abc"}}, "posemb"),  # a traceback when its time was shown
    ({"format": 1, "setup": "done"}, "setup"),
    ({"format": 1, "setup": {"key": None, "seconds": 5}}, "setup"),  # a traceback when why it runs again was said
    ({"format": 1, "finetune checkpoint": None}, "finetune checkpoint"),  # a traceback when fine-tuning was planned
    ({"format": 1, "finetune checkpoint": {"seconds": "1 h"}}, "finetune checkpoint"),  # added to the resumed run's
])
def test_a_record_edited_into_what_no_job_writes_is_refused(tmp_path, record, named):
    (tmp_path / "reproduce.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=rf"cannot be read \({named} is not what the job writes\)"):
        resuming.read_manifest(tmp_path)
    assert resuming.read_manifest(tmp_path, force=True) == {}


def test_force_starts_afresh_from_a_record_that_cannot_be_read(tmp_path):
    """--force runs every script again: a damaged record then reads as nothing done, not as a refusal."""
    (tmp_path / "reproduce.json").write_text('{"setup": {"seconds": 13')  # cut short
    assert resuming.read_manifest(tmp_path, force=True) == {}
    with pytest.raises(UserError, match="add --force to run every script again"):
        resuming.read_manifest(tmp_path)


@pytest.mark.parametrize("format_,kept", [(None, False), (2, False), (1, True)], ids=["older", "later", "this"])
def test_a_job_record_of_another_version_counts_nothing_done(tmp_path, format_, kept):
    """The job's record carries its format: another version's (none: an older one) says nothing of what this version
    made, and every script runs again; this version's keeps what it says."""
    manifest = {"setup": {"key": {"command": ["python"]}, "seconds": 13}, "not run": {}}
    resuming.write_manifest(tmp_path, manifest)
    written = json.loads((tmp_path / "reproduce.json").read_text())
    assert written["format"] == 1
    if format_ is None:
        del written["format"]
    else:
        written["format"] = format_
    (tmp_path / "reproduce.json").write_text(json.dumps(written))
    assert resuming.read_manifest(tmp_path) == (written if kept else {})
