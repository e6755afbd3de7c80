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

from job.standins import smooth_pictures

sys.path.insert(0, str(ROOT / "benchmarks"))
import throughput

CPU = torch.device("cpu")


def test_forward_flops_of_the_benchmark_model_are_the_articles_and_the_patch_embedding():
    """The article's 34.9 and 110.3 GFLOPs (34,894,909,440 and 110,287,687,680, tests/test_setup.py), plus the patch
    embedding's 2 N 3 P^2 D: N = 196 and 576 patches of 16 x 16 x 3 mapped to 768 numbers."""
    config = throughput.benchmark_model("B")
    assert throughput.forward_flops(config, 224) == 34_894_909_440 + 2 * 196 * 3 * 16 * 16 * 768
    assert throughput.forward_flops(config, 384) == 110_287_687_680 + 2 * 576 * 3 * 16 * 16 * 768


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
    loop = throughput.end_to_end(model, paths, 224, 2, CPU, torch.autocast("cpu", enabled=False), 2)
    assert loop["pictures/s"] > 0 and loop["model-only pictures/s"] > 0 and loop["ratio"] > 0
    assert loop["start-up seconds"] > 0 and 0 <= loop["waiting share"] <= 1 and loop["workers"] == 0  # a CPU
    speed, peak, what = throughput.training_step(model, 224, 2, CPU, torch.autocast("cpu", enabled=False), repeats=1)
    assert speed > 0 and peak > 0 and what
    assert not model.training


@pytest.mark.parametrize("precision", ["bf16"])  # fp32 takes the same path without autocast: test_gpu.py runs both
def test_whole_run_on_a_tiny_vit(tmp_path, precision):
    """On the CPU wherever the tests run (test_gpu.py makes the same run on CUDA)."""
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, "benchmarks/throughput.py", "--size", "tiny", "--batch-size", "4",
                          "--repeats", "1", "--rounds", "1", "--pictures", "8", "--loader-pictures", "4",
                          "--workers", "1",
                          "--device", "cpu", "--precision", precision, "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures["model-only"]) == {"224 sdpa", "224 eager", "384 sdpa", "384 eager"}
    assert figures["faster attention"] in ("sdpa", "eager") and figures["precision"] == precision
    assert figures["device"].startswith("CPU: ")
    lines = run.stdout.strip().splitlines()
    assert lines[-1].startswith("end-to-end / model-only at 224: ")
    assert float(lines[-1].rsplit(" ", 1)[1]) == pytest.approx(figures["end-to-end / model-only"], abs=0.005)
    assert_loader_lines(lines[-5:-1], figures, workers=1)


def assert_loader_lines(lines, figures, workers):
    """The four ratio lines, in the issue's order, each the ratio of the pictures/s in the JSON."""
    expected = [(resolution, what) for resolution in ("224", "384") for what in ("inline", "DataLoader")]
    assert len(lines) == 4
    for line, (resolution, what) in zip(lines, expected, strict=True):
        assert line.startswith(f"loader / {what} at {resolution} with {workers} workers: "), line
        figure = figures["loader-only"][resolution]
        ratio = figure["workers pictures/s"] / figure[f"{what} pictures/s"]
        assert float(line.rsplit(" ", 1)[1]) == pytest.approx(ratio, abs=0.005)


def test_loader_only_runs_just_the_loader_figures(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, "benchmarks/throughput.py", "--loader-only", "--loader-pictures", "4",
                          "--rounds", "1",
                          "--workers", "1", "--json", str(out)],  # one worker, as the whole run above: a spawn each
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert "model-only" not in figures and "end-to-end / model-only" not in run.stdout
    assert "== 7. the loader alone" in run.stdout and run.stdout.count("== ") == 1
    assert_loader_lines(run.stdout.strip().splitlines()[-4:], figures, workers=1)
