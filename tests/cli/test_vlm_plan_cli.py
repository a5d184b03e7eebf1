"""The per-tower options on the command line: listed in `sft --help`, ranges checked before a model loads, refused
on a text-only model (exit 2, one line naming the flags), and turned into the run's plan for a vision-language
model (the plan the banner prints and param_groups.json saves)."""

import pytest
from harness import cli_args
from tower_families import BASE, GAMMA, GAMMA_V, PROJ, HiddenTower, M, N, build, expected_lr
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()
FLAGS = ("--vision-llrd", "--projector-lr-scale", "--freeze-vision", "--vision-blocks")


@pytest.mark.parametrize("command", ["sft", "dpo"])
def test_help_lists_the_per_tower_flags(command):
    r = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    for flag in FLAGS:
        assert flag in r.output, flag


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--vision-llrd", "0.3"], "--vision-llrd"),
        (["--vision-llrd", "1.5"], "--vision-llrd"),
        (["--projector-lr-scale", "-1"], "--projector-lr-scale"),
    ],
)
def test_out_of_range_values_exit_2_before_the_model_loads(flags, named, tmp_path, alpaca_file):
    """Every usage problem is reported at once, one line each, before any model loads (here: none exists)."""
    missing = tmp_path / "no-model-here"
    r = runner.invoke(app, cli_args("sft", missing, alpaca_file, tmp_path / "o", *flags, dry_run=True))
    assert r.exit_code == 2, r.output
    (line,) = [ln for ln in r.output.splitlines() if named in ln]
    assert ("[0.5, 1.0]" in line or ">= 0" in line) and f"got {float(flags[1])}" in line
    assert "does not exist" in r.output  # the missing model is reported with them: nothing was loaded
    assert "Traceback" not in r.output


def test_vision_flags_on_a_text_only_model_exit_2_in_one_line(tiny_model_dir, alpaca_file, tmp_path):
    args = cli_args(
        "sft", tiny_model_dir, alpaca_file, tmp_path / "o", "--vision-llrd", "0.8", "--freeze-vision",
        llrd="0.8", lr=BASE, dry_run=True, max_length=256,
    )  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    (line,) = [ln for ln in r.output.splitlines() if "no vision tower" in ln]
    assert "--vision-llrd" in line and "--freeze-vision" in line and "drop them" in line
    assert "Traceback" not in r.output and not (tmp_path / "o" / "param_groups.json").exists()


def _config(tiny_model_dir, alpaca_file, tmp_path, *flags):
    from posttrainllm.commands.registry import to_config

    args = cli_args("sft", tiny_model_dir, alpaca_file, tmp_path / "o", *flags, lr=BASE)[1:]
    return to_config("sft", args)


def test_the_runs_plan_follows_the_flags_on_a_vlm(tiny_model_dir, alpaca_file, tmp_path):
    from posttrainllm.planning import plan_param_groups
    from posttrainllm.reporting.banner import summary_line

    flags = ["--llrd", str(GAMMA), "--vision-llrd", str(GAMMA_V), "--projector-lr-scale", str(PROJ)]
    model = build("qwen2_vl")
    plan = plan_param_groups(_config(tiny_model_dir, alpaca_file, tmp_path, *flags), model)
    for name, _ in model.named_parameters():
        assert plan.lr_of(name) == pytest.approx(expected_lr("qwen2_vl", name)), name
    line = summary_line(plan)
    assert f"γ_v={GAMMA_V:g} ({M} blocks)" in line and f"projector ×{PROJ:g}" in line and f"γ={GAMMA:g}" in line
    assert plan.num_layers == N


def test_freeze_vision_on_the_command_line_freezes_the_tower(tiny_model_dir, alpaca_file, tmp_path):
    from posttrainllm.planning import plan_param_groups
    from posttrainllm.reporting.banner import summary_line

    model = build("llava_clip")
    plan = plan_param_groups(_config(tiny_model_dir, alpaca_file, tmp_path, "--freeze-vision"), model)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in model.named_parameters() if n.startswith("model.vision_tower.")}
    assert "vision tower frozen" in summary_line(plan) and "--freeze-vision" in summary_line(plan)


def test_a_vision_tower_not_found_exits_2_naming_the_lists_and_the_flag(tiny_model_dir, alpaca_file, tmp_path):
    from posttrainllm.errors import UsageError
    from posttrainllm.planning import plan_param_groups

    cfg = _config(tiny_model_dir, alpaca_file, tmp_path, "--llrd", "0.8")
    with pytest.raises(UsageError) as e:
        plan_param_groups(cfg, HiddenTower())
    assert e.value.exit_code == 2
    text = str(e.value)
    assert "--vision-blocks PATH" in text and "vision (2)" in text and "\n" not in text
    cfg = _config(tiny_model_dir, alpaca_file, tmp_path, "--llrd", "0.8", "--vision-blocks", "vision")
    plan = plan_param_groups(cfg, HiddenTower())
    assert plan.vision["block_path"] == "vision" and plan.lr_of("vision.0.weight") == pytest.approx(BASE * 0.8)
