"""--resume continues only the same run: every setting that shapes training is compared as resolved
(posttrainllm/rundir/fingerprint.py), generated from the option table so a new option cannot be forgotten."""

import json
import shutil

import pytest
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.commands.registry import options_for
from posttrainllm.config.runconfig import _SKIP_IN_RECORD
from posttrainllm.rundir import fingerprint

runner = CliRunner()
TRAINING_COMMANDS = ("sft", "dpo", "kto", "finetune", "pretrain")


# ------------------------------------------------------------------ the comparison, option by option (no training)
def _defaults(command: str) -> dict:
    return {"command": command, **{o.name: o.default for o in options_for(command) if o.name not in _SKIP_IN_RECORD}}


def _other_value(opt):
    """A value of the option's type that differs from its default."""
    d = opt.default
    if opt.type is bool:
        return not d
    if opt.type is int:
        return (d or 0) + 1
    if opt.type is float:
        return 0.9 if d is None else (d * 0.5 if d else 0.5)
    if opt.type is list:
        return [*(d or []), "changed"]
    if opt.type is dict:
        return {**(d or {}), "changed_key": 1}
    return f"{d}-changed" if d else "changed"


def _cases():
    for command in TRAINING_COMMANDS:
        for opt in options_for(command):
            if opt.name not in _SKIP_IN_RECORD:
                yield pytest.param(command, opt, id=f"{command}:{opt.name}")


@pytest.mark.parametrize("command,opt", list(_cases()))
def test_every_option_that_shapes_training_is_compared_and_the_free_ones_are_not(command, opt):
    saved = _defaults(command)
    saved[fingerprint.RESOLVED] = {"num_blocks": 4, "inputs": {}}
    current = {**_defaults(command), opt.name: _other_value(opt)}
    diffs = fingerprint.differences(saved, current)
    names = [k for k, _, _ in diffs]
    if opt.name in fingerprint.FREE:
        assert diffs == [], diffs
        assert [k for k, _, _ in fingerprint.differences(saved, current, include_free=True)] == [opt.name]
    elif opt.name in fingerprint.GAMMA_KEYS:
        assert names == ["llrd (γ used)"], diffs
    else:
        assert names == [opt.name], diffs


def test_the_free_settings_are_options_of_the_training_commands():
    names = {o.name for c in TRAINING_COMMANDS for o in options_for(c)}
    assert names >= fingerprint.FREE


def test_layer_decay_is_compared_as_the_gamma_used():
    saved = {"llrd": None, "llrd_bottom_scale": 0.5, fingerprint.RESOLVED: {"num_blocks": 4}}
    same = {"llrd": 0.7937, "llrd_bottom_scale": None}  # 0.5 ** (1/3) = 0.793700526...
    assert fingerprint.differences(saved, same) == []
    other = fingerprint.differences(saved, {"llrd": None, "llrd_bottom_scale": 0.2})
    was, now = (
        f"{0.5 ** (1 / 3):.6g} (--llrd-bottom-scale 0.5 on 4 blocks)",
        f"{0.2 ** (1 / 3):.6g} (--llrd-bottom-scale 0.2 on 4 blocks)",
    )
    assert other == [("llrd (γ used)", was, now)]
    assert fingerprint.differences({"llrd": 0.9}, {"llrd": 0.8}) == [("llrd (γ used)", "0.9", "0.8")]
    assert fingerprint.differences({"llrd": 0.9}, {"llrd": 0.9}) == []
    assert fingerprint.differences({"llrd": None}, {"llrd": 1.0}) == []  # absent means flat


def test_trainer_args_compare_as_the_values_they_coerce_to():
    saved = {"trainer_args": {"adam_beta2": 0.999, "tf32": False}}
    assert fingerprint.differences(saved, {"trainer_args": {"adam_beta2": "0.999", "tf32": "false"}}) == []
    diffs = fingerprint.differences(saved, {"trainer_args": {"adam_beta2": "0.5", "tf32": "false"}})
    assert [k for k, _, _ in diffs] == ["trainer_args"] and "0.999" in diffs[0][1] and "0.5" in diffs[0][2]


def test_an_input_is_compared_by_what_the_path_holds(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a"}\n')
    saved = {"dataset": str(data), fingerprint.RESOLVED: fingerprint.resolved_record({"dataset": str(data)})}
    assert fingerprint.differences(saved, {"dataset": str(data)}) == []
    data.write_text('{"text": "b"}\n')  # same size, other bytes
    diffs = fingerprint.differences(saved, {"dataset": str(data)})
    assert [k for k, _, _ in diffs] == ["dataset contents"] and "sha256" in diffs[0][1]
    folder = tmp_path / "saved_dataset"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    saved = {"dataset": str(folder), fingerprint.RESOLVED: fingerprint.resolved_record({"dataset": str(folder)})}
    (folder / "data-00001.arrow").write_bytes(b"x" * 10)
    assert [k for k, _, _ in fingerprint.differences(saved, {"dataset": str(folder)})] == ["dataset contents"]


# ------------------------------------------------------------------------------ through the CLI, on a real run
def _rows(n=32, offset=0):
    return [{"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"It is {2 * i + 1}."} for i in range(n)]


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir, tmp_path_factory):
    """A finished 2-step SFT run with --llrd-bottom-scale 0.5 on the 4-block model (checkpoints at 1 and 2)."""
    root = tmp_path_factory.mktemp("fingerprint")
    data = root / "alpaca.json"
    data.write_text(json.dumps(_rows()))
    out = root / "run"
    r = runner.invoke(app, _sft(tiny_model_dir, data, out, "--llrd-bottom-scale", "0.5"))
    assert r.exit_code == 0, r.output
    return root


def _sft(model, data, out, *extra):
    return run_args("sft", model, data, out, *extra, max_length=256, save_steps=1, logging_steps=1)


@pytest.fixture
def run(sft_run, tmp_path):
    shutil.copytree(sft_run, tmp_path / "r")
    return tmp_path / "r"


@pytest.mark.parametrize(
    "change,field",
    [
        (["--llrd-bottom-scale", "0.2"], "llrd (γ used)"),
        (["--llrd-bottom-scale", "0.5", "--trainer-arg", "adam_beta2=0.5"], "trainer_args"),
        (["--llrd-bottom-scale", "0.5", "--max-length", "200"], "max_length"),
        (["--llrd-bottom-scale", "0.5", "--train-on-prompt"], "train_on_prompt"),
        (["--llrd-bottom-scale", "0.5", "--replay-dataset", "{data}", "--replay-ratio", "0.25"], "replay_dataset"),
        (["--llrd-bottom-scale", "0.5", "--model-arg", "attn_implementation=eager"], "model_args"),
        (["--llrd-bottom-scale", "0.5", "--kl-to-base", "0.1"], "kl_to_base"),
    ],
)
def test_resume_refuses_a_different_run_naming_the_field(run, tiny_model_dir, change, field):
    before = (run / "run" / "run_config.json").read_text()
    change = [str(run / "alpaca.json") if a == "{data}" else a for a in change]
    r = runner.invoke(app, _sft(tiny_model_dir, run / "alpaca.json", run / "run", "--resume", *change))
    assert r.exit_code == 2, r.output
    assert f"{field}:" in r.output and "--allow-config-change" in r.output
    assert (run / "run" / "run_config.json").read_text() == before


def test_resume_refuses_the_same_dataset_path_with_other_contents(run, tiny_model_dir):
    (run / "alpaca.json").write_text(json.dumps(_rows(33)))
    r = runner.invoke(
        app, _sft(tiny_model_dir, run / "alpaca.json", run / "run", "--resume", "--llrd-bottom-scale", "0.5")
    )
    assert r.exit_code == 2, r.output
    assert "dataset contents:" in r.output and "sha256" in r.output


def test_resume_accepts_the_equal_gamma_and_a_new_max_steps(run, tiny_model_dir):
    args = _sft(tiny_model_dir, run / "alpaca.json", run / "run", "--resume", "--llrd", "0.7937", "--max-steps", "3")
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    saved = json.loads((run / "run" / "run_config.json").read_text())
    assert saved["max_steps"] == 3 and saved["history"][0]["max_steps"] == 2
    assert json.loads((run / "run" / "training_complete.json").read_text())["global_step"] == 3


def test_resume_of_a_finished_run_with_only_a_new_logging_interval_changes_nothing(run, tiny_model_dir):
    before = (run / "run" / "run_config.json").read_text()
    args = _sft(tiny_model_dir, run / "alpaca.json", run / "run", "--resume", "--llrd-bottom-scale", "0.5")
    r = runner.invoke(app, [*args, "--logging-steps", "5"])
    assert r.exit_code == 0, r.output
    assert "already complete" in r.output and (run / "run" / "run_config.json").read_text() == before


def test_allow_config_change_trains_with_the_new_optimizer_hyperparameters(run, tiny_model_dir):
    import torch

    args = _sft(tiny_model_dir, run / "alpaca.json", run / "run", "--resume", "--llrd-bottom-scale", "0.5")
    r = runner.invoke(app, [*args, "--max-steps", "3", "--trainer-arg", "adam_beta2=0.5", "--allow-config-change"])
    assert r.exit_code == 0, r.output
    groups = torch.load(run / "run" / "checkpoint-3" / "optimizer.pt", weights_only=True)["param_groups"]
    assert {tuple(g["betas"]) for g in groups} == {(0.9, 0.5)}
    old = torch.load(run / "run" / "checkpoint-2" / "optimizer.pt", weights_only=True)["param_groups"]
    assert {tuple(g["betas"]) for g in old} == {(0.9, 0.999)}
    saved = json.loads((run / "run" / "run_config.json").read_text())
    assert saved["trainer_args"]["adam_beta2"] == 0.5 and saved["history"][0]["trainer_args"] == {}
