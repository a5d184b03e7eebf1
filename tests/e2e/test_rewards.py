"""Rewards against hostile or careless values: every reward is checked (one finite number, or None, per completion;
an exception names the reward), list-valued answer columns hold the accepted answers, patterns are time-bounded, and
a --reward-fn module is loaded without putting the working directory on sys.path."""

from __future__ import annotations

import math
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import write_jsonl
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm import rewards as R
from posttrainllm.cli import app
from posttrainllm.errors import TrainingError, UsageError

runner = CliRunner()


def _cfg(**kw):
    return SimpleNamespace(**{"reward_regex": None, "reward_match": None, "answer_pattern": None, "reward_fn": None,
                              **kw})  # fmt: skip


def _file(tmp_path, body: str, name: str = "rf.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


# ------------------------------------------------------------------------------------------- list-valued answers
def test_a_list_answer_column_holds_the_accepted_answers():
    reward = R.MatchReward("answer", r"= *(\w+)")
    got = reward(completions=["= 4", "= four", "= 5", "= 4"], answer=[["4", "four"], ["4", "four"], ["4"], []])
    assert got == [1.0, 1.0, 0.0, 0.0]


def test_a_nested_answer_value_is_a_usage_error_naming_the_column():
    with pytest.raises(UsageError, match="--reward-match answer: a row holds dict"):
        R.MatchReward("answer")(completions=["4"], answer=[{"value": "4"}])


# ------------------------------------------------------------------------------------- non-finite / odd rewards
@pytest.mark.parametrize(
    "body, says",
    [
        ("return [float('nan')] * len(completions)", "returned nan for completion 1 of 2"),
        ("return [1.0, float('inf')]", "returned inf for completion 2 of 2"),
        ("return [10 ** 400, 1]", "0000… (401 characters) for completion 1 of 2"),
        ("return [None] * len(completions)", "no reward scored completion 1 of 2"),
        ("return ['good'] * len(completions)", "returned a str ('good') for completion 1 of 2"),
        ("return 1.0", "returned a float (1.0), not a list of one number per completion"),
        ("return [1.0]", "returned 1 values for 2 completions"),
        ("return [1 / 0]", "raised ZeroDivisionError: division by zero"),
    ],
)
def test_a_bad_reward_stops_with_one_line_naming_it(body, says, tmp_path):
    spec = f"{_file(tmp_path, f'def f(completions, **kw):{chr(10)}    {body}{chr(10)}')}:f"
    (reward,) = R.build_rewards(_cfg(reward_fn=[spec]))
    state = SimpleNamespace(global_step=4)
    with pytest.raises(TrainingError, match=None) as e:
        reward(prompts=["p", "q"], completions=["a", "b"], completion_ids=[[1], [2]], trainer_state=state)
    text = str(e.value)
    assert says in text and f"reward --reward-fn {spec} (step 5)" in text and "\n" not in text, text


def test_none_is_accepted_when_another_reward_scores_the_completion(tmp_path):
    spec = f"{_file(tmp_path, 'def f(completions, **kw):' + chr(10) + '    return [None, 2.0]' + chr(10))}:f"
    regex, fn = R.build_rewards(_cfg(reward_regex=["a"], reward_fn=[spec]))
    batch = ["a", "b"]  # TRL hands every reward the same list of completions
    assert regex(completions=batch) == [1.0, 0.0]
    assert fn(completions=batch) == [None, 2.0]  # completion 1 has the regex's 1.0
    shared = R._Round(2)
    first = R.CheckedReward(lambda completions, **_: [None, 1.0], "first", shared)
    second = R.CheckedReward(lambda completions, **_: [None, None], "second", shared)
    assert first(completions=batch) == [None, 1.0]
    with pytest.raises(TrainingError, match="reward second: no reward scored completion 1 of 2"):
        second(completions=batch)


def test_rewards_keep_their_names_for_the_logs(tmp_path):
    spec = f"{_file(tmp_path, 'def low_ids(completions, **kw):' + chr(10) + '    return [0.0] * len(completions)')}"
    names = [r.__name__ for r in R.build_rewards(_cfg(reward_regex=["a"], reward_match="answer",
                                                        reward_fn=[f"{spec}:low_ids"]))]  # fmt: skip
    assert names == ["regex", "match_answer", "low_ids"]


# ----------------------------------------------------------------------------------------------- answer pattern
def test_an_optional_answer_group_that_took_no_part_is_one_clear_usage_error():
    reward = R.MatchReward("answer", r"(\d+)?a")
    assert reward(completions=["12a"], answer=["12"]) == [1.0]
    with pytest.raises(UsageError, match=r"--answer-pattern '\(\\d\+\)\?a': its first group took no part"):
        reward(completions=["a"], answer=["1"])


# ------------------------------------------------------------------------------------------------ slow patterns
_SLOW = [(r"(x+x+)+y", "x" * 5000), (r"(a|aa)+$", "a" * 4000 + "b")]


@pytest.mark.parametrize("pattern, text", _SLOW)
def test_a_catastrophic_pattern_stops_within_seconds_naming_it(pattern, text):
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="--reward-regex .* took over .* s") as e:
        R.RegexReward(pattern)(completions=["ok", text])
    assert time.monotonic() - t0 < R.REGEX_TIMEOUT_S + 5
    assert pattern[:10] in str(e.value)
    with pytest.raises(UsageError, match="--answer-pattern"):
        R.MatchReward("answer", pattern)(completions=[text], answer=["x"])


def test_a_catastrophic_pattern_ends_in_a_bounded_process():
    """The same in a child process with a wall-clock limit and a 2 GiB address-space cap: it ends by itself."""
    import resource
    import subprocess

    code = (
        "from posttrainllm.rewards import RegexReward\n"
        "from posttrainllm.errors import UsageError\n"
        "try:\n"
        f"    RegexReward({_SLOW[0][0]!r})(completions=['x' * 5000])\n"
        "except UsageError as e:\n"
        "    print('stopped:', e)\n"
    )

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=cap)
    assert "stopped: --reward-regex" in done.stdout, done.stdout + done.stderr
    assert time.monotonic() - t0 < 30


def test_an_invalid_pattern_is_refused_with_the_options(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "p", "answer": "1"}])
    r = runner.invoke(app, cli_args("grpo", tmp_path, data, reward_regex="(?<x", dry_run=True))  # fmt: skip
    assert r.exit_code == 2 and "--reward-regex is not a valid regular expression" in r.output, r.output


# ----------------------------------------------------------------------------------------- module by explicit path
def test_a_reward_module_does_not_put_the_working_directory_on_sys_path(tmp_path, monkeypatch):
    import importlib.util

    (tmp_path / "myrewards_xyz.py").write_text("def f(completions, **kw):\n    return [1.0] * len(completions)\n")
    (tmp_path / "shadow_pkg_xyz.py").write_text("raise SystemExit('a file of the working directory ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    try:
        assert R.load_reward_fn("myrewards_xyz:f")(completions=["a"]) == [1.0]
        assert sys.path == before
        assert importlib.util.find_spec("shadow_pkg_xyz") is None  # nothing in the directory shadows a package
    finally:
        sys.modules.pop("myrewards_xyz", None)


def test_a_reward_package_in_the_working_directory_loads_its_submodule(tmp_path, monkeypatch):
    pkg = tmp_path / "rewardpkg_xyz"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "score.py").write_text("def f(completions, **kw):\n    return [0.5] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    try:
        assert R.load_reward_fn("rewardpkg_xyz.score:f")(completions=["a", "b"]) == [0.5, 0.5]
    finally:
        for name in ("rewardpkg_xyz", "rewardpkg_xyz.score"):
            sys.modules.pop(name, None)


def test_finite_check_accepts_numpy_and_bool_values():
    import numpy as np

    reward = R.CheckedReward(lambda completions, **_: np.array([1, 0.5]), "np")
    assert reward(completions=["a", "b"]) == [1.0, 0.5]
    assert R.CheckedReward(lambda completions, **_: [True, False], "b")(completions=["a", "b"]) == [1.0, 0.0]
    assert not any(math.isnan(v) for v in reward(completions=["a", "b"]))


# ------------------------------------------------------------------------------------------ reward code in recipes
@pytest.fixture
def evil_recipe(tmp_path):
    marker = tmp_path / "ran.txt"
    evil = _file(tmp_path, f"open({str(marker)!r}, 'w').write('ran')\ndef f(completions, **kw):\n    return [0.0]\n",
                 name="evil.py")  # fmt: skip
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"reward_fn: ['{evil}:f']\nreward_regex: ['a']\n")
    return recipe, marker


def test_a_recipe_naming_reward_code_exits_2_without_importing_it(evil_recipe, tiny_model_dir, tmp_path):
    recipe, marker = evil_recipe
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "p", "answer": "1"}] * 4)
    base = ["grpo", "--recipe", str(recipe), "--model", str(tiny_model_dir), "--dataset", str(data)]
    r = runner.invoke(app, [*base, "--output-dir", str(tmp_path / "o"), "--dry-run"])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "names Python code to run; a recipe's reward code runs only with --trust-reward-code" in text, text
    assert not marker.exists()  # not imported, not even under --dry-run
    recipe.write_text(recipe.read_text() + "trust_reward_code: true\n")  # a recipe cannot trust itself
    r = runner.invoke(app, [*base, "--output-dir", str(tmp_path / "o"), "--dry-run"])
    assert r.exit_code == 2 and "unknown key 'trust_reward_code'" in r.output and not marker.exists(), r.output


def test_trust_reward_code_lets_the_recipe_s_reward_run(evil_recipe, tiny_model_dir, tmp_path):
    recipe, marker = evil_recipe
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "p", "answer": "1"}] * 4)
    args = ["grpo", "--recipe", str(recipe), "--model", str(tiny_model_dir), "--dataset", str(data)]
    r = runner.invoke(app, [*args, "--output-dir", str(tmp_path / "o"), "--dry-run", "--trust-reward-code"])
    assert r.exit_code == 0, r.output
    assert marker.read_text() == "ran"


def test_python_dash_m_does_not_let_the_working_directory_shadow_a_package(tmp_path):
    """`python -m posttrainllm` from a directory holding yaml.py: the recipe is read with the installed PyYAML."""
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "yaml.py").write_text("raise SystemExit('yaml.py of the working directory ran')\n")
    (tmp_path / "r.yaml").write_text("no_such_key: 1\n")
    root = str(Path(R.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-m", "posttrainllm", "sft", "--recipe", "r.yaml", "--model", "m", "--dataset", "d"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "working directory ran" not in done.stdout + done.stderr
    assert done.returncode == 2 and "unknown key 'no_such_key'" in done.stdout + done.stderr, done.stderr


@pytest.mark.smoke
@pytest.mark.parametrize("value, says", [("float('nan')", "returned nan"), ("None", "no reward scored completion 1")])
def test_a_run_whose_reward_is_nan_or_none_stops_with_exit_1(value, says, tiny_model_dir, tmp_path):
    spec = _file(tmp_path, f"def bad(completions, **kw):\n    return [{value}] * len(completions)\n")
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Count {i}:", "answer": "1"} for i in range(4)])
    out = tmp_path / "o"
    args = cli_args("grpo", tiny_model_dir, data, out)
    args += ["--reward-fn", f"{spec}:bad", "--batch-size", "4", "--max-completion-length", "4", "--max-steps", "2"]
    r = runner.invoke(app, args)
    assert r.exit_code == 1, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    text = " ".join(r.output.split())
    assert len(errors) == 1 and f"reward --reward-fn {spec}:bad (step 1)" in text and says in text, text
    assert "Traceback" not in r.output
    assert not (out / "model.safetensors").exists() and not (out / "training_complete.json").exists()


def test_an_async_reward_stays_awaitable_and_checked(tmp_path):
    import asyncio

    spec = _file(tmp_path, "async def f(completions, **kw):\n    return [float('inf')] * len(completions)\n")
    (reward,) = R.build_rewards(_cfg(reward_fn=[f"{spec}:f"]))
    assert reward.__name__ == "f"
    with pytest.raises(TrainingError, match="returned inf for completion 1 of 1"):
        asyncio.run(reward(completions=["a"]))


def test_integral_float_answers_compare_as_integers():
    assert R.MatchReward("answer")(completions=["4", "4", "0.5"], answer=[4.0, [4.0, "four"], 0.5]) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("flag", ["--reward-regex", "--answer-pattern"])
def test_a_pattern_whose_counted_repeats_explode_is_refused_with_the_options(flag, tmp_path):
    """The regex package writes counted repeats out when it compiles: (?:a{65535}){65535} would take gigabytes.
    It is refused (exit 2) from its parsed form, before anything compiles it, within bounded memory."""
    import subprocess
    from pathlib import Path

    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "p", "answer": "1"}])
    extra = [flag, "(?:a{65535}){65535}"] + (["--reward-match", "answer"] if flag == "--answer-pattern" else [])
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from posttrainllm.cli import main\n"
        "sys.argv = ['posttrainllm'] + sys.argv[1:]\n"
        "main()\n"
    )
    root = str(Path(R.__file__).resolve().parents[1])
    args = cli_args("grpo", tmp_path, data, None, *extra, dry_run=True)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": root},
    )  # fmt: skip
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, text
    assert f"{flag} has counted repeats that write out to about 4,294,836,225 items" in text, text
