"""The offline demo runs end to end with no network and prints the comparison table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.smoke
@pytest.mark.skipif(
    os.environ.get("POSTTRAINLLM_DEMO_CHECKED_BY_WHEEL") == "1",
    reason="CI ran demo --quick from the installed wheel with these checks (.ci/wheel_check.sh)",
)
def test_demo_quick_runs_offline(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "posttrainllm", "demo", "--quick", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "flat, layer decay, replay and a forgetting budget" in r.stdout
    results = json.loads((out / "demo_results.json").read_text())
    assert len(results) == 4
    for row in results.values():
        assert row["eval_loss"] > 0 and row["before"] > 0 and row["after"] > 0
    budgeted = next(row for label, row in results.items() if label.startswith("★ budget ≤20%"))
    assert budgeted["change_pct"] <= 20 + 1e-6 < results["flat (γ=1.0)"]["change_pct"]  # the quick flat run forgets
    assert 0 < budgeted["alpha"] < 1 and (out / "sft-flat" / "unmerged" / "model.safetensors").is_file()
    again = subprocess.run(
        [sys.executable, "-m", "posttrainllm", "demo", "--quick", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert again.returncode == 2 and "--overwrite" in again.stderr


# ---------------------- a fresh demo reproduces the README's record (its table: tests/unit/commands/test_demo_parts.py)
REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "docs" / "demo_results.json"


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("POSTTRAINLLM_CHECK_DEMO"), reason="set POSTTRAINLLM_CHECK_DEMO=1 (minutes)")
def test_a_fresh_demo_reproduces_the_record(tmp_path):
    """Opt-in: the recorded demo (full or --quick), re-run in this environment, gives the recorded numbers."""
    import torch

    record = json.loads(RECORD.read_text())
    if (
        torch.__version__ != record["environment"]["torch"]
        or torch.get_num_threads() != record["environment"]["threads"]
    ):
        pytest.skip("the record was made with another torch version or thread count")
    out = tmp_path / "demo"
    quick = ["--quick"] if record["environment"]["quick"] else []
    r = subprocess.run(
        [sys.executable, "-m", "posttrainllm", "demo", *quick, "--output-dir", str(out)], capture_output=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    fresh = json.loads((out / "demo_results.json").read_text())
    for label, row in record["runs"].items():
        assert fresh[label]["eval_loss"] == pytest.approx(row["eval_loss"], rel=1e-3)
        assert fresh[label]["change_pct"] == pytest.approx(row["change_pct"], abs=0.5)
