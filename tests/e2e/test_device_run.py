"""bench/device_run.py, the prepared GPU run, cannot rot: its dry mode (CPU, tiny sizes) runs both parts end to end
and writes its summaries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "alpaca_en_demo.json").is_file(), reason="../shared/data is absent")
def test_the_device_script_dry_mode_runs_both_parts(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "device_run.py"), str(tmp_path / "out"), "--dry-run"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    perf = summary["performance"]
    assert set(perf["rows"]) == {"llrd", "flat", "packed", "trl"}
    assert all(row["tokens_per_s"] > 0 for row in perf["rows"].values())
    assert perf["rows"]["flat"]["peak_memory_gb"] > 0  # the run's own record of its peak
    gemma = summary["performance_gemma"]  # the Gemma-shaped case: padding-free (sft's default) against padded
    assert set(gemma["rows"]) == {"flat", "padded", "trl"} and "flat/padded" in gemma["ratios"]
    assert all(row["tokens_per_s"] > 0 for row in gemma["rows"].values())
    assert "Gemma-3-shaped" in (tmp_path / "out" / "summary.md").read_text()
    evidence = summary["evidence"]
    assert evidence.get("summary") is not None, {k: v for k, v in evidence.items() if k != "summary"}
    methods = {row["method"] for row in evidence["summary"]}
    assert {"flat", "flat + KL β=0.1", "merge α=0.5 of flat"} <= methods
    assert "## Evidence, llama-shaped base" in (tmp_path / "out" / "summary.md").read_text()
    gemma_evidence = summary["evidence_gemma"]  # the same sweep on a Gemma-3-shaped base (sliding windows, tied)
    assert gemma_evidence["arch"] == "gemma3" and gemma_evidence.get("summary") is not None, gemma_evidence
    assert {"flat", "flat + KL β=0.1", "merge α=0.5 of flat"} <= {row["method"] for row in gemma_evidence["summary"]}
    assert "## Evidence, Gemma-3-shaped base" in (tmp_path / "out" / "summary.md").read_text()
    # the rest of the method comparison on that base (DFT ± KL, replay, self-replay, sdft, γ 0.97): each sweep's
    # every cell command line read as the CLI reads it (dry mode checks them, the GPU runs them)
    methods = gemma_evidence["methods"]
    assert set(methods) == {"dft", "replay", "self_replay", "sdft", "llrd"}
    assert all(status["rc"] == 0 for status in methods.values()), methods
