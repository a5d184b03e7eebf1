#!/usr/bin/env bash
# The depth study of docs/results.md §3 at a width a GPU makes cheap: hidden 512, 8 and 24 blocks, one seed.
# Prepared for one GPU (about 10 minutes on an H100/H200-class card); not run where no GPU was available.
#
#   bash studies/gpu_study.sh OUT_DIR
#
# Needs a CUDA build of torch, the project installed (pip install -e ".[plot]") and ../shared/data beside the
# checkout. Writes OUT_DIR/study/full/depth*-h512/ (sweep results of each depth) and OUT_DIR/docs/results.md.
set -euo pipefail
out="${1:?usage: bash studies/gpu_study.sh OUT_DIR}"
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; assert torch.cuda.is_available(), 'no GPU: this script is for a GPU machine'; print(torch.cuda.get_device_name(0))"
mkdir -p "$out/docs"
start=$(date +%s)
python studies/llrd_study.py --study depth --hidden 512 --depths 8,24 --pretrain-steps 1500 --seeds 0 --jobs 1 \
    --out "$out/study" --docs "$out/docs" 2>&1 | tee "$out/gpu_study.log"
echo "gpu_study: $(( $(date +%s) - start )) s" | tee -a "$out/gpu_study.log"
