"""Replay mixing (posttrainllm.data.replay)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from data_samples import (  # noqa: F401 - fixtures and samples
    ALPACA, MESSAGES, PREF_MSGS, PREF_STR, PROMPT_COMPLETION, PROMPT_COMPLETION_MSGS, SHARED, SHAREGPT, SHAREGPT_PREF,
    make_tokenizer, tokenizer, write_json, write_jsonl,
)
from posttrainllm import data as D
from posttrainllm.errors import DataError, PosttrainError, UsageError


# ---------------------------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------------------------


def test_mix_replay_prompt_completion_and_messages(tmp_path, tokenizer):
    import datasets

    train = D.prepare_sft(str(write_jsonl(tmp_path / "a.jsonl", ALPACA * 5)), tokenizer).train  # 20 rows
    replay = datasets.Dataset.from_list([{"text": "line of replay text number %d\n" % i * 3} for i in range(10)])
    mixed = D.mix_replay(train, replay, ratio=0.2, seed=0)
    assert len(mixed) == 25 and mixed.column_names == train.column_names
    replay_rows = [r for r in mixed if r["prompt"] == ""]
    assert len(replay_rows) == 5 and all("replay text" in r["completion"] for r in replay_rows)
    again = D.mix_replay(train, replay, ratio=0.2, seed=0)
    assert again.to_list() == mixed.to_list()
    assert D.mix_replay(train, replay, ratio=0.0, seed=0) is train
    with pytest.raises(UsageError):
        D.mix_replay(train, replay, ratio=1.0, seed=0)

    chat = D.prepare_sft(str(write_jsonl(tmp_path / "m.jsonl", MESSAGES)), make_tokenizer()).train
    mixed = D.mix_replay(chat, replay, ratio=0.5, seed=0)
    assert len(mixed) == 8
    assert sum(len(r["messages"]) == 1 and r["messages"][0]["role"] == "assistant" for r in mixed) == 4
