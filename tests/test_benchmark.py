"""benchmarks/throughput.py: its helpers and a whole run on a tiny ViT, so that the benchmark cannot rot.

The figures themselves depend on the machine and are not asserted.
"""
import json
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT

from common.compute import config_forward_flops
from common.standins import smooth_pictures

sys.path.insert(0, str(ROOT / "benchmarks"))
import throughput

CPU = torch.device("cpu")


def test_forward_flops_of_the_benchmark_model_are_the_articles():
    config = throughput.benchmark_model("B")
    assert round(config_forward_flops(config, 224) / 1e9, 1) == 34.9   # the article's 34.9 and 110.3 GFLOPs
    assert round(config_forward_flops(config, 384) / 1e9, 1) == 110.3


def test_median_seconds_times_the_calls():
    calls = []

    def nap():
        calls.append(1)
        time.sleep(0.01)

    seconds = throughput.median_seconds(nap, CPU, repeats=3, warmup=2)
    assert len(calls) == 5 and 0.009 < seconds < 0.5


def test_matmul_roofline_counts_2_n_cubed():
    gflops = throughput.matmul_gflops(CPU, torch.float32, 256, repeats=2)
    assert 0.1 < gflops < 1e5


def test_tiny_model_figures(tmp_path):
    config = throughput.benchmark_model("tiny")
    model = throughput.random_vit(config, "eager", CPU)
    assert model.config._attn_implementation == "eager"
    assert throughput.model_only(model, 224, 2, CPU, torch.autocast("cpu", enabled=False), repeats=1) > 0
    paths = smooth_pictures(tmp_path, 5)
    ours, alone, ratio = throughput.end_to_end(model, paths, 224, 2, CPU, torch.autocast("cpu", enabled=False), 2)
    assert ours > 0 and alone > 0 and ratio > 0
    speed, peak, what = throughput.training_step(model, 224, 2, CPU, torch.autocast("cpu", enabled=False), repeats=1)
    assert speed > 0 and peak > 0 and what
    assert not model.training


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_whole_run_on_a_tiny_vit(tmp_path, precision):
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, "benchmarks/throughput.py", "--size", "tiny", "--batch-size", "4",
                          "--repeats", "1", "--pictures", "8", "--precision", precision, "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures["model-only"]) == {"224 sdpa", "224 eager", "384 sdpa", "384 eager"}
    assert figures["faster attention"] in ("sdpa", "eager") and figures["precision"] == precision
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("end-to-end / model-only at 224: ")
    assert float(last.rsplit(" ", 1)[1]) == pytest.approx(figures["end-to-end / model-only"], abs=0.005)
