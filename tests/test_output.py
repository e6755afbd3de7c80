"""common/output.py's Report: what a line prints is what it records."""
import numpy as np
import pytest

from common.errors import UserError
from common.output import Report


def test_report_records_what_it_prints(capsys):
    report = Report("test")
    report.print(f"  loss {report.num('loss', 2.302585093, '.6f')}, W = {report.num('W', [[0.625, -0.625]], '.3f')}")
    assert capsys.readouterr().out == "  loss 2.302585, W = [[0.625, -0.625]]\n"
    assert report.numbers["loss"] == {"value": 2.302585093, "text": "2.302585"}
    assert report.numbers["W[1,2]"]["text"] == "-0.625" and report.line_of["W[1,2]"] == 0
    with pytest.raises(ValueError, match="printed twice"):
        report.num("loss", 1.0)


def test_num_formats_shapes_arrays_and_the_projects_specs_as_the_article_prints_them(capsys):
    report = Report("test")
    timing = report.num("224", {"seconds": 65.2, "waiting seconds": 0.04})
    report.print(f"  grid {report.num('grid', 7, '>2')}, {report.num('shape', (197, 768), 'd')}, "
                f"{report.num('X', np.array([[2.0, 1.0]]))}, {report.num('body (M)', 85.79, 'millions')}, "
                f"{report.num('norm', 0.0, 'zero or 3g')}, {report.num('small', 0.123456, 'zero or 3g')}, {timing}")
    assert capsys.readouterr().out == ("  grid  7, (197, 768), [[2.0, 1.0]], 85.8M, 0.0, 0.123, "
                                       "[65 s, 0.0 s waiting for pictures]\n")
    assert list(report.numbers) == ["224 seconds", "224 waiting seconds", "grid", "shape[1]", "shape[2]", "X[1,1]",
                                    "X[1,2]", "body (M)", "norm", "small"]
    assert report.line_of == dict.fromkeys(report.numbers, 0)
    assert report.numbers["grid"] == {"value": 7.0, "text": "7"}  # the text without its padding
    report.num("evidence", 0.5, printed=False)
    assert report.line_of["evidence"] is None


def test_an_accuracy_keeps_its_counts_and_a_reason_prints_as_text(capsys):
    report = Report("test")
    report.print(f"  {report.num('accuracy', 98.0, '.1f', right=49, of=50)}%")
    assert report.numbers["accuracy"] == {"value": 98.0, "text": "98.0", "right": 49, "of": 50, "scale": 100}
    report.cannot_run("4. accuracy", UserError("--data-dir x is a file, not a folder of {train,val}/<class>/"))
    assert capsys.readouterr().out.endswith('section "4. accuracy": --data-dir x is a file, not a folder of '
                                            '{train,val}/<class>/\n')
