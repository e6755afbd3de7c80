"""common/run.py: the article's ways of printing a number, and the Report that records numbers by name."""
import numpy as np
import pytest

from common.run import Report, listed, pass_text, section, short
from common.start_and_end import UserError
from compare.record import named


@pytest.mark.parametrize("text, printed", [
    (listed((197, 768), "d"), "(197, 768)"),  # E_pos's shape
    (listed(np.array([[2.0, 1.0], [1.0, 0.0]])), "[[2.0, 1.0], [1.0, 0.0]]"),  # few-shot's X
    (listed([0.125, -0.625], ".3f"), "[0.125, -0.625]"),
    (short(0.187512), "0.1875"), (short(-0.7), "-0.7"), (short(-0.0), "0.0"), (short(1), "1.0"),
    (pass_text({"seconds": 65.2, "waiting seconds": 0.04}), "[65 s, 0.0 s waiting for pictures]"),
])
def test_numbers_print_as_the_article_prints_them(text, printed):
    assert text == printed


def test_record_keeps_each_number_and_each_entry_by_name(capsys):
    report = Report("test")
    weights = np.array([[0.625, -0.625]])
    report.print("  loss 2.302585, W = [[0.625, -0.625]]", {"loss": 2.302585093, "W": weights, "shape": (197, 768)})
    weights[0, 0] = 0.0  # changed after its line: the number kept is the printed one
    assert capsys.readouterr().out == "  loss 2.302585, W = [[0.625, -0.625]]\n"
    assert named(report.script, report.given)[0] == {"loss": {"value": 2.302585093}, "W[1,1]": {"value": 0.625},
                                                     "W[1,2]": {"value": -0.625}, "shape[1]": {"value": 197.0},
                                                     "shape[2]": {"value": 768.0}}
    report.print("  loss 1.0", {"loss": 1.0})
    with pytest.raises(ValueError, match="recorded twice"):
        named(report.script, report.given)


def test_a_pass_keeps_its_timing_and_an_accuracy_its_counts(capsys):
    report = Report("test")
    report.print("  accuracy 98.0%", {"224": {"seconds": 65.2, "waiting seconds": 0.04, "pictures": 50},
                                       "accuracy": 98.0}, counts={"accuracy": (49, 50)})
    assert named("test", report.given)[1] == {"224": {"seconds": 65.2, "waiting seconds": 0.04, "pictures": 50}}
    assert {name: number["value"] for name, number in named("test", report.given)[0].items()} == {
        "224 seconds": 65.2, "224 waiting seconds": 0.04, "accuracy": 98.0}
    assert named(report.script, report.given)[0]["accuracy"] == {"value": 98.0, "right": 49, "of": 50, "scale": 100}

    @section
    def section_accuracy(report):
        """4. accuracy"""
        raise UserError("--data-dir x is a file, not a folder of {train,val}/<class>/")

    section_accuracy(report)
    assert capsys.readouterr().out.endswith('section "4. accuracy": --data-dir x is a file, not a folder of '
                                            '{train,val}/<class>/\n')
