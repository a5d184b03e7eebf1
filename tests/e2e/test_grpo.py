"""`posttrainllm grpo` / `rloo`: prompt data read with its other columns kept for the rewards; the built-in rewards
(regex, exact match) score what they say; --reward-fn loads only what the user names and a bad spec exits 2 before
any model loads; a tiny model trains with the per-block LRs of the formula (optimizer groups and first-step drift),
the reward rises on a toy verifiable task, flat and with --llrd."""

from __future__ import annotations

import json

import pytest
from conftest import check_optimizer_groups, write_jsonl
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm import data as D
from posttrainllm import rewards as R
from posttrainllm.cli import app
from posttrainllm.errors import DataError, UsageError

runner = CliRunner()

# The toy verifiable task: the share of a completion's tokens whose id is below LOW_ID (the tiny tokenizer's byte
# tokens). An untrained 4-block model samples them ~1 time in 5; a policy that learns the task emits only those.
LOW_ID = 64
TOY_REWARD = f"""
def low_ids(completions, completion_ids, **kwargs):
    return [sum(i < {LOW_ID} for i in ids) / max(1, len(ids)) for ids in completion_ids]


def answer_column_seen(completions, answer, **kwargs):
    return [1.0 if a else 0.0 for a in answer]
"""
# The rise of the mean reward (mean of the last 5 logged steps minus the first 5) that a flat run of
# test_reward_rises_on_the_toy_task measured at seed 42: 0.67 (0.231 -> 0.904); seeds 0, 1 and 123 gave 0.70, 0.66
# and 0.69, and --llrd 0.8 at seeds 42, 0, 7 gave 0.75, 0.79, 0.61. The same run at --lr 1e-9 (no learning) moved
# by -0.04 (0.228 -> 0.192), and at --lr 3e-3 by 0.00. The test asks for half of the measured flat rise.
MEASURED_FLAT_RISE = 0.67
RISE_NEEDED = MEASURED_FLAT_RISE / 2


def _prompts(n=8):
    return [{"prompt": f"Count {i}:", "answer": str(i % 3)} for i in range(n)]


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "toy_rewards.py"
    path.write_text(TOY_REWARD)
    return path


@pytest.fixture
def prompt_file(tmp_path):
    return write_jsonl(tmp_path / "p.jsonl", _prompts())


@pytest.fixture(scope="module")
def tok():
    from data_samples import make_tokenizer

    return make_tokenizer()


# ------------------------------------------------------------------------------------------------------- rewards
def test_regex_reward_is_one_for_a_match_and_zero_otherwise():
    reward = R.RegexReward(r"^<answer>\d+</answer>$")
    completions = ["<answer>42</answer>", "42", "<answer>4\n2</answer>"]
    assert reward(completions=completions) == [1.0, 0.0, 0.0]
    chat = [[{"role": "assistant", "content": "<answer>7</answer>"}]]
    assert reward(completions=chat) == [1.0]


def test_match_reward_compares_the_last_answer_with_the_column():
    reward = R.MatchReward("answer", r"= *(-?\d+)")
    got = reward(completions=["2+2 = 3, no: = 4", "= 5", "no number", " = 4 "], answer=["4", "4", "4", 4])
    assert got == [1.0, 0.0, 0.0, 1.0]
    whole = R.MatchReward("answer")
    assert whole(completions=[" Paris\n", "paris"], answer=["Paris", "Paris"]) == [1.0, 0.0]


def test_reward_fn_from_a_file_and_from_a_module(reward_file, monkeypatch):
    fn = R.load_reward_fn(f"{reward_file}:low_ids")
    assert fn(completions=["a", "b"], completion_ids=[[1, 100], [2, 3]]) == [0.5, 1.0]
    monkeypatch.chdir(reward_file.parent)
    assert R.load_reward_fn("toy_rewards:answer_column_seen")(completions=["x"], answer=["1"]) == [1.0]


@pytest.mark.parametrize(
    "spec, says",
    [
        ("no_colon", "must be module:function or path/to/file.py:function"),
        ("missing.py:f", "file missing.py does not exist"),
        ("{file}:nope", "has no 'nope'; its functions: answer_column_seen, low_ids"),
        ("{file}:LOW", "is a int, not a function"),
        ("{bad}:f", "importing .* failed: ZeroDivisionError"),
        ("no_such_module_xyz:f", "no module named 'no_such_module_xyz'"),
    ],
)
def test_a_bad_reward_fn_is_a_usage_error_naming_it(spec, says, reward_file, tmp_path):
    reward_file.write_text(TOY_REWARD + "\nLOW = 3\n")
    bad = tmp_path / "broken.py"
    bad.write_text("x = 1 / 0\n")
    with pytest.raises(UsageError, match=says):
        R.load_reward_fn(spec.format(file=reward_file, bad=bad))


# ---------------------------------------------------------------------------------------------------------- data
def test_prompt_data_keeps_the_other_columns_and_drops_empty_prompts(tmp_path, tok):
    rows = _prompts(6)
    rows[2]["prompt"] = "   "
    prep = D.prepare_prompts(str(write_jsonl(tmp_path / "p.jsonl", rows)), tok)
    assert prep.format == "prompt" and prep.n_train == 5 and prep.dropped == {"empty prompt": 1}
    assert prep.train.column_names == ["prompt", "answer"] or set(prep.train.column_names) == {"prompt", "answer"}
    assert [r["answer"] for r in prep.train] == ["0", "1", "0", "1", "2"]
    assert "dropped 1 degenerate row (1 empty prompt)" in D.describe(prep)


def test_messages_prompt_ends_at_the_last_user_turn(tmp_path, tok):
    conv = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    prep = D.prepare_prompts(str(write_jsonl(tmp_path / "m.jsonl", [{"messages": conv, "answer": "4"}] * 3)), tok)
    assert prep.conversational and [m["role"] for m in prep.train[0]["prompt"]] == ["system", "user"]
    assert prep.train[0]["answer"] == "4"


def test_alpaca_rows_become_the_sft_prompt(tmp_path, tok):
    rows = [{"instruction": "Add 2 and 2.", "input": "", "output": "4"}] * 2
    prep = D.prepare_prompts(str(write_jsonl(tmp_path / "a.json", rows)), tok)
    assert prep.format == "alpaca" and prep.train[0]["prompt"].endswith("### Response:\n")
    assert prep.train[0]["output"] == "4"


def test_prompt_data_errors_name_the_record(tmp_path, tok):
    with pytest.raises(DataError, match="cannot tell the prompts from columns"):
        D.prepare_prompts(str(write_jsonl(tmp_path / "x.jsonl", [{"question": "q"}])), tok)
    rows = [{"prompt": "a"}, {"prompt": 5}]
    with pytest.raises(DataError, match="record 2: 'prompt' must be a string or a list of messages"):
        D.prepare_prompts(str(write_jsonl(tmp_path / "y.jsonl", rows)), tok)
    rows = [{"messages": [{"role": "assistant", "content": "hi"}]}]
    with pytest.raises(DataError, match="record 1: 'messages' has no user turn"):
        D.prepare_prompts(str(write_jsonl(tmp_path / "z.jsonl", rows)), tok)


# ----------------------------------------------------------------------------------------------------------- CLI
def _args(model, data, out, *extra, command="grpo"):
    return cli_args(command, model, data, out, *extra)


@pytest.mark.parametrize(
    "extra, says",
    [
        ([], "grpo needs a reward: --reward-regex REGEX, --reward-match COLUMN and/or --reward-fn"),
        (["--reward-regex", "a(", "--reward-regex", "b"], "--reward-regex is not a valid regular expression"),
        (
            ["--reward-regex", "a", "--batch-size", "6"],
            "6 completions per step is not a multiple of --num-generations 4",
        ),
        (["--reward-regex", "a", "--num-generations", "1"], "--num-generations must be 2 or more"),
        (["--reward-regex", "a", "--temperature", "0"], "--temperature must be > 0 for grpo"),
        (["--reward-regex", "a", "--reward-weights", "1,2"], "--reward-weights has 2 weight(s) for 1 reward(s)"),
        (["--reward-regex", "a", "--answer-pattern", "x"], "--answer-pattern goes with --reward-match COLUMN"),
        (["--reward-fn", "nocolon"], "--reward-fn must be module:function or path/to/file.py:function"),
        (["--reward-regex", "a", "--max-length", "64"], "--max-length is not an option of grpo"),
    ],
)
def test_bad_options_exit_2_with_one_line(extra, says, tiny_model_dir, prompt_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, prompt_file, tmp_path / "o", *extra))
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output


def test_a_reward_fn_that_fails_to_import_exits_2_before_the_model_loads(tiny_model_dir, prompt_file, tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import not_installed_anywhere_xyz\n")
    out = tmp_path / "o"
    r = runner.invoke(app, _args(tiny_model_dir, prompt_file, out, "--reward-fn", f"{bad}:f"))
    assert r.exit_code == 2 and "importing" in r.output and "not_installed_anywhere_xyz" in r.output, r.output
    assert not (out / "param_groups.json").exists()  # stopped before the plan (and so before the model)


def test_reward_match_on_a_missing_column_exits_2(tiny_model_dir, prompt_file, tmp_path):
    r = runner.invoke(app, _args(tiny_model_dir, prompt_file, tmp_path / "o", "--reward-match", "solution"))
    assert r.exit_code == 2 and "no column 'solution'; its columns: answer" in " ".join(r.output.split()), r.output


def test_dry_run_banner_shows_sampling_rewards_and_steps(tiny_model_dir, prompt_file, reward_file, tmp_path):
    extra = ["--reward-regex", "^a", "--reward-match", "answer", "--reward-fn", f"{reward_file}:low_ids"]
    extra += ["--reward-weights", "1,2,0.5", "--batch-size", "8", "--dry-run", "--llrd", "0.9"]
    r = runner.invoke(app, _args(tiny_model_dir, prompt_file, tmp_path / "o", *extra))
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "4 completions per prompt, temperature 1, at most 128 tokens" in text
    assert "1×regex /^a/ + 2×exact match with column 'answer' + 0.5×" in text and "reference: none (β = 0)" in text
    assert "4 (batch 8 × accum 1 = 8 completions per step" in text  # 8 prompts × 4 completions / 8 per step
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())
    assert saved["reward_weights"] == [1.0, 2.0, 0.5] and saved["lr"] == 1e-6 and saved["beta"] == 0.0


# ------------------------------------------------------------------------------------------------------ training
def _train(model, data, out, *extra, command="grpo"):
    args = ["--max-completion-length", "12", "--batch-size", "8", "--logging-steps", "1", "--save-steps", "1000"]
    r = runner.invoke(app, _args(model, data, out, *args, *extra, command=command))
    assert r.exit_code == 0, r.output
    return r


@pytest.mark.smoke
@pytest.mark.parametrize("command", ["grpo", "rloo"])
def test_first_step_moves_each_block_by_its_lr(command, tiny_model_dir, prompt_file, reward_file, text_file, tmp_path):
    """Adam's first step moves each element with a gradient by about its group's LR: max|ΔW| per block = its LR,
    so the drift of block i over the top block is γ^(N-1-i); the groups in param_groups.json follow the formula;
    the drift and forgetting reports and the model card are written as for the other commands."""
    from safetensors.torch import load_file
    from test_smoke import block_change

    out = tmp_path / "o"
    reward = ["--reward-fn", f"{reward_file}:low_ids"]
    _train(tiny_model_dir, prompt_file, out, *reward, "--llrd", "0.5", "--lr", "1e-3", "--max-steps", "1",
           "--ood-eval", str(text_file), command=command)  # fmt: skip
    before, after = load_file(str(tiny_model_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for i in range(4):
        assert block_change(before, after, i, "max") == pytest.approx(1e-3 * 0.5 ** (3 - i), rel=0.02)
    assert block_change(before, after, "lm_head", "max") == pytest.approx(1e-3, rel=0.02)
    groups = {g["name"]: g["lr"] for g in json.loads((out / "param_groups.json").read_text())}
    assert groups["block_0"] == pytest.approx(1.25e-4) and groups["head"] == pytest.approx(1e-3)
    assert (out / "training_complete.json").is_file() and (out / "README.md").is_file()
    results = json.loads((out / "eval_results.json").read_text())
    drift = {d["block"]: d["drift"] for d in results["drift"]["depths"]}
    assert 0 < drift["block_0"] < drift["block_3"]  # block 0 moved at 1/8 of block 3's LR
    (ood,) = results["ood"].values()
    assert ood["before"] > 0 and ood["after"] > 0 and "kl" in ood
    assert json.loads((out / "run_config.json").read_text())["command"] == command


@pytest.mark.smoke
def test_optimizer_groups_follow_the_formula_and_hold_no_reference(tiny_model_dir, prompt_file, reward_file, tmp_path):
    """GRPO with β > 0 keeps a reference model: none of its weights is in the optimizer, whose groups follow
    base × γ^(N-1-i) and hold every trainable weight once."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm.commands.registry import spec_of, to_config
    from posttrainllm.planning import plan_param_groups
    from posttrainllm.training import build_trainer

    torch.set_num_threads(1)
    args = _args(tiny_model_dir, prompt_file, tmp_path / "o", "--reward-fn", f"{reward_file}:low_ids")[1:]
    cfg = to_config("grpo", args + ["--llrd", "0.5", "--lr", "1e-3", "--beta", "0.04", "--batch-size", "4"])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prep = D.prepare_prompts(str(prompt_file), tok)
    trainer = build_trainer(
        spec_of("grpo"), cfg, model=model, tokenizer=tok, train=prep.train, eval_ds=None, precision="fp32",
        plan=plan_param_groups(cfg, model), reward_funcs=R.build_rewards(cfg),
    )  # fmt: skip
    assert trainer.ref_model is not None
    check_optimizer_groups(trainer.create_optimizer(), trainer.model, 1e-3, 0.5, not_in=[trainer.ref_model])


def _rewards_logged(out) -> list[float]:
    state = json.loads((out / "trainer_state.json").read_text())
    return [h["reward"] for h in state["log_history"] if "reward" in h]


@pytest.mark.smoke
@pytest.mark.parametrize("llrd", ["1.0", "0.8"])
def test_reward_rises_on_the_toy_task(llrd, tiny_model_dir, reward_file, tmp_path):
    """30 GRPO steps on the toy verifiable task: the mean reward of the last 5 steps exceeds that of the first 5 by
    at least half of what a measured flat run gained (MEASURED_FLAT_RISE)."""
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"say {i}"} for i in range(16)])
    out = tmp_path / "o"
    _train(tiny_model_dir, data, out, "--reward-fn", f"{reward_file}:low_ids", "--lr", "3e-2", "--max-steps", "30",
           "--llrd", llrd, "--seed", "42")  # fmt: skip
    rewards = _rewards_logged(out)
    assert len(rewards) == 30
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last - first >= RISE_NEEDED, (first, last, rewards)
