#!/usr/bin/env bash
# CI: the package as a user installs it. Build the wheel, install it into a fresh virtual environment outside the
# checkout, and from a directory outside the checkout list the bundled recipes, run `demo --quick`, and dry-run a
# bundled recipe by name on the demo's base model. Nothing is written into the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONPATH  # the installed wheel, not this checkout, must be what runs
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS

# The wheel is built from a copy of what it is made of, so that no build/ or *.egg-info is left here.
mkdir "$work/src"
cp -r pyproject.toml README.md posttrainllm "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
"$python" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/posttrainllm-*.whl)
"$python" -m zipfile -l "$wheel" > "$work/wheel.txt"  # to a file: `| grep -q` would end the listing early (pipefail)
grep -q "posttrainllm/recipes/alpaca-sft-llrd.yaml" "$work/wheel.txt"

# A fresh environment (no --system-site-packages); the CPU build of PyTorch first, as the README says.
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.13.0
"$work/venv/bin/pip" install -q "$wheel"
posttrainllm="$work/venv/bin/posttrainllm"
echo "wheel built and installed in $((SECONDS - start)) s"

mkdir "$work/user" && cd "$work/user"
"$work/venv/bin/python" -c 'import posttrainllm as p, sys; sys.exit("/site-packages/" not in p.__file__)'
"$posttrainllm" recipes > recipes.txt
cat recipes.txt
grep -q "^alpaca-sft-llrd " recipes.txt
"$posttrainllm" demo --quick --output-dir demo
echo "demo --quick done at $((SECONDS - start)) s"
"$posttrainllm" sft --recipe alpaca-sft-llrd --model demo/base --dataset demo/data/instructions.jsonl \
  --output-dir sft-dry-run --dry-run
grep -q '"llrd": 0.8' sft-dry-run/run_config.json  # the bundled recipe's γ reached the run
echo "wheel check passed in $((SECONDS - start)) s"
