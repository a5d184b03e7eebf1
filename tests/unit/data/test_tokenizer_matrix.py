"""Every evaluation window and every training block starts as the model's texts start, on every kind of tokenizer,
checked by token ids: one that adds BOS through its post-processor (Gemma- and Llama-3-style), none (Qwen- and
SmolLM-style), BOS = EOS (GPT-2, plain and with a BOS added), no pad token, and a chat template that writes its own
BOS. A doubled BOS is a defect too. A tokenizer without a prefix gives the windows and blocks cut before the prefix
existed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CORPUS, build_tiny_model, build_tokenizer

from posttrainllm.data import text as T
from posttrainllm.data.prepare import prepare_text
from posttrainllm.evaluate import evaluate_files, text_perplexity
from posttrainllm.evaluate.stream import string_chunks, text_batches, window_prefix

KINDS = ["bos_post_processor", "no_prefix", "gpt2", "gpt2_adds_bos", "no_pad", "template_bos"]
TEXT = "".join(CORPUS) * 4 + "The end."
DOCS = [CORPUS[0] * 2, CORPUS[1], CORPUS[2] * 3, CORPUS[3], CORPUS[1] * 5]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make(kind: str):
    """The tokenizer of one kind of the matrix."""
    from tokenizers.processors import TemplateProcessing

    if kind in ("gpt2", "gpt2_adds_bos"):
        tok = build_tokenizer(specials=["<|endoftext|>"], eos_token="<|endoftext|>", bos_token="<|endoftext|>")
        first = "<|endoftext|>"
    else:
        roles = {"eos_token": "<eos>", "pad_token": "<pad>"}
        if kind != "no_prefix":
            roles["bos_token"] = "<bos>"
        if kind == "no_pad":
            roles.pop("pad_token")
        tok = build_tokenizer(specials=["<bos>", "<eos>", "<pad>"], **roles)
        first = "<bos>"
    if kind not in ("no_prefix", "gpt2"):  # the post-processor puts the first token before every text
        first_id = tok.convert_tokens_to_ids(first)
        tok._tokenizer.post_processor = TemplateProcessing(
            single=f"{first} $A", pair=f"{first} $A {first} $B", special_tokens=[(first, first_id)]
        )
    if kind == "template_bos":
        tok.chat_template = TEMPLATE
    return tok


def expected_prefix(kind: str, tok) -> list[int]:
    if kind in ("no_prefix", "gpt2"):
        return []
    return [tok.bos_token_id]


@pytest.fixture(scope="module", params=KINDS)
def kind_tok(request):
    return request.param, make(request.param)


def test_the_prefix_is_what_the_tokenizer_puts_before_a_text(kind_tok):
    kind, tok = kind_tok
    assert window_prefix(tok) == expected_prefix(kind, tok)
    assert T.block_prefix(tok) == expected_prefix(kind, tok)


@pytest.mark.parametrize("max_length", [5, 16, 33])
def test_every_window_starts_with_the_prefix_once_and_covers_the_text(kind_tok, max_length):
    kind, tok = kind_tok
    prefix = expected_prefix(kind, tok)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    batches, p = text_batches(tok, string_chunks(TEXT), max_length, 3)
    rows = [row.tolist() for batch, _ in batches for row in batch]
    assert p == len(prefix)
    body = []
    for row in rows:
        assert row[: len(prefix)] == prefix and len(row) <= max_length
        if prefix:
            assert row[len(prefix)] != prefix[0] or ids[len(body)] == prefix[0]  # never a doubled BOS
        body.extend(row[len(prefix) :])
    assert body == ids  # every text token once, in order
    assert all(len(r) == max_length for r in rows[:-1])
    if not prefix:  # the windows cut before the prefix existed, id for id
        assert rows == [ids[i : i + max_length] for i in range(0, len(ids), max_length)]


def _bare_nll(model, ids: list[int], prefix: list[int], max_length: int) -> float:
    """An independent scorer: every window is `prefix` + the next max_length - len(prefix) tokens, and every text
    token is predicted from what comes before it in its window."""
    width, total, count = max_length - len(prefix), 0.0, 0
    first = max(len(prefix), 1)
    with torch.no_grad():
        for start in range(0, len(ids), width):
            window = torch.tensor([prefix + ids[start : start + width]])
            if window.shape[1] <= first:
                continue
            logits = model(input_ids=window).logits[0].float()
            nll = F.cross_entropy(logits[first - 1 : -1], window[0, first:], reduction="sum")
            total, count = total + nll.item(), count + window.shape[1] - first
    return total / count


@pytest.mark.parametrize("max_length", [8, 24])
def test_the_perplexity_is_that_of_windows_started_with_the_prefix(kind_tok, max_length):
    kind, tok = kind_tok
    torch.manual_seed(0)
    model = build_tiny_model(tok, n_layers=2).eval()
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    result = text_perplexity(model, tok, TEXT, max_length, batch_size=4)
    assert result["nll"] == pytest.approx(_bare_nll(model, ids, expected_prefix(kind, tok), max_length), rel=1e-5)
    assert result["tokens"] == len(ids)
    assert result["predicted_tokens"] == len(ids) - (0 if expected_prefix(kind, tok) else result["windows"])


def test_the_kl_to_itself_is_zero_and_files_score_as_strings(kind_tok, tmp_path):
    kind, tok = kind_tok
    torch.manual_seed(0)
    model = build_tiny_model(tok, n_layers=2).eval()
    path = tmp_path / "held.txt"
    path.write_text(TEXT)
    got = evaluate_files(model, tok, [str(path)], 16, progress=False, reference=model)["held.txt"]
    assert got["kl"] == pytest.approx(0.0, abs=1e-7)
    assert got["nll"] == pytest.approx(text_perplexity(model, tok, TEXT, 16)["nll"], rel=1e-7)


def _doc_stream(tok, kind: str) -> list[int]:
    """The documents as the tokenizer writes each (its prefix, the text, EOS), joined: what the blocks cut."""
    out: list[int] = []
    for doc in DOCS:
        ids = tok(doc)["input_ids"]
        if kind == "gpt2_adds_bos":  # BOS = EOS: the EOS after each document is the next one's start
            ids = ids[1:]
        out.extend(ids + [tok.eos_token_id])
    return out


def _blocks(tok, tmp_path, max_length: int, streaming: bool):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return list(prepare_text(str(src), tok, max_length=max_length, streaming=streaming).train)


@pytest.mark.parametrize("max_length", [7, 16])
def test_a_stream_cuts_the_same_blocks(kind_tok, tmp_path, max_length):
    kind, tok = kind_tok
    cut = [(b["input_ids"], b["labels"]) for b in _blocks(tok, tmp_path, max_length, False)]
    streamed = [(b["input_ids"], b["labels"]) for b in _blocks(tok, tmp_path, max_length, True)]  # shuffled
    assert sorted(streamed) == sorted(cut)


@pytest.mark.parametrize("max_length", [7, 16])
def test_every_block_starts_with_the_prefix_once_and_keeps_each_eos(kind_tok, tmp_path, max_length):
    kind, tok = kind_tok
    prefix = expected_prefix(kind, tok)
    blocks = _blocks(tok, tmp_path, max_length, False)
    rows = [b["input_ids"] for b in blocks]
    assert rows and all(len(r) == max_length for r in rows)
    assert all(b["labels"] == b["input_ids"] for b in blocks)  # a one-token prefix is never predicted anyway
    stream = _doc_stream(tok, kind)
    body: list[int] = []
    for row in rows:
        assert row[: len(prefix)] == prefix
        own = prefix and stream[len(body) : len(body) + len(prefix)] == prefix  # a document starts here
        if prefix and not own:
            assert row[len(prefix)] != prefix[0]  # never a doubled BOS
        body.extend(row if own or not prefix else row[len(prefix) :])
    assert body == stream[: len(body)] and len(stream) - len(body) < max_length
    eos = tok.eos_token_id
    assert body.count(eos) == stream[: len(body)].count(eos) >= 2  # each document's EOS kept
    assert all(not (a == b == eos) for a, b in zip(body, body[1:]))  # no doubled EOS (BOS = EOS)
    if not prefix:  # the blocks cut before the prefix existed
        assert rows == [stream[i : i + max_length] for i in range(0, len(stream) - max_length + 1, max_length)]


def test_a_prefix_of_several_tokens_is_context_not_labels():
    ids = np.arange(10, 40, dtype=np.int32)
    blocks, used = T.cut_blocks(ids, 8, [1, 2])
    assert [b.tolist()[:2] for b in blocks] == [[1, 2]] * len(blocks) and used == 6 * len(blocks)
    table = T._blocks_table(np.concatenate(blocks), 8, prefix=2)
    labels = table.column("labels").to_pylist()
    assert all(row[1] == -100 and row[0] == 1 and row[2:] == b.tolist()[2:] for row, b in zip(labels, blocks))


@pytest.mark.smoke
@pytest.mark.parametrize("kind", ["bos_post_processor", "template_bos", "no_prefix"])
@pytest.mark.parametrize("shape", ["prompt_completion", "messages"])
def test_sft_rows_start_with_one_bos(kind, shape, tmp_path, captured_trainer):
    """sft hands whole rows to TRL, which tokenizes them: each row starts with the prefix once, with a chat template
    that writes BOS too, and packing keeps each packed row's start."""
    from harness import run_args
    from typer.testing import CliRunner

    from posttrainllm.cli import app

    tok = make(kind)  # without a template of its own, posttrainllm's default ChatML is applied
    torch.manual_seed(0)
    model_dir = tmp_path / "m"
    build_tiny_model(tok, n_layers=2).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    if shape == "prompt_completion":
        rows = [{"prompt": f"Add {i} and {i + 1}.", "completion": f" {2 * i + 1}."} for i in range(8)]
    else:
        rows = [
            {"messages": [{"role": "user", "content": f"Add {i}."}, {"role": "assistant", "content": f"{i + 1}"}]}
            for i in range(8)
        ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for packing in (False, True):
        argv = run_args("sft", model_dir, data, tmp_path / f"o{packing}", steps=1, max_length=64, packing=packing)
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0, r.output
        ds = captured_trainer[-1].train_dataset
        prefix = [tok.bos_token_id] if kind != "no_prefix" else []
        for row in ds:
            ids = row["input_ids"]
            starts = [0]
            if packing:
                starts = list(np.cumsum([0] + row["seq_lengths"][:-1]))
            for s in starts:
                assert ids[s : s + len(prefix)] == prefix
                if prefix:
                    assert ids[s + 1] != prefix[0]  # one BOS, not two
            if not prefix:
                assert tok.bos_token_id is None or tok.bos_token_id not in ids
