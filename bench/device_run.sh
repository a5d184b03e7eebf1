#!/usr/bin/env bash
# The prepared run for a lent GPU machine (bench/device_run.py), with the wheels that machine lacks installed first.
#
#   bash bench/device_run.sh OUT [WHEELS_DIR]     # on the GPU machine: under 8 minutes on one H200-class GPU
#   bash bench/device_run.sh OUT --dry-run        # on a CPU at a tiny size (what tests/ checks), under 2 minutes
#   bash bench/device_run.sh --wheels DIR         # here, with the package index: download those wheels into DIR
#
# The GPU machine's python3 has torch and transformers but no TRL or datasets, and reaches no package index, so the
# wheels travel with the working tree (at most 64 MiB in all). They are installed into a venv that sees the system's
# torch and transformers (--system-site-packages), from DIR only (--no-index).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ "${1:-}" = "--wheels" ]; then
  dir="${2:?usage: bash bench/device_run.sh --wheels DIR}"
  mkdir -p "$dir"
  # what posttrainllm needs beyond torch/transformers (and their own dependencies), as wheels for this Python
  "$PY" -m pip download -q --only-binary=:all: -d "$dir" "trl>=1.16,<2" "datasets>=4.0" "accelerate>=1.0" \
    "typer>=0.15" "rich>=13" "pyyaml>=6" "peft>=0.15"
  du -sh "$dir"
  exit 0
fi
out="${1:?usage: bash bench/device_run.sh OUT [WHEELS_DIR | --dry-run]}"
mkdir -p "$out"
if [ "${2:-}" = "--dry-run" ]; then
  exec "$PY" bench/device_run.py "$out" --dry-run
fi
if [ -n "${2:-}" ]; then
  "$PY" -m venv --system-site-packages "$out/venv"
  "$out/venv/bin/pip" install -q --no-index --find-links "$2" -e .
  PY="$out/venv/bin/python"
fi
timeout 480 "$PY" bench/device_run.py "$out"
