"""eval streams each text (read, tokenized and scored a batch at a time): the numbers are those of the previous
whole-text path, whatever the read size, and progress follows the part of the text read."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from conftest import build_tiny_model, build_tokenizer

from posttrainllm import evaluate as ev
from posttrainllm.evaluate import progress, stream
from posttrainllm.evaluate.scoring import _row_nll_sum

# Lines with indentation, blank lines, a line without newline at the end, and non-ASCII (2-, 3- and 4-byte UTF-8,
# which a small read size cuts in the middle of a character).
TEXT = (
    "def f(x):\n    return {'a': x}  # ünïcode\n\n"
    + "The quick brown fox jumps over the lazy dog. Ça coûte 5 € — 🦊!\n" * 12
    + "    indented line\n\tand a tab\nend without newline"
)


@pytest.fixture(scope="module")
def tok_and_models():
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, n_layers=2).eval()
    torch.manual_seed(1)
    return tok, model, build_tiny_model(tok, n_layers=2).eval()


def previous_eval(model, tokenizer, text: str, L: int, batch_size: int, reference=None) -> dict:
    """The path eval took before streaming: the whole text's ids at once (one tokenizer call, what it did for a text
    under 64K characters), cut into full windows scored `batch_size` at a time, then the shorter last one."""
    ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    full, nll, predicted, kl, kl_n = len(ids) // L, 0.0, 0, 0.0, 0
    rows = [ids[b0 * L : min(b0 + batch_size, full) * L].reshape(-1, L) for b0 in range(0, full, batch_size)]
    rows += [ids[full * L :][None]] if len(ids) - full * L >= 2 else []
    from posttrainllm.evaluate.divergence import kl_sum

    with torch.inference_mode():
        for window in rows:
            batch = torch.from_numpy(window)
            logits = model(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False).logits
            ref = reference(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False).logits
            for r in range(batch.shape[0]):
                s, c = _row_nll_sum(logits[r, :-1], batch[r, 1:])
                nll, predicted = nll + s, predicted + c
                s, c = kl_sum(ref[r, :-1], logits[r, :-1])
                kl, kl_n = kl + s, kl_n + c
    mean = nll / predicted
    windows = math.ceil(len(ids) / L)
    return {
        "perplexity": math.exp(mean),
        "nll": mean,
        "tokens": len(ids),
        "predicted_tokens": predicted,
        "windows": windows,
        "kl": kl / kl_n,
    }


@pytest.mark.parametrize("read_bytes", [7, 100, 1 << 20])
@pytest.mark.parametrize("L, batch_size", [(16, 3), (16, 1), (13, 8), (500, 2)])
def test_streamed_results_are_those_of_the_whole_text_path(
    tok_and_models, tmp_path, monkeypatch, read_bytes, L, batch_size
):
    tok, model, reference = tok_and_models
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8-sig")  # a BOM too: it is not text
    monkeypatch.setattr(stream, "READ_BYTES", read_bytes)
    got = ev.evaluate_files(model, tok, [str(path)], L, batch_size=batch_size, progress=False, reference=reference)
    want = previous_eval(model, tok, TEXT, L, batch_size, reference)
    assert got["t.txt"] == want  # exactly: the same windows in the same batches
    # an in-memory text streams the same way
    without_kl = {k: v for k, v in want.items() if k != "kl"}
    assert ev.text_perplexity(model, tok, TEXT, L, batch_size=batch_size) == without_kl
    assert ev.evaluate_files(model, tok, {"t": TEXT}, L, batch_size=batch_size, progress=False)["t"] == without_kl


def test_pieces_and_ids_do_not_depend_on_the_read_size(tok_and_models, tmp_path, monkeypatch):
    """Pieces are cut only where the text past the cut has been read: with small pieces and any read size the ids
    are those of split_text on the whole text (for this byte-level BPE, those of one call)."""
    tok = tok_and_models[0]
    from posttrainllm.data.text import split_text

    text = TEXT * 30
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    whole = np.concatenate([tok(p, add_special_tokens=False)["input_ids"] for p in split_text(text, 200)])
    assert whole.tolist() == tok(text, add_special_tokens=False)["input_ids"]
    for read_bytes in (5, 64, 333, 4096, 1 << 20):
        monkeypatch.setattr(stream, "READ_BYTES", read_bytes)
        items = list(stream.token_chunks(tok, stream.file_chunks(str(path)), limit=200))
        assert np.array_equal(np.concatenate([ids for ids, _ in items]), whole), read_bytes
        positions = [p for _, p in items]
        assert positions == sorted(positions) and positions[-1] == len(text.encode())


def test_window_batches_shapes():
    ids = np.arange(23, dtype=np.int32)
    chunks = [(ids[:5], 5), (ids[5:6], 6), (ids[6:], 23)]
    got = [(b.shape, b.dtype, p) for b, p in stream.window_batches(iter(chunks), 4, 2)]
    assert got == [((2, 4), np.int64, 23), ((2, 4), np.int64, 23), ((1, 4), np.int64, 23), ((1, 3), np.int64, 23)]
    got = [b for b, _ in stream.window_batches(iter(chunks), 4, 2)]
    assert np.array_equal(np.concatenate([b.ravel() for b in got]), ids)
    assert [b.shape for b, _ in stream.ids_batches(np.arange(9), 4, 8)] == [(2, 4), (1, 1)]
    assert list(stream.ids_batches([], 4, 8)) == []


def test_progress_lines_follow_the_bytes_read(tok_and_models, tmp_path, monkeypatch, capsys):
    """stderr not a terminal: lines whose percentage grows with the part of the file read, to 100% at the end."""
    tok, model, _ = tok_and_models
    path = tmp_path / "big.txt"
    path.write_text(TEXT * 400, encoding="utf-8")  # 370 KB: pieces of up to 64K characters are tokenized as read
    monkeypatch.setattr(stream, "READ_BYTES", 10_000)
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.0)
    got = ev.evaluate_files(model, tok, [str(path)], 128, batch_size=8, progress=True)["big.txt"]
    err = capsys.readouterr()
    assert err.out == ""
    size = f"{path.stat().st_size / 1e3:.1f} KB"
    lines = [line for line in err.err.splitlines() if line.startswith("eval: big.txt: ")]
    parsed = [re.fullmatch(rf"eval: big\.txt: (\d+) windows, (\d+)% of {re.escape(size)} read", x) for x in lines]
    assert all(parsed), lines
    windows, pct = zip(*[(int(m[1]), int(m[2])) for m in parsed])
    assert pct[0] == 0 and pct[-1] == 100 and list(pct) == sorted(pct)
    assert len({p for p in pct if 0 < p < 100}) >= 3  # it moves while the text is read, not only at its end
    assert windows[-1] == got["windows"] and list(windows) == sorted(windows)
