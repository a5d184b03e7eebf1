"""Every curated recipe (shipped in the package, run by name): first line is its exact invocation, second a one-line
description, keys are valid, dry run works with local stand-ins; precedence defaults < recipe < command line;
unknown keys and bad values exit 2 listing all problems."""

import json
from pathlib import Path

import pytest
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.commands.registry import options_for, resolve
from posttrainllm.config.recipe import BUNDLED_DIR, bundled_recipes

runner = CliRunner()
RECIPES = list(bundled_recipes().values())
TRAINING_RECIPES = [p for p in RECIPES if not p.read_text().startswith("# posttrainllm merge ")]
MERGE_RECIPES = [p for p in RECIPES if p not in TRAINING_RECIPES]


def recipe_command(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    prefix = "# posttrainllm "
    assert first.startswith(prefix) and first.endswith(f"--recipe {path.stem}"), first
    return first[len(prefix) :].split()[0]


def test_there_are_curated_recipes_for_each_kind():
    commands = {recipe_command(p) for p in RECIPES}
    assert {"pretrain", "sft", "dpo", "kto", "reward", "grpo", "rloo", "distill", "finetune"} <= commands
    names = {p.name for p in RECIPES}
    assert {"alpaca-sft.yaml", "alpaca-sft-llrd.yaml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_keys_are_valid(recipe):
    import yaml

    keys = set(yaml.safe_load(recipe.read_text()))
    # a recipe may leave the user's own inputs to the command line (e.g. smollm2-finetune: --dataset YOUR_TEXT)
    stand_ins = {"model": "m", "dataset": str(recipe), "output_dir": "o"}  # dataset: a file that exists
    cfg = resolve(
        recipe_command(recipe), {"recipe": str(recipe), **{k: v for k, v in stand_ins.items() if k not in keys}}
    )
    assert {k for k, src in cfg.sources.items() if src == "recipe"} == set(yaml.safe_load(recipe.read_text()))


@pytest.mark.smoke
@pytest.mark.parametrize("recipe", TRAINING_RECIPES, ids=lambda p: p.name)
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
    shapes.update(grpo=prompts_file, rloo=prompts_file, distill=prompts_file, reward=preference_file, sdft=alpaca_file)
    data = {**shapes, "pretrain": text_file}[cmd]
    args = [cmd, "--recipe", recipe.stem, "--dataset", str(data), "--output-dir", str(tmp_path / "o"), "--dry-run"]
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


@pytest.mark.parametrize("recipe", MERGE_RECIPES, ids=lambda p: p.name)
def test_a_merge_recipe_merges_local_stand_ins_at_each_of_its_alphas(recipe, tiny_model_dir, tmp_path):
    import yaml

    alphas = yaml.safe_load(recipe.read_text())["alpha"]
    out = tmp_path / "merged"
    r = runner.invoke(app, ["merge", "--recipe", recipe.stem, "--base", str(tiny_model_dir), "--model",
                            str(tiny_model_dir), "--output-dir", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert len(alphas) > 1 and sorted(p.name for p in out.glob("alpha-*")) == [f"alpha-{a}" for a in alphas]


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
    from posttrainllm import lifecycle

    monkeypatch.setattr(lifecycle, "main", lambda cfg, spec: seen.setdefault("cfg", cfg))
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
    r = runner.invoke(app, cli_args("sft", "org/m", "org/d", "o", recipe=recipe))
    assert r.exit_code == 2
    assert fragment in r.output


def test_missing_recipe_exits_2(tmp_path):
    r = runner.invoke(app, ["sft", "--recipe", str(tmp_path / "none.yaml")])
    assert r.exit_code == 2 and "recipe not found" in r.output


def test_every_option_is_a_recipe_key_except_run_switches():
    keys = {o.name for o in options_for("sft") if o.recipe}
    assert {"llrd", "lr", "max_steps", "model", "dataset", "output_dir"} <= keys
    assert "recipe" not in keys


# ------------------------------------------------------------------ the recipes ship in the package, run by name
REPO = Path(__file__).resolve().parents[2]


def test_the_recipes_are_package_data_in_the_wheel():
    import fnmatch

    import posttrainllm

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    assert BUNDLED_DIR.parent == Path(posttrainllm.__file__).resolve().parent
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in RECIPES:
        rel = path.relative_to(BUNDLED_DIR.parent).as_posix()
        assert any(fnmatch.fnmatch(rel, pat) for pat in patterns["posttrainllm"]), rel
    assert (REPO / "recipes").resolve() == BUNDLED_DIR  # a clone's recipes/ paths keep working


@pytest.mark.parametrize("name", ["alpaca-sft-llrd", "alpaca-sft-llrd.yaml"])
def test_a_bundled_recipe_is_found_by_name_from_any_directory(name, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    cfg = resolve("sft", {"recipe": name})
    given = yaml.safe_load(bundled_recipes()["alpaca-sft-llrd"].read_text())
    assert {k for k, src in cfg.sources.items() if src == "recipe"} == set(given)
    assert cfg.llrd == given["llrd"] and cfg.lr == given["lr"] and cfg.output_dir == given["output_dir"]
    assert cfg.recipe == name  # the run records the recipe as the user named it


def test_a_file_of_the_users_wins_over_a_bundled_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "alpaca-sft-llrd").write_text("model: org/m\ndataset: org/d\nllrd: 0.6\n")
    cfg = resolve("sft", {"recipe": "alpaca-sft-llrd"})
    assert cfg.llrd == 0.6 and cfg.sources["llrd"] == "recipe" and cfg.sources["lr"] == "default"


def test_an_unknown_recipe_name_exits_2_listing_the_bundled_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["sft", "--recipe", "no-such-recipe", "--model", "org/m", "--dataset", "org/d"])
    assert r.exit_code == 2, r.output
    assert "recipe not found: no-such-recipe" in r.output and "Traceback" not in r.output
    listed = r.output.split("bundled recipes:")[1]
    assert all(name in listed for name in bundled_recipes())
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "given,suggested",
    [("recipes/alpaca-sft-llrd.yaml", "alpaca-sft-llrd"), ("alpaca-sft-lrd", "alpaca-sft-llrd")],
)
def test_a_missing_repository_path_or_a_typo_names_the_bundled_recipe(given, suggested, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ folder here, as for a user who installed the wheel
    r = runner.invoke(app, ["sft", "--recipe", given, "--model", "org/m", "--dataset", "org/d"])
    assert r.exit_code == 2, r.output
    assert f"`--recipe {suggested}`" in r.output


def test_a_link_to_nothing_is_not_taken_for_a_bundled_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "alpaca-sft").symlink_to(tmp_path / "gone.yaml")
    r = runner.invoke(app, ["sft", "--recipe", "alpaca-sft", "--model", "org/m", "--dataset", "org/d"])
    assert r.exit_code == 2 and "recipe not found: alpaca-sft (a link to nothing)" in r.output, r.output


def test_a_recipe_name_too_long_for_the_file_system_exits_2(tmp_path):
    r = runner.invoke(app, ["sft", "--recipe", "a" * 5000, "--model", "org/m", "--dataset", "org/d"])
    assert r.exit_code == 2, r.output
    assert "cannot read recipe" in r.output and "(5000 characters)" in r.output


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_each_recipe_has_a_one_line_description_on_its_second_line(recipe):
    second = recipe.read_text().splitlines()[1]
    assert second.startswith("# ") and 20 <= len(second) <= 120 and second.endswith("."), second


def test_the_recipes_command_lists_each_bundled_recipe_on_one_line():
    r = runner.invoke(app, ["recipes"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    for name, path in bundled_recipes().items():
        (line,) = [x for x in lines if x.split()[:1] == [name]]
        description = path.read_text().splitlines()[1][2:]
        assert line.split()[1] == recipe_command(path) and line.endswith(description), line
    assert str(BUNDLED_DIR) in r.output  # where to copy one from
