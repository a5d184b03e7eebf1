"""`posttrainllm distill`: a teacher into a student with TRL's DistillationTrainer. Layer decay applies to the student
only (first-step drift per block = its LR; the teacher's weights are in no optimizer group and do not move); the
teacher must share the student's vocabulary (exit 2 before either model loads); --teacher is required."""

from __future__ import annotations

import json

import pytest
from conftest import check_optimizer_groups
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


@pytest.fixture
def teacher_dir(teacher_model_dir):
    return teacher_model_dir


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    import torch
    from conftest import build_tiny_model, build_tokenizer

    torch.manual_seed(2)
    tok = build_tokenizer(vocab_size=300)
    d = tmp_path_factory.mktemp("other-vocab")
    build_tiny_model(tok).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _args(model, teacher, data, out, *extra):
    base = cli_args("distill", model, data, out)
    return base + (["--teacher", str(teacher)] if teacher else []) + list(extra)


def test_teacher_is_required(tiny_model_dir, prompts_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, None, prompts_file, tmp_path / "o"))
    assert r.exit_code == 2 and "missing --teacher" in r.output, r.output


def test_a_teacher_of_another_vocabulary_exits_2(tiny_model_dir, other_vocab_dir, prompts_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, other_vocab_dir, prompts_file, tmp_path / "o"))
    assert r.exit_code == 2, r.output
    assert "has a vocabulary of" in r.output and "pick a teacher of the same tokenizer family" in r.output


@pytest.mark.parametrize("extra, says", [(["--beta", "1.5"], "must be in [0, 1]"), (["--temperature", "0"], "> 0")])
def test_bad_divergence_settings_exit_2(extra, says, tiny_model_dir, teacher_dir, prompts_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, teacher_dir, prompts_file, tmp_path / "o", *extra))
    assert r.exit_code == 2 and says in r.output, r.output


def test_dry_run_banner_names_the_teacher_and_the_divergence(tiny_model_dir, teacher_dir, prompts_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, teacher_dir, prompts_file, tmp_path / "o", "--dry-run"))
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"teacher {teacher_dir} (frozen, out of the optimizer)" in text and "β=1 (0 forward KL" in text
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())
    assert saved["teacher"] == str(teacher_dir) and saved["lr"] == 1e-5 and saved["beta"] == 1.0


@pytest.mark.smoke
def test_first_step_moves_the_student_by_its_lrs_and_not_the_teacher(
    tiny_model_dir, teacher_dir, prompts_file, tmp_path
):
    from safetensors.torch import load_file
    from test_smoke import block_change

    out = tmp_path / "o"
    extra = ["--llrd", "0.5", "--lr", "1e-3", "--max-steps", "1", "--batch-size", "4", "--max-completion-length", "8"]
    r = runner.invoke(app, _args(tiny_model_dir, teacher_dir, prompts_file, out, *extra))
    assert r.exit_code == 0, r.output
    before, after = load_file(str(tiny_model_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for i in range(4):
        assert block_change(before, after, i, "max") == pytest.approx(1e-3 * 0.5 ** (3 - i), rel=0.02)
    assert block_change(before, after, "lm_head", "max") == pytest.approx(1e-3, rel=0.02)
    assert "layers.5.mlp.up_proj.weight" not in " ".join(after)  # the student's 4 blocks were saved, not the teacher
    groups = {g["name"]: g["lr"] for g in json.loads((out / "param_groups.json").read_text())}
    assert set(groups) >= {"block_0", "block_3", "head"} and "block_5" not in groups
    assert (out / "training_complete.json").is_file()


@pytest.mark.smoke
def test_the_teacher_is_in_no_optimizer_group(tiny_model_dir, teacher_dir, prompts_file, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm import data as D
    from posttrainllm.commands.registry import spec_of, to_config
    from posttrainllm.planning import plan_param_groups
    from posttrainllm.training import build_trainer

    torch.set_num_threads(1)
    cfg = to_config("distill", _args(tiny_model_dir, teacher_dir, prompts_file, tmp_path / "o", "--llrd", "0.5")[1:])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).requires_grad_(False)
    trainer = build_trainer(
        spec_of("distill"), cfg, model=model, tokenizer=tok, train=D.prepare_prompts(str(prompts_file), tok).train,
        eval_ds=None, precision="fp32", plan=plan_param_groups(cfg, model), teacher_model=teacher,
    )  # fmt: skip
    check_optimizer_groups(trainer.create_optimizer(), model, 1e-5, 0.5, not_in=[teacher])


def _teacher_with_tokenizer(teacher_dir, tmp_path, change):
    """A copy of the teacher (same config, so the same vocabulary size) whose tokenizer.json is changed."""
    import shutil

    d = tmp_path / "teacher"
    shutil.copytree(teacher_dir, d)
    tokenizer = json.loads((d / "tokenizer.json").read_text())
    change(tokenizer)
    (d / "tokenizer.json").write_text(json.dumps(tokenizer))
    return d


def _swap_two_ids(tokenizer):
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[120:122]
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _other_text_tokenizer(tokenizer):
    from conftest import build_tokenizer

    other = json.loads(build_tokenizer(["zzz yyy xxx www vvv"] * 10, vocab_size=320).backend_tokenizer.to_str())
    tokenizer.clear()
    tokenizer.update(other)


@pytest.mark.parametrize("change", [_swap_two_ids, _other_text_tokenizer], ids=["ids swapped", "other tokens"])
def test_a_teacher_of_the_same_vocabulary_size_but_other_tokens_exits_2_before_a_model_loads(
    change, tiny_model_dir, teacher_dir, prompts_file, tmp_path, monkeypatch
):
    from posttrainllm import models

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the vocabularies were compared")

    monkeypatch.setattr(models, "load_model", no_load)
    teacher = _teacher_with_tokenizer(teacher_dir, tmp_path, change)
    assert models.vocab_size(str(teacher)) == models.vocab_size(str(tiny_model_dir))
    r = runner.invoke(app, _args(tiny_model_dir, teacher, prompts_file, tmp_path / "o", "--dry-run"))
    text = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert "does not share the vocabulary of --model" in text and "in --model's vocabulary" in text, r.output
    assert "pick a teacher of the same tokenizer family" in text
    assert not (tmp_path / "o").exists()


def test_the_vocabulary_difference_names_a_token_and_counts_the_rest(tiny_model_dir, teacher_dir, tmp_path):
    from transformers import AutoTokenizer

    from posttrainllm.models.vocab import vocabulary_difference

    student = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert vocabulary_difference(student, AutoTokenizer.from_pretrained(teacher_dir)) is None
    swapped = AutoTokenizer.from_pretrained(_teacher_with_tokenizer(teacher_dir, tmp_path, _swap_two_ids))
    a, b = list(json.loads((teacher_dir / "tokenizer.json").read_text())["model"]["vocab"])[120:122]
    vocab = student.get_vocab()
    said = vocabulary_difference(student, swapped)
    assert said == (
        f"token {a!r} is id {vocab[a]} in --model's vocabulary and {vocab[b]} in --teacher's (and 1 more tokens differ)"
    )


def test_a_teacher_without_a_tokenizer_is_compared_by_size_with_a_note(
    tiny_model_dir, teacher_dir, prompts_file, tmp_path
):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (teacher_dir / name).exists():
            shutil.copy(teacher_dir / name, bare / name)
    r = runner.invoke(app, _args(tiny_model_dir, bare, prompts_file, tmp_path / "o", "--dry-run"))
    assert r.exit_code == 0, r.output
    assert "has no tokenizer of its own: only its vocabulary size was compared" in " ".join(r.output.split())
