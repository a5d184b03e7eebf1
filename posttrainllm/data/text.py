"""Raw text to token blocks (``finetune``/``pretrain``), the way transformers' ``run_clm`` does it: a batched
tokenization map, then grouping into ``--max-length`` blocks in Arrow. Unlike ``run_clm``'s ``group_texts``, the
remainder of one batch is carried into the next, so the blocks are consecutive over the whole corpus and only the
very last partial block is dropped (what the project always did).

Documents longer than 64 KiB characters are tokenized in pieces cut after a newline that is followed by a
non-space character (else before a space between two words): for byte-level BPE tokenizers (GPT-2, Llama 3,
Qwen, and the ones ``pretrain`` trains) such a cut is a pre-tokenizer boundary, so the ids are exactly those of
the whole document; a SentencePiece tokenizer that marks the start of its input may differ at those cuts. The
tokenizer's own special tokens (e.g. a BOS) come once per document, and the eos token after it.

Every block starts as the model's texts start (decision log 67): a block that does not begin with the tokenizer's
prefix (``block_prefix``, e.g. Gemma's and Llama 3's ``<bos>``) gets it put in front, followed by
``max_length - len(prefix)`` tokens of the stream; a block where a document (and so its prefix) begins holds
``max_length`` tokens of the stream. The prefix is context: for a prefix of several tokens, those after the first
are not labels. A tokenizer whose prefix is its EOS token (BOS = EOS) puts it only after each document, so two
documents are never split by a doubled EOS. A tokenizer without a prefix (GPT-2, Qwen, SmolLM) gives the same
blocks as before the prefix existed.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Any

from ..errors import DataError
from . import reading
from .formats import is_null, where
from .reading import PIECE_COLUMNS, json_type, safe_cut

PIECE_CHARS = 1 << 16  # longest text handed to the tokenizer at once
CALL_CHARS = 1 << 18  # text per tokenizer call
BLOCK_BATCH_TOKENS = 1 << 20  # tokens per grouping batch


def iter_split(text: str, limit: int = PIECE_CHARS) -> Iterator[str]:
    """Pieces of `text` of at most about `limit` characters, cut at pre-tokenizer boundaries, one at a time."""
    start, n = 0, len(text)
    while n - start > limit:
        lo, hi = start + limit // 4, start + limit
        cut = safe_cut(text, lo, hi)
        if cut is None:  # no newline: before a space between two non-space characters
            i = text.rfind(" ", lo, hi)
            while i > lo and (text[i - 1].isspace() or text[i + 1].isspace()):
                i = text.rfind(" ", lo, i)
            cut = i if i > lo else hi
        yield text[start:cut]
        start = cut
    yield text[start:] if start else text


def split_text(text: str, limit: int = PIECE_CHARS) -> list[str]:
    """Cut `text` into pieces of at most about `limit` characters at pre-tokenizer boundaries."""
    return list(iter_split(text, limit))


def encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text without special tokens: the Rust tokenizer's `encode_batch_fast` (no offsets) when
    the tokenizer is a fast one, else the tokenizer's own call."""
    backend = getattr(tokenizer, "_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is not None and getattr(tokenizer, "is_fast", False):
        return [e.ids for e in fast(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]


def block_prefix(tokenizer) -> list[int]:
    """The ids every training block starts with: the special tokens the tokenizer puts before a text."""
    return special_affixes(tokenizer)[0]


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (e.g. ([bos], []))."""
    with_special = list(tokenizer("a", verbose=False)["input_ids"])
    plain = list(tokenizer("a", add_special_tokens=False, verbose=False)["input_ids"])
    for k in range(len(with_special) - len(plain) + 1):
        if with_special[k : k + len(plain)] == plain:
            return with_special[:k], with_special[k + len(plain) :]
    return [], []


class Tokenize:
    """The batched map function: documents (or pieces of a document, see `SplitDocuments`) -> ``input_ids``
    (int32), one row per document with text; the eos token after each document that does not already end with
    it."""

    def __init__(self, tokenizer, source: str):
        self.tokenizer = tokenizer
        self.source = source
        self.eos = getattr(tokenizer, "eos_token_id", None)
        self.prefix, self.suffix = special_affixes(tokenizer)
        if self.eos is not None and self.prefix == [self.eos]:  # BOS = EOS: the one after each document serves
            self.prefix = []

    def encode(self, pieces):
        """Token ids of each piece (no special tokens), as int32 numpy arrays, in tokenizer calls of bounded size."""
        out: list[Any] = []
        for _, ids in self._encode_tagged((None, p) for p in pieces):
            out.append(ids)
        return out

    def _encode_tagged(self, tagged):
        """(tag, piece) pairs -> (tag, ids) in the same order; pieces are held only for one tokenizer call."""
        import numpy as np

        buffer: list[tuple[Any, str]] = []
        size = 0

        def flush():
            ids = encode_batch(self.tokenizer, [p for _, p in buffer])
            lengths = [len(x) for x in ids]
            flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=sum(lengths))
            return zip((t for t, _ in buffer), np.split(flat, np.cumsum(lengths)[:-1]))

        for tag, piece in tagged:
            buffer.append((tag, piece))
            size += len(piece)
            if size >= CALL_CHARS:
                yield from flush()
                buffer, size = [], 0
        if buffer:
            yield from flush()

    def __call__(self, batch, indices):
        import numpy as np
        import pyarrow as pa

        if isinstance(batch, pa.Table):
            texts = batch.column("text").to_pylist()
            starts = batch.column(PIECE_COLUMNS[0]).to_pylist() if PIECE_COLUMNS[0] in batch.column_names else None
            ends = batch.column(PIECE_COLUMNS[1]).to_pylist() if PIECE_COLUMNS[1] in batch.column_names else None
            reading.release(batch)
        else:
            texts, starts, ends = batch["text"], batch.get(PIECE_COLUMNS[0]), batch.get(PIECE_COLUMNS[1])
        docs: list[tuple[int, bool, bool]] = []  # (row, starts a document, ends it)
        for j, text in enumerate(texts):
            if is_null(text):
                continue
            if not isinstance(text, str):
                raise DataError(f"{where(self.source, indices[j])}: 'text' must be a string, found {json_type(text)}")
            if starts is None and not text.strip():
                continue
            docs.append((j, True if starts is None else starts[j], True if ends is None else ends[j]))
        tagged = ((j, piece) for j, _, _ in docs for piece in iter_split(texts[j]))
        encoded: dict[int, list] = {j: [] for j, _, _ in docs}
        for j, ids in self._encode_tagged(tagged):
            encoded[j].append(ids)
        parts, lengths = [], []
        for j, doc_start, doc_end in docs:
            row = encoded.pop(j)
            if doc_start and self.prefix:
                row.insert(0, np.asarray(self.prefix, dtype=np.int32))
            if doc_end and self.suffix:
                row.append(np.asarray(self.suffix, dtype=np.int32))
            if doc_end and self.eos is not None:
                last = next((x[-1] for x in reversed(row) if len(x)), None)
                if last != self.eos:
                    row.append(np.asarray([self.eos], dtype=np.int32))
            parts.extend(row)
            lengths.append(sum(len(x) for x in row))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        del parts
        if not isinstance(batch, pa.Table):  # a stream's Python batch: Python rows back
            return {"input_ids": [v.tolist() for v in np.split(values, offsets[1:-1])] if lengths else []}
        return pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))})


class SplitDocuments:
    """The batched map function run before tokenizing when some document is longer than `limit` characters:
    documents -> pieces of at most about `limit` characters cut at pre-tokenizer boundaries, with the .txt piece
    columns saying where each document starts and ends (so that tokenization batches stay small)."""

    def __init__(self, source: str, limit: int):
        self.source = source
        self.limit = limit

    def __call__(self, batch, indices):
        out: dict[str, list] = {"text": [], PIECE_COLUMNS[0]: [], PIECE_COLUMNS[1]: []}
        for j, text in enumerate(batch["text"]):
            if is_null(text):
                continue
            if not isinstance(text, str):
                raise DataError(f"{where(self.source, indices[j])}: 'text' must be a string, found {json_type(text)}")
            if not text.strip():
                continue
            pieces = split_text(text, self.limit)
            out["text"].extend(pieces)
            out[PIECE_COLUMNS[0]].extend([True] + [False] * (len(pieces) - 1))
            out[PIECE_COLUMNS[1]].extend([False] * (len(pieces) - 1) + [True])
        return out


def cut_blocks(ids, max_length: int, prefix) -> tuple[list, int]:
    """(blocks, tokens of `ids` used) of the flat stream `ids`: consecutive blocks of `max_length` ids, each
    starting with `prefix` (put in front where the stream does not already start with it there). The ids past the
    last whole block are not used (the caller carries them)."""
    import numpy as np

    p = len(prefix)
    if not p:
        n = len(ids) // max_length
        return [ids[: n * max_length]], n * max_length
    head = np.asarray(prefix, dtype=ids.dtype)
    blocks: list = []
    start = 0
    while True:
        own = len(ids) - start >= p and bool((ids[start : start + p] == head).all())
        take = max_length if own else max_length - p
        if len(ids) - start < take:
            return blocks, start
        piece = ids[start : start + take]
        blocks.append(piece if own else np.concatenate([head, piece]))
        start += take


class GroupBlocks:
    """The batched map function (Arrow in, Arrow out, one process, in order): token ids -> consecutive blocks of
    `max_length` tokens, each starting with `prefix` (``cut_blocks``), ``labels`` = ``input_ids`` but the prefix's
    tokens after its first; the tokens left over at the end of a batch start the next."""

    def __init__(self, max_length: int, prefix=()):
        import numpy as np

        self.max_length = max_length
        self.prefix = list(prefix)
        self.carry = np.zeros(0, dtype=np.int32)

    def __call__(self, table):
        import numpy as np
        import pyarrow as pa

        chunks = [self.carry]
        for chunk in table.column("input_ids").chunks:
            chunks.append(pa.compute.list_flatten(chunk).to_numpy(zero_copy_only=False).astype(np.int32, copy=False))
        ids = np.concatenate(chunks)
        reading.release(table)
        blocks, used = cut_blocks(ids, self.max_length, self.prefix)
        self.carry = ids[used:].copy()
        flat = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int32)
        return _blocks_table(flat, self.max_length, len(self.prefix))


def _blocks_table(ids, max_length: int, prefix: int = 0):
    import numpy as np
    import pyarrow as pa

    offsets = pa.array(np.arange(0, len(ids) + 1, max_length, dtype=np.int32))
    blocks = pa.ListArray.from_arrays(offsets, pa.array(ids, type=pa.int32()))
    if prefix <= 1:
        return pa.table({"input_ids": blocks, "labels": blocks})
    labels = ids.reshape(-1, max_length).copy()
    labels[:, 1:prefix] = -100  # the prefix is context, not a label
    return pa.table({"input_ids": blocks, "labels": pa.ListArray.from_arrays(offsets, pa.array(labels.reshape(-1)))})


def token_features():
    import datasets

    return datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))})


def block_features():
    import datasets

    ids = datasets.List(datasets.Value("int32"))
    return datasets.Features({"input_ids": ids, "labels": ids})


def _text_columns(ds) -> list[str]:
    return ["text"] + [c for c in PIECE_COLUMNS if c in (ds.column_names or [])]


def check_text_column(ds, source: str, column: str = "text") -> None:
    """A DataError naming the column and its Arrow type when a column that must hold text holds something else
    (a parquet binary or float column), before any Arrow string function meets it."""
    import pyarrow as pa

    table = getattr(getattr(ds, "data", None), "table", None)
    if table is None or column not in table.column_names:
        return  # a stream: each row is checked as it comes
    kind = table.schema.field(column).type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind):
        return
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        raise DataError(
            f"{source}: column '{column}' is stored as binary (Arrow type {kind}), not as text; cast it to string "
            f"(pyarrow: table.cast(...) with '{column}' as pa.string(); pandas: df['{column}'].str.decode('utf-8')) "
            "and save the file again"
        )
    raise DataError(
        f"{source}: column '{column}' holds {kind} values, not text; store the training text as strings "
        f"(a string column '{column}')"
    )


def tokenize(ds, tokenizer, source: str, num_proc: int | None = None):
    """``input_ids`` per document (a ``Dataset``, cached by datasets; or a lazy stream)."""
    import datasets

    from .convert import has_json_feature

    fn = Tokenize(tokenizer, source)
    cols = _text_columns(ds)
    pieces = PIECE_COLUMNS[0] in cols
    if isinstance(ds, datasets.IterableDataset):
        src = ds.select_columns(cols) if ds.column_names else ds
        return src.map(
            fn,
            batched=True,
            with_indices=True,
            batch_size=4 if pieces else 256,
            remove_columns=cols,
            features=token_features(),
        )
    check_text_column(ds, source)
    src = ds.select_columns(cols)
    json_text = has_json_feature(datasets.Features({"text": ds.features["text"]}))
    if not pieces and (json_text or _longest_text(src) > reading.TXT_PIECE_BYTES):
        src = src.map(
            SplitDocuments(source, reading.TXT_PIECE_BYTES),
            batched=True,
            with_indices=True,
            batch_size=16,
            writer_batch_size=16,
            remove_columns=cols,
            features=reading.txt_features(),
            desc="Cutting long documents",
        )
        pieces, json_text = True, False
    if not json_text:
        src = src.with_format("arrow")
    return src.map(
        fn,
        batched=True,
        with_indices=True,
        batch_size=4 if pieces else 256,
        writer_batch_size=64 if pieces else 1000,
        num_proc=reading.processes(num_proc),
        remove_columns=cols,
        features=token_features(),
        desc="Tokenizing",
    ).with_format(None)


def _longest_text(ds) -> int:
    import pyarrow.compute as pc

    longest = 0
    for chunk in ds.data.column("text").chunks:
        longest = max(longest, pc.max(pc.utf8_length(chunk)).as_py() or 0)
        reading.release(chunk)
    return longest


def count_tokens(tokenized) -> int:
    import pyarrow.compute as pc

    column = tokenized.data.column("input_ids")
    return int(sum(pc.sum(pc.list_value_length(c)).as_py() or 0 for c in column.chunks))


def group(tokenized, max_length: int, n_tokens: int, prefix=()):
    """Consecutive blocks of `max_length` tokens over the whole tokenized dataset (one ordered pass), each starting
    with `prefix` (``block_prefix``)."""
    rows = max(1, tokenized.num_rows)
    batch = max(1, min(1000, BLOCK_BATCH_TOKENS * rows // max(1, n_tokens)))
    return (
        tokenized.with_format("arrow")
        .map(
            GroupBlocks(max_length, prefix),
            batched=True,
            batch_size=batch,
            remove_columns=["input_ids"],
            features=block_features(),
            desc="Grouping into blocks",
        )
        .with_format(None)
    )


def stream_blocks(tokenized, max_length: int, prefix=()) -> Iterator[dict]:
    """Generator of blocks from a tokenized stream (a fresh carry for every pass over the stream), as ``group``
    cuts them."""
    import numpy as np
    import pyarrow as pa

    carry = np.zeros(0, dtype=np.int32)
    for table in tokenized.with_format("arrow").iter(batch_size=16):
        flat = pa.compute.list_flatten(table.column("input_ids")).to_numpy(zero_copy_only=False)
        ids = np.concatenate([carry, flat.astype(np.int32, copy=False)])
        blocks, used = cut_blocks(ids, max_length, list(prefix))
        for piece in blocks:
            for k in range(len(piece) // max_length):
                block = piece[k * max_length : (k + 1) * max_length].tolist()
                labels = block if len(prefix) <= 1 else [block[0]] + [-100] * (len(prefix) - 1) + block[len(prefix) :]
                yield {"input_ids": block, "labels": labels}
        carry = ids[used:]


def blocks_stream(tokenized, max_length: int, prefix=()):
    import datasets

    kwargs = {"tokenized": tokenized, "max_length": max_length, "prefix": list(prefix)}
    return datasets.IterableDataset.from_generator(stream_blocks, features=block_features(), gen_kwargs=kwargs)


def load_texts(source: str, streaming: bool = False):
    """A dataset of raw text (a .txt file, or records with a 'text' column), checked to be text."""
    from .detect import format_from_columns

    ds = reading.load(source, streaming=streaming)
    rows = reading.head(ds) if streaming else None
    format_from_columns(reading.columns(ds, rows), "text", str(source))
    return ds


def iter_texts(ds, batch_size: int = 64) -> Iterator[list[str]]:
    """Batches of text pieces (at most PIECE_CHARS each), e.g. for training a tokenizer, in constant memory."""
    src = ds.select_columns(["text"]) if ds.column_names else ds
    for batch in src.iter(batch_size=batch_size):
        out: list[str] = []
        for text in batch["text"]:
            if isinstance(text, str) and text.strip():
                out.extend(split_text(text))
        if out:
            yield out
