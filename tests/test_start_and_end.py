"""common/start_and_end.py: a script's first line handles Ctrl-C before anything slow loads, and a Python without the
project's packages is one line, not a ModuleNotFoundError traceback."""
import ast
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import ROOT

from common.start_and_end import UserError, guarded

ENTRY_POINTS = ["reproduce.py", "vit_part3_setup.py", "vit_part3_posemb.py", "vit_part3_fewshot.py",
                "vit_part3_finetune.py", "vit_backbone.py", "job/standins.py"]


def new_modules(code):
    """The modules a fresh interpreter loads to run `code`, beyond those it starts with."""
    shown = ("import sys; before = set(sys.modules); " + code +
             "; print(' '.join(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", shown], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_the_first_line_loads_nothing_but_what_signal_needs():
    """What stands between the interpreter's start and the Ctrl-C handler: `signal` and what it imports, no more."""
    assert new_modules("import common.start_and_end") - new_modules("import signal") == {
        "common", "common.start_and_end"}
    assert new_modules("import job.environment") - new_modules("import os") == {"job", "job.environment"}  # the job's


def imports_before_the_first_line(tree):
    """The modules a script imports before it calls before_torch_loads(), in the order they come; None: no call."""
    imported = []
    for node in tree.body:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import):
                imported += [alias.name for alias in inner.names]
            elif isinstance(inner, ast.ImportFrom):
                imported.append(inner.module)
            elif isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "before_torch_loads":
                return imported
    return None


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_each_script_handles_ctrl_c_before_any_other_import(script):
    """Before `before_torch_loads()` runs, a script imports common.start_and_end alone (job/standins.py: also os and
    sys, which the interpreter's start has loaded, to find the checkout; reproduce.py: job.environment, os alone)."""
    allowed = ({"common.start_and_end"} | ({"os", "sys"} if script == "job/standins.py" else set())
               | ({"job.environment"} if script == "reproduce.py" else set()))
    imported = imports_before_the_first_line(ast.parse((ROOT / script).read_text()))
    assert imported is not None and set(imported) <= allowed, imported


def python_with(tmp_path, keep):
    """A Python whose site-packages are only the entries `keep(name)` accepts: -S (no site), the kept entries
    linked into a folder on PYTHONPATH."""
    site = Path(sysconfig.get_paths()["purelib"])
    folder = tmp_path / "site"
    folder.mkdir()
    for entry in site.iterdir():
        if keep(entry.name):
            (folder / entry.name).symlink_to(entry)
    return [sys.executable, "-S"], {**os.environ, "PYTHONPATH": str(folder)}


ARTICLE = "torch, transformers, safetensors, scipy, pillow, numpy, tqdm, huggingface_hub"  # its block's, as pip
WANTS = {"vit_part3_setup.py": "article", "vit_part3_posemb.py": "article", "vit_part3_fewshot.py": "article",
         "vit_part3_finetune.py": "article", "vit_backbone.py": "backbone", "reproduce.py": "job",
         "job/standins.py": "job"}
ENVIRONMENTS = [  # (which of site-packages' entries the Python has, {what the entry point wants: the line's names})
    ("nothing", lambda name: False, {"article": ARTICLE, "backbone": f"{ARTICLE}, datasets, accelerate",
                                     "job": f"{ARTICLE}, datasets, accelerate, psutil"}),
    ("all but torch", lambda name: not name.startswith("torch"), {"article": "torch", "backbone": "torch",
                                                                  "job": "torch"}),
    ("all but Pillow and psutil", lambda name: not name.startswith(("PIL", "pillow", "psutil")),
     {"article": "pillow", "backbone": "pillow", "job": "pillow, psutil"}),
    ("the article's packages alone", lambda name: not name.startswith(("datasets", "accelerate", "psutil")),
     {"backbone": "datasets, accelerate", "job": "datasets, accelerate, psutil"}),  # Part 3 runs: test_first_contact
]
SET_UP = ("activate the project's environment (. .venv/bin/activate, which `make quick` or `make test` makes) or "
          "install requirements.lock into yours (docs/setup.md)")


CASES = [(script, what, keep, missing[WANTS[script]]) for what, keep, missing in ENVIRONMENTS
         for script in ENTRY_POINTS if WANTS[script] in missing]


@pytest.mark.parametrize("script,what,keep,names", CASES, ids=[f"{case[0]}-{case[1]}" for case in CASES])
def test_a_python_without_the_packages_is_one_line_with_the_pip_command(tmp_path, script, what, keep, names):
    """The scripts ask for what they import: the Part 3 scripts the article's packages alone, the backbone datasets
    and accelerate besides, the job and its tools requirements.txt's; each names the pip command for its own."""
    command, environment = python_with(tmp_path, keep)
    done = subprocess.run([*command, script, "--help"], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    fix = SET_UP if WANTS[script] == "job" else f"pip install {names.replace(', ', ' ')}, or {SET_UP}"
    assert done.stderr == f"error: this Python ({sys.executable}) has no {names}: {fix}\n"


def test_a_python_with_every_package_says_nothing_of_them(tmp_path):
    command, environment = python_with(tmp_path, lambda name: True)
    done = subprocess.run([*command, "reproduce.py", "--help"], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage: reproduce.py"), done.stderr


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
    code = ("from common.start_and_end import before_torch_loads; before_torch_loads(); import tqdm; "
            "print(tqdm.tqdm([]).disable)")
    plain = {name: value for name, value in os.environ.items() if name not in ("RANK", "WORLD_SIZE", "TQDM_DISABLE")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**plain, **environment}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.stdout.split() == [str(not speaks)], done.stderr
