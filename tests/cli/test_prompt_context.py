"""grpo / rloo / distill: prompts that leave no room for a completion in the model's positions are refused with exit 2
and their count before the model loads (GPT-2's learned positions would fail with an IndexError), for string prompts
and chat prompts alike; when the longest prompt and --max-completion-length do not fit together, the completion
length is clamped to what is left, and the run says so."""

from __future__ import annotations

import pytest
from conftest import write_jsonl
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()

EXTRA = {"grpo": ["--reward-regex", "a"], "rloo": ["--reward-regex", "a"], "distill": ["--teacher", "{model}"]}


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A GPT-2 (learned position embeddings) with 64 positions."""
    from data_samples import make_tokenizer
    from test_cli_models import save_family

    d = tmp_path_factory.mktemp("gpt2")
    save_family("gpt2", make_tokenizer(), d)
    return d


def _run(command, model, data, out, *extra):
    extra = [e.format(model=model) for e in (*EXTRA[command], *extra)]
    args = cli_args(command, model, data, out, batch_size=4)
    return runner.invoke(app, args + ["--dry-run", *extra])


@pytest.mark.parametrize("command", ["grpo", "rloo", "distill"])
def test_prompts_over_the_context_exit_2_with_their_count(command, gpt2_dir, tmp_path):
    rows = [{"prompt": "word " * (200 if i % 3 == 0 else 2), "answer": "1"} for i in range(7)]  # 3 long ones
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    r = _run(command, gpt2_dir, data, tmp_path / "o", "--max-completion-length", "16")
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "3 of 7 train prompts do not fit the model's context: they hold 64 tokens or more" in text
    assert "Traceback" not in r.output and "IndexError" not in r.output
    short = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "word word", "answer": "1"}] * 4)
    assert _run(command, gpt2_dir, short, tmp_path / "o2", "--max-completion-length", "16").exit_code == 0


@pytest.mark.parametrize("command", ["grpo", "distill"])
def test_a_completion_length_past_the_context_is_clamped_and_said(command, gpt2_dir, tmp_path):
    import json

    from transformers import AutoTokenizer

    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "word " * n, "answer": "1"} for n in (1, 3, 9, 2)])
    longest = max(len(AutoTokenizer.from_pretrained(gpt2_dir)("word " * n)["input_ids"]) for n in (1, 3, 9, 2))
    r = _run(command, gpt2_dir, data, tmp_path / "o", "--max-completion-length", "64")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    said = f"--max-completion-length 64 does not fit the model's 64 positions after the longest prompt ({longest} "
    assert said in text and f"completions are cut at {64 - longest} tokens" in text, text
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())
    assert saved["max_completion_length"] == 64 - longest


def test_chat_prompts_are_counted_with_their_template(tiny_model_dir, tmp_path):
    long = [{"role": "user", "content": "word " * 300}]  # 300 tokens and more, past the 256 positions
    rows = [{"prompt": long, "answer": "1"}, {"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}] * 2
    data = write_jsonl(tmp_path / "m.jsonl", rows)
    r = _run("grpo", tiny_model_dir, data, tmp_path / "o", "--max-completion-length", "32")
    assert r.exit_code == 2, r.output
    assert "2 of 4 train prompts do not fit the model's context: they hold 256 tokens" in " ".join(r.output.split())
