#!/usr/bin/env bash
# The distributed engines that need GPUs, checked with layer decay (bench/gpu_distributed.py has the table):
# FSDP2 on GPUs, FSDP1 with use_orig_params true (trains with per-block LRs) and false (refused), DeepSpeed ZeRO-2
# and ZeRO-3 without an "optimizer" block (train with posttrainllm's groups, read back from DeepSpeed's optimizer),
# a DeepSpeed config with its own "optimizer" (refused), each compared with a DDP run of the same seed.
#
#   bash bench/gpu_distributed.sh [OUT_DIR]     # a CUDA torch, posttrainllm installed (pip install -e .);
#                                                # DeepSpeed cases need `pip install deepspeed`, else reported as skipped
#
# Budget: 7 launches of a 4-block model for 12 steps, at most 150 s each, about 3-5 minutes in all on one machine
# with 2 GPUs (with 1 GPU every launch runs 1 process: the engines and checks run, without real sharding).
# Writes OUT_DIR/{env.txt,summary.json,summary.txt} and one directory per case (log.txt, out/, spy/). Exit 1 when
# a check fails. Not run yet: no GPU machine has been lent to this work.
set -euo pipefail
OUT="${1:-${OUT:-bench-gpu-distributed-out}}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"

{
  date -Is; nproc
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PY" -c "import torch, transformers, trl, accelerate; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.device_count(), 'GPU(s)'); print('transformers', transformers.__version__, 'trl', trl.__version__, 'accelerate', accelerate.__version__)"
  "$PY" -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>/dev/null || echo "deepspeed: not installed"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
NPROC="${NPROC:-$("$PY" -c "import torch; print(min(2, torch.cuda.device_count()))")}"

timeout 570 "$PY" bench/gpu_distributed.py "$OUT" --nproc "$NPROC"
