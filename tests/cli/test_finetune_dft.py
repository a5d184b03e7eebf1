"""finetune --loss-type dft: Dynamic Fine-Tuning on raw text (transformers' Trainer has no DFT loss, so
posttrainllm/training/dft.py gives it one). The logged training losses are recomputed here from the models' logits on
the batches the trainer saw, under gradient accumulation too and with --kl-to-base (the ASFT form); the evaluation
loss stays the plain NLL; the closed form of the loss function is checked on hand-made logits."""

from __future__ import annotations

import json
import math

import pytest
import torch
from harness import cli_args
from transformers import AutoModelForCausalLM, Trainer
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.training.dft import dft_loss

runner = CliRunner()


def _invoke(model, data, out, *extra):
    args = cli_args("finetune", model, data, out, precision="fp32")
    args += ["--batch-size", "2", "--max-length", "32", "--logging-steps", "1", "--save-steps", "1000"]
    return runner.invoke(app, [*args, "--lr", "1e-2", *extra])


def _run(model, data, out, *extra):
    """The run's log_history (trainer_state.json)."""
    r = _invoke(model, data, out, *extra)
    assert r.exit_code == 0, r.output
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


@pytest.fixture
def batches(monkeypatch):
    """{"train": [...], "eval": [...]}: the inputs of every loss transformers' Trainer computed in this test."""
    seen: dict[str, list] = {"train": [], "eval": []}
    original = Trainer.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        tensors = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        seen["train" if model.training else "eval"].append(tensors)
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(Trainer, "compute_loss", spy)
    return seen


def _sums(model, base, batch) -> dict[str, float]:
    """Σ over the loss tokens (label != -100, shifted) of −p(y)·log p(y), of −log p(y), of KL(base ‖ model) (float64),
    and their count."""
    fwd = {k: batch[k] for k in ("input_ids", "attention_mask") if k in batch}
    with torch.no_grad():
        logits, ref = (m(**fwd, use_cache=False).logits[:, :-1] for m in (model, base))
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    log_q, log_p = logits[mask].double().log_softmax(-1), ref[mask].double().log_softmax(-1)
    log_y = log_q.gather(-1, labels[mask][:, None])[:, 0]
    kl = (log_p.exp() * (log_p - log_q)).sum()
    return {"dft": -(log_y.exp() * log_y).sum().item(), "nll": -log_y.sum().item(), "kl": kl.item(), "n": mask.sum()}


def _total(model, base, group) -> dict[str, float]:
    parts = [_sums(model, base, b) for b in group]
    return {k: sum(float(p[k]) for p in parts) for k in parts[0]}


def test_the_first_steps_logged_loss_is_the_dft_formula(tiny_model_dir, text_file, tmp_path, batches):
    """Step 1's logged loss = Σ −p·log p / the step's loss tokens, over both its micro-batches (gradient
    accumulation; the starting model's logits), not the cross-entropy; run_config.json records the loss."""
    accum, out = 2, tmp_path / "o"
    extra = ["--max-steps", "1", "--loss-type", "dft", "--grad-accum", str(accum)]
    steps = {h["step"]: h for h in _run(tiny_model_dir, text_file, out, *extra) if "loss" in h}
    assert len(batches["train"]) == accum
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sums = _total(model, model, batches["train"])
    assert steps[1]["loss"] == pytest.approx(sums["dft"] / sums["n"], rel=1e-5)
    assert steps[1]["loss"] != pytest.approx(sums["nll"] / sums["n"], rel=1e-3)  # not the plain cross-entropy
    assert json.loads((out / "run_config.json").read_text())["loss_type"] == "dft"


def test_dft_with_kl_to_base_logs_dft_plus_beta_kl(tiny_model_dir, text_file, tmp_path, batches):
    """Step 3's logged loss = DFT(model after step 2) + β × KL(base ‖ model after step 2), token means over step 3's
    batch: the ASFT form on raw text."""
    beta, out = 0.7, tmp_path / "o"
    extra = ["--max-steps", "3", "--save-steps", "2", "--loss-type", "dft", "--kl-to-base", str(beta)]
    steps = {h["step"]: h for h in _run(tiny_model_dir, text_file, out, *extra) if "loss" in h}
    assert len(batches["train"]) == 3
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sums = _sums(model, base, batches["train"][2])
    n = float(sums["n"])
    dft, kl = sums["dft"] / n, sums["kl"] / n
    assert kl > 1e-4  # the model moved: the KL term is not a no-op here
    assert steps[3]["kl_to_base"] == pytest.approx(kl, rel=1e-4)
    assert steps[3]["loss"] == pytest.approx(dft + beta * kl, rel=1e-4)
    assert steps[3]["loss"] != pytest.approx(sums["nll"] / n + beta * kl, rel=1e-3)


def test_the_eval_loss_stays_the_plain_nll(tiny_model_dir, text_file, tmp_path, batches):
    """A DFT run's eval_loss is the cross-entropy of the final model on the eval batches, so it compares with any
    other run's."""
    eval_file = tmp_path / "eval.txt"
    eval_file.write_text(text_file.read_text()[:600])
    out = tmp_path / "o"
    extra = ["--max-steps", "2", "--eval-dataset", str(eval_file), "--eval-steps", "2", "--loss-type", "dft"]
    history = _run(tiny_model_dir, text_file, out, *extra)
    final = [h for h in history if "eval_loss" in h and h["step"] == 2][0]
    assert len(batches["eval"]) >= 1
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    per_batch = [_sums(model, model, b) for b in batches["eval"]]  # step 2 and the final evaluation: one model
    rows = [int(b["input_ids"].shape[0]) for b in batches["eval"]]
    # the Trainer's eval_loss: the mean of each eval batch's mean loss, weighted by its rows
    nll = sum(r * float(s["nll"]) / float(s["n"]) for r, s in zip(rows, per_batch)) / sum(rows)
    dft = sum(r * float(s["dft"]) / float(s["n"]) for r, s in zip(rows, per_batch)) / sum(rows)
    assert final["eval_loss"] == pytest.approx(nll, rel=1e-4)
    assert final["eval_loss"] != pytest.approx(dft, rel=1e-3)


def test_help_and_banner_describe_it(tiny_model_dir, text_file, tmp_path):
    r = runner.invoke(app, ["finetune", "--help"], terminal_width=200)
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "--loss-type" in text and "Dynamic Fine-Tuning" in text
    args = cli_args("finetune", tiny_model_dir, text_file, tmp_path / "o", dry_run=True, loss_type="dft")
    r = runner.invoke(app, args, terminal_width=200)
    banner = " ".join(r.output.split())
    assert r.exit_code == 0 and "NLL × its own probability (detached)" in banner and "plain NLL" in banner, r.output


def test_the_loss_function_is_the_closed_form():
    """Two sequences, vocabulary 3: Σ −p(y)·log p(y) over the labelled positions ÷ the count it is given (else the
    labelled positions); the position after a -100 label and the first token are not in the loss."""
    logits = torch.tensor([[[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.0, 0.0, 3.0]] * 3])
    labels = torch.tensor([[5, 0, 1], [7, -100, 2]])  # predicted: (seq 0) 0 from pos 0, 1 from pos 1; (seq 1) 2
    p = [1 / 3, 1 / (math.exp(2) + 2), math.exp(3) / (math.exp(3) + 2)]
    terms = [-q * math.log(q) for q in p]
    out = {"logits": logits}
    assert dft_loss(out, labels).item() == pytest.approx(sum(terms) / 3, rel=1e-6)
    assert dft_loss(out, labels, num_items_in_batch=torch.tensor(6)).item() == pytest.approx(sum(terms) / 6, rel=1e-6)
    none = torch.full_like(labels, -100)
    assert dft_loss(out, none).item() == 0.0  # no loss token: a finite zero


def test_the_gradient_is_p_times_the_nll_gradient():
    """p(y) is detached: d loss / d logits = p(y) × d NLL / d logits, at each position."""
    logits = torch.randn(1, 4, 5, requires_grad=True)
    labels = torch.tensor([[0, 3, 1, 4]])
    dft_loss({"logits": logits}, labels).backward()
    grad = logits.grad.clone()
    logits.grad = None
    log_p = logits[0, :-1].log_softmax(-1).gather(-1, labels[0, 1:, None])[:, 0]
    (-log_p).sum().div(3).backward()
    expected = logits.grad.clone()
    expected[0, :-1] *= log_p.exp().detach()[:, None]
    assert torch.allclose(grad, expected, atol=1e-7)
