"""common/run.py: the loads a section needs, each tried in turn, and the lines a run that could not run a section ends
on."""
import pytest

from common.run import loaded
from common.start_and_end import UserError


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

    assert loaded(model) == ["the model"]
    with pytest.raises(UserError) as problem:
        loaded(data, checkpoint, model)
    assert problem.value.args == ("no data here; pass --data-dir", "no checkpoint here; pass --model",
                                  "no processor either")
    assert str(problem.value) == ("no data here; pass --data-dir; also no checkpoint here; pass --model; also no "
                                  "processor either")
    assert calls == ["model", "data", "checkpoint", "model"]  # each tried, in turn, even after a failure


def test_inside_the_job_a_script_leaves_the_command_to_run_next_to_the_job(monkeypatch):
    """Each reason once, in order; the next command only outside reproduce.py, whose own last line gives the job's."""
    from common.run import closing_lines
    from common.start_and_end import IN_JOB

    could_not_run = [("2. a", UserError("no checkpoint", "no pictures")), ("3. b", UserError("no checkpoint"))]
    reasons = ["\n2 section(s) could not run (2. a, 3. b):", "  no checkpoint", "  no pictures"]
    monkeypatch.setenv(IN_JOB, "1")
    assert closing_lines(could_not_run) == reasons
    monkeypatch.delenv(IN_JOB)
    assert closing_lines(could_not_run) == [*reasons, ("next: do what each line above says, then the same command "
                                                      "runs every section")]
