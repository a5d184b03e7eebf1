"""Preparation (posttrainllm.data.prepare / text): splits, eval sets, describe, token blocks."""

from __future__ import annotations

import json

import pytest
from data_samples import (
    ALPACA,
    MESSAGES,
    PROMPT_COMPLETION,
    SHAREGPT,
    make_tokenizer,
    write_json,
    write_jsonl,
)
from harness import cli_args

from posttrainllm import data as D
from posttrainllm.errors import DataError

# ---------------------------------------------------------------------------------------------------------------
# Splits, eval source, max_samples, describe
# ---------------------------------------------------------------------------------------------------------------


def test_eval_split_deterministic_and_disjoint(tmp_path):
    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(50)]
    path = str(write_jsonl(tmp_path / "pc.jsonl", rows))
    a = D.prepare_sft(path, make_tokenizer(), eval_split=0.2, seed=1)
    b = D.prepare_sft(path, make_tokenizer(), eval_split=0.2, seed=1)
    c = D.prepare_sft(path, make_tokenizer(), eval_split=0.2, seed=1, split_seed=5)
    assert (a.n_train, a.n_eval) == (40, 10) and len(a.train) == 40 and len(a.eval) == 10
    assert a.train.to_list() == b.train.to_list() and a.eval.to_list() == b.eval.to_list()
    assert a.eval.to_list() != c.eval.to_list()  # the split seed draws the rows
    train_p, eval_p = set(a.train["prompt"]), set(a.eval["prompt"])
    assert not train_p & eval_p and len(train_p | eval_p) == 50
    # tiny fraction still gives one eval row
    d = D.prepare_sft(path, make_tokenizer(), eval_split=0.001)
    assert (d.n_train, d.n_eval) == (49, 1)
    # one row cannot be split
    one = str(write_jsonl(tmp_path / "one.jsonl", rows[:1]))
    with pytest.raises(DataError, match="too few"):
        D.prepare_sft(one, make_tokenizer(), eval_split=0.5)


@pytest.mark.parametrize("prepare", ["prepare_sft", "prepare_dpo", "prepare_kto", "prepare_prompts"])
def test_the_eval_rows_do_not_depend_on_the_run_seed(prepare, tmp_path):
    """Runs of several seeds are scored on one eval set: --seed does not draw the eval rows, --eval-split-seed does."""
    rows = [
        {"prompt": f"p{i}", "completion": f"c{i}", "chosen": f"y{i}", "rejected": f"n{i}", "label": i % 2 == 0}
        for i in range(40)
    ]
    if prepare == "prepare_dpo":
        rows = [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows]
    elif prepare in ("prepare_sft", "prepare_prompts"):
        rows = [{k: r[k] for k in ("prompt", "completion")} for r in rows]
    else:
        rows = [{k: r[k] for k in ("prompt", "completion", "label")} for r in rows]
    path = str(write_jsonl(tmp_path / "rows.jsonl", rows))
    fn = getattr(D, prepare)

    def eval_prompts(**kw):
        return sorted(fn(path, make_tokenizer(), eval_split=0.25, **kw).eval["prompt"])

    one, two = eval_prompts(seed=1), eval_prompts(seed=2)
    assert one == two and len(one) == 10
    assert eval_prompts(seed=1, split_seed=3) != one


def test_the_pipeline_draws_the_eval_rows_with_eval_split_seed(tmp_path):
    """The run's config reaches the split: --seed 1 and --seed 2 share the rows, another --eval-split-seed does not."""
    from posttrainllm.config.runconfig import RunConfig
    from posttrainllm.data.pipeline import prepare

    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(40)]
    path = str(write_jsonl(tmp_path / "rows.jsonl", rows))

    def eval_prompts(**kw):
        cfg = RunConfig(command="sft", dataset=path, eval_split=0.25, train_on_prompt=True, **kw)
        return sorted(prepare(cfg, make_tokenizer(), "sft").eval["prompt"])

    assert eval_prompts(seed=1) == eval_prompts(seed=2)
    assert eval_prompts(seed=1, eval_split_seed=7) != eval_prompts(seed=1)


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


# ---------------------------------------------------------------------------------------------------------------
# Token blocks in Arrow: carried across batches, long documents in pieces
# ---------------------------------------------------------------------------------------------------------------


def _reference_blocks(tokenizer, docs, max_length):
    ids = []
    for d in docs:
        ids += tokenizer(d)["input_ids"] + [tokenizer.eos_token_id]
    return [ids[i * max_length : (i + 1) * max_length] for i in range(len(ids) // max_length)]


def test_blocks_are_consecutive_across_batches_and_document_pieces(tmp_path, tokenizer, monkeypatch):
    from posttrainllm.data import reading, text

    docs = [
        f"Hello world {i}. " * (1 + i % 9) + "The quick brown fox\njumps over the lazy dog.\n" * (i % 4)
        for i in range(120)
    ]
    path = str(write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs]))
    monkeypatch.setattr(text, "BLOCK_BATCH_TOKENS", 50)  # many grouping batches: the remainder is carried over
    monkeypatch.setattr(reading, "TXT_PIECE_BYTES", 60)  # long documents are cut into pieces before tokenizing
    monkeypatch.setattr(text, "PIECE_CHARS", 40)
    prep = D.prepare_text(path, tokenizer, max_length=16)
    assert prep.train["input_ids"] == _reference_blocks(tokenizer, docs, 16)
    assert all(row["labels"] == row["input_ids"] for row in prep.train)


# ---------------------------------------------------------------------------------------------------------------
# --dataset-num-proc and --streaming
# ---------------------------------------------------------------------------------------------------------------


def test_num_proc_gives_the_same_rows_and_blocks(tmp_path, tokenizer):
    rows = [dict(r, instruction=f"{r['instruction']} #{i}") for i, r in enumerate(ALPACA * 30)]
    path = str(write_jsonl(tmp_path / "a.jsonl", rows))
    one = D.prepare_sft(path, tokenizer, eval_split=0.1, num_proc=1)
    two = D.prepare_sft(path, make_tokenizer(), eval_split=0.1, num_proc=2)
    assert two.train.to_list() == one.train.to_list() and two.eval.to_list() == one.eval.to_list()
    docs = str(write_jsonl(tmp_path / "t.jsonl", [{"text": f"Hello world {i}. " * 3} for i in range(300)]))
    blocks = D.prepare_text(docs, tokenizer, max_length=8, num_proc=2)
    assert blocks.train["input_ids"] == D.prepare_text(docs, tokenizer, max_length=8).train["input_ids"]


def _multiset(rows):
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def test_streaming_sft_gives_the_same_rows_with_eval_from_the_head(tmp_path, tokenizer):
    rows = MESSAGES * 10 + [{"messages": [{"role": "user", "content": "no answer"}]}]
    path = str(write_jsonl(tmp_path / "m.jsonl", rows))
    full = D.prepare_sft(path, tokenizer)
    stream = D.prepare_sft(path, make_tokenizer(), streaming=True)
    assert stream.n_train is None and stream.eval is None and stream.streaming
    assert _multiset(stream.train) == _multiset(full.train)  # converted, degenerate row dropped, shuffled
    # eval_split: the fraction of the rows training reads (stream_rows), taken from the head of the stream
    split = D.prepare_sft(path, make_tokenizer(), streaming=True, eval_split=0.2, stream_rows=16)
    assert split.n_eval == 4 and split.eval.to_list() == full.train.to_list()[:4]
    assert _multiset(split.train) == _multiset(full.train.to_list()[4:])
    assert D.describe(split) == (
        "m.jsonl · messages → messages · streamed, first 4 rows held out for eval"
        " · degenerate rows dropped as they stream"
    )
    # --max-samples counts records of the stream; --eval-dataset is read as a dataset
    capped = D.prepare_sft(path, make_tokenizer(), streaming=True, max_samples=3, eval_source=path)
    assert len(list(capped.train)) == 3 and capped.n_eval == full.n_train


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_streaming_text_gives_the_same_blocks(tmp_path, tokenizer, suffix):
    text = "".join(f"line {i}: the quick brown fox\n" for i in range(200))
    path = tmp_path / f"corpus{suffix}"
    if suffix == ".txt":
        path.write_text(text)
    else:
        write_jsonl(path, [{"text": text[i : i + 500]} for i in range(0, len(text), 500)])
    full = D.prepare_text(str(path), tokenizer, max_length=16)
    stream = D.prepare_text(str(path), tokenizer, max_length=16, streaming=True, eval_split=0.1, stream_rows=90)
    assert stream.n_eval == 10 and stream.eval["input_ids"] == full.train["input_ids"][:10]
    assert _multiset(stream.train) == _multiset(full.train.to_list()[10:])
    assert D.describe(stream) == (
        f"corpus{suffix} · text → 16-token blocks · streamed, first 10 blocks held out for eval"
    )


@pytest.mark.smoke
@pytest.mark.parametrize("command", ["sft", "finetune"])
def test_cli_streaming_trains_with_eval_and_replay(command, tiny_model_dir, alpaca_file, text_file, tmp_path):
    from typer.testing import CliRunner

    from posttrainllm.cli import app

    data = alpaca_file if command == "sft" else text_file
    args = cli_args(
        command,
        tiny_model_dir,
        data,
        tmp_path / "o",
        streaming=True,
        batch_size=2,
        max_length="256" if command == "sft" else "64",
        eval_split="0.2",
        replay_dataset=text_file,
        replay_ratio="0.25",
        dataset_num_proc=2,
    )
    runner = CliRunner()
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "--streaming needs --max-steps" in r.output
    r = runner.invoke(app, args + ["--max-steps", "3"])
    assert r.exit_code == 0, r.output
    results = json.loads((tmp_path / "o" / "eval_results.json").read_text())
    assert results["train"]["eval_loss"] > 0
    assert json.loads((tmp_path / "o" / "trainer_state.json").read_text())["global_step"] == 3
    assert "streamed, first 2" in r.output  # eval = 0.2 / 0.8 × (3 steps × 2 rows) rows from the head
