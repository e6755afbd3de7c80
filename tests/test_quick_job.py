"""benchmarks/quick_job.py: its figures from a job's OUT, checked against figures worked out by hand.

The job itself takes minutes (the benchmark is run by hand, docs/performance.md); here its report is read
from a made-up OUT, so that the arithmetic it prints cannot rot.
"""
import json
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import quick_job


def made_up_out(tmp_path):
    out = tmp_path / "job"
    out.mkdir()
    seconds = {"setup": 6.0, "posemb": 300.0, "fewshot": 150.0, "finetune": 600.0, "backbone": 144.0}
    (out / "reproduce.json").write_text(json.dumps({"command": "python reproduce.py --quick",
                                                    **{s: {"seconds": t} for s, t in seconds.items()}}))
    passes = {"posemb": {"224": {"seconds": 40.0, "waiting seconds": 0.5, "pictures": 100},
                         "1D": {"seconds": 70.0, "waiting seconds": 0.5, "pictures": 100}},
              "fewshot": {"pool": {"seconds": 60.0, "waiting seconds": 1.0, "pictures": 500},
                          "validation": {"seconds": 20.0, "waiting seconds": 0.0, "pictures": 200}},
              "finetune": {"checks": {"seconds": 300.0, "waiting seconds": 2.0, "pictures": 2000}}}
    for script, timing in passes.items():
        (out / f"{script}.json").write_text(json.dumps({"passes": timing}))
    return out


def test_the_speed_is_the_224_inference_passes_only(tmp_path):
    out = made_up_out(tmp_path)
    runs = {script: json.loads((out / f"{script}.json").read_text()) for script in ("posemb", "fewshot", "finetune")}
    # posemb's 224 row and few-shot's two passes: 100 + 500 + 200 pictures in 40 + 60 + 20 s; not the 384 row
    assert quick_job.pictures_per_second(runs) == pytest.approx(800 / 120)


def test_the_report_scales_by_the_pictures_per_second(tmp_path):
    lines = quick_job.report(made_up_out(tmp_path), wall=1260.0)
    # 800 / 120 = 6.67 pictures/s here against the table's 3.3: 1,260 s = 21.0 min here, x 6.67 / 3.3 = 42.4 min
    assert lines[0] == "ViT-B/16 at 224 here: 6.67 pictures/s; the README's table machine: 3.3"
    assert lines[1] == "the whole job: 1260.0 s (21.0 min, 42.4 min scaled to the table's machine)"
    # the scripts: 6 + 300 + 150 + 600 + 144 = 1,200 s = 20.0 min, x 6.67 / 3.3 = 40.4 min
    assert lines[2] == "the five scripts' processes: 1200.0 s (20.0 min, 40.4 min scaled to the table's machine)"
    assert "  finetune: 600.0 s (10.0 min, 20.2 min scaled to the table's machine)" in lines
    assert "    finetune checks: 2,000 pictures, 300.0 s (2.0 s waiting for pictures)" in lines


def test_without_a_224_pass_nothing_is_scaled(tmp_path):
    out = made_up_out(tmp_path)
    (out / "posemb.json").unlink()
    (out / "fewshot.json").unlink()
    lines = quick_job.report(out, wall=None)
    assert lines[0] == "no 224 pass was timed: nothing scaled"
    assert "  setup: 6.0 s (0.1 min)" in lines
