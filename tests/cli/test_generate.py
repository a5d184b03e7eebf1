"""`posttrainllm generate`: prints the greedy completion a tiny model gives (checked against transformers'
generate directly), renders prompts the way sft trained them, and writes JSON Lines for a prompts file."""

import json

import pytest
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def _reference(model_dir, text, n):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    enc = tok(text, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def test_generate_prints_the_greedy_completion(tiny_model_dir):
    r = runner.invoke(app, cli_args("generate", tiny_model_dir, prompt="the quick brown", max_new_tokens=8))
    assert r.exit_code == 0, r.output
    want = _reference(tiny_model_dir, "the quick brown", 8)
    assert want and r.stdout.rstrip("\n").endswith(want)


def test_prompts_file_writes_one_json_line_per_prompt(tiny_model_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "hello world"}) + "\n" + json.dumps({"instruction": "Add 1 and 2."}) + "\n"
    )
    out = tmp_path / "out.jsonl"
    r = runner.invoke(
        app,
        cli_args("generate", tiny_model_dir, prompts=prompts, output=out, max_new_tokens=4),
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == ["hello world", {"instruction": "Add 1 and 2.", "input": ""}]
    assert rows[0]["completion"] == _reference(tiny_model_dir, "hello world", 4)


def test_prompts_are_rendered_as_sft_trained_them(tiny_model_dir):
    from transformers import AutoTokenizer

    from posttrainllm.commands.generate import render
    from posttrainllm.data import ALPACA_PROMPT_NO_INPUT, DEFAULT_CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert render(tok, "Add 1 and 2.", "alpaca", None) == ALPACA_PROMPT_NO_INPUT.format(instruction="Add 1 and 2.")
    assert render(tok, {"instruction": "Add 1 and 2.", "input": ""}, "auto", None).endswith("### Response:\n")
    assert render(tok, "hi", "auto", None) == "hi"  # no chat template: plain text
    tok.chat_template = DEFAULT_CHAT_TEMPLATE
    chat = render(tok, "hi", "auto", "be brief")
    assert chat == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "args,fragment",
    [
        ([], "either --prompt TEXT or --prompts FILE"),
        (["--prompt", "a", "--prompts", "x.txt"], "either --prompt TEXT or --prompts FILE"),
        (["--prompt", "a", "--temperature", "-1"], "--temperature"),
        (["--prompt", "a", "--prompt-format", "xml"], "--prompt-format"),
    ],
)
def test_generate_usage_errors(args, fragment, tiny_model_dir):
    r = runner.invoke(app, ["generate", "--model", str(tiny_model_dir), *args])
    assert r.exit_code == 2 and fragment in r.output


def test_max_new_tokens_is_clamped_to_the_context_with_a_note(tiny_model_dir, monkeypatch):
    """100,000,000 new tokens on a 256-position model: generate gets the positions the prompt leaves, and stderr
    says so (generate itself is replaced, so the test never runs on unbounded)."""
    from transformers import GenerationMixin

    asked = {}

    def fake_generate(self, input_ids=None, max_new_tokens=None, **kwargs):
        asked["prompt"], asked["new"] = input_ids.shape[1], max_new_tokens
        return input_ids

    monkeypatch.setattr(GenerationMixin, "generate", fake_generate)
    r = runner.invoke(
        app,
        cli_args("generate", tiny_model_dir, prompt="the quick brown", max_new_tokens=100000000),
    )
    assert r.exit_code == 0, r.output
    assert asked["new"] == 256 - asked["prompt"]
    assert f"generating at most {asked['new']} tokens" in r.stderr and "note:" not in r.stdout


def test_a_prompt_filling_the_context_exits_2(tiny_model_dir):
    long = "the quick brown fox jumps over the lazy dog. " * 60
    r = runner.invoke(app, cli_args("generate", tiny_model_dir, prompt=long, max_new_tokens=4))
    assert r.exit_code == 2, r.output
    assert "no room to generate" in r.output
