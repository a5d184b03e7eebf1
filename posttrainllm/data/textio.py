"""The pieces every reader shares: the limits, UTF-8 text read in chunks with its checks (BOM, NUL, bad bytes), safe
cut points, error unwrapping, datasets' generator datasets. A leaf of posttrainllm/data/reading.py's readers."""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import DataError, PosttrainError, error_in, one_line

DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt")
# A .txt file is one document read in pieces: these columns say where the document starts and ends.
PIECE_COLUMNS = ("_doc_start", "_doc_end")
TXT_PIECE_BYTES = 1 << 20
# A .json file holding one object (not a list, not JSON Lines) has to be parsed whole: up to this size.
SINGLE_OBJECT_LIMIT = 256 << 20
# Above this size (or for Hub ids and streams) datasets' progress bars are shown.
PROGRESS_BYTES = 32 << 20
HEAD_ROWS = 100  # rows looked at to detect a format
GENERATOR_WRITER_BATCH = 8  # rows buffered before datasets writes them, for rows that can each be MBs
# JSON Lines files with a line this long are read line by line (pyarrow's reader would need ~10x the line).
LONG_LINE = 4 << 20

# Names that look like a file (any short alphanumeric extension) are never treated as a Hub id.
# Column names of the known formats: a JSON object holding one of them is one record, not a wrapper of records.
_RECORD_KEYS = {
    "messages",
    "conversations",
    "prompt",
    "completion",
    "chosen",
    "rejected",
    "instruction",
    "output",
    "text",
}
_BOM = codecs.BOM_UTF8
_CHUNK = 1 << 20


def nonfinite_as_null(constant: str) -> None:
    """``parse_constant`` for json: Python's json reads NaN, Infinity and -Infinity (not JSON); they are no value, so
    they read as null (a degenerate row where text is needed), never as a float that could become the text "nan"."""
    return None


_NONFINITE = re.compile(rb"[:,\[]\s*-?(?:NaN|Infinity)\s*[,}\]]")


def has_nonfinite_literal(path: Path) -> bool:
    """Whether a JSON Lines file holds a NaN/Infinity literal (outside strings, about). pyarrow refuses those and
    datasets then reads the file with pandas, which also turns strings such as "007" into numbers; the project
    reads such a file line by line instead. A memchr-speed search first, the pattern only where the word occurs."""
    import mmap

    if path.stat().st_size == 0:
        return False
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm.find(b"NaN") == -1 and mm.find(b"Infinity") == -1:
            return False
        return _NONFINITE.search(mm) is not None


def json_type(obj: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(obj), "number" if isinstance(obj, (int, float)) else type(obj).__name__
    )


def _unwrap(error: BaseException) -> PosttrainError | None:
    """The project's error inside an exception chain (datasets wraps generator errors), if any."""
    return error_in(error, PosttrainError)


def _root(error: BaseException) -> BaseException:
    """The innermost cause (datasets' DatasetGenerationError hides the Arrow/pandas error that matters)."""
    e = error
    while e.__cause__ is not None and e.__cause__ is not e:
        e = e.__cause__
    return e


def _first_char(path: Path, source: str) -> str | None:
    """The first non-whitespace character of a text file (after a UTF-8 BOM), None when it holds only whitespace."""
    try:
        with open(path, "rb") as f:
            start = True
            while chunk := f.read(1 << 16):
                if start and chunk.startswith(_BOM):
                    chunk = chunk[len(_BOM) :]
                start = False
                rest = chunk.lstrip()
                if rest:
                    return chr(rest[0])
    except OSError as e:
        raise DataError(f"cannot read {source}: {e.strerror or one_line(e)}") from None
    return None


def _decode_error(source: str, error: UnicodeDecodeError, offset: int) -> DataError:
    byte = error.object[error.start] if error.start < len(error.object) else 0
    return DataError(
        f"{source} is not a UTF-8 text file (undecodable byte 0x{byte:02x} at offset {offset + error.start}); "
        "save it as UTF-8 text, or use .parquet for binary data"
    )


def _nul_error(source: str) -> DataError:
    return DataError(f"{source} is not a UTF-8 text file (it contains NUL bytes); is it a binary file?")


def iter_text(path: str | Path, source: str | None = None, chunk_bytes: int = _CHUNK) -> Iterator[str]:
    """Decode a UTF-8 text file chunk by chunk (constant memory): a leading BOM is dropped; undecodable bytes and
    NUL bytes raise DataError naming the file (and the offset)."""
    source = source or str(path)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    try:
        with open(path, "rb") as f:
            first = True
            while True:
                chunk = f.read(chunk_bytes)
                final = not chunk
                if first and chunk.startswith(_BOM):
                    chunk, offset = chunk[len(_BOM) :], len(_BOM)
                first = False
                if b"\x00" in chunk:
                    raise _nul_error(source)
                pending = len(decoder.getstate()[0])
                try:
                    text = decoder.decode(chunk, final=final)
                except UnicodeDecodeError as e:
                    raise _decode_error(source, e, offset - pending) from None
                offset += len(chunk)
                if text:
                    yield text
                if final:
                    return
    except OSError as e:
        raise DataError(f"cannot read {source}: {e.strerror or one_line(e)}") from None


def scan_text(path: Path, source: str) -> None:
    """Constant-memory check that a file is UTF-8 text without NUL bytes."""
    for _ in iter_text(path, source):
        pass


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"


def _from_generator(generator, gen_kwargs: dict, features, streaming: bool):
    import datasets

    try:
        if streaming:
            return datasets.IterableDataset.from_generator(generator, features=features, gen_kwargs=gen_kwargs)
        # rows can be MBs each (.txt pieces, long JSON lines): write them a few at a time (datasets' default buffers
        # 1000 rows before writing)
        return datasets.Dataset.from_generator(
            generator, features=features, gen_kwargs=gen_kwargs, writer_batch_size=GENERATOR_WRITER_BATCH
        )
    except Exception as e:  # datasets wraps the generator's DataError in a DatasetGenerationError
        inner = _unwrap(e)
        if inner is not None:
            raise inner from None
        raise


def _arrow_message(error: BaseException) -> str:
    root = _root(error)
    text = one_line(root)
    if "corresponds to no data" in text:
        return "it holds no records"
    if "couldn't cast" in text.lower() or "column names don't match" in text.lower():
        return f"its records do not all have the same columns and types ({text})"
    return f"{type(root).__name__}: {text}"


def _cache_dir() -> Path:
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "posttrainllm" / "jsonl"
