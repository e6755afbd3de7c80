"""Throughput: where the scripts' time goes on this machine, and how close it is to the hardware.

The scripts spend almost all their time in ViT-B/16 forward and backward passes. This benchmark
measures, with a randomly initialised ViT-B/16 (the compute of the released weights, nothing
downloaded) and a generated folder of 160-px JPEGs:
  1. the matrix-multiply roofline (fp32; bf16 too where the device has fast bf16 units), GFLOP/s;
  2. model-only forward at 224 and 384: pictures/s, GFLOP/s by torch's count of the forward pass, and the
     fraction of the roofline, with eager and SDPA attention;
  3. end-to-end evaluation with the project's loader (decode, resize, normalise, batch, forward);
  4. the transformers pipeline("image-classification") on the same pictures, as a peer;
  5. a training step (forward, backward, SGD with momentum): pictures/s and peak memory;
  6. scaling: the time ratio 384/224 beside the compute ratio;
  7. the loader alone at 224 and 384: the scripts' loader inline and with N worker processes, beside
     a plain torch DataLoader over the same pictures and the same resize with as many workers.

    python benchmarks/throughput.py                       # about 4 min on a 2-core CPU
    python benchmarks/throughput.py --json throughput.json
    python benchmarks/throughput.py --device cuda --precision bf16
    python benchmarks/throughput.py --size tiny           # a seconds-long smoke run (the test suite's)
    python benchmarks/throughput.py --loader-only         # figure 7 alone, about 1 min on a 2-core CPU

Times are medians over --repeats timed batches after one warm-up batch; the loader's, best of --rounds rounds.
"""
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for common/

from common.data import PREFETCH, load_rgb, picture_loader, resized_rgb, run_model, start_loader
from common.files import write_text
from common.pretrained import ARTICLE_PIXELS
from common.run import (
    DEVICE_CHOICES,
    PRECISIONS,
    batch_pictures,
    begin,
    positive_int,
    script_parser,
)
from common.start_and_end import guarded
from compare.record import device_name
from job.standins import smooth_pictures, vit_config

ATTENTION = ("sdpa", "eager")
PEER_BATCHES = 30  # the pipeline's pictures/s settles within this many batches; it is slower than our loop
SIZES = {"B": {}, "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 256,
                             "num_attention_heads": 4}}  # overrides of ViT-B/16: empty for B


# ---------------------------------------------------------------- measuring

def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def median_seconds(run, device, repeats, warmup=1):
    """The median wall time of run() over `repeats` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        run()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fast_bf16(device):
    """bf16 matrix units: a GPU of compute capability 8.0 or later, or a CPU with AMX or AVX-512 BF16."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "cpu" and Path("/proc/cpuinfo").exists():
        flags = Path("/proc/cpuinfo").read_text()
        return "amx_bf16" in flags or "avx512_bf16" in flags
    return False


def matmul_gflops(device, dtype, n, repeats):
    """GFLOP/s of an n x n by n x n product (2 n^3 operations) on random data."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    seconds = median_seconds(lambda: torch.mm(a, b), device, repeats)
    return 2 * n**3 / seconds / 1e9


def peak_memory_reset(device):
    """Start counting peak memory: the GPU allocator's, or the process's resident set on Linux."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif Path("/proc/self/clear_refs").exists():
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak resident set
        except OSError:
            pass


def peak_memory_gb(device):
    """(GB, what was measured)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9, "GPU memory allocated by torch"
    status = Path("/proc/self/status")
    if status.exists():
        for text in status.read_text().splitlines():
            if text.startswith("VmHWM:"):
                return int(text.split()[1]) * 1024 / 1e9, "peak resident memory of the process"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, "peak resident memory of the process"


# ---------------------------------------------------------------- the model and the pictures

def random_vit(config, attention, device):
    from transformers import AutoModelForImageClassification

    torch.manual_seed(0)
    return AutoModelForImageClassification.from_config(config, attn_implementation=attention).to(device).eval()


def forward_flops(config, resolution):
    """FLOPs of one picture's forward pass through the encoder, as torch's FlopCounterMode counts them on the meta
    device (shapes, no compute): the setup script's formula plus the patch embedding (tests/test_setup.py)."""
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(config, attn_implementation="eager", add_pooling_layer=False)
    with FlopCounterMode(display=False) as counter:
        model(pixel_values=torch.zeros(1, 3, resolution, resolution, device="meta"), interpolate_pos_encoding=True)
    return counter.get_total_flops()


def model_only(model, resolution, batch_size, device, autocast, repeats):
    """Pictures/s of the forward pass alone, on a batch already on the device."""
    pixels = torch.randn(batch_size, 3, resolution, resolution, device=device)

    def forward():
        with torch.inference_mode(), autocast:
            model(pixel_values=pixels, interpolate_pos_encoding=True)

    return batch_size / median_seconds(forward, device, repeats)


def end_to_end(model, paths, resolution, batch_size, device, autocast, rounds=3):
    """{end-to-end and model-only pictures/s, their ratio, the loader's start-up, its wait} of the scripts' loop.

    The loop as the scripts run it: each pass a loader of its own whose workers start before it, each
    picture decoded by a worker from its path (few-shot's passes). The start-up (the workers' start) is
    timed on its own, as a run pays it before each pass. Each round then times the model alone on as many
    batches, and a pass over the JPEG files; the ratio is the median of the rounds' ratios, so that the
    machine's drift (10% between minutes on a shared CPU) falls on both sides of each ratio.
    """
    pixels = torch.randn(batch_size, 3, resolution, resolution, device=device)
    batches = math.ceil(len(paths) / batch_size)

    def model_alone():
        with torch.inference_mode(), autocast:
            for _ in range(batches):
                model(pixel_values=pixels, interpolate_pos_encoding=True)

    run_model(model, paths[:batch_size], resolution, device, batch_size, lambda out: out.logits.argmax(1), "warm-up",
              autocast, pixels=ARTICLE_PIXELS)
    alone, whole, waiting, startup = [], [], [], []
    for _ in range(rounds):
        alone.append(median_seconds(model_alone, device, repeats=1, warmup=0))
        _, timing = run_model(model, paths, resolution, device, batch_size, lambda out: out.logits.argmax(1),
                              "end-to-end", autocast, pixels=ARTICLE_PIXELS)  # its workers' start apart
        startup.append(timing["start-up seconds"])
        whole.append(timing["seconds"])
        waiting.append(timing["waiting seconds"])
    return {"pictures/s": len(paths) / statistics.median(whole),
            "model-only pictures/s": len(paths) / statistics.median(alone),
            "ratio": statistics.median(a / w for a, w in zip(alone, whole, strict=True)),
            "start-up seconds": statistics.median(startup),
            "waiting share": statistics.median(w / t for w, t in zip(waiting, whole, strict=True)),
            "workers": timing["workers"]}


def pipeline_peer(model, paths, batch_size, device, autocast):
    """Pictures/s of transformers' pipeline("image-classification") on the same files."""
    from transformers import ViTImageProcessor, pipeline

    processor = ViTImageProcessor(size={"height": 224, "width": 224})
    classify = pipeline("image-classification", model=model, image_processor=processor, device=device)
    names = [str(path) for path in paths]
    with autocast:
        classify(names[:batch_size], batch_size=batch_size)
        synchronize(device)
        start = time.perf_counter()
        classify(names, batch_size=batch_size)
        synchronize(device)
    return len(paths) / (time.perf_counter() - start)


def training_step(model, resolution, batch_size, device, autocast, repeats):
    """(pictures/s, peak GB, what the peak measures) of forward, backward and an SGD-with-momentum step."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    pixels = torch.randn(batch_size, 3, resolution, resolution, device=device)
    labels = torch.randint(0, model.config.num_labels, (batch_size,), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(pixel_values=pixels).logits, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    peak_memory_reset(device)
    speed = batch_size / median_seconds(step, device, repeats)
    model.eval()
    return (speed, *peak_memory_gb(device))


class Resized(Dataset):
    """The reference: picture i resized, as a PyTorch user would write it for a plain DataLoader."""

    def __init__(self, pictures, resolution):
        self.pictures, self.resolution = pictures, resolution

    def __len__(self):
        return len(self.pictures)

    def __getitem__(self, i):
        return torch.from_numpy(np.array(resized_rgb(self.pictures[i], self.resolution)))


def loader_alone(pictures, resolution, batch_size, workers, rounds=3):
    """Pictures/s, best of `rounds`, of the scripts' loader inline and with `workers` processes, and of the reference.

    Nothing consumes the batches: this is how fast the loader can feed a model that waits for it
    (beside a GPU), not how it shares the cores with a model on the CPU. In each round the three
    run in turn, so that the machine's drift falls on all three; each pass starts its workers before
    it is timed, as the scripts' passes do.
    """
    cpu = torch.device("cpu")
    plain = DataLoader(Resized(pictures, resolution), batch_size=batch_size, num_workers=workers,
                       persistent_workers=True, prefetch_factor=PREFETCH)
    passes = {"inline": lambda: start_loader(picture_loader(pictures, resolution, batch_size, cpu, workers=0))[0],
              "workers": lambda: start_loader(picture_loader(pictures, resolution, batch_size, cpu,
                                                             workers=workers))[0],
              "DataLoader": lambda: iter(plain)}
    best = dict.fromkeys(passes, 0.0)
    for _ in range(rounds):
        for name, started in passes.items():
            batches = started()
            start = time.perf_counter()
            count = sum(len(batch) for batch in batches)
            best[name] = max(best[name], count / (time.perf_counter() - start))
    return best


# ---------------------------------------------------------------- the sections

def benchmark_model(size):
    """The ViT-B/16 config, or B/16 with the tiny overrides."""
    return vit_config("B", **SIZES[size])


def section_roofline(run, figures, report):
    report.print(f"\n== 1. matrix-multiply roofline, {figures['device']} ==")
    n = 8192 if run.device.type == "cuda" else 2048
    products = max(10, run.repeats)  # a product takes milliseconds: enough of them for a steady median
    roofline = {"fp32": matmul_gflops(run.device, torch.float32, n, products)}
    if fast_bf16(run.device):
        roofline["bf16"] = matmul_gflops(run.device, torch.bfloat16, n, products)
    for dtype, gflops in roofline.items():
        report.print(f"  {dtype}: {gflops:,.0f} GFLOP/s  ({n} x {n} by {n} x {n}, median of {products})")
    figures["roofline GFLOP/s"] = roofline


def section_model_only(run, figures, report):
    """Model-only pictures/s at 224 and 384 with both attentions; returns the faster attention's model."""
    args = run.args
    roofline = figures["roofline GFLOP/s"]
    ceiling = roofline["bf16" if args.precision == "bf16" and "bf16" in roofline else "fp32"]
    report.print(f"\n== 2. model-only forward, batch {args.batch_size}, {args.precision}: eager vs SDPA attention ==")
    config = benchmark_model(args.size)
    models = {attention: random_vit(config, attention, run.device) for attention in ATTENTION}
    forward = {}
    for resolution in (224, 384):
        flops = forward_flops(config, resolution)
        repeats = run.repeats if resolution == 224 else max(1, run.repeats // 2)
        for attention, model in models.items():
            speed = model_only(model, resolution, args.batch_size, run.device, run.autocast, repeats)
            gflops = speed * flops / 1e9
            forward[f"{resolution} {attention}"] = {"pictures/s": speed, "GFLOP/s": gflops,
                                                    "of roofline": gflops / ceiling}
            report.print(f"  {resolution} px, {attention:<5}: {speed:8.2f} pictures/s  {gflops:9,.0f} GFLOP/s  "
                         f"{gflops / ceiling:.2f} of the roofline  ({flops / 1e9:.1f} GFLOP a picture)")
    faster = max(ATTENTION, key=lambda attention: forward[f"224 {attention}"]["pictures/s"])
    report.print(f"  faster attention here: {faster}")
    figures.update({"model-only": forward, "faster attention": faster})
    return models[faster]


def section_end_to_end(run, figures, report, model):
    """Our loader end to end, and transformers' pipeline on the same generated JPEGs."""
    args = run.args
    count = args.pictures or (2 if run.device.type == "cpu" else 100) * args.batch_size
    with tempfile.TemporaryDirectory(prefix="vit-bench-") as folder:
        paths = smooth_pictures(folder, count)
        report.print(f"\n== 3. end-to-end evaluation with our loader: {count} JPEGs (160 px high), 224 px, "
                     f"batch {args.batch_size}, decoded by the loader's workers, which persist over the passes ==")
        loop = end_to_end(model, paths, 224, args.batch_size, run.device, run.autocast, args.rounds)
        ours = loop["pictures/s"]
        report.print(f"  the loader's start-up ({loop['workers']} worker processes, the first batch): "
                     f"{loop['start-up seconds']:.2f} s, paid once per run")
        report.print(f"  {ours:8.2f} pictures/s; the model alone on as many batches "
                     f"{loop['model-only pictures/s']:.2f}: ratio {loop['ratio']:.3f}; waiting for pictures "
                     f"{100 * loop['waiting share']:.1f}% of the pass (medians of {args.rounds} rounds, each timing "
                     "both)")
        report.print("\n== 4. peer: transformers pipeline('image-classification') on the same pictures ==")
        peer = pipeline_peer(model, paths[:PEER_BATCHES * args.batch_size], args.batch_size, run.device, run.autocast)
        report.print(f"  {peer:8.2f} pictures/s; ours / pipeline {ours / peer:.2f}")
    figures.update({"end-to-end pictures/s": ours, "end-to-end / model-only": loop["ratio"],
                    "end-to-end start-up seconds": loop["start-up seconds"],
                    "end-to-end waiting share": loop["waiting share"], "end-to-end workers": loop["workers"],
                    "pipeline pictures/s": peer, "ours / pipeline": ours / peer})


def section_training(run, figures, report, model):
    batch = run.args.batch_size
    report.print(f"\n== 5. a training step (forward, backward, clipping, SGD momentum), batch {batch}, 224 px ==")
    speed, peak, what = training_step(model, 224, batch, run.device, run.autocast, run.repeats)
    report.print(f"  {speed:8.2f} pictures/s;  {batch / speed:.2f} s a step; peak {peak:.1f} GB ({what})")
    figures.update({"training pictures/s": speed, "training seconds/step": batch / speed, "training peak GB": peak})


def section_scaling(run, figures, report):
    report.print("\n== 6. scaling from 224 to 384 px ==")
    forward, faster = figures["model-only"], figures["faster attention"]
    time_ratio = forward[f"224 {faster}"]["pictures/s"] / forward[f"384 {faster}"]["pictures/s"]
    config = benchmark_model(run.args.size)
    compute_ratio = forward_flops(config, 384) / forward_flops(config, 224)
    report.print(f"  time ratio 384/224 {time_ratio:.2f}; compute ratio {compute_ratio:.2f}")
    figures.update({"time ratio 384/224": time_ratio, "compute ratio 384/224": compute_ratio})


def section_loader(run, figures, report):
    """The loader alone on pictures decoded once, as posemb and fine-tuning's checks hold them."""
    args, workers = run.args, run.args.workers
    with tempfile.TemporaryDirectory(prefix="vit-bench-") as folder:
        pictures = [load_rgb(path) for path in smooth_pictures(folder, args.loader_pictures)]
    report.print(f"\n== 7. the loader alone: {args.loader_pictures} pictures decoded once (160 px high), batch "
                 f"{args.batch_size}, best of {args.rounds} rounds; the reference is a plain DataLoader with {workers} "
                 "workers ==")
    loader = {}
    for resolution in (224, 384):
        speed = loader_alone(pictures, resolution, args.batch_size, workers, args.rounds)
        loader[str(resolution)] = {"inline pictures/s": speed["inline"], "workers": workers,
                                   "workers pictures/s": speed["workers"], "DataLoader pictures/s": speed["DataLoader"],
                                   "loader / inline": speed["workers"] / speed["inline"],
                                   "loader / DataLoader": speed["workers"] / speed["DataLoader"]}
        report.print(f"  {resolution} px: inline {speed['inline']:8,.0f} pictures/s; {workers} workers "
                     f"{speed['workers']:8,.0f}; plain DataLoader, {workers} workers {speed['DataLoader']:8,.0f}")
    figures["loader-only"] = loader


def loader_lines(figures):
    """The ratio lines a script can read: the loader with workers against inline and against the reference."""
    lines = []
    for resolution, figure in figures["loader-only"].items():
        for what in ("inline", "DataLoader"):
            lines.append(f"loader / {what} at {resolution} with {figure['workers']} workers: "
                         f"{figure[f'loader / {what}']:.2f}")
    return lines


def main(argv=None):
    parser = script_parser(__doc__)
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                        help="auto picks cuda, then mps, then cpu (default: %(default)s)")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="of the model's passes (default: %(default)s)")
    parser.add_argument("--size", default="B", choices=tuple(SIZES),
                        help="B: ViT-B/16; tiny: a smoke test (default: %(default)s)")
    parser.add_argument("--batch-size", type=batch_pictures, default=32,
                        help="pictures per pass (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int,
                        help="timed batches per figure (default: 2 on a CPU, 10 on a GPU)")
    parser.add_argument("--pictures", type=positive_int,
                        help="JPEGs for the end-to-end figures (default: 2 batches on a CPU, 100 beside a GPU)")
    parser.add_argument("--workers", type=positive_int, default=min(8, os.cpu_count() or 1),
                        help="worker processes for the loader-only figures: the cores, at most 8 "
                             "(default: %(default)s)")
    parser.add_argument("--loader-pictures", type=positive_int, default=1024,
                        help="pictures for the loader-only figures (default: %(default)s)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="rounds of the end-to-end and loader-only figures, each starting its workers anew "
                             "(default: %(default)s)")
    parser.add_argument("--loader-only", action="store_true", help="run the loader-only figures alone")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = parser.parse_args(argv)
    run, report = begin("throughput", args)  # --json checked before any work
    run.repeats = args.repeats or (2 if run.device.type == "cpu" else 10)
    figures = {"device": device_name(run.device), "torch": torch.__version__, "precision": args.precision,
               "model": "ViT-B/16" if args.size == "B" else "tiny ViT", "batch": args.batch_size}
    if not args.loader_only:
        section_roofline(run, figures, report)
        model = section_model_only(run, figures, report)
        section_end_to_end(run, figures, report, model)
        section_training(run, figures, report, model)
        section_scaling(run, figures, report)
    section_loader(run, figures, report)
    if args.json:
        write_text(args.json, json.dumps(figures, indent=2, default=str), what="--json file")
    print("\n" + "\n".join(loader_lines(figures)))
    if not args.loader_only:
        print(f"end-to-end / model-only at 224: {figures['end-to-end / model-only']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
