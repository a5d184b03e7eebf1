"""Preparation (posttrainllm.data.prepare / text): splits, eval sets, describe, token blocks."""

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
# Splits, eval source, max_samples, describe
# ---------------------------------------------------------------------------------------------------------------


def test_eval_split_deterministic_and_disjoint(tmp_path):
    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(50)]
    path = str(write_jsonl(tmp_path / "pc.jsonl", rows))
    a = D.prepare_sft(path, make_tokenizer(), eval_split=0.2, seed=1)
    b = D.prepare_sft(path, make_tokenizer(), eval_split=0.2, seed=1)
    c = D.prepare_sft(path, make_tokenizer(), eval_split=0.2, seed=2)
    assert (a.n_train, a.n_eval) == (40, 10) and len(a.train) == 40 and len(a.eval) == 10
    assert a.train.to_list() == b.train.to_list() and a.eval.to_list() == b.eval.to_list()
    assert a.eval.to_list() != c.eval.to_list()
    train_p, eval_p = set(a.train["prompt"]), set(a.eval["prompt"])
    assert not train_p & eval_p and len(train_p | eval_p) == 50
    # tiny fraction still gives one eval row
    d = D.prepare_sft(path, make_tokenizer(), eval_split=0.001)
    assert (d.n_train, d.n_eval) == (49, 1)
    # one row cannot be split
    one = str(write_jsonl(tmp_path / "one.jsonl", rows[:1]))
    with pytest.raises(DataError, match="too few"):
        D.prepare_sft(one, make_tokenizer(), eval_split=0.5)


def test_eval_source_and_max_samples(tmp_path, tokenizer):
    train = write_jsonl(tmp_path / "train.jsonl", ALPACA)
    evals = write_jsonl(tmp_path / "eval.jsonl", PROMPT_COMPLETION[:2])  # other format, same converted shape
    prep = D.prepare_sft(str(train), tokenizer, eval_source=str(evals), max_samples=3)
    assert (prep.n_train, prep.n_eval) == (3, 2) and prep.eval.to_list() == PROMPT_COMPLETION[:2]
    assert prep.train[2]["completion"] == "HELLO WORLD"
    assert D.describe(prep) == "train.jsonl · alpaca → prompt/completion · 3 train / 2 eval (from eval.jsonl)"
    msgs = write_jsonl(tmp_path / "msgs.jsonl", MESSAGES)
    with pytest.raises(DataError, match="same kind of data"):
        D.prepare_sft(str(train), make_tokenizer(), eval_source=str(msgs))


def test_describe_without_eval(tmp_path, tokenizer):
    prep = D.prepare_sft(str(write_json(tmp_path / "sg.json", SHAREGPT)), tokenizer)
    assert D.describe(prep) == "sg.json · sharegpt → messages · 2 train, no eval"



# ---------------------------------------------------------------------------------------------------------------
# Text blocks
# ---------------------------------------------------------------------------------------------------------------


def test_prepare_text_blocks(tmp_path, tokenizer):
    docs = [{"text": "The quick brown fox jumps over the lazy dog. " * 5}, {"text": "Hello world. " * 8}]
    path = write_jsonl(tmp_path / "docs.jsonl", docs)
    ids = []
    for d in docs:
        ids += tokenizer(d["text"])["input_ids"] + [tokenizer.eos_token_id]
    prep = D.prepare_text(str(path), tokenizer, max_length=16)
    n_blocks = len(ids) // 16
    assert prep.n_train == n_blocks and prep.eval is None and prep.train.column_names == ["input_ids", "labels"]
    for i, row in enumerate(prep.train):
        assert len(row["input_ids"]) == 16 and row["labels"] == row["input_ids"]
        assert row["input_ids"] == ids[i * 16 : (i + 1) * 16]  # consecutive, eos between documents
    assert D.describe(prep) == f"docs.jsonl · text → 16-token blocks · {n_blocks} train, no eval"

    split = D.prepare_text(str(path), tokenizer, max_length=16, eval_split=0.25)
    assert split.n_train + split.n_eval == n_blocks and split.n_eval == round(n_blocks * 0.25)
    # eval = the LAST blocks, contiguous
    assert list(split.train["input_ids"]) + list(split.eval["input_ids"]) == list(prep.train["input_ids"])


def test_prepare_text_txt_and_too_short(tmp_path, tokenizer):
    txt = tmp_path / "tiny.txt"
    txt.write_text("Hello world.\n\nThe sky is blue.\n", encoding="utf-8")
    n = len(tokenizer(txt.read_text())["input_ids"]) + 1
    with pytest.raises(DataError, match=rf"has {n} tokens, fewer than one block of max_length=512"):
        D.prepare_text(str(txt), tokenizer, max_length=512)
    prep = D.prepare_text(str(txt), tokenizer, max_length=4)
    assert prep.n_train == n // 4 and all(len(r) == 4 for r in prep.train["input_ids"])


def test_prepare_text_eval_source(tmp_path, tokenizer):
    a = tmp_path / "a.txt"
    b = tmp_path / "b.txt"
    a.write_text("The quick brown fox jumps over the lazy dog. " * 10)
    b.write_text("Hello world. " * 10)
    prep = D.prepare_text(str(a), tokenizer, max_length=8, eval_source=str(b), max_samples=3)
    assert prep.n_train == 3 and prep.n_eval >= 1 and prep.block_size == 8
