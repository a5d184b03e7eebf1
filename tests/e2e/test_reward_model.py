"""`posttrainllm reward`: a reward model (sequence classification, one score) from preference pairs. The backbone's
blocks get the per-block LRs of the formula and the new score head the base LR (optimizer groups and first-step
drift); the head's being new is a note, not an error; the model learns to score chosen above rejected; bad inputs
exit 2 or 1 with one line."""

from __future__ import annotations

import json

import pytest
from conftest import check_optimizer_groups
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def _args(model, data, out, *extra):
    return cli_args("reward", model, data, out, *extra)


def test_dry_run_names_the_new_score_head(tiny_model_dir, preference_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, preference_file, tmp_path / "o", "--dry-run", "--llrd", "0.9"))
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "LlamaForSequenceClassification" in text and "reward model: a new score head (score.weight" in text
    assert "the head trains at the base LR" in text
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())
    assert saved["command"] == "reward" and saved["lr"] == 1e-5


@pytest.mark.parametrize(
    "extra, code, says",
    [
        (["--ood-eval", "x.txt"], 2, "--ood-eval is not an option of reward"),
        (["--reward-regex", "a"], 2, "--reward-regex is not an option of reward"),
        (["--trainer-arg", "max_length=9"], 2, "--trainer-arg max_length: set it with --max-length"),
    ],
)
def test_bad_options_exit_with_one_line(extra, code, says, tiny_model_dir, preference_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, preference_file, tmp_path / "o", *extra))
    assert r.exit_code == code and says in " ".join(r.output.split()), r.output


def test_sft_data_is_named_as_such(tiny_model_dir, alpaca_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, alpaca_file, tmp_path / "o"))
    assert r.exit_code == 1 and "looks like SFT data" in r.output and "Traceback" not in r.output, r.output


@pytest.mark.smoke
def test_groups_follow_the_formula_with_the_score_head_at_the_base_lr(tiny_model_dir, preference_file, tmp_path):
    import torch

    from posttrainllm import data as D
    from posttrainllm import models
    from posttrainllm.commands.registry import spec_of, to_config
    from posttrainllm.planning import plan_param_groups
    from posttrainllm.training import build_trainer

    torch.set_num_threads(1)
    cfg = to_config(
        "reward", _args(tiny_model_dir, preference_file, tmp_path / "o", "--llrd", "0.5", "--lr", "1e-3")[1:]
    )
    tok = models.load_tokenizer(str(tiny_model_dir))
    model = models.load_model(str(tiny_model_dir), fine_tune=True, reward_head=True, notes=[])
    prep = D.prepare_dpo(str(preference_file), tok)
    plan = plan_param_groups(cfg, model)
    trainer = build_trainer(
        spec_of("reward"), cfg, model=model, tokenizer=tok, train=prep.train, eval_ds=None, precision="fp32", plan=plan
    )
    by_name = check_optimizer_groups(trainer.create_optimizer(), trainer.model, 1e-3, 0.5)
    assert any(p is model.score.weight for p in by_name["head"]["params"])


@pytest.mark.smoke
def test_first_step_drift_follows_the_lrs_and_the_model_learns_the_preference(
    tiny_model_dir, preference_file, tmp_path
):
    from safetensors.torch import load_file
    from test_smoke import block_change

    one = tmp_path / "one"
    r = runner.invoke(app, _args(tiny_model_dir, preference_file, one, "--llrd", "0.5", "--lr", "1e-3",
                                 "--max-steps", "1", "--batch-size", "4"))  # fmt: skip
    assert r.exit_code == 0, r.output
    before, after = load_file(str(tiny_model_dir / "model.safetensors")), load_file(str(one / "model.safetensors"))
    for i in range(4):
        assert block_change(before, after, i, "max") == pytest.approx(1e-3 * 0.5 ** (3 - i), rel=0.02)
    assert "score.weight" in after and (one / "training_complete.json").is_file()

    # 24 steps at a higher LR: the saved reward model scores each chosen answer above its rejected one
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "long"
    r = runner.invoke(app, _args(tiny_model_dir, preference_file, out, "--llrd", "0.9", "--lr", "3e-3",
                                 "--max-steps", "24", "--batch-size", "8", "--logging-steps", "4"))  # fmt: skip
    assert r.exit_code == 0, r.output
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    rows = [json.loads(line) for line in preference_file.read_text().splitlines()]

    def score(text):  # as TRL scores a plain-text pair: the text with EOS, the score at its last token
        with torch.no_grad():
            return model(**tok(text + tok.eos_token, return_tensors="pt")).logits[0, 0].item()

    wins = sum(score(r["prompt"] + r["chosen"]) > score(r["prompt"] + r["rejected"]) for r in rows)
    assert wins >= 0.9 * len(rows), wins


@pytest.mark.parametrize("max_length, says", [("100000", "the model's limit of 256 positions"), ("64", "raise")])
def test_examples_longer_than_the_clamped_limit_do_not_say_raise_max_length(max_length, says, tiny_model_dir,
                                                                            tmp_path):  # fmt: skip
    """--max-length above the model's 256 positions is clamped to them: when no pair then fits, the advice is to
    shorten the examples, not to raise --max-length (which would be clamped again)."""
    from conftest import write_jsonl

    rows = [{"prompt": "word " * 400, "chosen": " yes", "rejected": " no"}] * 4
    data = write_jsonl(tmp_path / "long.jsonl", rows)
    r = runner.invoke(app, _args(tiny_model_dir, data, tmp_path / "o", "--max-length", max_length, "--max-steps", "1"))
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "no training example is left after tokenization" in text and says in text, text
    if max_length == "100000":
        assert "raise --max-length" not in text and "shorten the examples" in text
    else:
        assert "than --max-length 64; raise --max-length" in text
