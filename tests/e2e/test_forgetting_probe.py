"""The forgetting probe (posttrainllm/evaluate/probe.py): every run from a model without --ood-eval reports
KL(start ‖ tuned) on samples of the starting model drawn before training; exactly 0 for a model that did not move;
kept in OUT/forgetting_probe.jsonl and reused by --resume."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import build_tiny_model, build_tokenizer
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.evaluate import probe


def invoke(argv):
    return CliRunner().invoke(app, [str(a) for a in argv])


def test_the_probe_of_a_model_against_itself_is_exactly_zero(tmp_path):
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, n_layers=2).eval()
    texts = probe.obtain(model, tok, tmp_path, n=4, seed=0, model_identity="m")
    assert len(texts) == 4 and (tmp_path / probe.PROBE_FILE).is_file()
    result = probe.measure(model, model, tok, texts)
    assert result["kl"] == 0.0 and result["tokens"] > 0
    assert probe.obtain(None, tok, tmp_path, n=4, seed=0, model_identity="m") == texts  # read back, not drawn
    torch.manual_seed(1)
    other = build_tiny_model(tok, n_layers=2).eval()
    assert probe.measure(other, model, tok, texts)["kl"] > 1e-3


def test_an_untrained_run_reports_a_probe_of_exactly_zero(tiny_model_dir, text_file, tmp_path):
    out = tmp_path / "o"
    r = invoke(run_args("finetune", tiny_model_dir, text_file, out, lr="1e-30", precision="fp32"))  # no weight moves
    assert r.exit_code == 0, r.output
    got = json.loads((out / "eval_results.json").read_text())["probe"]
    assert got["kl"] == 0.0 and got["samples"] >= 1
    assert "forgetting probe: KL(start ‖ tuned) = 0.00000" in " ".join(r.output.split())
    assert "Forgetting probe" in (out / "README.md").read_text()


@pytest.mark.parametrize("command", ["finetune", "sft"])
def test_a_trained_run_reports_how_far_it_moved_and_resume_reuses_the_samples(
    command, tiny_model_dir, text_file, alpaca_file, tmp_path
):
    out = tmp_path / "o"
    data = text_file if command == "finetune" else alpaca_file
    r = invoke(run_args(command, tiny_model_dir, data, out, steps=2, lr="1e-2", save_steps=1, max_length=128))
    assert r.exit_code == 0, r.output
    first = json.loads((out / "eval_results.json").read_text())["probe"]
    assert first["kl"] > 0
    kept = (out / probe.PROBE_FILE).read_bytes()
    r = invoke(run_args(command, tiny_model_dir, data, out, "--resume", steps=3, lr="1e-2", save_steps=1,
        max_length=128))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert (out / probe.PROBE_FILE).read_bytes() == kept
    assert json.loads((out / "eval_results.json").read_text())["probe"]["kl"] > 0


def test_no_probe_with_ood_eval_or_when_turned_off(tiny_model_dir, text_file, tmp_path):
    for extra, name in ((["--ood-eval", text_file], "a"), (["--forgetting-probe", "0"], "b")):
        r = invoke(run_args("finetune", tiny_model_dir, text_file, tmp_path / name, *extra))
        assert r.exit_code == 0, r.output
        assert "probe" not in json.loads((tmp_path / name / "eval_results.json").read_text())
        assert not (tmp_path / name / probe.PROBE_FILE).exists()


def test_sigterm_while_the_probe_samples_stops_cleanly_with_143(tiny_model_dir, text_file, tmp_path, monkeypatch):
    import os
    import signal

    real = probe.obtain

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the signal arrives while the starting model is being sampled
        return real(*args, **kwargs)

    monkeypatch.setattr(probe, "obtain", interrupted)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "o"
    r = invoke(run_args("finetune", tiny_model_dir, text_file, out))
    assert r.exit_code == 143, r.output
    assert "SIGTERM during the forgetting probe's sampling" in " ".join(r.output.split())
    assert not (out / ".posttrainllm" / "lock").exists() and signal.getsignal(signal.SIGTERM) == before


def test_a_signal_raised_inside_an_import_still_stops_with_143(tiny_model_dir, text_file, tmp_path, monkeypatch):
    """A library that imports lazily wraps what an import raised (transformers: RuntimeError "Failed to import"):
    the stop is still the signal's, exit 143 and one line."""
    import os
    import signal

    from posttrainllm import training

    real = training.build_trainer

    def wrapped(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except Exception as e:
            raise RuntimeError("Failed to import trl.trainer.sft_trainer") from e
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "build_trainer", wrapped)
    r = invoke(run_args("finetune", tiny_model_dir, text_file, tmp_path / "o"))
    assert r.exit_code == 143, r.output
    assert "SIGTERM during the trainer's setup" in " ".join(r.output.split()) and "RuntimeError" not in r.output
