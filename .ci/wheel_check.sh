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
# The demo's end-to-end check (tests/e2e/test_demo.py runs the same from the checkout; CI runs it here only, from
# the wheel, and the suite skips it: POSTTRAINLLM_DEMO_CHECKED_BY_WHEEL): the table, its record, the refusal to
# write into a finished output.
"$posttrainllm" demo --quick --output-dir demo > demo.txt
cat demo.txt
grep -q "flat, layer decay, replay and a forgetting budget" demo.txt
"$work/venv/bin/python" - <<'PY'
import json, os
rows = json.load(open("demo/demo_results.json"))
assert len(rows) == 4, rows
assert all(r["eval_loss"] > 0 and r["before"] > 0 and r["after"] > 0 for r in rows.values()), rows
budgeted = next(r for label, r in rows.items() if label.startswith("★ budget ≤20%"))
assert budgeted["change_pct"] <= 20 + 1e-6 < rows["flat (γ=1.0)"]["change_pct"], rows
assert 0 < budgeted["alpha"] < 1 and os.path.isfile("demo/sft-flat/unmerged/model.safetensors"), rows
PY
if "$posttrainllm" demo --quick --output-dir demo 2> again.txt; then echo "a second demo into demo/ was not refused"; exit 1; fi
grep -q -- "--overwrite" again.txt
echo "demo --quick done at $((SECONDS - start)) s"
"$posttrainllm" sft --recipe alpaca-sft-llrd --model demo/base --dataset demo/data/instructions.jsonl \
  --output-dir sft-dry-run --dry-run
grep -q '"llrd": 0.8' sft-dry-run/run_config.json  # the bundled recipe's γ reached the run
echo "wheel check passed in $((SECONDS - start)) s"
