"""sft --loss-type dft: Dynamic Fine-Tuning (TRL's SFTConfig.loss_type="dft", arXiv 2508.05629), each loss token's
NLL weighted by its own detached probability, mean over the loss tokens; with --kl-to-base β the ASFT form, DFT +
β × KL(base ‖ model). The logged losses are recomputed here from the models' logits on the batches the trainer saw;
the option is recorded in run_config.json, refused on a resume that changes it and on the commands without it."""

from __future__ import annotations

import json

import pytest
import torch
from harness import cli_args
from transformers import AutoModelForCausalLM
from trl import SFTTrainer
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def _invoke(model, data, out, *extra):
    args = cli_args("sft", model, data, out, precision="fp32")
    args += ["--batch-size", "4", "--logging-steps", "1", "--save-steps", "1000", "--lr", "1e-2", *extra]
    return runner.invoke(app, args)


def _run(model, data, out, *extra):
    """{step: logged entry} of the run's trainer_state.json."""
    r = _invoke(model, data, out, *extra)
    assert r.exit_code == 0, r.output
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return {h["step"]: h for h in history if "loss" in h}


@pytest.fixture
def batches(monkeypatch):
    """The inputs of every training loss TRL's SFTTrainer computed in this test, in order."""
    seen = []
    original = SFTTrainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        if model.training:
            seen.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "compute_loss", spy)
    return seen


def _sums(model, base, batch) -> dict[str, float]:
    """Σ over the loss tokens (label != -100, shifted) of the DFT loss −p(y)·log p(y), of the NLL −log p(y), of
    KL(base ‖ model) (from the two models' full logits, float64), and their count."""
    # padded, or padding-free (the examples' boundaries read from the position ids, which a KV cache would skip)
    fwd = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    with torch.no_grad():
        logits, ref = (m(**fwd, use_cache=False).logits[:, :-1] for m in (model, base))
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    log_q, log_p = logits[mask].double().log_softmax(-1), ref[mask].double().log_softmax(-1)
    log_y = log_q.gather(-1, labels[mask][:, None])[:, 0]
    kl = (log_p.exp() * (log_p - log_q)).sum()
    return {"dft": -(log_y.exp() * log_y).sum().item(), "nll": -log_y.sum().item(), "kl": kl.item(), "n": mask.sum()}


def test_the_first_steps_logged_loss_is_the_dft_formula(tiny_model_dir, alpaca_file, tmp_path, batches):
    out = tmp_path / "o"
    steps = _run(tiny_model_dir, alpaca_file, out, "--max-steps", "1", "--loss-type", "dft")
    assert len(batches) == 1
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()  # step 1's loss is the starting model's
    sums = _sums(model, model, batches[0])
    n = int(sums["n"])
    assert 0 < n < _tokens(batches[0])  # on the completions only
    assert steps[1]["loss"] == pytest.approx(sums["dft"] / n, rel=1e-5)
    assert steps[1]["loss"] != pytest.approx(sums["nll"] / n, rel=1e-3)  # not the plain cross-entropy
    config = json.loads((out / "run_config.json").read_text())
    assert config["loss_type"] == "dft" and "sft_loss_type" not in config


def test_dft_with_kl_to_base_logs_dft_plus_beta_kl_the_asft_form(tiny_model_dir, alpaca_file, tmp_path, batches):
    """Step 3's logged loss = DFT(model after step 2) + β × KL(base ‖ model after step 2), token means over step 3's
    batch (at step 1 the model is the base, so the KL is 0: a later step is where the term shows)."""
    beta, out = 0.7, tmp_path / "o"
    extra = ["--max-steps", "3", "--save-steps", "2", "--loss-type", "dft", "--kl-to-base", str(beta)]
    steps = _run(tiny_model_dir, alpaca_file, out, *extra)
    assert len(batches) == 3
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sums = _sums(model, base, batches[2])
    n = int(sums["n"])
    dft, kl = sums["dft"] / n, sums["kl"] / n
    assert kl > 1e-4  # the model moved: the KL term is not a no-op here
    assert steps[3]["kl_to_base"] == pytest.approx(kl, rel=1e-4)
    assert steps[3]["loss"] == pytest.approx(dft + beta * kl, rel=1e-4)
    assert steps[3]["loss"] != pytest.approx(sums["nll"] / n + beta * kl, rel=1e-3)  # DFT, not NLL, under the KL
    assert json.loads((out / "run_config.json").read_text())["loss_type"] == "dft"


def test_the_default_is_nll_and_a_resume_may_not_change_it(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "o"
    _run(tiny_model_dir, alpaca_file, out, "--max-steps", "1", "--save-steps", "1")
    assert json.loads((out / "run_config.json").read_text())["loss_type"] == "nll"
    r = _invoke(tiny_model_dir, alpaca_file, out, "--max-steps", "2", "--resume", "--loss-type", "dft")
    assert r.exit_code == 2, r.output
    assert "loss_type: 'nll' → 'dft'" in " ".join(r.output.split())


def _tokens(batch) -> int:
    """The batch's real tokens (no padding)."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()


@pytest.mark.parametrize("command", ["kto", "grpo"])
def test_commands_without_it_refuse_loss_type_in_one_line(command, tiny_model_dir, alpaca_file, tmp_path):
    r = runner.invoke(app, cli_args(command, tiny_model_dir, alpaca_file, tmp_path / "o", loss_type="dft"))
    assert r.exit_code == 2, r.output
    error = [line for line in r.output.splitlines() if "--loss-type" in line]
    assert len(error) == 1 and f"not an option of {command} (sft, dpo and finetune take it)" in error[0], r.output
    assert not (tmp_path / "o").exists()


def test_an_unknown_sft_loss_type_exits_2_naming_the_choices(tiny_model_dir, alpaca_file, tmp_path):
    r = runner.invoke(app, cli_args("sft", tiny_model_dir, alpaca_file, tmp_path / "o", loss_type="sigmoid"))
    assert r.exit_code == 2 and "--loss-type must be one of: nll, dft, got 'sigmoid'" in r.output, r.output


def test_help_and_banner_describe_it(tiny_model_dir, alpaca_file, tmp_path):
    r = runner.invoke(app, ["sft", "--help"], terminal_width=200)
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "--loss-type" in text and "Dynamic Fine-Tuning" in text and "ASFT" in text
    args = cli_args("sft", tiny_model_dir, alpaca_file, tmp_path / "o", dry_run=True, loss_type="dft")
    r = runner.invoke(app, args, terminal_width=200)
    assert r.exit_code == 0 and "NLL × its own probability (detached)" in " ".join(r.output.split()), r.output


def test_the_eval_loss_stays_the_plain_nll(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    """TRL's SFTTrainer would evaluate its DFT loss; sft's eval_loss is the NLL of the final model on the eval
    batches (as finetune's is), so a sweep's frontier compares DFT and NLL runs on one scale."""
    evals = []
    original = SFTTrainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        if not model.training:
            evals.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "compute_loss", spy)
    out = tmp_path / "o"
    extra = ["--max-steps", "2", "--eval-dataset", str(alpaca_file), "--eval-steps", "2", "--loss-type", "dft"]
    _run(tiny_model_dir, alpaca_file, out, *extra)
    final = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "eval_loss" in h]
    assert evals and final
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    sums = [_sums(model, model, b) for b in evals]  # step 2's evaluation and the final one: the same model
    rows = [int(b["input_ids"].shape[0]) for b in evals]
    nll = sum(r * s["nll"] / int(s["n"]) for r, s in zip(rows, sums)) / sum(rows)
    dft = sum(r * s["dft"] / int(s["n"]) for r, s in zip(rows, sums)) / sum(rows)
    assert final[-1]["eval_loss"] == pytest.approx(nll, rel=1e-4)
    assert final[-1]["eval_loss"] != pytest.approx(dft, rel=1e-3)
