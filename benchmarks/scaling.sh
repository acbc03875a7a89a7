#!/usr/bin/env bash
# Does a second process pay on a 2-core machine? Workload W (benchmarks/ppo_iteration.py's defaults:
# four Llama models of hidden 256 / 4 layers, 32 prompts x 16 tokens, 32 new tokens, 4 epochs,
# minibatch 8; fp32 on CPU) with the same global batch as
#   one  : 1 process x 2 threads
#   fsdp : 2 processes x 1 thread under torchrun, policy and critic sharded (dist.*: fsdp)
#   rep  : 2 processes x 1 thread under torchrun, policy and critic replicated (dist.*: replicate)
# and the rollout engine's weights under fsdp (generation.weights: auto, the default, which is
# gathered there: once per rollout; live, every layer at every token; copy, a plain copy with the
# static engine) and under replicate (the static engine on a copy),
# run ROUNDS times each, alternating (one, fsdp, rep, one, fsdp, rep, ...), one JSON line per run
# (also appended to $OUT/scaling.jsonl when OUT is set); then, with PROFILE=1, one profiled
# 2-process run of each placement (torch.profiler: the collectives per iteration in the JSON line,
# the top operators by self CPU time on stderr). Run it on a quiet machine:
#
#   bash benchmarks/scaling.sh                 # from the repository root
#   ROUNDS=3 ITERS=10 PROFILE=1 bash benchmarks/scaling.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-2}
ITERS=${ITERS:-10}
LOG=${OUT:-/tmp}/scaling.jsonl
W="--iterations $ITERS --warmup 2"
one() { $PY benchmarks/ppo_iteration.py $W --threads 2 "$@"; }
two() { OMP_NUM_THREADS=1 $PY -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/ppo_iteration.py $W --threads 1 "$@"; }
emit() {  # label, then the command's output on stdin: its last line, labelled
  local line
  line=$(tail -n 1)
  echo "{\"config\": \"$1\", \"result\": ${line:-null}}" | tee -a "$LOG"
}
for round in $(seq "$ROUNDS"); do
  one | emit "1 process x 2 threads (round $round)"
  two --fsdp --weights live | emit "2 processes x 1 thread, fsdp, weights live (round $round)"
  two --replicate | emit "2 processes x 1 thread, replicate (round $round)"
  two --fsdp | emit "2 processes x 1 thread, fsdp, default weights (auto: gathered) (round $round)"
  two --fsdp --engine static --weights copy | emit "2 processes x 1 thread, fsdp, static engine on a copy (round $round)"
  two --replicate --engine static --weights copy | emit "2 processes x 1 thread, replicate, static engine on a copy (round $round)"
done
if [ "${PROFILE:-0}" = 1 ]; then
  W="--iterations 4 --warmup 1"
  two --fsdp --weights live --profile | emit "2 processes x 1 thread, fsdp, weights live, profiled"
  two --replicate --profile | emit "2 processes x 1 thread, replicate, profiled"
fi
