"""A run that trains nothing is no success: training data that fills no batch (one prompt, four completions per step
in groups of two) exits 1 with one line before training, for every sampling command, and a run that ends without an
optimizer step exits 1 with no final model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import write_jsonl
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm import lifecycle
from posttrainllm.cli import app
from posttrainllm.errors import TrainingError

runner = CliRunner()


@pytest.mark.parametrize(
    "command, extra, need",
    [
        ("grpo", ["--reward-regex", "a", "--num-generations", "2"], 2),
        ("rloo", ["--reward-regex", "a", "--num-generations", "2", "--max-steps", "3"], 2),
        ("distill", ["--teacher", "{teacher}"], 4),
    ],
)
def test_data_that_fills_no_batch_exits_1_with_one_line(command, extra, need, tiny_model_dir, teacher_model_dir,
                                                        tmp_path):  # fmt: skip
    data = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "Count 1:", "answer": "1"}])
    out = tmp_path / "o"
    extra = [e.format(teacher=teacher_model_dir) for e in extra]
    args = cli_args(command, tiny_model_dir, data, out)
    r = runner.invoke(app, args + ["--batch-size", "4", "--max-completion-length", "4", *extra])
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert f"nothing left to train on: 1 training prompt(s), but one step takes {need} prompts" in text, text
    assert "Traceback" not in r.output
    assert not (out / "training_complete.json").exists() and not (out / "model.safetensors").exists()


class _Guard:
    signum = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("resumed_at, asked", [(None, {"max_steps": 3}), ("checkpoint-8", {"max_steps": -1})])
def test_a_run_that_ends_without_a_step_is_a_training_error(resumed_at, asked, tmp_path):
    from pathlib import Path

    step = int(resumed_at.split("-")[1]) if resumed_at else 0
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=step),
        train=lambda resume_from_checkpoint=None: SimpleNamespace(metrics={"train_loss": 0.0}),
    )
    cfg = SimpleNamespace(lr=1e-5, epochs=2.0, **asked)
    with pytest.raises(TrainingError, match=f"nothing was trained: .* the run ended at step {step} without"):
        lifecycle._train(cfg, trainer, _Guard(), Path(tmp_path / resumed_at) if resumed_at else None)
    trainer.state.global_step = step + 1
    assert lifecycle._train(cfg, trainer, _Guard(), Path(tmp_path / resumed_at) if resumed_at else None) == {
        "train_loss": 0.0
    }
