"""`posttrainllm sdft`: self-distillation fine-tuning with TRL's SDFTTrainer. Layer decay moves block i by
lr × γ^(N-1-i) on the first step (Adam's first step is the LR itself, per weight); the banner and param_groups.json
give those LRs; the run records its teacher settings; the data is sft's rows as a prompt and a demonstration; what
TRL's trainer cannot take is refused before a model loads."""

from __future__ import annotations

import json

import pytest
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def _sdft(model, data, out, *extra, **options):
    return run_args("sdft", model, data, out, *extra, max_length=None, max_completion_length=8, **options)


@pytest.mark.smoke
def test_first_step_moves_each_block_by_its_decayed_lr_and_records_it(tiny_model_dir, alpaca_file, tmp_path):
    from safetensors.torch import load_file
    from test_smoke import block_change

    out = tmp_path / "o"
    r = runner.invoke(app, _sdft(tiny_model_dir, alpaca_file, out, steps=1, batch=4, llrd=0.5, lr="1e-3"))
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "LR layer-decay: γ=0.5 → block_0 LR=1.25e-04, head LR=1e-03" in text
    assert "teacher: moving average of the model (rate 0.01 per step)" in text
    before, after = load_file(str(tiny_model_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for i in range(4):
        assert block_change(before, after, i, "max") == pytest.approx(1e-3 * 0.5 ** (3 - i), rel=0.02)
    assert block_change(before, after, "lm_head", "max") == pytest.approx(1e-3, rel=0.02)
    groups = {g["name"]: g["lr"] for g in json.loads((out / "param_groups.json").read_text())}
    assert groups["block_0"] == pytest.approx(1e-3 * 0.5**3) and groups["head"] == pytest.approx(1e-3)
    assert groups["embeddings"] == pytest.approx(groups["block_0"])
    saved = json.loads((out / "run_config.json").read_text())
    assert (saved["teacher_kind"], saved["teacher_update_rate"], saved["beta"]) == ("ema", 0.01, 1.0)
    assert (out / "training_complete.json").is_file()


def test_dry_run_banner_says_what_the_teacher_is(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "o"
    r = runner.invoke(app, _sdft(tiny_model_dir, alpaca_file, out, "--dry-run", teacher_kind="base", beta=0.5))
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "teacher: the starting model, frozen, shown the demonstration; β=0.5" in text
    assert "one completion per prompt" in text


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--beta", "1.5"], "must be in [0, 1]"),
        (["--temperature", "0"], "> 0"),
        (["--teacher-kind", "frozen"], "must be one of: ema, base, live"),
        (["--teacher-update-rate", "2"], "must be in [0, 1]"),
        (["--streaming"], "--streaming"),
        (["--num-generations", "4"], "--num-generations"),
    ],
)
def test_settings_trl_cannot_take_exit_2_in_one_line(extra, says, tiny_model_dir, alpaca_file, tmp_path):
    r = runner.invoke(app, _sdft(tiny_model_dir, alpaca_file, tmp_path / "o", *extra))
    assert r.exit_code == 2 and says in r.output, r.output
    assert "Traceback" not in r.output


def test_text_rows_have_no_demonstration_exit_1_naming_what_sdft_reads(tiny_model_dir, text_file, tmp_path):
    r = runner.invoke(app, _sdft(tiny_model_dir, text_file, tmp_path / "o"))
    assert r.exit_code == 1, r.output
    assert "sdft learns from a prompt and its demonstration" in r.output and "Traceback" not in r.output


def test_sdft_rows_from_each_sft_shape():
    from posttrainllm.data.demonstrations import demonstration_of
    from posttrainllm.errors import DataError

    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert demonstration_of({"messages": chat}, "r") == {"prompt": chat[:2], "privileged_context": "4"}
    assert demonstration_of({"prompt": "Say hi.", "completion": "hi"}, "r") == {
        "prompt": "Say hi.",
        "privileged_context": "hi",
    }
    completion = [{"role": "assistant", "content": [{"type": "text", "text": "yes"}]}]
    row = {"prompt": chat[1:2], "completion": completion}
    assert demonstration_of(row, "r") == {"prompt": chat[1:2], "privileged_context": "yes"}
    with pytest.raises(DataError, match="row 3: sdft needs a user turn right before the last assistant turn"):
        demonstration_of({"messages": [chat[0], chat[2]]}, "row 3")
