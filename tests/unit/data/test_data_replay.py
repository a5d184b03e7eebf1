"""Replay mixing (posttrainllm.data.replay)."""

from __future__ import annotations

import pytest
from data_samples import (
    ALPACA,
    MESSAGES,
    make_tokenizer,
    write_jsonl,
)

from posttrainllm import data as D
from posttrainllm.errors import UsageError

# ---------------------------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------------------------


def test_mix_replay_prompt_completion_and_messages(tmp_path, tokenizer):
    import datasets

    train = D.prepare_sft(str(write_jsonl(tmp_path / "a.jsonl", ALPACA * 5)), tokenizer).train  # 20 rows
    replay = datasets.Dataset.from_list([{"text": f"line of replay text number {i}\n" * 3} for i in range(10)])
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


def test_mix_replay_token_blocks_in_the_same_place(tmp_path, tokenizer):
    """finetune's replay blocks go through the same function as sft's replay rows."""
    train = D.prepare_text(
        str(write_jsonl(tmp_path / "t.jsonl", [{"text": "Hello world. " * 40}])), tokenizer, max_length=8
    ).train
    replay = D.prepare_text(
        str(write_jsonl(tmp_path / "r.jsonl", [{"text": "The quick brown fox. " * 20}])), tokenizer, max_length=8
    ).train
    mixed = D.mix_replay(train, replay, ratio=0.25, seed=3)
    k = round(0.25 * len(train) / 0.75)
    assert len(mixed) == len(train) + k and mixed.column_names == ["input_ids", "labels"]
    replay_blocks = {tuple(b) for b in replay["input_ids"]}
    assert sum(tuple(b) in replay_blocks for b in mixed["input_ids"]) == k
    assert mixed.to_list() == D.mix_replay(train, replay, ratio=0.25, seed=3).to_list()
    assert list(mixed["input_ids"])[: len(train)] != list(train["input_ids"])  # shuffled together


def test_mix_replay_interleaves_streams(tmp_path, tokenizer):
    import datasets

    path = str(
        write_jsonl(
            tmp_path / "a.jsonl", [dict(r, instruction=f"{r['instruction']} {i}") for i, r in enumerate(ALPACA * 100)]
        )
    )
    stream = D.prepare_sft(path, tokenizer, streaming=True).train
    replay = datasets.Dataset.from_list([{"text": f"replay line {i}\n" * 3} for i in range(50)])
    mixed = D.mix_replay(stream, replay, ratio=0.3, seed=0)
    assert isinstance(mixed, datasets.IterableDataset)
    rows = list(mixed.take(400))
    n_replay = sum(r["prompt"] == "" and r["completion"].startswith("replay line") for r in rows)
    assert 0.2 < n_replay / len(rows) < 0.4  # sampled with probability 0.3
    assert all(set(r) == {"prompt", "completion"} for r in rows)
    again = D.mix_replay(stream, replay, 0.3, 0).take(50)
    assert [r["completion"] for r in rows[:50]] == [r["completion"] for r in again]
