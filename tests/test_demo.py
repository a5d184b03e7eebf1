"""The offline demo runs end to end with no network and prints the comparison table."""

import json
import os
import subprocess
import sys

import pytest

from posttrainllm import demo_data


@pytest.mark.smoke
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
    assert "flat vs layer-wise LR decay" in r.stdout
    results = json.loads((out / "demo_results.json").read_text())
    assert len(results) == 2
    for row in results.values():
        assert row["eval_loss"] > 0 and row["before"] > 0 and row["after"] > 0
    again = subprocess.run(
        [sys.executable, "-m", "posttrainllm", "demo", "--quick", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_demo_data_comes_from_this_python_install(tmp_path):
    files = demo_data.write_demo_files(tmp_path)
    assert files["pretrain"].stat().st_size > 100_000
    assert files["heldout_code"].read_text() not in files["pretrain"].read_text()
