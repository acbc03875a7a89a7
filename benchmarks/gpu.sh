#!/usr/bin/env bash
# One prepared GPU check: workload G of ../shared/reference/anchors.md (four Llama models of 0.45B
# parameters, 64 prompts x 64 tokens, 128 new tokens, 4 PPO epochs, minibatch 16) on one CUDA
# device, in bf16-mixed (fp32 master weights of the trained roles, bf16 autocast, bf16 frozen
# roles), pure bf16 and fp32. Prints one JSON line per configuration (and copies them to
# $OUT/gpu.jsonl when OUT is set). Meant to finish in well under 8 minutes on one H100/H200.
#
#   bash benchmarks/gpu.sh            # from the repository root, with torch+transformers installed
#   ITERS=4 bash benchmarks/gpu.sh    # fewer timed iterations
#
# The last run is the same workload under `torchrun --nproc-per-node 1` with the policy and the
# critic sharded by FSDP2 (`--fsdp`, the placement `fourfold ppo` uses under torchrun, NCCL).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
ITERS=${ITERS:-6}
LOG=${OUT:-/tmp}/gpu.jsonl
: > "$LOG"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
G="--hidden 896 --layers 24 --heads 14 --intermediate 4864 --vocab 32000 --batch 64 --prompt-len 64 --response-len 128 --ppo-epochs 4 --minibatch 16 --device cuda"
run() {  # label, extra args
  local label=$1; shift
  local t0=$SECONDS
  if line=$($PY benchmarks/ppo_iteration.py $G "$@" | tail -n 1); then
    echo "$line" | tee -a "$LOG"
  else
    echo "{\"benchmark\": \"ppo_iteration\", \"config\": \"$label\", \"error\": \"failed, see stderr\"}" | tee -a "$LOG"
  fi
  echo "# $label: $((SECONDS - t0)) s wall" >&2
}
run bf16-mixed --precision bf16-mixed --iterations "$ITERS" --warmup 2
run bf16 --precision bf16 --iterations "$ITERS" --warmup 2
run fp32 --precision fp32 --iterations 4 --warmup 1
# the memory estimate beside torch.cuda.max_memory_allocated per phase (issue: within 15%)
if line=$($PY benchmarks/estimate_vs_measured.py $G --precision bf16-mixed --iterations 2 | tail -n 1); then
  echo "$line" | tee -a "$LOG"
else
  echo '{"benchmark": "estimate_vs_measured", "error": "failed, see stderr"}' | tee -a "$LOG"
fi
# workload G under torchrun with FSDP2 (one process; NCCL on CUDA)
t0=$SECONDS
if line=$($PY -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/ppo_iteration.py $G \
    --precision bf16-mixed --fsdp --iterations "$ITERS" --warmup 2 | tail -n 1); then
  echo "$line" | tee -a "$LOG"
else
  echo '{"benchmark": "ppo_iteration", "config": "fsdp2-torchrun-1", "error": "failed, see stderr"}' | tee -a "$LOG"
fi
echo "# fsdp2 torchrun 1 process: $((SECONDS - t0)) s wall" >&2
