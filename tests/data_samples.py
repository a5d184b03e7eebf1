"""Shared samples and helpers for the tests of posttrainllm.data (tests/unit/data/).

Everything runs offline on files written into tmp_path and a byte-level BPE tokenizer trained here on a few
strings.
"""

from __future__ import annotations

import json
from pathlib import Path

SHARED = next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "data",) if p.is_dir()), None)

# ---------------------------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------------------------

DATA_CORPUS = [
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.",
    "### Instruction:\nAdd 23 and 58.\n\n### Response:\n81",
    "<|im_start|>user\nWhat color is the sky?<|im_end|>\n<|im_start|>assistant\nIt is blue.<|im_end|>\n",
    "The quick brown fox jumps over the lazy dog. Hello world, this is a tiny corpus.",
]
_TOKENIZER = None


def make_tokenizer():
    """A fresh copy of the data tests' tokenizer (trained once; conftest.build_tokenizer)."""
    import copy

    from conftest import build_tokenizer

    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = build_tokenizer(
            DATA_CORPUS, 400, specials=["<|endoftext|>", "<pad>"], eos_token="<|endoftext|>", pad_token="<pad>"
        )
    return copy.deepcopy(_TOKENIZER)


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=2), encoding="utf-8")
    return path


ALPACA = [
    {"instruction": "Add 23 and 58.", "input": "", "output": "81"},
    {"instruction": "Reverse the word.", "input": "python", "output": "nohtyp"},
    {"instruction": "Uppercase: hello world", "input": "", "output": "HELLO WORLD"},
    {"instruction": "Count the letters in: banana", "input": "", "output": "6"},
]
MESSAGES = [
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What color is the sky?"},
            {"role": "assistant", "content": "It is blue."},
        ]
    },
    {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
    {"messages": [{"role": "user", "content": "Name a fruit"}, {"role": "assistant", "content": "apple"}]},
]
SHAREGPT = [
    {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Hi there"},
            {"from": "human", "value": "Bye"},
            {"from": "model", "value": "Bye!"},
        ]
    },
    {"conversations": [{"from": "user", "value": "2+2?"}, {"from": "assistant", "value": "4"}]},
]
PROMPT_COMPLETION = [
    {"prompt": "The sky is", "completion": " blue."},
    {"prompt": "Two plus two is", "completion": " four."},
    {"prompt": "Hello", "completion": " world."},
    {"prompt": "Fish live in", "completion": " water."},
]
PROMPT_COMPLETION_MSGS = [
    {
        "prompt": [{"role": "user", "content": r["prompt"]}],
        "completion": [{"role": "assistant", "content": r["completion"]}],
    }
    for r in PROMPT_COMPLETION
]
PREF_STR = [
    {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
    {"prompt": "Two plus two is", "chosen": " four.", "rejected": " five."},
    {"prompt": "Water is", "chosen": " wet.", "rejected": " dry."},
    {"prompt": "Fire is", "chosen": " hot.", "rejected": " cold."},
]
PREF_MSGS = [
    {
        "prompt": [{"role": "user", "content": r["prompt"]}],
        "chosen": [{"role": "assistant", "content": r["chosen"].strip()}],
        "rejected": [{"role": "assistant", "content": r["rejected"].strip()}],
    }
    for r in PREF_STR
]
# Same structure as ../shared/data/dpo_en_demo.json
SHAREGPT_PREF = [
    {
        "conversations": [{"from": "human", "value": "What color is the sky?"}],
        "chosen": {"from": "gpt", "value": "It is blue."},
        "rejected": {"from": "gpt", "value": "It is green."},
    },
    {
        "conversations": [
            {"from": "system", "value": "Answer with a number."},
            {"from": "human", "value": "2+2?"},
        ],
        "chosen": {"from": "gpt", "value": "4"},
        "rejected": {"from": "gpt", "value": "5"},
    },
    {
        "conversations": [
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello! How can I help?"},
            {"from": "human", "value": "Name a fruit."},
        ],
        "chosen": {"from": "gpt", "value": "Apple."},
        "rejected": {"from": "gpt", "value": "Carrot."},
    },
    {
        "conversations": [{"from": "human", "value": "Is fire hot?"}],
        "chosen": {"from": "gpt", "value": "Yes."},
        "rejected": {"from": "gpt", "value": "No."},
    },
]
