#!/usr/bin/env bash
# The GPU figures of the README in one call, on a machine without a network: stand-ins (random
# ViT-B/16 checkpoints, generated pictures), the benchmark in fp32 and bf16, the full posemb run,
# the few-shot features, 300 fine-tuning steps, torchrun with nccl, and fp32 vs bf16 posemb accuracy
# on the tiny stand-ins. Logs, JSON and times.txt go to $OUT.
#
#     OUT=gpu-results bash benchmarks/gpu_timings.sh
#     SMOKE=1 OUT=/tmp/smoke bash benchmarks/gpu_timings.sh    # the plumbing, with tiny models, on a CPU
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
WORK=${WORK:-/tmp/vit-timing}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TQDM_DISABLE=1
if [ "${SMOKE:-0}" = 1 ]; then
    size=tiny; in21k=$WORK/tiny-in21k; in1k=$WORK/tiny-1k; data=$WORK/nette; per_class=12; steps=(--steps 6)
else
    size=B; in21k=$WORK/vit-b16-in21k; in1k=$WORK/vit-b16-1k; data=$WORK/nette; per_class=393; steps=()
fi

timed() {  # timed NAME COMMAND...: the command's output to NAME.log, its wall time to times.txt
    local name=$1; shift
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
    local start; start=$(date +%s%N)
    timeout "${LIMIT:-180}" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local ms=$((($(date +%s%N) - start) / 1000000))
    printf '%-16s rc %d  %6d.%01d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) | tee -a "$OUT/times.txt"
    return 0
}

{ nvidia-smi -L || true; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } | tee "$OUT/machine.txt"
timed standins python3 benchmarks/timing_standins.py "$WORK" --per-class "$per_class"
timed bench_fp32 python3 benchmarks/throughput.py --size "$size" --json "$OUT/bench_fp32.json"
timed posemb python3 vit_part3_posemb.py --model "$in1k" --data-dir "$data" --json "$OUT/posemb.json"
timed finetune python3 vit_part3_finetune.py --model "$in21k" --data-dir "$data" "${steps[@]}" --json "$OUT/finetune.json"
timed fewshot python3 vit_part3_fewshot.py --model "$in21k" --data-dir "$data" --no-cache --json "$OUT/fewshot.json"
timed bench_bf16 python3 benchmarks/throughput.py --size "$size" --precision bf16 --json "$OUT/bench_bf16.json"
timed finetune_bf16 python3 vit_part3_finetune.py --model "$in21k" --data-dir "$data" "${steps[@]}" --precision bf16 \
    --json "$OUT/finetune_bf16.json"
timed torchrun python3 -m torch.distributed.run --standalone --nproc_per_node 1 vit_part3_finetune.py \
    --model "$WORK/tiny-in21k" --data-dir "$WORK/tiny-nette" --steps 3 --batch-size 8
for precision in fp32 bf16; do
    timed "tiny_$precision" python3 vit_part3_posemb.py --model "$WORK/tiny-1k" --data-dir "$WORK/tiny-nette" \
        --precision "$precision" --json "$OUT/tiny_posemb_$precision.json"
done
python3 - "$OUT" <<'PY' | tee -a "$OUT/times.txt"
import json, sys
out = sys.argv[1]
def results(name):
    try:
        return json.load(open(f"{out}/{name}.json"))
    except (OSError, ValueError):
        return None
fp32, bf16 = (results(f"tiny_posemb_{p}")["results"] for p in ("fp32", "bf16"))
keys = [k for k in fp32 if k.endswith(("of 10", "of 1000"))]
print("bf16 - fp32 posemb accuracy on the tiny stand-ins, points: max |difference|",
      max(abs(bf16[k] - fp32[k]) for k in keys), "over", len(keys), "figures")
for name in ("bench_fp32", "bench_bf16"):
    b = results(name)
    if b is None:
        continue
    print(name, b["device"], {k: round(v["pictures/s"], 1) for k, v in b["model-only"].items()},
          "end-to-end/model-only", round(b["end-to-end / model-only"], 3), "train s/step",
          round(b["training seconds/step"], 4))
PY
grep -h "step 300:\|step   6:\|on all\|(of 10)\|features computed" "$OUT"/*.log | head -20
