"""CLI contract: commands listed, --llrd optional value and range, all problems reported at once, lazy imports."""

import subprocess
import sys

import pytest
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.commands.registry import resolve

runner = CliRunner()
BASE = ["--model", "m", "--dataset", "d.jsonl", "--output-dir", "out"]


def test_help_lists_the_four_training_commands():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for cmd in ("pretrain", "sft", "dpo", "finetune"):
        assert cmd in r.output


@pytest.mark.parametrize("cmd", ["sft", "dpo", "finetune"])
@pytest.mark.parametrize("bad", ["0.49", "1.2", "nan", "inf", "-inf", "-1", "0", "abc", "", "1e400"])
def test_llrd_out_of_range_exits_2_naming_the_range(cmd, bad, tmp_path):
    r = runner.invoke(
        app,
        cli_args(cmd, tmp_path, tmp_path, tmp_path / "o", llrd=bad),
    )
    assert r.exit_code == 2, r.output
    assert "[0.5, 1.0]" in r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--llrd", "--lr-layer-decay"])  # the second: pretrain's deprecated name for it
@pytest.mark.parametrize("bad", ["0.3", "2", "nan"])
def test_pretrain_llrd_range(bad, flag, tmp_path):
    r = runner.invoke(app, ["pretrain", "--dataset", str(tmp_path), "--output-dir", str(tmp_path / "o"), flag, bad])
    assert r.exit_code == 2
    assert "[0.5, 1.0]" in r.output


def test_pretrain_takes_llrd_and_still_reads_its_deprecated_name(tmp_path):
    """One public name per concept: pretrain's γ is --llrd (recipe key llrd); --lr-layer-decay / lr_layer_decay
    are still read (hidden from the help)."""
    (tmp_path / "c.txt").write_text("some text\n")
    base = {"dataset": str(tmp_path / "c.txt"), "output_dir": str(tmp_path / "o")}
    from posttrainllm.commands.registry import to_config

    assert to_config("pretrain", ["--dataset", base["dataset"], "--llrd", "0.8"]).llrd == 0.8
    assert to_config("pretrain", ["--dataset", base["dataset"], "--lr-layer-decay", "0.7"]).llrd == 0.7
    assert to_config("pretrain", ["--dataset", base["dataset"], "--lr-layer-decay=0.75"]).llrd == 0.75
    assert to_config("pretrain", ["--dataset", base["dataset"], "--llrd"]).llrd == 0.95
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr_layer_decay: 0.9\n")
    assert resolve("pretrain", {**base, "recipe": str(recipe)}).llrd == 0.9
    recipe.write_text("llrd: 0.85\n")
    assert resolve("pretrain", {**base, "recipe": str(recipe)}).llrd == 0.85
    r = runner.invoke(app, ["pretrain", "--help"])
    assert "--llrd" in r.output and "--lr-layer-decay" not in r.output


def test_llrd_absent_is_flat():
    assert resolve("sft", {"model": "m", "dataset": "x/y", "output_dir": "o"}).llrd == 1.0


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--llrd"], 0.95),
        (["--llrd", "--lr", "1e-3"], 0.95),
        (["--lr", "1e-3", "--llrd"], 0.95),
        (["--llrd", "0.8"], 0.8),
        (["--llrd=0.7"], 0.7),
        (["--llrd", "0.5"], 0.5),
        (["--llrd", "1.0"], 1.0),
    ],
)
def test_bare_and_valued_llrd_reach_the_config(argv, expected, monkeypatch):
    seen = {}
    from posttrainllm import lifecycle

    monkeypatch.setattr(lifecycle, "main", lambda cfg, spec: seen.setdefault("cfg", cfg))
    r = runner.invoke(app, cli_args("sft", "org/model", "org/data", "o", *argv))
    assert r.exit_code == 0, r.output
    assert seen["cfg"].llrd == expected


def test_all_problems_reported_at_once():
    r = runner.invoke(
        app,
        cli_args("sft", "org/m", "org/d", "o", llrd=2, lr="-1", batch_size=0, max_length="x"),
    )
    assert r.exit_code == 2
    for fragment in ("--llrd", "--lr", "--batch-size", "--max-length", "4 problems"):
        assert fragment in r.output


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--lr", "0"], "--lr must be > 0"),
        (["--lr", "nan"], "--lr must be a finite number"),
        (["--lr", "inf"], "--lr must be a finite number"),
        (["--max-steps", "0"], "--max-steps"),
        (["--max-steps", "-5"], "--max-steps"),
        (["--batch-size", "-1"], "--batch-size"),
        (["--max-length", "0"], "--max-length"),
        (["--epochs", "0"], "--epochs"),
        (["--grad-accum", "0"], "--grad-accum"),
        (["--lr-scheduler", "bogus"], "--lr-scheduler"),
        (["--tied-embeddings", "middle"], "--tied-embeddings"),
        (["--eval-split", "1.5"], "--eval-split"),
    ],
)
def test_bad_values_exit_2_with_the_option_named(args, fragment):
    r = runner.invoke(app, cli_args("sft", "org/m", "org/d", "o", *args))
    assert r.exit_code == 2, r.output
    assert fragment in r.output


def test_missing_required_options_are_listed():
    r = runner.invoke(app, ["sft"])
    assert r.exit_code == 2
    assert "--model" in r.output and "--dataset" in r.output


@pytest.mark.parametrize(
    "command,values,expected",
    [
        ("sft", {"model": "Qwen/Qwen2.5-0.5B", "dataset": "org/d"}, "runs/sft-Qwen2.5-0.5B"),
        ("dpo", {"model": "models/tiny/", "dataset": "org/d"}, "runs/dpo-tiny"),
        ("pretrain", {"dataset": "models/corpus.txt"}, "runs/pretrain-corpus"),
        ("sft", {"model": "org/m", "dataset": "org/d", "output_dir": "mine"}, "mine"),
    ],
)
def test_output_dir_defaults_to_runs_command_name(command, values, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "corpus.txt").write_text("text")
    assert resolve(command, values).output_dir == expected


def test_unknown_option_exits_2():
    r = runner.invoke(app, ["sft", "--modle", "x"])
    assert r.exit_code == 2


def test_missing_local_dataset_is_a_usage_error(tmp_path):
    r = runner.invoke(app, cli_args("sft", "org/m", tmp_path / "nope.jsonl", tmp_path / "o"))
    assert r.exit_code == 2
    assert "nope.jsonl" in r.output and "does not exist" in r.output


@pytest.mark.parametrize("argv", [["--help"], ["sft", "--help"], ["dpo", "--help"], ["pretrain", "--help"]])
def test_help_imports_no_heavy_library(argv):
    code = (
        "import sys\n"
        f"sys.argv = ['posttrainllm', *{argv!r}]\n"
        "from posttrainllm.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'datasets', 'peft') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_validation_imports_no_heavy_library():
    code = (
        "import sys\n"
        "sys.argv = ['posttrainllm', 'sft', '--model', 'a/b', '--dataset', 'c/d', '--output-dir', 'o', '--llrd', '7']\n"
        "from posttrainllm.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 2, e.code\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'datasets') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_python_dash_m_works():
    r = subprocess.run([sys.executable, "-m", "posttrainllm", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "sft" in r.stdout


def test_run_config_fields_match_the_option_table():
    """RunConfig is typed (checked statically); this keeps it and the option table from drifting apart."""
    import dataclasses

    from posttrainllm.config import EXTRA_OPTIONS, OPTIONS, RunConfig

    fields = {f.name for f in dataclasses.fields(RunConfig)} - {"command", "sources", "argv", "names"}
    names = {o.name for o in OPTIONS} | {o.name for o in EXTRA_OPTIONS}
    assert fields == names
    cfg = RunConfig(command="sft")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0


def test_pretrain_layer_decay_is_one_internal_name():
    from posttrainllm.commands.registry import resolve

    cfg = resolve("pretrain", {"dataset": "org/corpus", "llrd": "0.8"})
    assert cfg.llrd == 0.8 and cfg.to_dict()["llrd"] == 0.8 and "lr_layer_decay" not in cfg.to_dict()


@pytest.mark.parametrize(
    "command, flag, takers",
    [("dpo", "--kl-to-base", "sft and finetune"), ("merge", "--replay-dataset", "sft and finetune"),
     ("eval", "--self-replay", "sft, dpo, kto and finetune")],
)  # fmt: skip
def test_an_option_of_other_commands_is_named_as_theirs(command, flag, takers):
    """An option the command does not take but others do: exit 2 naming the commands that take it."""
    r = runner.invoke(app, [command, flag, "1"])
    assert r.exit_code == 2
    assert f"{flag} is not an option of {command} ({takers} take it)" in r.output
    assert "Possible options" not in r.output


def test_an_unknown_option_still_gets_click_suggestions():
    r = runner.invoke(app, ["sft", "--kl-too", "0.1"])
    assert r.exit_code == 2 and "No such option: --kl-too" in r.output and "--kl-to-base" in r.output
