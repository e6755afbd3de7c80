#!/usr/bin/env bash
# The GPU figures of the README in one call, on a machine without a network: stand-ins (random ViT-B/16
# checkpoints, generated pictures, a beans-shaped dataset of the release's size), the benchmark in fp32
# and bf16, each script whole (posemb, few-shot, fine-tuning in bf16, the backbone's Trainer on beans),
# then, with PYTEST=N, the test suite with N parallel workers. Logs, JSON and times.txt go to $OUT; it
# ends with one table: script, whole time, the model's share, the longest wait of a pass.
#
#     OUT=gpu-results bash benchmarks/gpu_timings.sh
#     PYTEST=8 OUT=gpu-results bash benchmarks/gpu_timings.sh            # and the suite, 8 workers
#     SMOKE=1 OUT=/tmp/smoke bash benchmarks/gpu_timings.sh              # the plumbing, with tiny models, on a CPU
#     ONLY="standins backbone" PER_CLASS=100 bash benchmarks/gpu_timings.sh   # some steps, fewer pictures
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
WORK=${WORK:-/tmp/vit-timing}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/times.txt"  # this call's times only: a reused OUT keeps no older lines
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TQDM_DISABLE=1
if [ "${SMOKE:-0}" = 1 ]; then
    size=tiny; in21k=$WORK/tiny-in21k; in1k=$WORK/tiny-1k; standins=(--per-class 12 --beans-per-class 4 --beans-side 64)
    quick=(--steps 6); small=(--batch-size 4 --probe-epochs 5); device=(--device cpu)
else
    size=B; in21k=$WORK/vit-b16-in21k; in1k=$WORK/vit-b16-1k; standins=(--per-class "${PER_CLASS:-393}"); quick=(); small=()
    device=(--device cuda)
fi

timed() {  # timed NAME COMMAND...: the command's output to NAME.log, its wall time to times.txt
    local name=$1; shift
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
    rm -f "$OUT/$name.json"  # the table reads only what this call made
    local start; start=$(date +%s%N)
    timeout "${LIMIT:-180}" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local ms=$((($(date +%s%N) - start) / 1000000))
    printf '%-16s rc %d  %6d.%01d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) | tee -a "$OUT/times.txt"
    return 0
}

{ nvidia-smi -L || true; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 -c "import datasets, pyarrow; print('datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"; nproc; } \
    2>&1 | tee "$OUT/machine.txt"
timed standins python3 benchmarks/timing_standins.py "$WORK" "${standins[@]}"
timed bench_fp32 python3 benchmarks/throughput.py --size "$size" "${device[@]}" --json "$OUT/bench_fp32.json"
timed bench_bf16 python3 benchmarks/throughput.py --size "$size" "${device[@]}" --precision bf16 \
    --loader-pictures 256 --json "$OUT/bench_bf16.json"  # the loader alone is fp32's figure; a short look here
timed posemb python3 vit_part3_posemb.py --model "$in1k" --data-dir "$WORK/nette" "${device[@]}" --json "$OUT/posemb.json"
timed fewshot python3 vit_part3_fewshot.py --model "$in21k" --data-dir "$WORK/nette" "${device[@]}" --no-cache \
    --json "$OUT/fewshot.json"
timed finetune_bf16 python3 vit_part3_finetune.py --model "$in21k" --data-dir "$WORK/nette" "${quick[@]}" \
    "${device[@]}" --precision bf16 --json "$OUT/finetune_bf16.json"
timed backbone python3 vit_backbone.py --model "$in1k" --data-dir "$WORK/beans" "${small[@]}" "${device[@]}" \
    --no-cache --json "$OUT/backbone.json"
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import json, sys
out = sys.argv[1]
wall = {fields[0]: float(fields[3]) for fields in map(str.split, open(f"{out}/times.txt"))
        if len(fields) > 3 and fields[1] == "rc"}  # the steps' lines: NAME rc CODE SECONDS s
def record(name):
    if name not in wall:  # not run by this call (ONLY): an older call's file is not this call's figure
        return None
    try:
        return json.load(open(f"{out}/{name}.json"))
    except (OSError, ValueError):
        return None
print(f"{'script':<14} {'whole (s)':>9} {'model share':>11}  longest wait of a pass")
for name in ("posemb", "fewshot", "finetune_bf16", "backbone"):
    if name not in wall:
        continue
    r = record(name)
    if r is None or not r.get("passes"):
        print(f"{name:<14} {wall[name]:9.1f}  no JSON with passes: see {name}.log")
        continue
    passes = r["passes"]
    model = sum(p["seconds"] - p["waiting seconds"] for p in passes.values())
    worst = max(passes, key=lambda k: passes[k]["waiting seconds"] / max(passes[k]["seconds"], 1e-9))
    p = passes[worst]
    print(f"{name:<14} {wall[name]:9.1f} {model / wall[name]:11.2f}  {worst}: {p['waiting seconds']:.2f} of "
          f"{p['seconds']:.1f} s ({100 * p['waiting seconds'] / max(p['seconds'], 1e-9):.1f}%)")
for name in ("bench_fp32", "bench_bf16"):
    b = record(name)
    if b is None:
        continue
    print(name, b["device"], {k: round(v["pictures/s"], 1) for k, v in b["model-only"].items()},
          "end-to-end/model-only", round(b["end-to-end / model-only"], 3), "waiting share",
          round(b["end-to-end waiting share"], 3), "start-up s", round(b["end-to-end start-up seconds"], 2),
          "train s/step", round(b["training seconds/step"], 4))
for name in ("posemb", "fewshot", "finetune_bf16", "backbone"):
    r = record(name)
    if r is not None:
        print(name, "peak memory GB", r["environment"].get("peak memory GB"), "seconds", r["environment"]["seconds"])
PY
if [ -n "${PYTEST:-}" ]; then
    start=$(date +%s)
    timeout "${PYTEST_LIMIT:-240}" python3 -m pytest -n "$PYTEST" -p no:cacheprovider -q -rs >"$OUT/pytest.log" 2>&1
    echo "pytest -n $PYTEST: rc $?, $(( $(date +%s) - start )) s; $(tail -1 "$OUT/pytest.log")" | tee -a "$OUT/times.txt"
fi
