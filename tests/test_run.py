"""common/run.py: a section given what could not be loaded, and the lines a run that could not run a section ends
on."""
import pytest

from common.run import Report, section, tried
from common.start_and_end import UserError


@section
def section_two(report, model, pictures):
    """2. a section"""
    report.print(f"  {model} on {pictures}")
    return "done"


def missing(what):
    raise UserError(f"no {what}; pass --{what}")


@pytest.mark.parametrize("model,pictures,printed", [
    ("the model", "pictures", "  the model on pictures"),
    (tried(missing, "model"), "pictures", '  cannot run section "2. a section": no model; pass --model'),
    (tried(missing, "model"), tried(missing, "data"),  # each reason once, the arguments' order
     '  cannot run section "2. a section": no model; pass --model; also no data; pass --data'),
    (tried(missing, "model"), tried(missing, "model"), '  cannot run section "2. a section": no model; pass --model'),
])
def test_a_section_given_what_could_not_be_loaded_says_why_in_one_line_and_the_run_goes_on(model, pictures, printed):
    report = Report("posemb")
    returned = section_two(report, model, pictures)
    assert report.lines == [printed]
    if model == "the model":
        assert returned == "done" and not report.could_not_run
    else:  # for the sections that need what this one returns
        assert report.could_not_run == [("2. a section", returned)] and isinstance(returned, UserError)


def test_an_operation_missing_elsewhere_than_on_mps_is_not_taken_for_a_missing_load():
    @section
    def section_three(report):
        """3. a section"""
        raise NotImplementedError("a method left to a subclass")

    with pytest.raises(NotImplementedError):
        section_three(Report("posemb"))


def test_inside_the_job_a_script_leaves_the_command_to_run_next_to_the_job(monkeypatch):
    """Each reason once, in order; the next command only outside reproduce.py, whose own last line gives the job's."""
    from common.run import closing_lines
    from common.start_and_end import IN_JOB

    could_not_run = [("2. a", UserError("no checkpoint", "no pictures")), ("3. b", UserError("no checkpoint"))]
    reasons = ["\n2 section(s) could not run (2. a, 3. b):", "  no checkpoint", "  no pictures"]
    monkeypatch.setenv(IN_JOB, "1")
    assert closing_lines(could_not_run) == reasons
    monkeypatch.delenv(IN_JOB)
    assert closing_lines(could_not_run) == [*reasons, ("next: do what each line above says, then the same command, "
                                                      "with any flag those lines name, runs every section")]
