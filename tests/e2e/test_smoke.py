"""Smoke tests: each command really trains a tiny local model for a few steps on CPU, and the weights move by
the amounts the per-block LRs imply."""

import json
import re

import pytest
from harness import cli_args
from safetensors.torch import load_file
from typer.testing import CliRunner

from posttrainllm.cli import app

pytestmark = pytest.mark.smoke
runner = CliRunner()


def weights(d):
    return load_file(str(d / "model.safetensors"))


def block_change(before, after, block, kind="relative"):
    """Relative (‖ΔW‖/‖W‖ over the block's matrices) or max-abs change of a block's weights."""
    names = [
        n
        for n in before
        if (f"layers.{block}." in n if isinstance(block, int) else block in n) and before[n].dim() == 2
    ]
    assert names, block
    if kind == "max":
        return max((after[n] - before[n]).abs().max().item() for n in names)
    num = sum(((after[n] - before[n]) ** 2).sum() for n in names) ** 0.5
    den = sum((before[n] ** 2).sum() for n in names) ** 0.5
    return (num / den).item()


def train(cmd, model_dir, data, out, *extra):
    r = runner.invoke(
        app,
        cli_args(cmd, model_dir, data, out, *extra, batch_size=4, max_length=256, logging_steps=1),
    )
    assert r.exit_code == 0, r.output
    return r.output


def test_sft_first_step_moves_each_block_by_its_lr(tiny_model_dir, alpaca_file, tmp_path):
    """Adam's first step moves every element with a non-negligible gradient by exactly lr: max|ΔW| = group LR."""
    out = tmp_path / "o"
    text = train("sft", tiny_model_dir, alpaca_file, out, "--llrd", "0.5", "--lr", "1e-3", "--max-steps", "1")
    before, after = weights(tiny_model_dir), weights(out)
    for i in range(4):
        expected = 1e-3 * 0.5 ** (3 - i)
        assert block_change(before, after, i, "max") == pytest.approx(expected, rel=0.02)
    assert block_change(before, after, "embed_tokens", "max") == pytest.approx(1e-3 * 0.5**3, rel=0.02)
    assert block_change(before, after, "lm_head", "max") == pytest.approx(1e-3, rel=0.02)
    groups = json.loads((out / "param_groups.json").read_text())
    assert {g["name"]: g["lr"] for g in groups}["block_0"] == pytest.approx(1.25e-4)
    m = re.search(r"LR layer-decay: γ=0\.5 → block_0 LR=([0-9.e+-]+), head LR=([0-9.e+-]+)", text)
    assert m, text
    assert float(m.group(1)) / float(m.group(2)) == pytest.approx(0.5**3, rel=0.05)  # the banner's ratio is γ^(N-1)


def _ratio_run(cmd, model_dir, data, out, *extra):
    train(cmd, model_dir, data, out, "--lr", "1e-3", "--max-steps", "3", *extra)
    before, after = weights(model_dir), weights(out)
    top = block_change(before, after, 3)
    return block_change(before, after, 0) / top, block_change(before, after, "embed_tokens") / top


@pytest.mark.parametrize("cmd,data_fixture", [("sft", "alpaca_file"), ("dpo", "preference_file")])
def test_llrd_half_slows_block0_and_embeddings(cmd, data_fixture, tiny_model_dir, tmp_path, request):
    data = request.getfixturevalue(data_fixture)
    r_block0, r_embed = _ratio_run(cmd, tiny_model_dir, data, tmp_path / "llrd", "--llrd", "0.5")
    assert r_block0 < 0.35
    assert r_embed < 0.35
    flat_block0, _ = _ratio_run(cmd, tiny_model_dir, data, tmp_path / "flat")
    assert 0.6 < flat_block0 < 1.6


def test_finetune_writes_a_loadable_hf_checkpoint(tiny_model_dir, text_file, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "ft"
    train("finetune", tiny_model_dir, text_file, out, "--llrd", "0.5", "--lr", "1e-3", "--max-steps", "3")
    before, after = weights(tiny_model_dir), weights(out)
    assert block_change(before, after, 0) / block_change(before, after, 3) < 0.35
    AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    for f in ("trainer_state.json", "run_config.json", "param_groups.json", "training_complete.json"):
        assert (out / f).is_file(), f


def test_pretrain_builds_tokenizer_and_model(text_file, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "pt"
    r = runner.invoke(
        app,
        [
            "pretrain",
            "--dataset",
            str(text_file),
            "--output-dir",
            str(out),
            "--model-config",
            "tiny",
            "--vocab-size",
            "300",
            "--max-length",
            "32",
            "--batch-size",
            "4",
            "--max-steps",
            "3",
            "--llrd",
            "0.5",
            "--lr",
            "1e-3",
        ],
    )
    assert r.exit_code == 0, r.output
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok)
    groups = {g["name"]: g["lr"] for g in json.loads((out / "param_groups.json").read_text())}
    n = model.config.num_hidden_layers
    assert groups["block_0"] == pytest.approx(1e-3 * 0.5 ** (n - 1))
    assert "LR layer-decay: γ=0.5" in r.output


def test_dry_run_trains_nothing_and_writes_groups(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "dry"
    text = train("sft", tiny_model_dir, alpaca_file, out, "--llrd", "0.8", "--lr", "1e-3", "--dry-run")
    assert "block_3" in text and "embeddings" in text
    assert sorted(p.name for p in out.iterdir()) == ["param_groups.json", "run_config.json"]
