"""Every curated recipe: first line is its exact invocation, keys are valid, dry run works with local stand-ins;
precedence defaults < recipe < command line; unknown keys and bad values exit 2 listing all problems."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.config import options_for, resolve

runner = CliRunner()
RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))


def recipe_command(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    prefix = "# posttrainllm "
    assert first.startswith(prefix) and first.endswith(f"--recipe recipes/{path.name}"), first
    return first[len(prefix) :].split()[0]


def test_there_are_curated_recipes_for_each_kind():
    commands = {recipe_command(p) for p in RECIPES}
    assert {"pretrain", "sft", "dpo", "kto", "reward", "grpo", "rloo", "distill", "finetune"} <= commands
    names = {p.name for p in RECIPES}
    assert {"alpaca-sft.yaml", "alpaca-sft-llrd.yaml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_keys_are_valid(recipe):
    import yaml

    cfg = resolve(recipe_command(recipe), {"recipe": str(recipe)})
    assert {k for k, src in cfg.sources.items() if src == "recipe"} == set(yaml.safe_load(recipe.read_text()))


@pytest.mark.smoke
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_dry_run_with_local_stand_ins(
    recipe,
    tiny_model_dir,
    teacher_model_dir,
    alpaca_file,
    preference_file,
    unpaired_file,
    prompts_file,
    text_file,
    tmp_path,
):
    cmd = recipe_command(recipe)
    shapes = {"sft": alpaca_file, "dpo": preference_file, "kto": unpaired_file, "finetune": text_file}
    shapes.update(grpo=prompts_file, rloo=prompts_file, distill=prompts_file, reward=preference_file)
    data = {**shapes, "pretrain": text_file}[cmd]
    args = [cmd, "--recipe", str(recipe), "--dataset", str(data), "--output-dir", str(tmp_path / "o"), "--dry-run"]
    if cmd != "pretrain":
        args += ["--model", str(tiny_model_dir)]
    else:
        args += ["--vocab-size", "300", "--max-length", "32"]
    if cmd == "distill":
        args += ["--teacher", str(teacher_model_dir)]
    if "replay_dataset" in recipe.read_text():
        args += ["--replay-dataset", str(text_file)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())
    import yaml

    assert saved["llrd"] == yaml.safe_load(recipe.read_text()).get("llrd", 1.0)  # every command's recipe key


def test_cli_overrides_recipe_which_overrides_defaults(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: org/m\ndataset: org/d\noutput_dir: o\nllrd: 0.8\nlr: 1.0e-4\nmax_steps: 10\n")
    cfg = resolve("sft", {"recipe": str(recipe), "lr": "3e-4"})
    assert cfg.lr == 3e-4 and cfg.sources["lr"] == "cli"  # CLI beats recipe
    assert cfg.llrd == 0.8 and cfg.sources["llrd"] == "recipe"  # recipe beats default
    assert cfg.batch_size == 8 and cfg.sources["batch_size"] == "default"


def test_cli_llrd_overrides_recipe_llrd(tmp_path, monkeypatch):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: org/m\ndataset: org/d\noutput_dir: o\nllrd: 0.8\n")
    seen = {}
    import posttrainllm.commands.sft as sft

    monkeypatch.setattr(sft, "main", lambda cfg: seen.setdefault("cfg", cfg))
    r = runner.invoke(app, ["sft", "--recipe", str(recipe), "--llrd", "0.6"])
    assert r.exit_code == 0, r.output
    assert seen["cfg"].llrd == 0.6


def test_unknown_key_and_bad_value_are_all_reported(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: org/m\ndataset: org/d\noutput_dir: o\nllrd: 1.7\nlearning_rate: 1e-4\nbatch_size: many\n")
    r = runner.invoke(app, ["sft", "--recipe", str(recipe)])
    assert r.exit_code == 2
    assert "learning_rate" in r.output and "llrd" in r.output and "[0.5, 1.0]" in r.output and "batch_size" in r.output
    assert "valid recipe keys" in r.output
    for key in ("max_steps", "lr", "llrd"):
        assert key in r.output.split("valid recipe keys")[1]


@pytest.mark.parametrize(
    "content,fragment",
    [
        ("- a\n- b\n", "must be a mapping"),
        ("llrd: [0.9\n", "invalid YAML"),
        ("llrd: 1.7\n", "[0.5, 1.0]"),
        ("bogus: 1\n", "unknown key 'bogus'"),
        ("beta: 0.1\n", "another command"),
    ],
)
def test_bad_recipes_exit_2(content, fragment, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(content)
    r = runner.invoke(
        app, ["sft", "--recipe", str(recipe), "--model", "org/m", "--dataset", "org/d", "--output-dir", "o"]
    )
    assert r.exit_code == 2
    assert fragment in r.output


def test_missing_recipe_exits_2(tmp_path):
    r = runner.invoke(app, ["sft", "--recipe", str(tmp_path / "none.yaml")])
    assert r.exit_code == 2 and "recipe not found" in r.output


def test_every_option_is_a_recipe_key_except_run_switches():
    keys = {o.name for o in options_for("sft") if o.recipe}
    assert {"llrd", "lr", "max_steps", "model", "dataset", "output_dir"} <= keys
    assert "recipe" not in keys
