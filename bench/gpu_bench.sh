#!/usr/bin/env bash
# One prepared GPU run of the optimizer-step and throughput benchmarks (bf16, ~0.5-1B llama-shaped models built
# from configs, random init, nothing downloaded), then the real model (SmolLM2-135M-Instruct): posttrainllm vs bare
# TRL and packing vs TRL's padded default. Not run yet: no GPU machine has been lent to the tasks that wrote it.
#
#   bash bench/gpu_bench.sh [OUT_DIR]          # needs a CUDA build of torch with posttrainllm installed (pip install -e .)
#   GGUF=SmolLM2-135M-Instruct.Q4_1.gguf bash bench/gpu_bench.sh OUT   # a machine that cannot reach the package index
#
# Budget: about 12-16 minutes on one H100/H200-class GPU (most of it process start-up and model building).
# Writes OUT_DIR/{env.txt,optimizer_step.json,throughput.json,real_throughput.json} (+ .txt: the summaries).
set -euo pipefail
OUT="${1:-${OUT:-bench-gpu-out}}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"

{
  date -Is; nproc; grep -m1 'model name' /proc/cpuinfo || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c "import torch, transformers, trl; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('transformers', transformers.__version__, 'trl', trl.__version__)"
} > "$OUT/env.txt" 2>&1
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
cat "$OUT/env.txt"

# 1. optimizer.step(): LLRD vs flat, fused and foreach AdamW, bf16 params/grads/state.
#    hidden 1536 (24 heads of 64, 12 KV heads, intermediate 4096), vocab 32000: 12 blocks ≈ 0.41B, 24 blocks ≈ 0.72B params.
timeout 300 "$PY" bench/optimizer_step.py --json --device cuda --dtype bf16 --hidden 1536 --blocks 12,24 \
    --impls fused,foreach --reps 9 --threads 0 > "$OUT/optimizer_step.json" 2> "$OUT/optimizer_step.txt" \
    || echo "optimizer_step failed or timed out (rc=$?)" | tee -a "$OUT/optimizer_step.txt"
tail -n 30 "$OUT/optimizer_step.txt"

# 2. SFT throughput: posttrainllm --llrd 0.9 vs flat vs plain TRL, bf16, hidden 1536 x 24 blocks (~0.6B with the
#    bench's small BPE vocab), batch 8, max length 512, 40 steps, 3 rotated repetitions of 3 subprocesses.
timeout 420 "$PY" bench/throughput.py --json --precision bf16 --hidden 1536 --blocks 24 --batch-size 8 \
    --max-length 512 --steps 40 --reps 3 --threads 0 > "$OUT/throughput.json" 2> "$OUT/throughput.txt" \
    || echo "throughput failed or timed out (rc=$?)" | tee -a "$OUT/throughput.txt"
tail -n 12 "$OUT/throughput.txt"

# 3. The real model (SmolLM2-135M-Instruct, 30 blocks, from bench/smollm2.py; GGUF=FILE puts a copy of the file in
#    the cache it checks by SHA-256, for a machine without the package index), Alpaca, bf16:
#    posttrainllm flat / --llrd 0.9 / bare TRL SFTTrainer (batch 8 x 512, 30 steps, 3 rotated reps), and
#    `--packing` vs TRL's padded default in useful tokens/s with the eval loss at equal tokens seen (batch 8 x 512).
#    It answers whether padding-free packing pays on a GPU with sdpa (on the CPU it did not at batch 8: section 7).
if [ -n "${GGUF:-}" ]; then
  cache="${POSTTRAINLLM_CACHE:-$HOME/.cache/posttrainllm}/smollm2"
  mkdir -p "$cache" && cp "$GGUF" "$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
timeout 600 "$PY" bench/real_throughput.py --json --precision bf16 --steps 30 --batch-size 8 --max-length 512 \
    --reps 3 --pad-steps 60 --pad-batch-size 8 --pad-max-length 512 --pad-kinds trl,packed --threads 4 \
    > "$OUT/real_throughput.json" 2> "$OUT/real_throughput.txt" \
    || echo "real_throughput failed or timed out (rc=$?)" | tee -a "$OUT/real_throughput.txt"
tail -n 12 "$OUT/real_throughput.txt"
