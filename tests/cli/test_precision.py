"""Precision: `--precision bf16` on CPU is autocast over fp32 weights; `auto` is bf16 on a CPU with bf16 instructions
and fp32 on one without (decision log 37); fp16 needs a GPU."""

from __future__ import annotations

import json

import pytest
import torch
from harness import cli_args
from safetensors.torch import load_file
from typer.testing import CliRunner

from posttrainllm import models
from posttrainllm.cli import app

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU behaviour")
runner = CliRunner()


def _flat(output: str) -> str:
    """The banner as one line: a table cell wrapped at the console's width joins up again (borders dropped)."""
    return " ".join(output.replace("│", " ").split())


def _sft(model_dir, data, out, precision):
    args = cli_args("sft", model_dir, data, out)
    args += ["--batch-size", "4", "--max-length", "128", "--max-steps", "3", "--lr", "1e-3", "--logging-steps", "1"]
    r = runner.invoke(app, [*args, "--precision", precision])
    assert r.exit_code == 0, r.output
    losses = [h["loss"] for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    return r.output, losses


def test_bf16_on_cpu_trains_under_autocast_and_saves_fp32_weights(tiny_model_dir, alpaca_file, tmp_path):
    text16, bf16 = _sft(tiny_model_dir, alpaca_file, tmp_path / "bf16", "bf16")
    _, fp32 = _sft(tiny_model_dir, alpaca_file, tmp_path / "fp32", "fp32")
    assert "bf16 on cpu" in _flat(text16) and "autocast" in _flat(text16)
    assert all(torch.isfinite(torch.tensor(bf16)))
    # autocast really ran: the same run in bf16 is close to the fp32 one but not bit-identical
    assert bf16 != fp32
    assert bf16[0] == pytest.approx(fp32[0], rel=0.02)
    saved = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}  # weights stay fp32 (master weights)
    run_config = json.loads((tmp_path / "bf16" / "run_config.json").read_text())
    assert run_config["precision"] == "bf16"
    warned = "without bf16 instructions" in _flat(text16)
    assert warned == (not models.cpu_has_native_bf16())


@pytest.mark.parametrize("native", [True, False])
def test_auto_on_cpu_follows_the_cpus_bf16_instructions_and_says_why(native, monkeypatch):
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: native)
    picked = models.pick_precision("auto")
    assert picked == ("bf16" if native else "fp32")
    reason = models.precision_reason("auto", picked)
    assert reason.startswith("auto: ")
    assert ("has bf16 instructions" in reason) == native and ("no bf16 instructions" in reason) == (not native)
    assert models.precision_notes(picked) == []  # auto never picks emulated bf16, so never warns
    assert models.pick_precision("fp32") == "fp32" and models.pick_precision("bf16") == "bf16"


@pytest.mark.parametrize("native", [True, False])
def test_the_banner_names_autos_pick_and_why(native, monkeypatch, tiny_model_dir, alpaca_file, tmp_path):
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: native)
    out = tmp_path / "run"
    args = cli_args("sft", tiny_model_dir, alpaca_file, out)
    r = runner.invoke(app, [*args, "--max-length", "64", "--dry-run"])
    assert r.exit_code == 0, r.output
    text = _flat(r.output)
    picked = "bf16" if native else "fp32"
    assert f"{picked} on cpu" in text
    assert ("this CPU has bf16 instructions" in text) == native


def test_auto_on_cpu_with_bf16_instructions_trains_under_autocast(monkeypatch, tiny_model_dir, alpaca_file, tmp_path):
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    text, auto = _sft(tiny_model_dir, alpaca_file, tmp_path / "auto", "auto")
    _, bf16 = _sft(tiny_model_dir, alpaca_file, tmp_path / "bf16", "bf16")
    _, fp32 = _sft(tiny_model_dir, alpaca_file, tmp_path / "fp32", "fp32")
    assert auto == bf16 and auto != fp32  # the same arithmetic as an explicit --precision bf16
    saved = load_file(str(tmp_path / "auto" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}


def test_fp16_needs_a_gpu():
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


def _eval(model_dir, text_file, precision, *extra):
    args = cli_args("eval", model_dir, None, None, "--text", str(text_file), "--max-length", "48", "--json", *extra)
    r = runner.invoke(app, [*args, "--precision", precision])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)[text_file.name]


@pytest.mark.parametrize("native", [True, False])
def test_eval_scores_at_the_precision_training_picks(native, monkeypatch, tiny_model_dir, text_file):
    """eval --precision: bf16 is autocast (close to fp32, not bit-identical), auto follows the CPU as training does."""
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: native)
    fp32, bf16, auto = (_eval(tiny_model_dir, text_file, p) for p in ("fp32", "bf16", "auto"))
    assert bf16["perplexity"] != fp32["perplexity"]
    assert bf16["perplexity"] == pytest.approx(fp32["perplexity"], rel=0.02)
    assert auto == (bf16 if native else fp32)
    # a reference scored under the same autocast as the model: its KL to itself is exactly 0 in either precision
    for p in ("fp32", "bf16"):
        assert _eval(tiny_model_dir, text_file, p, "--reference", str(tiny_model_dir))["kl"] == 0.0


def test_the_base_caches_key_holds_the_scoring_precision(tiny_model_dir):
    """A base scored under bf16 autocast is another cache entry than the fp32 one; fp32 keys are as before."""
    from transformers import AutoModelForCausalLM

    from posttrainllm.evaluate.base_cache import base_identity, entry_key

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    fp32 = base_identity(str(tiny_model_dir), model, "fp32")
    assert set(fp32) == {"model", "dtype"} and base_identity(str(tiny_model_dir), model) == fp32
    bf16 = base_identity(str(tiny_model_dir), model, "bf16")
    assert bf16 == {**fp32, "autocast": "bfloat16"}
    text = tiny_model_dir / "config.json"
    assert entry_key(fp32, str(text), 64, 8) != entry_key(bf16, str(text), 64, 8)
