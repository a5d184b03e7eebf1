"""What a finished run leaves for people: a model card naming the base model and holding the LR table, a drift
report for every training command (full and LoRA), the forgetting report in the trackers, a summary table."""

import json
import re

import pytest
from harness import cli_args, run_args
from typer.testing import CliRunner

from posttrainllm.cli import app

pytestmark = pytest.mark.smoke
runner = CliRunner()


def _run(cmd, model, data, out, *extra):
    r = runner.invoke(
        app,
        run_args(cmd, model, data, out, *extra, steps=3, batch=4, max_length=128),
    )
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize(
    "cmd,data_fixture,extra",
    [
        ("sft", "alpaca_file", ["--llrd", "0.5"]),
        ("sft", "alpaca_file", ["--llrd", "0.5", "--lora-r", "2"]),
        ("dpo", "preference_file", ["--llrd", "0.5"]),
        ("dpo", "preference_file", ["--llrd", "0.5", "--lora-r", "2"]),
        ("finetune", "text_file", ["--llrd", "0.5"]),
        ("finetune", "text_file", ["--llrd", "0.5", "--lora-r", "2"]),
    ],
)
def test_drift_report_for_every_command_full_and_lora(cmd, data_fixture, extra, tiny_model_dir, tmp_path, request):
    out = tmp_path / "o"
    text = _run(cmd, tiny_model_dir, request.getfixturevalue(data_fixture), out, *extra)
    report = json.loads((out / "drift.json").read_text())
    assert json.loads((out / "eval_results.json").read_text())["drift"] == report
    drift = {r["block"]: r["drift"] for r in report["depths"]}
    assert list(drift) == ["embeddings", "block_0", "block_1", "block_2", "block_3", "head"]
    assert drift["block_3"] > 0 and drift["block_0"] < drift["block_3"]  # γ = 0.5: block_0 at 1/8 of the top's LR
    assert "weight drift per depth" in text and "█" in text
    assert (out / "drift.png").stat().st_size > 1000
    if "--lora-r" in extra:
        assert drift["embeddings"] == 0.0 and drift["head"] == 0.0  # LoRA trains adapters inside the blocks only


def test_model_card_names_the_base_model_and_holds_the_lr_table(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "o"
    text = _run("sft", tiny_model_dir, alpaca_file, out, "--llrd", "0.5", "--eval-split", "0.2")
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers")
    assert "- posttrainllm" in card and "- sft" in card and "- llrd" in card
    assert f"`{tiny_model_dir}`" in card and "None" not in card
    assert "| block_0 | 1.25e-04 | 0.125 |" in card and "| head | 1e-03 | 1 |" in card
    assert "alpaca" in card and "training rows" in card and "| eval_loss |" in card
    assert "posttrainllm sft --model" in card
    assert "run summary" in text and "train loss" in text and "done: {" not in text


def test_hub_base_model_goes_into_the_front_matter():
    from posttrainllm.reporting.model_card import render

    card = render(
        command="dpo",
        argv=["dpo"],
        recipe="dpo-llrd",
        base_model="Qwen/Qwen2.5-0.5B",
        plan=None,
        data={"source": "d.jsonl", "format": "preference", "n_train": 10, "n_eval": 0},
        metrics={"train_loss": 0.5},
    )
    assert (
        "base_model: Qwen/Qwen2.5-0.5B" in card
        and "[Qwen/Qwen2.5-0.5B](https://huggingface.co/Qwen/Qwen2.5-0.5B)" in card
    )
    assert "Recipe: `dpo-llrd`" in card and "- dpo" in card and "- llrd" not in card


def test_forgetting_report_reaches_tensorboard(tiny_model_dir, alpaca_file, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ood = tmp_path / "ood.txt"
    ood.write_text("the lazy dog sleeps in the sun. " * 80)
    out = tmp_path / "o"
    _run("sft", tiny_model_dir, alpaca_file, out, "--ood-eval", str(ood), "--report-to", "tensorboard")
    report = json.loads((out / "eval_results.json").read_text())["ood"]["ood.txt"]
    values = {}
    for events in out.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            values[tag] = acc.Scalars(tag)[-1].value
    assert values["train/ood/ood.txt/ppl_before"] == pytest.approx(report["before"], rel=1e-5)
    assert values["train/ood/ood.txt/change_pct"] == pytest.approx(report["change_pct"], rel=1e-4)


def test_the_recipe_in_use_is_in_the_banner(tiny_model_dir, alpaca_file, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("llrd: 0.8\n")
    r = runner.invoke(
        app,
        cli_args("sft", tiny_model_dir, alpaca_file, tmp_path / "o", recipe=recipe, dry_run=True, max_length=128),
    )
    assert r.exit_code == 0, r.output
    unwrapped = re.sub(r"\n +", "", r.output)  # a long path wraps onto the banner's next line, indented
    assert f"recipe     {recipe}" in unwrapped, repr(r.output)
