"""Precision: `--precision bf16` on CPU is autocast over fp32 weights; `auto` stays fp32 on CPU; fp16 needs a GPU."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from posttrainllm import models
from posttrainllm.cli import app

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU behaviour")
runner = CliRunner()


def _sft(model_dir, data, out, precision):
    args = ["sft", "--model", str(model_dir), "--dataset", str(data), "--output-dir", str(out)]
    args += ["--batch-size", "4", "--max-length", "128", "--max-steps", "3", "--lr", "1e-3", "--logging-steps", "1"]
    r = runner.invoke(app, [*args, "--precision", precision])
    assert r.exit_code == 0, r.output
    losses = [h["loss"] for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    return r.output, losses


def test_bf16_on_cpu_trains_under_autocast_and_saves_fp32_weights(tiny_model_dir, alpaca_file, tmp_path):
    text16, bf16 = _sft(tiny_model_dir, alpaca_file, tmp_path / "bf16", "bf16")
    _, fp32 = _sft(tiny_model_dir, alpaca_file, tmp_path / "fp32", "fp32")
    assert "bf16 on cpu" in text16 and "autocast" in text16
    assert all(torch.isfinite(torch.tensor(bf16)))
    # autocast really ran: the same run in bf16 is close to the fp32 one but not bit-identical
    assert bf16 != fp32
    assert bf16[0] == pytest.approx(fp32[0], rel=0.02)
    saved = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}  # weights stay fp32 (master weights)
    run_config = json.loads((tmp_path / "bf16" / "run_config.json").read_text())
    assert run_config["precision"] == "bf16"
    warned = "without bf16 instructions" in " ".join(text16.split())
    assert warned == (not models.cpu_has_native_bf16())


def test_auto_is_fp32_on_cpu_with_its_reason_and_fp16_needs_a_gpu():
    assert models.pick_precision("auto") == "fp32"
    assert "auto" in models.precision_reason("auto", "fp32")
    from posttrainllm.errors import UsageError

    with pytest.raises(UsageError, match="needs a GPU"):
        models.pick_precision("fp16")
    assert models.pick_precision("bf16") == "bf16"


def test_trainer_config_for_bf16_on_cpu_is_autocast_on_the_cpu(tmp_path):
    from posttrainllm.config import RunConfig
    from posttrainllm.training import common_args

    cfg = RunConfig(
        command="sft",
        output_dir=str(tmp_path),
        lr=1e-3,
        weight_decay=0.0,
        optim="adamw_torch",
        lr_scheduler="linear",
        warmup_ratio=0.0,
        max_steps=1,
        epochs=1.0,
        batch_size=1,
        grad_accum=1,
        seed=1,
        save_steps=10,
        save_total_limit=1,
        logging_steps=1,
        eval_steps=None,
        gradient_checkpointing=False,
        report_to="none",
        ddp_timeout=60,
    )
    args = common_args(cfg, "bf16", has_eval=False)
    assert args["bf16"] is True and args["use_cpu"] is True and args["fp16"] is False
