"""--resume compares every input the table marks (Opt.input) by what it holds and by its resolved path: reward code
(`--reward-fn` files, modules found as Python would import them), teachers and reference models (their config and
tokenizer files, and their weights' headers and spread blocks), as datasets already were."""

from __future__ import annotations

import json
import shutil

import pytest
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.rundir import fingerprint

runner = CliRunner()
REWARD = "def f(completions, **kw):\n    return [float(len(c) % 3) for c in completions]\n"


def _record(cfg: dict) -> dict:
    return {**cfg, fingerprint.RESOLVED: fingerprint.resolved_record(cfg)}


def _fields(saved: dict, current: dict) -> list[str]:
    return [k for k, _, _ in fingerprint.differences(saved, current)]


# ------------------------------------------------------------------------------------ the comparison (no training)
def test_a_reward_file_is_the_same_under_any_path_that_resolves_to_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rf2.py").write_text(REWARD)
    saved = _record({"command": "grpo", "reward_fn": ["rf2.py:f"]})
    for spec in ("./rf2.py:f", f"{tmp_path}/rf2.py:f", "rf2:f", "sub/../rf2.py:f"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        assert _fields(saved, {"command": "grpo", "reward_fn": [spec]}) == [], spec
    diffs = fingerprint.differences(saved, {"command": "grpo", "reward_fn": ["./rf2.py:g"]})  # another function
    assert [k for k, _, _ in diffs] == ["reward_fn contents"] and "function g" in diffs[0][2], diffs


def test_an_edited_reward_file_is_another_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rf2.py").write_text(REWARD)
    saved = _record({"command": "rloo", "reward_fn": ["rf2.py:f"]})
    (tmp_path / "rf2.py").write_text(REWARD.replace("% 3", "* 1e4"))
    diffs = fingerprint.differences(saved, {"command": "rloo", "reward_fn": ["./rf2.py:f"]})
    assert [k for k, _, _ in diffs] == ["reward_fn contents"], diffs
    assert "function f" in diffs[0][1] and "sha256" in diffs[0][2]


def test_a_reward_module_is_compared_by_its_file_without_importing_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (tmp_path / "pkg" / "rewards.py").write_text(REWARD)
    saved = _record({"command": "grpo", "reward_fn": ["pkg.rewards:f"]})
    assert saved[fingerprint.RESOLVED]["inputs"]["reward_fn"][0]["function"] == "f"
    (tmp_path / "pkg" / "rewards.py").write_text(REWARD + "# changed\n")
    assert _fields(saved, {"command": "grpo", "reward_fn": ["pkg.rewards:f"]}) == ["reward_fn contents"]


@pytest.fixture
def model_pair(tmp_path):
    """Two models of one architecture, size and tokenizer, with other weights (same file names and sizes)."""
    import torch
    from conftest import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        d = tmp_path / f"m{seed}"
        build_tiny_model(tok).save_pretrained(d)
        tok.save_pretrained(d)
        dirs.append(d)
    return dirs


@pytest.mark.parametrize("key, command", [("teacher", "distill"), ("ref_model", "dpo"), ("model", "sft")])
@pytest.mark.parametrize("weights_are_big", [False, True])
def test_a_model_directory_replaced_with_other_weights_is_another_run(
    model_pair, tmp_path, monkeypatch, key, command, weights_are_big
):
    if weights_are_big:  # the weights as a real model's: past the size hashed whole, identified by header and blocks
        monkeypatch.setattr(fingerprint, "_SMALL_IN_DIR", 1024)
    first, other = model_pair
    used = tmp_path / "used"
    shutil.copytree(first, used)
    saved = _record({"command": command, key: str(used)})
    moved = tmp_path / "moved"
    shutil.copytree(used, moved)  # the same files under another path: the same input
    assert _fields(saved, {"command": command, key: str(used)}) == []
    shutil.copy(other / "model.safetensors", used / "model.safetensors")
    assert (used / "model.safetensors").stat().st_size == (moved / "model.safetensors").stat().st_size
    assert _fields(saved, {"command": command, key: str(used)}) == [f"{key} contents"]
    saved = _record({"command": command, key: str(moved)})
    tokenizer = json.loads((moved / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # the same tokens under other ids
    (moved / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert _fields(saved, {"command": command, key: str(moved)}) == [f"{key} contents"]


def test_a_record_of_an_earlier_version_is_compared_by_what_it_holds(model_pair):
    """A run_config.json written before weights were sampled has no "big_files_sha256": the keys it has are compared."""
    first, _ = model_pair
    saved = _record({"command": "sft", "model": str(first)})
    del saved[fingerprint.RESOLVED]["inputs"]["model"]["big_files_sha256"]
    assert _fields(saved, {"command": "sft", "model": str(first)}) == []


# ------------------------------------------------------------------------------------- through the CLI, real runs
@pytest.mark.smoke
def test_grpo_resume_refuses_an_edited_reward_file_and_accepts_another_spelling(
    tiny_model_dir, prompts_file, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rf2.py").write_text(REWARD)
    base = run_args(
        "grpo",
        tiny_model_dir,
        prompts_file,
        "o",
        steps=1,
        batch=4,
        max_length=None,
        lr=None,
        max_completion_length=4,
        save_steps=1,
    )
    r = runner.invoke(app, [*base, "--reward-fn", "rf2.py:f"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*base, "--reward-fn", "./rf2.py:f", "--resume"])
    assert r.exit_code == 0 and "already complete" in r.output, r.output
    (tmp_path / "rf2.py").write_text(REWARD.replace("% 3", "* 1e4"))
    before = (tmp_path / "o" / "run_config.json").read_text()
    r = runner.invoke(app, [*base, "--reward-fn", "rf2.py:f", "--resume", "--max-steps", "2"])
    assert r.exit_code == 2 and "reward_fn contents" in r.output, r.output
    assert (tmp_path / "o" / "run_config.json").read_text() == before


@pytest.mark.smoke
def test_distill_resume_refuses_a_teacher_replaced_in_place(tiny_model_dir, teacher_model_dir, prompts_file, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dir, teacher)
    base = run_args(
        "distill",
        tiny_model_dir,
        prompts_file,
        tmp_path / "o",
        steps=1,
        batch=4,
        max_length=None,
        lr=None,
        teacher=teacher,
        max_completion_length=4,
        save_steps=1,
    )
    r = runner.invoke(app, base)
    assert r.exit_code == 0, r.output
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())
    assert saved[fingerprint.RESOLVED]["inputs"]["teacher"]["files"] >= 3
    shutil.rmtree(teacher)
    shutil.copytree(teacher_model_dir, teacher)  # other weights and depth, same path
    r = runner.invoke(app, [*base, "--resume", "--max-steps", "2"])
    assert r.exit_code == 2 and "teacher contents" in r.output, r.output
