""".txt files (one document in pieces) and .jsonl files (JSON Lines) as datasets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import DataError, one_line
from .textio import (
    _BOM,
    LONG_LINE,
    TXT_PIECE_BYTES,
    _arrow_message,
    _decode_error,
    _from_generator,
    _nul_error,
    _stamp,
    _unwrap,
    has_nonfinite_literal,
    iter_text,
    json_type,
    nonfinite_as_null,
)

# --- .txt -------------------------------------------------------------------------------------------------------


def safe_cut(text: str, lo: int, hi: int | None = None) -> int | None:
    """The last position p in [lo, hi) right after a newline whose next character is not whitespace (a pre-token
    boundary for GPT-2/Llama-3/Qwen-style byte-level BPE), or None."""
    hi = len(text) - 1 if hi is None else min(hi, len(text) - 1)
    i = text.rfind("\n", lo, hi)
    while i != -1 and text[i + 1].isspace():
        i = text.rfind("\n", lo, i)
    return None if i == -1 else i + 1


def txt_pieces(path: str, source: str, stamp: str = "", piece_bytes: int = TXT_PIECE_BYTES) -> Iterator[dict]:
    """The rows of a .txt file: pieces of about `piece_bytes` characters of one document, cut at safe points.

    `stamp` (size and mtime) is only there so that datasets' cache key changes when the file changes.
    """
    pending = ""
    started = False
    for text in iter_text(path, source, chunk_bytes=piece_bytes):
        pending += text
        while len(pending) > piece_bytes:
            cut = safe_cut(pending, len(pending) // 4, piece_bytes + piece_bytes // 2)
            if cut is None:
                if len(pending) < 16 * piece_bytes:
                    break  # a very long line: read on until a safe cut appears
                cut = piece_bytes  # no newline at all in 16 pieces: cut anywhere (tokenization may differ here)
            yield {"text": pending[:cut], "_doc_start": not started, "_doc_end": False}
            started = True
            pending = pending[cut:]
    yield {"text": pending, "_doc_start": not started, "_doc_end": True}


def txt_features():
    import datasets

    return datasets.Features(
        {"text": datasets.Value("string"), "_doc_start": datasets.Value("bool"), "_doc_end": datasets.Value("bool")}
    )


def _load_txt(path: Path, source: str, streaming: bool):
    kwargs = {"path": str(path), "source": source, "stamp": _stamp(path)}
    return _from_generator(txt_pieces, kwargs, txt_features(), streaming)


# --- .jsonl -----------------------------------------------------------------------------------------------------


def jsonl_records(path: str, source: str, stamp: str = "") -> Iterator[dict]:
    """The records of a JSON Lines file, line by line (memory: about three times the longest line), with errors
    naming the line."""
    offset = 0
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                if lineno == 1 and raw.startswith(_BOM):
                    raw, offset = raw[len(_BOM) :], len(_BOM)
                size = len(raw)
                if b"\x00" in raw:
                    raise _nul_error(source)
                if not raw or raw.isspace():
                    offset += size
                    continue
                try:
                    obj = json.loads(raw, parse_constant=nonfinite_as_null)  # bytes: decoded inside, no copy kept
                except UnicodeDecodeError as e:
                    raise _decode_error(source, e, offset) from None
                except json.JSONDecodeError:
                    try:  # again without the line break, so that the column is the line's
                        json.loads(raw.rstrip(b"\r\n"))
                        e = None
                    except json.JSONDecodeError as again:
                        e = again
                    raise DataError(
                        f"{source}: line {lineno} is not valid JSON ({e.msg if e else 'invalid'} at column "
                        f"{e.colno if e else 1}); "
                        "each line of a .jsonl file must be one JSON object"
                    ) from None
                del raw
                offset += size
                if not isinstance(obj, dict):
                    raise DataError(
                        f"{source}: line {lineno} is a JSON {json_type(obj)}, not an object; each line of a .jsonl "
                        'file must be one JSON object like {"instruction": ..., "output": ...}'
                    )
                yield obj
                del obj
    except OSError as e:
        raise DataError(f"cannot read {source}: {e.strerror or one_line(e)}") from None


def has_long_line(path: Path, limit: int = LONG_LINE) -> bool:
    """Whether some line is at least about `limit` bytes long (always found from 2 × limit on): a probe every
    `limit` bytes for the next newline, on a memory map (no read of the file)."""
    import mmap

    size = path.stat().st_size
    if size < limit:
        return False
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for pos in range(0, size - limit + 1, limit):
            if mm.find(b"\n", pos, pos + limit) == -1:
                return True
    return False


def _load_jsonl(path: Path, source: str, streaming: bool):
    import datasets

    kwargs = {"path": str(path), "source": source, "stamp": _stamp(path)}
    if streaming:
        return _from_generator(jsonl_records, kwargs, None, True)
    if has_long_line(path) or has_nonfinite_literal(path):
        # pyarrow's JSON reader needs ~10x a record's size for a record of many MB, and refuses NaN (datasets then
        # reads with pandas, which makes numbers of strings like "007"): read such files line by line (~3x),
        # falling back to the JSON reader when the records' types differ from row to row.
        try:
            return _from_generator(jsonl_records, kwargs, None, False)
        except DataError:
            raise
        except Exception:  # noqa: BLE001 - e.g. a column that is a string in one record and a list in another
            pass
    try:
        return datasets.load_dataset("json", data_files=str(path), split="train")
    except Exception as e:  # noqa: BLE001 - Arrow refused the file: find the first bad line ourselves
        inner = _unwrap(e)
        if inner is not None:
            raise inner from None
        for _ in jsonl_records(str(path), source):
            pass
        raise DataError(f"cannot load {source}: {_arrow_message(e)}") from None
