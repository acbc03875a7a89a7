#!/usr/bin/env bash
# One prepared GPU check: workload G of ../shared/reference/anchors.md (four Llama models of 0.45B
# parameters, 64 prompts x 64 tokens, 128 new tokens, 4 PPO epochs, minibatch 16) on one CUDA
# device. Prints one JSON line per configuration (and copies them to $OUT/gpu.jsonl when OUT is set),
# most important first. No configuration runs past HARD seconds from the start (default 500: with
# the set-up the whole script stays under 9 minutes): one that expects to need more than what is
# left is skipped (a `skipped` line), one still running at HARD is killed (an `error` line).
#
#   1. bf16-mixed, the eager rollout engine (today's default);
#   2. bf16-mixed, the static engine on a bf16 inference copy, its step compiled (CUDA graphs):
#      generation.engine=static, weights=copy, compile=true (side by side with 1);
#   3. long responses: benchmarks/decode.py on G's policy, 64 rows x 64 prompt tokens, 1024 new
#      tokens, the eager engine against the compiled static one (decode only, ms per token);
#   4. running ahead (issue 42): benchmarks/async.py on G in bf16-mixed, fourfold ppo itself,
#      rollout.max_staleness 0 (run.threads 2) against 1 and 2 (the sampler's thread and the
#      trainer's one torch thread each), eager engine, 4 iterations (the first apart); both threads
#      issue to the one default CUDA stream, so this measures the host-side overlap only;
#   5. bf16 (every weight in bf16), eager;  6. the estimate beside the measured peaks;
#   7. torchrun, one process, policy and critic sharded by FSDP2 (NCCL), each FSDP unit gathered
#      once per rollout (weights=gathered);  8. fp32, eager.
#
#   bash benchmarks/gpu.sh            # from the repository root, with torch+transformers installed
#   ITERS=4 HARD=300 bash benchmarks/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
ITERS=${ITERS:-6}        # PPO iterations per configuration (the first 2 are warm-up)
HARD=${HARD:-500}        # seconds from the start: nothing runs past this
LOG=${OUT:-/tmp}/gpu.jsonl
: > "$LOG"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
G="--hidden 896 --layers 24 --heads 14 --intermediate 4864 --vocab 32000 --prompt-len 64 --device cuda"
PPO="$G --batch 64 --response-len 128 --ppo-epochs 4 --minibatch 16"

# label, expected seconds, command...: one configuration (its last stdout line is the JSON line);
# skipped when it expects more than the seconds left before HARD, killed at HARD
run() {
  local label=$1 expect=$2; shift 2
  local t0=$SECONDS left=$((HARD - SECONDS)) line
  if (( expect > left )); then
    echo "{\"config\": \"$label\", \"skipped\": \"expects ${expect} s, ${left} s left before HARD=${HARD}\"}" | tee -a "$LOG"
    return
  fi
  if line=$(timeout "$left" "$@" | tail -n 1) && [[ $line == "{"* ]]; then
    echo "$line" | tee -a "$LOG"
  else
    echo "{\"config\": \"$label\", \"error\": \"failed or killed after $((SECONDS - t0)) s, see stderr\"}" | tee -a "$LOG"
  fi
  echo "# $label: $((SECONDS - t0)) s wall, $SECONDS s in all" >&2
}
PPO_RUN=($PY benchmarks/ppo_iteration.py $PPO --iterations "$ITERS" --warmup 2)

run bf16-mixed-eager 65 "${PPO_RUN[@]}" --precision bf16-mixed
run bf16-mixed-static-copy-compiled 110 "${PPO_RUN[@]}" --precision bf16-mixed --engine static --weights copy --compile
run decode-1024-eager-vs-static-compiled 110 $PY benchmarks/decode.py $G --batch 64 --response-len 1024 \
    --precision bf16-mixed --engines eager,static-compiled --warmup 0 --repeats 1
run async-k0-k1-k2-bf16-mixed 180 $PY benchmarks/async.py $PPO --precision bf16-mixed --iterations 4 --warmup 1
run bf16-eager 50 "${PPO_RUN[@]}" --precision bf16
run estimate-vs-measured 40 $PY benchmarks/estimate_vs_measured.py $PPO --precision bf16-mixed --iterations 2
run fsdp2-torchrun-1-gathered 70 $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
    benchmarks/ppo_iteration.py $PPO --precision bf16-mixed --fsdp --weights gathered --iterations "$ITERS" --warmup 2
run fp32-eager 75 "${PPO_RUN[@]}" --precision fp32
echo "# gpu.sh: $SECONDS s in all" >&2
