"""Reading (posttrainllm.data.reading): files, folders and Hub ids into Arrow, and the errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from data_samples import (
    ALPACA,
    MESSAGES,
    PREF_MSGS,
    PROMPT_COMPLETION,
    write_json,
    write_jsonl,
)

from posttrainllm import data as D
from posttrainllm.errors import DataError, PosttrainError, UsageError

# ---------------------------------------------------------------------------------------------------------------
# Module hygiene
# ---------------------------------------------------------------------------------------------------------------


def test_import_is_cheap():
    code = (
        "import sys, posttrainllm.data, posttrainllm.commands.demo_data;"
        "print(sorted(m for m in ('torch','transformers','datasets','trl','pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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


def test_csv_alpaca(tmp_path, tokenizer):
    path = tmp_path / "a.csv"
    path.write_text('instruction,input,output\n"Add 1 and 2.",,3\n"Reverse, please",abc,cba\n', encoding="utf-8")
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


@pytest.mark.parametrize("content", ["", "   \n", "[]", '{"data": []}'])
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


# ---------------------------------------------------------------------------------------------------------------
# Arrow reading at scale: streamed JSON lists, .txt pieces, long records
# ---------------------------------------------------------------------------------------------------------------


def test_json_list_is_decoded_record_by_record_across_read_chunks(tmp_path):
    from posttrainllm.data import reading

    records = [{"instruction": f"task {i} \u00e9\u4e2d", "input": "x" * (i % 7), "output": str(i)} for i in range(60)]
    pretty = write_json(tmp_path / "pretty.json", records)  # indented, many lines
    minified = tmp_path / "minified.json"
    minified.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")  # one line, multi-byte chars
    for path in (pretty, minified):
        for chunk in (5, 64, 1 << 20):  # records cut by the read chunks at every possible place
            assert list(reading.json_list_records(str(path), path.name, chunk_bytes=chunk)) == records
    # An error deep in the file is located like json.loads would locate it, whatever the chunking.
    text = pretty.read_text().replace('"output": "41"', '"output": "41" "extra"')
    (tmp_path / "bad.json").write_text(text)
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}"
    for chunk in (5, 64, 1 << 20):
        with pytest.raises(DataError, match=f"bad.json: invalid JSON at {where}"):
            list(reading.json_list_records(str(tmp_path / "bad.json"), "bad.json", chunk_bytes=chunk))


def test_txt_is_read_in_pieces_cut_where_tokenization_does_not_change(tmp_path, tokenizer):
    from posttrainllm.data import reading
    from posttrainllm.data.text import Tokenize

    lines = [
        ("    " * (i % 3)) + f"def f{i}(x):  # the quick brown fox\n" + ("\n" if i % 5 == 0 else "") for i in range(300)
    ]
    text = "".join(lines)
    path = tmp_path / "code.txt"
    path.write_text(text, encoding="utf-8")
    pieces = list(reading.txt_pieces(str(path), "code.txt", piece_bytes=256))
    assert len(pieces) > 20 and "".join(p["text"] for p in pieces) == text
    assert [p["_doc_start"] for p in pieces] == [True] + [False] * (len(pieces) - 1)
    assert [p["_doc_end"] for p in pieces] == [False] * (len(pieces) - 1) + [True]
    for p in pieces[1:]:  # every cut follows a newline and precedes a non-space character
        assert not p["text"][0].isspace()
    for p in pieces[:-1]:
        assert p["text"].endswith("\n")
    # Tokenizing the pieces one by one gives exactly the ids of the whole text (byte-level BPE).
    pieced = [i for p in pieces for i in tokenizer(p["text"], add_special_tokens=False)["input_ids"]]
    assert pieced == tokenizer(text, add_special_tokens=False)["input_ids"]
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert list(Tokenize(tokenizer, "code.txt").encode([text])[0]) == whole


_LONG_RECORD_SCRIPT = r"""
import json, os, random, resource, sys
sys.path.insert(0, sys.argv[1])
from data_samples import make_tokenizer
from posttrainllm import data as D
tok = make_tokenizer()
rng = random.Random(0)
words = "the quick brown fox jumps over the lazy dog hello world this is a tiny corpus".split()
size = int(sys.argv[3])
text = " ".join(rng.choice(words) + ("\n" if rng.random() < 0.02 else "") for _ in range(size // 5))[:size]
small, big = os.path.join(sys.argv[2], "small.jsonl"), os.path.join(sys.argv[2], "big.jsonl")
open(small, "w").write(json.dumps({"text": text[:2000]}) + "\n")
open(big, "w").write(json.dumps({"text": text}) + "\n")
D.prepare_text(small, tok, max_length=16)  # imports and first allocations
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
prep = D.prepare_text(big, tok, max_length=16)
extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
print(json.dumps({"ratio": extra / os.path.getsize(big), "blocks": prep.n_train}))
"""


@pytest.mark.slow
def test_a_long_jsonl_record_is_read_within_a_few_times_its_size(tmp_path):
    """A 16 MiB single-record JSON Lines file, tokenized into blocks: the peak memory it adds stays a few times its
    size (the whole-text tokenization this replaced needed over 100x)."""
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[2])  # tests/: data_samples
    out = subprocess.run(
        [sys.executable, "-c", _LONG_RECORD_SCRIPT, tests, str(tmp_path), str(16 << 20)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["blocks"] > 100_000
    assert result["ratio"] < 8, result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/status are Linux's")
def test_release_unmaps_read_pages_and_never_touches_other_memory(tmp_path):
    """Memory follows the batch: pages of a memory-mapped dataset that were read are given back (they stay in the
    page cache); heap memory is never advised (MADV_DONTNEED would zero it)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from posttrainllm.data import reading

    def rss_file() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024

    heap = pa.array(np.arange(1 << 21, dtype=np.int64))  # 16 MiB on the heap
    reading.release(heap)
    assert pc.sum(heap).as_py() == (1 << 21) * ((1 << 21) - 1) // 2
    rows = [{"text": f"row {i} " + "x" * 2000} for i in range(12000)]  # ~24 MB of text
    ds = reading.load(str(write_jsonl(tmp_path / "t.jsonl", rows)))
    column = ds.data.column("text")
    total = pc.sum(pc.utf8_length(column)).as_py()  # reads every page
    before = rss_file()
    reading.release(ds.data)
    after = rss_file()
    assert before - after > 16 << 20, (before, after)
    assert pc.sum(pc.utf8_length(column)).as_py() == total and ds[11999]["text"] == rows[11999]["text"]
