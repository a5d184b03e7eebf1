"""Issue-level acceptance: `posttrainllm sft` trains on Alpaca JSON/JSONL, messages JSONL and prompt/completion JSONL;
`posttrainllm dpo` trains on prompt/chosen/rejected JSONL and the ShareGPT preference JSON; bad data fails with
file and line (or the columns found)."""

import json

import pytest
from conftest import SHARED_DATA, write_jsonl
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()
pytestmark = pytest.mark.smoke

ALPACA = [{"instruction": f"Double {i}.", "input": "", "output": str(2 * i)} for i in range(12)]
MESSAGES = [
    {"messages": [{"role": "user", "content": f"Double {i}."}, {"role": "assistant", "content": str(2 * i)}]}
    for i in range(12)
]
PROMPT_COMPLETION = [{"prompt": f"Double {i}.", "completion": str(2 * i)} for i in range(12)]
PREFS = [{"prompt": f"Double {i}.", "chosen": str(2 * i), "rejected": str(i)} for i in range(12)]
SHAREGPT_PREFS = [
    {
        "conversations": [{"from": "human", "value": f"Double {i}."}],
        "chosen": {"from": "gpt", "value": str(2 * i)},
        "rejected": {"from": "gpt", "value": str(i)},
    }
    for i in range(12)
]


def _file(tmp_path, name, rows):
    p = tmp_path / name
    if name.endswith(".jsonl"):
        return write_jsonl(p, rows)
    p.write_text(json.dumps(rows))
    return p


def _train(cmd, model, data, out):
    return runner.invoke(
        app,
        run_args(cmd, model, data, out, batch=4, max_length=256, lr=None),
    )


@pytest.mark.parametrize(
    "cmd,name,rows,fmt",
    [
        ("sft", "alpaca.json", ALPACA, "alpaca"),
        ("sft", "alpaca.jsonl", ALPACA, "alpaca"),
        ("sft", "messages.jsonl", MESSAGES, "messages"),
        ("sft", "pc.jsonl", PROMPT_COMPLETION, "prompt_completion"),
        ("dpo", "prefs.jsonl", PREFS, "preference"),
        ("dpo", "sharegpt_prefs.json", SHAREGPT_PREFS, "sharegpt_preference"),
    ],
)
def test_trains_on_format(cmd, name, rows, fmt, tiny_model_dir, tmp_path):
    r = _train(cmd, tiny_model_dir, _file(tmp_path, name, rows), tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "o" / "run_config.json").read_text())["data_format"] == fmt
    assert (tmp_path / "o" / "model.safetensors").is_file()
    if fmt == "messages":
        assert "chat template" in r.output  # the tiny tokenizer has none: the default is applied and said


@pytest.mark.skipif(not (SHARED_DATA / "dpo_en_demo.json").exists(), reason="../shared/data not present")
def test_dpo_on_the_shared_sharegpt_preference_file(tiny_model_dir, tmp_path):
    r = runner.invoke(
        app,
        run_args(
            "dpo",
            tiny_model_dir,
            SHARED_DATA / "dpo_en_demo.json",
            tmp_path / "o",
            steps=1,
            max_length=256,
            lr=None,
            max_samples=8,
        ),
    )
    assert r.exit_code == 0, r.output


def test_broken_third_line_names_file_and_line(tiny_model_dir, tmp_path):
    p = tmp_path / "broken.jsonl"
    p.write_text(
        "".join(json.dumps(r) + "\n" for r in PROMPT_COMPLETION[:2])
        + '{"prompt": "x", "completion"\n'
        + json.dumps(PROMPT_COMPLETION[3])
        + "\n"
    )
    r = _train("sft", tiny_model_dir, p, tmp_path / "o")
    assert r.exit_code == 1
    assert "broken.jsonl" in r.output and "line 3" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o" / "model.safetensors").exists()


def test_question_only_column_is_named(tiny_model_dir, tmp_path):
    p = write_jsonl(tmp_path / "q.jsonl", [{"question": "why?"}] * 3)
    r = _train("sft", tiny_model_dir, p, tmp_path / "o")
    assert r.exit_code == 1 and "question" in r.output and "alpaca" in r.output
