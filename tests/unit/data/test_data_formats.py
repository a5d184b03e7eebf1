"""Formats and conversion (posttrainllm.data.formats / convert / chat): detection, the rows each format becomes,
errors naming the record, the chat template."""

from __future__ import annotations

import pytest
from data_samples import (
    ALPACA,
    MESSAGES,
    PREF_MSGS,
    PREF_STR,
    PROMPT_COMPLETION,
    PROMPT_COMPLETION_MSGS,
    SHARED,
    SHAREGPT,
    SHAREGPT_PREF,
    make_tokenizer,
    write_json,
    write_jsonl,
)
from harness import cli_args, run_args

from posttrainllm import data as D
from posttrainllm.errors import DataError, UsageError

# ---------------------------------------------------------------------------------------------------------------
# Reading and SFT conversion
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_alpaca_json_and_jsonl(tmp_path, tokenizer, suffix):
    path = tmp_path / f"alpaca{suffix}"
    write_json(path, ALPACA) if suffix == ".json" else write_jsonl(path, ALPACA)
    records = D.read_records(str(path))
    assert records == ALPACA
    assert D.detect_format(records, "sft", str(path)) == "alpaca"
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.format == "alpaca" and prep.n_train == 4 and prep.eval is None and prep.n_eval == 0
    assert prep.train.column_names == ["prompt", "completion"]
    row0, row1 = prep.train[0], prep.train[1]
    assert "### Instruction:\nAdd 23 and 58.\n\n### Response:\n" in row0["prompt"]
    assert "### Input:" not in row0["prompt"] and row0["completion"] == "81"
    assert "### Input:\npython\n\n### Response:\n" in row1["prompt"] and row1["completion"] == "nohtyp"
    assert prep.template_note is None and tokenizer.chat_template is None  # not conversational: no template


def test_messages_jsonl(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "chat.jsonl", MESSAGES)
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.format == "messages"
    assert prep.train.column_names == ["messages"]
    assert prep.train[0]["messages"] == MESSAGES[0]["messages"]
    assert prep.template_note and "ChatML" in prep.template_note


def test_sharegpt_json_maps_roles(tmp_path, tokenizer):
    path = write_json(tmp_path / "sharegpt.json", SHAREGPT)
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.format == "sharegpt"
    assert prep.train.column_names == ["messages"]
    msgs = prep.train[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[2]["content"] == "Hi there"
    assert [m["role"] for m in prep.train[1]["messages"]] == ["user", "assistant"]


def test_sharegpt_unknown_role(tmp_path, tokenizer):
    rows = [{"conversations": [{"from": "narrator", "value": "Once"}, {"from": "gpt", "value": "upon"}]}]
    path = write_json(tmp_path / "bad_roles.json", rows)
    with pytest.raises(DataError, match=r"record 1: unknown role 'narrator'"):
        D.prepare_sft(str(path), tokenizer)


def test_prompt_completion_strings_and_messages(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "pc.jsonl", PROMPT_COMPLETION)
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.format == "prompt_completion" and prep.train.to_list() == PROMPT_COMPLETION
    assert prep.template_note is None

    path = write_jsonl(tmp_path / "pc_msgs.jsonl", PROMPT_COMPLETION_MSGS)
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.train.to_list() == PROMPT_COMPLETION_MSGS
    assert prep.template_note is not None

    # A string prompt with a message-list completion becomes all messages (one schema for Arrow and TRL).
    mixed = [{"prompt": "Hi", "completion": [{"role": "assistant", "content": "Hello"}]}]
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "mixed.jsonl", mixed)), make_tokenizer())
    assert prep.train[0]["prompt"] == [{"role": "user", "content": "Hi"}]


def test_text_jsonl_and_txt_for_sft(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "one document"}, {"text": "another one"}])
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.format == "text" and prep.train.to_list() == [{"text": "one document"}, {"text": "another one"}]
    txt = tmp_path / "t.txt"
    txt.write_text("line one\n\nline two\n", encoding="utf-8")
    assert D.read_records(str(txt)) == [{"text": "line one\n\nline two\n"}]
    assert D.prepare_sft(str(txt), tokenizer).format == "text"


# ---------------------------------------------------------------------------------------------------------------
# Preference data
# ---------------------------------------------------------------------------------------------------------------


def test_preference_strings_and_messages(tmp_path, tokenizer):
    prep = D.prepare_dpo(str(write_jsonl(tmp_path / "p.jsonl", PREF_STR)), tokenizer)
    assert prep.format == "preference" and prep.train.to_list() == PREF_STR and prep.template_note is None
    prep = D.prepare_dpo(str(write_jsonl(tmp_path / "pm.jsonl", PREF_MSGS)), tokenizer)
    assert prep.train.to_list() == PREF_MSGS and prep.template_note is not None


def test_preference_implicit_prompt(tmp_path, tokenizer):
    convs = [
        {
            "chosen": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Blue."}],
            "rejected": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Green."}],
        }
    ]
    prep = D.prepare_dpo(str(write_jsonl(tmp_path / "impl.jsonl", convs)), tokenizer)
    assert prep.train[0] == {
        "prompt": [{"role": "user", "content": "Sky?"}],
        "chosen": [{"role": "assistant", "content": "Blue."}],
        "rejected": [{"role": "assistant", "content": "Green."}],
    }
    strings = [{"chosen": "Q: sky colour? A: blue", "rejected": "Q: sky colour? A: bleu"}]
    prep = D.prepare_dpo(str(write_jsonl(tmp_path / "impl_s.jsonl", strings)), tokenizer)
    assert prep.train[0] == {"prompt": "Q: sky colour? A: ", "chosen": "blue", "rejected": "bleu"}


def test_sharegpt_preference_small_file(tmp_path, tokenizer):
    path = write_json(tmp_path / "dpo_demo.json", SHAREGPT_PREF)
    assert D.detect_format(D.read_records(str(path)), "dpo") == "sharegpt_preference"
    prep = D.prepare_dpo(str(path), tokenizer)
    assert prep.format == "sharegpt_preference" and prep.n_train == 4
    assert prep.train.column_names == ["prompt", "chosen", "rejected"]
    row = prep.train[2]
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert row["chosen"] == [{"role": "assistant", "content": "Apple."}]
    assert row["rejected"] == [{"role": "assistant", "content": "Carrot."}]
    assert prep.train[1]["prompt"][0] == {"role": "system", "content": "Answer with a number."}
    assert prep.template_note is not None


@pytest.mark.slow
@pytest.mark.skipif(SHARED is None or not (SHARED / "dpo_en_demo.json").exists(), reason="shared data absent")
def test_sharegpt_preference_real_file(tokenizer):
    prep = D.prepare_dpo(str(SHARED / "dpo_en_demo.json"), tokenizer, eval_split=0.1, seed=0)
    assert prep.format == "sharegpt_preference"
    assert (prep.n_train, prep.n_eval) == (270, 30)
    for row in prep.train.select(range(20)):
        assert row["prompt"][-1]["role"] == "user"
        assert row["chosen"][0]["role"] == "assistant" and row["rejected"][0]["role"] == "assistant"
    assert D.describe(prep) == (
        "dpo_en_demo.json · sharegpt_preference → prompt/chosen/rejected (messages) · 270 train / 30 eval"
    )


@pytest.mark.slow
@pytest.mark.skipif(SHARED is None or not (SHARED / "alpaca_en_demo.json").exists(), reason="shared data absent")
def test_alpaca_real_file(tokenizer):
    prep = D.prepare_sft(str(SHARED / "alpaca_en_demo.json"), tokenizer, eval_split=0.1)
    assert prep.format == "alpaca" and (prep.n_train, prep.n_eval) == (899, 100)
    assert D.describe(prep) == "alpaca_en_demo.json · alpaca → prompt/completion · 899 train / 100 eval"


def test_unknown_columns_lists_formats(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "data.jsonl", [{"question": "why?"}, {"question": "how?"}])
    with pytest.raises(DataError) as err:
        D.prepare_sft(str(path), tokenizer)
    msg = str(err.value)
    assert "['question']" in msg
    for fmt in ("alpaca (instruction, input, output)", "messages", "sharegpt", "prompt_completion", "text"):
        assert fmt in msg
    with pytest.raises(DataError, match=r"preference.*sharegpt_preference"):
        D.prepare_dpo(str(path), tokenizer)


def test_wrong_shape_for_command(tmp_path, tokenizer):
    alpaca = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA)
    with pytest.raises(DataError) as err:
        D.prepare_dpo(str(alpaca), tokenizer)
    assert "looks like SFT data (alpaca)" in str(err.value) and "sft" in str(err.value)
    assert "prompt/chosen/rejected" in str(err.value)

    pref = write_jsonl(tmp_path / "pref.jsonl", PREF_STR)
    with pytest.raises(DataError, match=r"looks like preference data \(preference\).*dpo"):
        D.prepare_sft(str(pref), tokenizer)
    sgp = write_json(tmp_path / "sgp.json", SHAREGPT_PREF)
    with pytest.raises(DataError, match=r"sharegpt_preference.*dpo"):
        D.prepare_sft(str(sgp), tokenizer)
    with pytest.raises(DataError, match=r"looks like SFT data \(alpaca\).*text"):
        D.prepare_text(str(alpaca), tokenizer, max_length=8)


def test_bad_values_name_the_record(tmp_path, tokenizer):
    rows = ALPACA[:2] + [{"instruction": "x", "input": "", "output": ["not", "a", "string"]}]
    with pytest.raises(DataError, match=r"record 3: 'output' must be a string"):
        D.prepare_sft(str(write_jsonl(tmp_path / "bad.jsonl", rows)), tokenizer)
    rows = [{"messages": []}]
    with pytest.raises(DataError, match=r"record 1: 'messages' is an empty list"):
        D.prepare_sft(str(write_jsonl(tmp_path / "bad2.jsonl", rows)), tokenizer)


def test_bad_arguments(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", ALPACA)
    with pytest.raises(UsageError):
        D.prepare_sft(str(path), tokenizer, eval_split=1.0)
    with pytest.raises(UsageError):
        D.prepare_sft(str(path), tokenizer, eval_split=0.2, eval_source=str(path))
    with pytest.raises(UsageError):
        D.prepare_sft(str(path), tokenizer, max_samples=0)
    with pytest.raises(UsageError):
        D.detect_format(ALPACA, "rlhf")


# ---------------------------------------------------------------------------------------------------------------
# Chat template
# ---------------------------------------------------------------------------------------------------------------


def test_default_chat_template_applied_and_renders(tmp_path, tokenizer):
    assert tokenizer.chat_template is None
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "chat.jsonl", MESSAGES)), tokenizer)
    assert tokenizer.chat_template == D.DEFAULT_CHAT_TEMPLATE and prep.template_note
    msgs = prep.train[0]["messages"]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat color is the sky?<|im_end|>\n"
        "<|im_start|>assistant\nIt is blue.<|im_end|><|endoftext|>\n"
    )
    prompt = tokenizer.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n") and text.startswith(prompt)
    ids = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
    assert ids.count(tokenizer.eos_token_id) == 1
    marked = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert tokenizer.decode([t for t, m in zip(marked["input_ids"], marked["assistant_masks"]) if m]) == (
        "It is blue.<|im_end|><|endoftext|>"  # the generation markers hold the assistant's words, end of turn included
    )


def test_existing_chat_template_is_kept(tmp_path, tokenizer):
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "chat.jsonl", MESSAGES)), tokenizer)
    assert prep.template_note is None and tokenizer.chat_template.startswith("{% for m")


# ---------------------------------------------------------------------------------------------------------------
# Vectorized conversion = the per-record reference
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,records",
    [
        ("alpaca", ALPACA + [{"instruction": "Be brief.", "input": "  ", "output": ""}]),
        ("alpaca", [dict(r, system=s) for r, s in zip(ALPACA, ["You are terse.", "", None, "  Be kind. "])]),
        (
            "messages",
            MESSAGES + [{"messages": [{"role": "User", "content": "hi"}, {"role": "Assistant", "content": None}]}],
        ),
        ("messages", [{"messages": [dict(m, name="x") for m in r["messages"]]} for r in MESSAGES]),
        ("sharegpt", SHAREGPT + [{"conversations": [{"from": "human", "value": "only a question"}]}]),
        (
            "prompt_completion",
            PROMPT_COMPLETION + [{"prompt": None, "completion": " x"}, {"prompt": "p", "completion": " "}],
        ),
        ("text", [{"text": "one"}, {"text": "  "}, {"text": "two\nlines"}]),
    ],
)
def test_arrow_fast_paths_give_the_reference_rows(fmt, records):
    import pyarrow as pa

    from posttrainllm.data.convert import Converter, fast_batch

    table = pa.Table.from_pylist(records)
    conv = Converter(fmt, "d.jsonl", conversational=fmt in ("messages", "sharegpt"))
    fast = fast_batch(table, conv, range(len(records)))
    assert fast is not None  # these shapes take the vectorized path
    got = pa.table({**fast.columns, "_drop": fast.reasons}).to_pylist()
    want = conv.rows(records, range(len(records)))
    want = [dict(zip(want, values)) for values in zip(*want.values())]
    for g, w in zip(got, want):
        assert g["_drop"] == w["_drop"]
        if w["_drop"] is None:
            assert g == w


def test_fast_path_leaves_bad_records_to_the_reference_errors(tmp_path, tokenizer):
    import pyarrow as pa

    from posttrainllm.data.convert import Converter, fast_batch

    rows = ALPACA[:2] + [{"instruction": "  ", "input": "", "output": "x"}]
    assert fast_batch(pa.Table.from_pylist(rows), Converter("alpaca", "a.jsonl", False), range(3)) is None
    with pytest.raises(DataError, match=r"record 3: 'instruction' is empty"):
        D.prepare_sft(str(write_jsonl(tmp_path / "a.jsonl", rows)), tokenizer)
    rows = MESSAGES[:2] + [{"messages": [{"role": "narrator", "content": "x"}]}]
    assert fast_batch(pa.Table.from_pylist(rows), Converter("messages", "m.jsonl", True), range(3)) is None
    with pytest.raises(DataError, match=r"record 3: unknown role 'narrator'"):
        D.prepare_sft(str(write_jsonl(tmp_path / "m.jsonl", rows)), make_tokenizer())


# ---------------------------------------------------------------------------------------------------------------
# Degenerate rows: dropped with a count, an error when nothing is left
# ---------------------------------------------------------------------------------------------------------------


def test_dpo_pairs_with_equal_or_empty_answers_are_dropped_and_counted(tmp_path, tokenizer):
    rows = PREF_STR + [
        {"prompt": "Same?", "chosen": " yes", "rejected": " yes"},
        {"prompt": "Empty?", "chosen": " yes", "rejected": "   "},
        {"prompt": "Msgs", "chosen": " a", "rejected": " a"},
    ]
    prep = D.prepare_dpo(str(write_jsonl(tmp_path / "p.jsonl", rows)), tokenizer)
    assert prep.n_train == len(PREF_STR) and prep.train.to_list() == PREF_STR
    assert prep.dropped == {"chosen equals rejected": 2, "empty chosen or rejected": 1}
    assert D.describe(prep).endswith("· dropped 3 degenerate rows (2 chosen = rejected, 1 empty chosen/rejected)")
    # message lists too, including ShareGPT preference pairs
    same = dict(SHAREGPT_PREF[0], rejected=SHAREGPT_PREF[0]["chosen"])
    prep = D.prepare_dpo(str(write_json(tmp_path / "s.json", SHAREGPT_PREF + [same])), make_tokenizer())
    assert prep.n_train == len(SHAREGPT_PREF) and prep.dropped == {"chosen equals rejected": 1}


def test_conversations_without_assistant_content_are_dropped(tmp_path, tokenizer):
    rows = MESSAGES + [
        {"messages": [{"role": "user", "content": "Anyone there?"}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  "}]},
    ]
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "m.jsonl", rows)), tokenizer)
    assert prep.n_train == len(MESSAGES) and prep.dropped == {"no assistant content": 2}
    sharegpt = SHAREGPT + [{"conversations": [{"from": "human", "value": "Hello?"}]}]
    prep = D.prepare_sft(str(write_json(tmp_path / "s.json", sharegpt)), make_tokenizer())
    assert prep.n_train == len(SHAREGPT) and prep.dropped == {"no assistant content": 1}
    completions = PROMPT_COMPLETION + [{"prompt": "Nothing follows", "completion": ""}]
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "pc.jsonl", completions)), make_tokenizer())
    assert prep.n_train == len(PROMPT_COMPLETION) and prep.dropped == {"empty completion": 1}


def test_conversations_whose_prompt_fills_max_length_are_dropped(tmp_path, tokenizer):
    """Exactly the rows whose first assistant token would sit at or beyond --max-length after the chat template."""
    long_question = "What color is the sky over the quick brown fox? " * 6
    rows = MESSAGES + [
        {"messages": [{"role": "user", "content": long_question}, {"role": "assistant", "content": "Blue."}]},
        {
            "messages": [
                {"role": "system", "content": long_question},
                {"role": "user", "content": "?"},
                {"role": "assistant", "content": "Blue."},
            ]
        },
    ]
    path = str(write_jsonl(tmp_path / "m.jsonl", rows))
    max_length = 64  # the sample conversations' prompt parts have 24-54 tokens, the long ones over 100
    prep = D.prepare_sft(path, tokenizer, max_length=max_length)
    assert prep.dropped == {"prompt fills --max-length": 2} and prep.n_train == len(MESSAGES)
    for row in rows:  # the rule, checked by tokenizing the rendered prompt part
        msgs = row["messages"]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        prompt = tokenizer.apply_chat_template(msgs[:first], tokenize=False, add_generation_prompt=True)
        n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert (n_prompt >= max_length) == (row not in MESSAGES)
    assert "prompt ≥ --max-length" in D.describe(prep)
    # without max_length nothing is checked; a longer max_length keeps them
    assert D.prepare_sft(path, tokenizer).n_train == len(rows)
    assert D.prepare_sft(path, tokenizer, max_length=4096).n_train == len(rows)
    # conversational prompt/completion rows: the prompt part is the prompt, with the generation prompt
    pc = [
        {"prompt": [{"role": "user", "content": long_question}], "completion": [{"role": "assistant", "content": "x"}]}
    ]
    prep = D.prepare_sft(
        str(write_jsonl(tmp_path / "pc.jsonl", PROMPT_COMPLETION_MSGS + pc)), make_tokenizer(), max_length=max_length
    )
    assert prep.dropped == {"prompt fills --max-length": 1} and prep.n_train == len(PROMPT_COMPLETION_MSGS)


def test_nothing_left_after_dropping_is_a_data_error(tmp_path, tokenizer):
    rows = [{"prompt": f"p{i}", "chosen": "same", "rejected": "same"} for i in range(3)]
    with pytest.raises(DataError, match=r"nothing left to train on: all 3 rows were dropped \(3 chosen = rejected\)"):
        D.prepare_dpo(str(write_jsonl(tmp_path / "p.jsonl", rows)), tokenizer)
    rows = [{"messages": [{"role": "user", "content": "x" * 400}, {"role": "assistant", "content": "y"}]}] * 2
    with pytest.raises(DataError, match=r"all 2 rows were dropped \(2 prompt ≥ --max-length"):
        D.prepare_sft(str(write_jsonl(tmp_path / "m.jsonl", rows)), make_tokenizer(), max_length=16)


@pytest.mark.smoke
def test_cli_banner_counts_dropped_rows_and_exits_1_when_none_is_left(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from posttrainllm.cli import app

    runner = CliRunner()
    rows = [
        {"prompt": f"Say {i}.", "chosen": f"{i}", "rejected": f"{i}" if i % 3 == 0 else f"no {i}"} for i in range(9)
    ]
    data = write_jsonl(tmp_path / "prefs.jsonl", rows)
    r = runner.invoke(
        app,
        cli_args("dpo", tiny_model_dir, data, tmp_path / "o", dry_run=True, max_length=64),
    )
    assert r.exit_code == 0, r.output
    assert "6 train" in r.output and "dropped 3 degenerate rows (3 chosen = rejected)" in " ".join(r.output.split())
    same = write_jsonl(tmp_path / "same.jsonl", [dict(row, rejected=row["chosen"]) for row in rows])
    r = runner.invoke(
        app,
        run_args("dpo", tiny_model_dir, same, tmp_path / "o2", steps=1, batch=None, lr=None),
    )
    assert r.exit_code == 1 and "nothing left to train on" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o2" / "model.safetensors").exists()


# ---------------------------------------------------------------------------------------------------------------
# No value silently becomes training text; a file that changes format is blamed at the record that changes it
# ---------------------------------------------------------------------------------------------------------------


def _write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize(
    "task,suffix,rows,where",
    [  # ALPACA's outputs "81" and "6" are strings that datasets' mixed-type JSON column reads back as numbers
        ("sft", ".jsonl", ALPACA + [{"instruction": "x", "input": "", "output": 42}], "record 5: 'output'"),
        ("sft", ".json", ALPACA + [{"instruction": "x", "input": "", "output": 4.5}], "record 5: 'output'"),
        ("sft", ".jsonl", PROMPT_COMPLETION[:1] + [{"prompt": "p", "completion": 7}], "record 2: 'completion'"),
        ("sft", ".parquet", [{"instruction": r["instruction"], "output": 0.0} for r in ALPACA], "record 1: 'output'"),
        ("dpo", ".jsonl", PREF_STR[:2] + [{"prompt": "p", "chosen": 1, "rejected": "b"}], "record 3: 'chosen'"),
        ("dpo", ".jsonl", PREF_STR[:2] + [{"prompt": 12, "chosen": "a", "rejected": "b"}], "record 3: 'prompt'"),
        ("dpo", ".parquet", [{"prompt": "p", "chosen": "a", "rejected": i} for i in range(3)], "record 1: 'rejected'"),
    ],
)
def test_a_number_in_a_text_field_is_an_error_naming_the_file_record_and_column(tmp_path, task, suffix, rows, where):
    path = tmp_path / f"data{suffix}"
    {".jsonl": write_jsonl, ".json": write_json, ".parquet": _write_parquet}[suffix](path, rows)
    prepare = D.prepare_sft if task == "sft" else D.prepare_dpo
    with pytest.raises(DataError) as err:
        prepare(str(path), make_tokenizer())
    assert f"{path}: {where} must be a string, found number" in str(err.value)


def test_null_or_nan_text_is_a_degenerate_row_dropped_and_counted(tmp_path, tokenizer):
    import json

    lines = [json.dumps(r) for r in ALPACA] + [
        '{"instruction": "x", "input": "", "output": NaN}',  # Python's json reads NaN; it must never train as "nan"
        '{"instruction": "y", "input": NaN, "output": null}',
    ]
    path = tmp_path / "nan.jsonl"
    path.write_text("\n".join(lines) + "\n")
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.n_train == len(ALPACA) and prep.dropped == {"null or NaN text": 2}
    assert prep.train.to_list()[0]["completion"] == "81"  # a string stays a string (no pandas number)
    assert "2 null/NaN text" in D.describe(prep)
    # a JSON list with NaN, and parquet: a NaN in a float column of text is no value either
    listed = tmp_path / "nan.json"
    listed.write_text("[" + ",\n".join(lines) + "]")
    assert D.prepare_sft(str(listed), make_tokenizer()).dropped == {"null or NaN text": 2}
    rows = [{"prompt": "p1", "completion": "c1"}, {"prompt": "p2", "completion": None}]
    prep = D.prepare_sft(str(_write_parquet(tmp_path / "pc.parquet", rows)), make_tokenizer())
    assert (prep.n_train, prep.dropped) == (1, {"null or NaN text": 1})
    nan_only = [{"instruction": "a", "output": float("nan")}, {"instruction": "b", "output": float("nan")}]
    with pytest.raises(DataError, match=r"all 2 rows were dropped \(2 null/NaN text\)"):
        D.prepare_sft(str(_write_parquet(tmp_path / "nan.parquet", nan_only)), make_tokenizer())
    pairs = PREF_STR + [{"prompt": "p", "chosen": None, "rejected": "b"}]
    prep = D.prepare_dpo(str(_write_parquet(tmp_path / "p.parquet", pairs)), make_tokenizer())
    assert (prep.n_train, prep.dropped) == (len(PREF_STR), {"null or NaN text": 1})
    pairs.append({"prompt": "p", "chosen": "a", "rejected": float("nan")})
    prep = D.prepare_dpo(str(write_jsonl(tmp_path / "p.jsonl", pairs)), make_tokenizer())
    assert (prep.n_train, prep.dropped) == (len(PREF_STR), {"null or NaN text": 2})
    assert "nan" not in json.dumps(prep.train.to_list()).lower()


def test_a_binary_text_column_is_named_with_its_type_and_the_fix(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = pa.table({"text": pa.array([b"one document", b"another one"], type=pa.binary())})
    pq.write_table(texts, tmp_path / "bin.parquet")
    with pytest.raises(DataError, match=r"column 'text' is stored as binary \(Arrow type binary\).*cast it to string"):
        D.prepare_text(str(tmp_path / "bin.parquet"), tokenizer, max_length=8)
    pq.write_table(pa.table({"text": [1.5, 2.5]}), tmp_path / "float.parquet")
    with pytest.raises(DataError, match=r"column 'text' holds double values, not text"):
        D.prepare_text(str(tmp_path / "float.parquet"), tokenizer, max_length=8)
    alpaca = pa.table({"instruction": ["a", "b"], "output": pa.array([b"x", b"y"], type=pa.binary())})
    pq.write_table(alpaca, tmp_path / "alpaca.parquet")
    with pytest.raises(DataError, match=r"record 1: 'output' must be a string, found bytes .*cast it to string"):
        D.prepare_sft(str(tmp_path / "alpaca.parquet"), make_tokenizer())


@pytest.mark.parametrize(
    "task,later,holds",
    [
        (
            "sft",
            lambda i: {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "messages",
        ),
        ("sft", lambda i: {"prompt": f"q{i}", "chosen": "a", "rejected": "b"}, "chosen"),
        ("sft", lambda i: {"question": f"q{i}", "answer": "a"}, "question"),
        ("dpo", lambda i: {"instruction": f"q{i}", "output": "a"}, "instruction"),
    ],
)
def test_a_file_that_changes_format_names_the_first_record_that_does_not_fit(tmp_path, task, later, holds):
    first = (
        (lambda i: {"instruction": f"Say {i}.", "input": "", "output": f"{i}"})
        if task == "sft"
        else (lambda i: {"prompt": f"Say {i}.", "chosen": f"{i}", "rejected": f"no {i}"})
    )
    path = write_jsonl(tmp_path / "mixed.jsonl", [first(i) if i < 144 else later(i) for i in range(200)])
    prepare = D.prepare_sft if task == "sft" else D.prepare_dpo
    with pytest.raises(DataError) as err:
        prepare(str(path), make_tokenizer())
    msg = str(err.value)
    fmt = "alpaca" if task == "sft" else "preference"
    assert msg.startswith(f"{path}: record 145: does not fit the dataset's format {fmt}"), msg
    assert repr(holds) in msg and "record 1:" not in msg
