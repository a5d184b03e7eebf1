"""Tests for posttrainllm.data (reading, format detection, conversion) and posttrainllm.demo_data.

Everything runs offline on files written into tmp_path and a byte-level BPE tokenizer trained here on a few
strings. The `smoke` tests run TRL's SFTTrainer / DPOTrainer for 2 steps on a tiny Llama to prove the shapes are
accepted; the `slow` ones read ../shared/data and skip when it is absent.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from posttrainllm import data as D
from posttrainllm import demo_data
from posttrainllm.errors import DataError, PosttrainError, UsageError

SHARED = next(
    (p for p in (Path(__file__).resolve().parents[2] / "shared" / "data", Path("/work/shared/data")) if p.is_dir()),
    None,
)

# ---------------------------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------------------------

_TOKENIZER_JSON: str | None = None


def _tokenizer_json() -> str:
    global _TOKENIZER_JSON
    if _TOKENIZER_JSON is None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        corpus = [
            "Below is an instruction that describes a task. Write a response that appropriately completes the request.",
            "### Instruction:\nAdd 23 and 58.\n\n### Response:\n81",
            "<|im_start|>user\nWhat color is the sky?<|im_end|>\n<|im_start|>assistant\nIt is blue.<|im_end|>\n",
            "The quick brown fox jumps over the lazy dog. Hello world, this is a tiny corpus.",
        ]
        tok.train_from_iterator(corpus * 20, trainer=trainer)
        _TOKENIZER_JSON = tok.to_str()
    return _TOKENIZER_JSON


def make_tokenizer():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()), eos_token="<|endoftext|>", pad_token="<pad>"
    )


@pytest.fixture
def tokenizer():
    return make_tokenizer()


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


# ---------------------------------------------------------------------------------------------------------------
# Module hygiene
# ---------------------------------------------------------------------------------------------------------------


def test_import_is_cheap():
    code = (
        "import sys, posttrainllm.data, posttrainllm.demo_data;"
        "print(sorted(m for m in ('torch','transformers','datasets','trl','pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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


def test_json_variants(tmp_path):
    # An object holding one list, and JSON Lines saved with a .json name.
    wrapped = write_json(tmp_path / "wrapped.json", {"data": ALPACA})
    assert D.read_records(str(wrapped)) == ALPACA
    lines = write_jsonl(tmp_path / "lines.json", ALPACA)
    assert D.read_records(str(lines)) == ALPACA
    with_meta = write_json(tmp_path / "meta.json", {"version": 2, "data": ALPACA})
    assert D.read_records(str(with_meta)) == ALPACA
    single = write_json(tmp_path / "single.json", MESSAGES[0])  # one record, not a wrapper of records
    assert D.read_records(str(single)) == [MESSAGES[0]]
    # U+2028 is legal inside JSON strings and must not split a JSONL line.
    odd = {"text": "a\u2028b"}
    (tmp_path / "odd.jsonl").write_text(json.dumps(odd, ensure_ascii=False) + "\n", encoding="utf-8")
    assert D.read_records(str(tmp_path / "odd.jsonl")) == [odd]
    # Blank lines in JSONL are skipped; a UTF-8 BOM is accepted.
    (tmp_path / "bom.jsonl").write_text("\ufeff" + json.dumps(ALPACA[0]) + "\n\n" + json.dumps(ALPACA[1]) + "\n")
    assert D.read_records(str(tmp_path / "bom.jsonl")) == ALPACA[:2]


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


def test_csv_alpaca(tmp_path, tokenizer):
    path = tmp_path / "a.csv"
    path.write_text(
        'instruction,input,output\n"Add 1 and 2.",,3\n"Reverse, please",abc,cba\n', encoding="utf-8"
    )
    records = D.read_records(str(path))
    assert records == [
        {"instruction": "Add 1 and 2.", "input": "", "output": "3"},
        {"instruction": "Reverse, please", "input": "abc", "output": "cba"},
    ]
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.format == "alpaca" and prep.train[1]["completion"] == "cba"


def test_parquet_prompt_completion_and_preference(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "pc.parquet"
    pq.write_table(pa.Table.from_pylist(PROMPT_COMPLETION), path)
    prep = D.prepare_sft(str(path), tokenizer)
    assert prep.format == "prompt_completion" and prep.train.to_list() == PROMPT_COMPLETION

    path = tmp_path / "pref.parquet"
    pq.write_table(pa.Table.from_pylist(PREF_MSGS), path)
    prep = D.prepare_dpo(str(path), tokenizer)
    assert prep.format == "preference" and prep.train.to_list() == PREF_MSGS


def test_saved_dataset_folder(tmp_path, tokenizer):
    import datasets

    datasets.Dataset.from_list(ALPACA).save_to_disk(str(tmp_path / "saved"))
    assert D.read_records(str(tmp_path / "saved")) == ALPACA


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


# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


def test_broken_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    lines = [json.dumps(ALPACA[0]), json.dumps(ALPACA[1]), '{"instruction": "x", ', json.dumps(ALPACA[2])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        D.read_records(str(path))
    msg = str(err.value)
    assert "broken.jsonl" in msg and "line 3" in msg and "\n" not in msg
    assert err.value.exit_code == 1


def test_broken_json_names_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "c" "output": "d"}\n]\n')
    with pytest.raises(DataError, match=r"broken\.json: invalid JSON at line 3"):
        D.read_records(str(path))


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


@pytest.mark.parametrize("content", ["", "   \n", "[]", "{\"data\": []}"])
def test_empty_files(tmp_path, content):
    path = tmp_path / "empty.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="empty"):
        D.read_records(str(path))


def test_empty_jsonl_and_csv(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n\n")
    (tmp_path / "e.csv").write_text("instruction,output\n")
    for name in ("e.jsonl", "e.csv"):
        with pytest.raises(DataError, match="empty"):
            D.read_records(str(tmp_path / name))


@pytest.mark.parametrize("name", ["blob.jsonl", "blob.json", "blob.txt", "blob.parquet"])
def test_binary_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(DataError) as err:
        D.read_records(str(path))
    assert name in str(err.value)
    if not name.endswith(".parquet"):
        assert "not a UTF-8 text file" in str(err.value)


def test_missing_path_is_usage_error(tmp_path):
    for missing in (str(tmp_path / "nope.jsonl"), "data/train.jsonl", "./nothing", "missing.json"):
        with pytest.raises(UsageError, match="dataset not found"):
            D.read_records(missing)


def test_hub_id_offline_is_clean_error():
    # Not a local path, looks like a Hub id: datasets is asked, fails offline, and we get one clean error.
    with pytest.raises(PosttrainError, match="someone/no-such-dataset"):
        D.read_records("someone/no-such-dataset")


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
    assert "{% generation %}" not in D.DEFAULT_CHAT_TEMPLATE


def test_existing_chat_template_is_kept(tmp_path, tokenizer):
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    prep = D.prepare_sft(str(write_jsonl(tmp_path / "chat.jsonl", MESSAGES)), tokenizer)
    assert prep.template_note is None and tokenizer.chat_template.startswith("{% for m")


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


# ---------------------------------------------------------------------------------------------------------------
# Demo data
# ---------------------------------------------------------------------------------------------------------------


def test_instruction_set_deterministic_and_correct():
    a = demo_data.instruction_set(300, seed=3)
    assert a == demo_data.instruction_set(300, seed=3)
    assert a != demo_data.instruction_set(300, seed=4)
    assert len(a) == 300 and all(set(r) == {"instruction", "input", "output"} for r in a)
    checked = 0
    for r in a:
        ins, out = r["instruction"], r["output"]
        if m := re.fullmatch(r"Add (\d+) and (\d+)\.", ins):
            assert int(out) == int(m[1]) + int(m[2])
        elif m := re.fullmatch(r"What is (\d+) minus (\d+)\?", ins):
            assert int(out) == int(m[1]) - int(m[2])
        elif m := re.fullmatch(r"Multiply (\d+) by (\d+)\.", ins):
            assert int(out) == int(m[1]) * int(m[2])
        elif m := re.fullmatch(r"Reverse the word: (\w+)", ins):
            assert out == m[1][::-1]
        elif m := re.fullmatch(r"Uppercase: (.+)", ins):
            assert out == m[1].upper()
        elif m := re.fullmatch(r"Count the letters in: (\w+)", ins):
            assert int(out) == len(m[1])
        elif ins == "Sort these numbers in ascending order.":
            assert [int(x) for x in out.split(", ")] == sorted(int(x) for x in r["input"].split(", "))
        elif ins == "Which number is the largest?":
            assert int(out) == max(int(x) for x in r["input"].split(", "))
        else:
            continue
        checked += 1
    assert checked > 100
    assert any(r["instruction"].startswith("Add ") for r in a)
    kinds = {r["instruction"].split()[0] for r in a}
    assert len(kinds) >= 8


def test_stdlib_corpus_deterministic_and_disjoint():
    pre, held = demo_data.stdlib_corpus(max_chars=60_000, seed=0)
    assert (pre, held) == demo_data.stdlib_corpus(max_chars=60_000, seed=0)
    assert 0 < len(pre) <= 60_000 and 0 < len(held) <= 60_000 // 8
    header = re.compile(r"^# ==== Lib/(\S+) ====$", re.M)
    top = lambda p: p.split("/")[0].removesuffix(".py")  # noqa: E731
    pre_mods = {top(p) for p in header.findall(pre)}
    held_mods = {top(p) for p in header.findall(held)}
    assert pre_mods and held_mods and not pre_mods & held_mods
    assert not any(m in {"test", "idlelib", "tkinter"} for m in pre_mods | held_mods)
    assert demo_data.stdlib_corpus(max_chars=60_000, seed=1) != (pre, held)


def test_write_demo_files(tmp_path, tokenizer):
    paths = demo_data.write_demo_files(tmp_path / "demo")
    assert set(paths) == {"pretrain", "heldout_code", "instructions", "instructions_eval"}
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())
    train = D.read_records(str(paths["instructions"]))
    evals = D.read_records(str(paths["instructions_eval"]))
    assert len(train) == 400 and len(evals) == 50
    assert not {r["instruction"] + r["input"] for r in train} & {r["instruction"] + r["input"] for r in evals}
    prep = D.prepare_sft(str(paths["instructions"]), tokenizer, eval_source=str(paths["instructions_eval"]))
    assert prep.format == "alpaca" and (prep.n_train, prep.n_eval) == (400, 50)
    assert D.detect_format(D.read_records(str(paths["pretrain"])), "text") == "text"


# ---------------------------------------------------------------------------------------------------------------
# Smoke: TRL trainers accept the shapes
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """A tiny model on a shared 2-core machine: extra torch threads only contend (seconds -> milliseconds)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def _common_args(tmp_path):
    return dict(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        learning_rate=1e-3,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        max_length=64,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


@pytest.mark.smoke
@pytest.mark.parametrize("kind", ["alpaca", "messages", "prompt_completion", "prompt_completion_msgs", "replay"])
def test_sft_trainer_accepts_shapes(tmp_path, tokenizer, kind, one_thread):
    import math

    import datasets
    from trl import SFTConfig, SFTTrainer

    rows = {
        "alpaca": ALPACA,
        "replay": ALPACA,
        "messages": MESSAGES,
        "prompt_completion": PROMPT_COMPLETION,
        "prompt_completion_msgs": PROMPT_COMPLETION_MSGS,
    }[kind]
    path = write_jsonl(tmp_path / f"{kind}.jsonl", rows)
    prep = D.prepare_sft(str(path), tokenizer, eval_split=0.25, seed=0)
    train = prep.train
    if kind == "replay":
        train = D.mix_replay(train, datasets.Dataset.from_list([{"text": "Hello world. " * 4}]), 0.4, seed=0)
    model = _tiny_model(tokenizer)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**_common_args(tmp_path)),
        train_dataset=train,
        eval_dataset=prep.eval,
        processing_class=tokenizer,
    )
    # Alpaca / prompt-completion: the loss is on the completion only (prompt tokens labelled -100).
    sample = trainer.train_dataset[0]
    if "prompt" in train.column_names:
        assert -100 in sample["labels"] and any(t != -100 for t in sample["labels"])
    out = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(out.training_loss)
    assert math.isfinite(trainer.evaluate()["eval_loss"])


@pytest.mark.smoke
@pytest.mark.parametrize("kind", ["preference", "preference_msgs", "sharegpt_preference"])
def test_dpo_trainer_accepts_shapes(tmp_path, tokenizer, kind, one_thread):
    import math

    from trl import DPOConfig, DPOTrainer

    if kind == "sharegpt_preference":
        path = write_json(tmp_path / "sgp.json", SHAREGPT_PREF)
    else:
        path = write_jsonl(tmp_path / f"{kind}.jsonl", PREF_STR if kind == "preference" else PREF_MSGS)
    prep = D.prepare_dpo(str(path), tokenizer)
    assert prep.format == kind.removesuffix("_msgs")
    model = _tiny_model(tokenizer)
    trainer = DPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=DPOConfig(**_common_args(tmp_path)),
        train_dataset=prep.train,
        processing_class=tokenizer,
    )
    out = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(out.training_loss)
