"""Habits of TRL users: --trainer-arg / trainer_args checked against the installed config classes, --model-arg,
--report-to tensorboard with every depth's LR as its own scalar (read back from the real event files), -V."""

import json
from pathlib import Path

import pytest
from harness import cli_args, run_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def _sft(model, data, out, *extra):
    return runner.invoke(
        app,
        run_args("sft", model, data, out, *extra, steps=1, max_length=128, lr=None),
    )


@pytest.mark.smoke
def test_trainer_arg_reaches_the_trainer_and_run_config(captured_trainer, tiny_model_dir, alpaca_file, tmp_path):
    r = _sft(
        tiny_model_dir,
        alpaca_file,
        tmp_path / "o",
        "--trainer-arg",
        "pad_to_multiple_of=8",
        "--trainer-arg",
        "neftune_noise_alpha=5",
        "--trainer-arg",
        'gradient_checkpointing_kwargs={"use_reentrant": false}',
    )
    assert r.exit_code == 0, r.output
    args = captured_trainer[0].args
    assert args.pad_to_multiple_of == 8 and args.neftune_noise_alpha == 5.0
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())["trainer_args"]
    assert saved == {
        "pad_to_multiple_of": 8,
        "neftune_noise_alpha": 5.0,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    }


def test_recipe_trainer_args_mapping_is_checked_the_same_way(tiny_model_dir, alpaca_file, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("trainer_args:\n  completion_only_loss: false\n  packin: true\n")
    r = _sft(tiny_model_dir, alpaca_file, tmp_path / "o", "--recipe", str(recipe), "--dry-run")
    assert r.exit_code == 2, r.output
    assert "--trainer-arg packin: not a field of SFTConfig; did you mean packing" in r.output


@pytest.mark.parametrize(
    "arg,fragment",
    [
        ("packin=true", "did you mean packing"),
        ("learning_rate=1e-4", "set it with --lr"),
        ("per_device_train_batch_size=4", "set it with --batch-size"),
        ("eval_packing=maybe", "eval_packing=maybe: expected"),
        ("packing=true", "set it with --packing"),
        ("neftune_noise_alpha=loud", "expected"),
        ("noequals", "KEY=VALUE"),
    ],
)
def test_bad_trainer_args_exit_2_before_any_model_is_loaded(arg, fragment, tmp_path, alpaca_file):
    r = runner.invoke(
        app,
        cli_args("sft", "org/not-loaded", alpaca_file, tmp_path / "o", trainer_arg=arg),
    )
    assert r.exit_code == 2, r.output
    assert fragment in r.output and "Traceback" not in r.output


def test_trainer_args_are_checked_per_command(tmp_path, text_file):
    from posttrainllm.commands.registry import spec_of
    from posttrainllm.errors import ConfigErrors
    from posttrainllm.training import check_trainer_args

    finetune = spec_of("finetune")
    assert check_trainer_args(finetune, {"label_names": "a,b"}) == {"label_names": ["a", "b"]}  # list[str] field
    with pytest.raises(ConfigErrors, match="set it with --loss-type"):
        check_trainer_args(spec_of("dpo"), {"loss_type": "ipo,sft"})  # DPO's loss is a posttrainllm option
    with pytest.raises(ConfigErrors, match="not a field of TrainingArguments"):
        check_trainer_args(spec_of("finetune"), {"packing": "true"})  # an SFT field: not for finetune


@pytest.mark.smoke
def test_model_arg_reaches_from_pretrained_and_unknown_keys_are_refused(
    captured_trainer, tiny_model_dir, alpaca_file, tmp_path
):
    r = _sft(tiny_model_dir, alpaca_file, tmp_path / "o", "--model-arg", "attn_implementation=eager")
    assert r.exit_code == 0, r.output
    assert captured_trainer[0].model.config._attn_implementation == "eager"
    bad = _sft(tiny_model_dir, alpaca_file, tmp_path / "o2", "--model-arg", "attn_implementaton=eager")
    assert bad.exit_code == 2 and "did you mean attn_implementation" in bad.output
    owned = _sft(tiny_model_dir, alpaca_file, tmp_path / "o3", "--model-arg", "trust_remote_code=true")
    assert owned.exit_code == 2 and "--trust-remote-code" in owned.output


@pytest.mark.smoke
def test_tensorboard_gets_every_depths_lr_following_the_schedule(tiny_model_dir, text_file, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "o"
    steps, lr, gamma = 4, 1e-3, 0.5
    r = runner.invoke(
        app,
        run_args(
            "finetune",
            tiny_model_dir,
            text_file,
            out,
            steps=steps,
            lr=lr,
            logging_steps=1,
            llrd=gamma,
            lr_scheduler="linear",
            report_to="tensorboard",
        ),
    )
    assert r.exit_code == 0, r.output
    events = [p for p in out.rglob("events.out.tfevents.*")]
    assert events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/lr/embeddings", "train/lr/block_0", "train/lr/block_3", "train/lr/head"} <= set(tags), tags
    block0 = {e.step: e.value for e in acc.Scalars("train/lr/block_0")}
    head = {e.step: e.value for e in acc.Scalars("train/lr/head")}
    base = {e.step: e.value for e in acc.Scalars("train/learning_rate")}
    assert sorted(block0) == list(range(1, steps + 1))
    for step, value in block0.items():
        factor = 1 - (step - 1) / steps  # linear decay over max_steps, no warmup: the LR that step `step` used
        assert value == pytest.approx(lr * gamma**3 * factor, rel=1e-5, abs=1e-12), step
        assert head[step] == pytest.approx(lr * factor, rel=1e-5, abs=1e-12)
        assert base[step] == pytest.approx(lr * factor, rel=1e-5, abs=1e-12)


def test_version_short_flag():
    r = runner.invoke(app, ["-V"])
    assert r.exit_code == 0 and r.output.startswith("posttrainllm ")


@pytest.mark.smoke
def test_no_max_length_note_when_the_user_did_not_pass_one(tokenizer_and_small_positions, alpaca_file, tmp_path):
    model_dir = tokenizer_and_small_positions
    quiet = runner.invoke(
        app,
        cli_args("sft", model_dir, alpaca_file, tmp_path / "a", dry_run=True),
    )
    assert quiet.exit_code == 0, quiet.output
    assert "is more than the model's" not in quiet.output and "max length 64" in quiet.output
    loud = runner.invoke(
        app,
        cli_args("sft", model_dir, alpaca_file, tmp_path / "b", dry_run=True, max_length=512),
    )
    assert "--max-length 512 is more than the model's 64 positions" in loud.output


@pytest.fixture
def tokenizer_and_small_positions(tmp_path):
    import torch
    from conftest import build_tiny_model, build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_tiny_model(tok, max_position_embeddings=64)
    d = Path(tmp_path) / "short"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.mark.smoke
def test_a_log_file_gets_plain_lines_not_progress_bar_redraws(tiny_model_dir, text_file, tmp_path):
    import os
    import subprocess
    import sys

    log = tmp_path / "run.log"
    with open(log, "w") as f:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "posttrainllm",
                *run_args(
                    "finetune",
                    tiny_model_dir,
                    text_file,
                    tmp_path / "o",
                    steps=20,
                    lr=None,
                    save_steps=5,
                    logging_steps=5,
                    eval_split="0.1",
                    eval_steps=10,
                ),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
    text = log.read_text()
    assert r.returncode == 0, text[-2000:]
    assert text.count("\r") == 0
    steps = [ln for ln in text.splitlines() if ln.startswith("step ")]
    train_lines = [ln.split(" · ")[0] for ln in steps if " · loss " in ln]
    assert train_lines == ["step 1/20", "step 5/20", "step 10/20", "step 15/20", "step 20/20"]
    assert any(" · eval_loss " in ln for ln in steps)  # evaluation results are plain lines too
    assert not any(ln.lstrip().startswith("{") for ln in text.splitlines())  # no printed dicts
    assert len(text.splitlines()) < 60
