"""The second real model, Gemma 3 270M (base, Q4_K_M GGUF; bench/gemma3.py fetches it), through every command:
finetune, sft on prompt/completion rows, dpo, merge, eval --reference, generate, --self-replay and --kl-to-base, and
a sweep's dry run. What is particular to it is checked where it shows: its tokenizer puts <bos> before every text,
so every training block and every evaluation window starts with it; a 262k vocabulary; sliding-window layers; a
tied embedding that holds most of the parameters; Q4_K_M tensors.

Skipped when the file is not in the cache ($POSTTRAINLLM_CACHE/gemma3 or ~/.cache/posttrainllm/gemma3); with
POSTTRAINLLM_FETCH_MODELS=1 the test fetches it first (bench/gemma3.py), and skips when the wheels cannot be had."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from harness import run_args

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

REPO = Path(__file__).resolve().parents[2]
NAME = "gemma-3-270m-q4_k_m.gguf"


def _cached() -> Path | None:
    roots = [os.environ.get("POSTTRAINLLM_CACHE"), os.path.join(os.path.expanduser("~"), ".cache", "posttrainllm")]
    for root in filter(None, roots):
        if (Path(root) / "gemma3" / NAME).is_file():
            return Path(root) / "gemma3" / NAME
    return None


@pytest.fixture(scope="module")
def gemma() -> Path:
    pytest.importorskip("gguf")
    found = _cached()
    if found is None and os.environ.get("POSTTRAINLLM_FETCH_MODELS") == "1":
        fetched = subprocess.run([sys.executable, str(REPO / "bench" / "gemma3.py"), "--gguf"], capture_output=True)
        found = _cached() if fetched.returncode == 0 else None
    if found is None:
        pytest.skip(f"{NAME} is not in the cache (python bench/gemma3.py fetches it)")
    if not (SHARED_DATA / "tinyshakespeare.txt").is_file():
        pytest.skip("../shared/data is absent")
    return found


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gemma-data")
    text = (SHARED_DATA / "tinyshakespeare.txt").read_text(encoding="utf-8")
    out = {"train": d / "train.txt", "held": d / "held.txt", "rows": d / "rows.jsonl", "pairs": d / "pairs.jsonl"}
    out["train"].write_text(text[:6000], encoding="utf-8")
    out["held"].write_text(text[-3000:], encoding="utf-8")
    alpaca = json.loads((SHARED_DATA / "alpaca_en_demo.json").read_text())[:16]
    rows = [{"prompt": f"{r['instruction']}\n{r['input']}\nAnswer: ", "completion": r["output"][:200]} for r in alpaca]
    out["rows"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = [{"prompt": r["prompt"], "chosen": r["completion"], "rejected": r["completion"][::-1]} for r in rows]
    out["pairs"].write_text("".join(json.dumps(r) + "\n" for r in pairs))
    return out


def invoke(*args):
    from typer.testing import CliRunner

    from posttrainllm.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def finetuned(gemma, files, tmp_path_factory) -> tuple[Path, list]:
    """A 2-step finetune on Shakespeare (the trainer captured), its output and its first logged loss."""
    from posttrainllm.training import LLRDMixin

    seen, original = [], LLRDMixin.create_optimizer

    def spy(self, model=None):
        seen.append(self)
        return original(self, model)

    out = tmp_path_factory.mktemp("ft") / "o"
    LLRDMixin.create_optimizer = spy
    try:
        argv = run_args("finetune", gemma, files["train"], out, steps=2, max_length=48, lr="1e-5", llrd="0.9",
            logging_steps=1, precision="fp32")  # fmt: skip
        r = invoke(*argv)
    finally:
        LLRDMixin.create_optimizer = original
    return out, [seen[0].train_dataset, r.output]


def test_finetune_trains_on_blocks_that_start_with_bos_at_a_bos_started_loss(finetuned):
    out, (blocks, output) = finetuned
    assert "block_17" in output and "block_18" not in output  # 18 blocks
    assert all(b["input_ids"][0] == 2 and b["input_ids"][1] != 2 for b in blocks)  # <bos> once
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    first = next(h["loss"] for h in history if "loss" in h)
    assert 1.0 < first < 5.5  # BOS-started: ~3.3-4.3 per token on Shakespeare; without BOS the first loss was 6.12
    groups = json.loads((out / "param_groups.json").read_text())
    assert groups  # the plan was saved


def test_eval_reference_and_merge(gemma, finetuned, files, tmp_path):
    out, _ = finetuned
    r = invoke("eval", "--model", out, "--reference", gemma, "--text", files["held"], "--max-length", "64", "--json",
        "--precision", "fp32")  # fmt: skip
    result = json.loads(r.stdout)
    held = next(v for k, v in result.items() if "held" in k)
    assert 0 < held["kl"] < 1.0 and 1.0 < held["nll"] < 6.0
    merged = tmp_path / "merged"
    invoke("merge", "--base", gemma, "--model", out, "--alpha", "0.5", "--output-dir", merged, "--ood-eval",
        files["held"], "--max-length", "64", "--precision", "fp32")  # fmt: skip
    assert any(merged.rglob("model.safetensors"))


def test_sft_on_prompt_completion_rows_with_the_kl_anchor_and_self_replay(gemma, files, tmp_path):
    argv = run_args("sft", gemma, files["rows"], tmp_path / "s", steps=1, max_length=64, lr="1e-5",
        kl_to_base="0.1", self_replay="1", replay_ratio="0.5", ood_eval=files["held"])  # fmt: skip
    r = invoke(*argv)
    assert "KL" in r.output and (tmp_path / "s" / "model.safetensors").is_file()


def test_dpo_and_generate(gemma, files, tmp_path):
    invoke(*run_args("dpo", gemma, files["pairs"], tmp_path / "d", steps=1, max_length=64, lr="1e-6"))
    r = invoke("generate", "--model", gemma, "--prompt", "To be, or not to be,", "--max-new-tokens", "8")
    assert r.stdout.strip()


def test_a_sweep_dry_run(gemma, files, tmp_path):
    r = invoke("sweep", "finetune", "--model", gemma, "--dataset", files["train"], "--eval-dataset", files["held"],
        "--ood-eval", files["held"], "--llrd", "1.0,0.9", "--lr", "1e-5", "--max-steps", "2", "--max-length", "48",
        "--output-dir", tmp_path / "sw", "--dry-run")  # fmt: skip
    text = " ".join(r.output.split())
    assert "2 cells (0 already done, 2 to run" in text and "--llrd 0.9" in text and not (tmp_path / "sw").exists()
