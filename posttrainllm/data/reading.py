"""Reading datasets into Arrow: local files, folders and Hub ids become a memory-mapped ``datasets.Dataset`` (or,
with ``streaming=True``, an ``IterableDataset``). Nothing here holds the whole dataset as Python objects.

==================== ====================================================================================
input                how it is read
==================== ====================================================================================
``.jsonl``           ``load_dataset("json")`` (pyarrow's JSON reader, cached). When Arrow refuses the file, a
                     line-by-line scan finds the first bad line and reports it (``file: line 7 is not valid
                     JSON ...``). Streaming reads it line by line with the same checks.
``.json``            a JSON list is cut into its records by a streaming decoder (constant memory, errors with
                     line and column) into a JSON Lines copy in the datasets cache, which is then loaded like a
                     ``.jsonl`` file; JSON Lines saved as ``.json`` are loaded directly; a single object (one
                     record, or a wrapper holding one list of records) is parsed whole up to 256 MiB and refused
                     above that with a message saying how to convert it.
``.csv``             ``load_dataset("csv")`` with every column read as a string; a constant-memory scan checks
                     the encoding first.
``.parquet``         ``load_dataset("parquet")``.
``.txt``             one document, read in pieces of about 1 MiB cut after a newline that is followed by a
                     non-space character (a pre-tokenizer boundary for byte-level BPE tokenizers), with the
                     UTF-8 / NUL / BOM checks done on the fly: rows ``{"text", "_doc_start", "_doc_end"}``.
folder               ``load_from_disk`` (a folder written by ``Dataset.save_to_disk``) or ``load_dataset``.
Hub id               ``load_dataset(id, split=...)``.
==================== ====================================================================================

``datasets`` and ``pyarrow`` are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import DataError, PosttrainError, UsageError, one_line
from ..refs import looks_like_hub_id

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


# ----------------------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------------------


def json_type(obj: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(obj), "number" if isinstance(obj, (int, float)) else type(obj).__name__
    )


def _unwrap(error: BaseException) -> PosttrainError | None:
    """The project's error inside an exception chain (datasets wraps generator errors), if any."""
    seen = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, PosttrainError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _root(error: BaseException) -> BaseException:
    """The innermost cause (datasets' DatasetGenerationError hides the Arrow/pandas error that matters)."""
    e = error
    while e.__cause__ is not None and e.__cause__ is not e:
        e = e.__cause__
    return e


@contextlib.contextmanager
def quiet_datasets():
    """datasets logs an ERROR line for files it cannot parse; the project reports those itself, in one line."""
    import datasets

    before = datasets.utils.logging.get_verbosity()
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(before)


@contextlib.contextmanager
def progress_bars(*sources: str | None, streaming: bool = False):
    """Show datasets' progress bars only for big inputs (local files above PROGRESS_BYTES, Hub ids)."""
    import datasets

    big = False
    for source in sources:
        if not source:
            continue
        path = Path(str(source)).expanduser()
        try:
            if path.is_file():
                big = big or path.stat().st_size > PROGRESS_BYTES
            elif path.is_dir():
                big = big or sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) > PROGRESS_BYTES
            else:
                big = True
        except OSError:
            pass
    was = datasets.utils.logging.is_progress_bar_enabled()
    if big and not streaming:
        datasets.enable_progress_bars()
    else:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        (datasets.enable_progress_bars if was else datasets.disable_progress_bars)()


def release(table) -> None:
    """Drop the pages of a memory-mapped Arrow table (or batch) that has been read from this process's memory.

    datasets memory-maps its Arrow files; every page a pass reads stays mapped into the process, so its RSS grows
    with the dataset although those are clean page-cache pages. After a batch is processed, madvise(MADV_DONTNEED)
    unmaps the pages of its buffers that lie in a read-only file mapping: they stay in the page cache (a later
    read maps them again, from memory) and nothing else is touched (heap memory is never advised). Linux only; a
    no-op elsewhere or on any error.
    """
    advise = _madvise()
    if advise is None or table is None:
        return
    try:
        columns = table.columns if hasattr(table, "columns") else [table]
        ranges = []
        for column in columns:
            for chunk in getattr(column, "chunks", [column]):
                ranges += [(b.address, b.address + b.size) for b in chunk.buffers() if b is not None and b.size]
        _advise_file_pages(ranges, advise)
    except Exception:  # noqa: BLE001 - only a hint
        pass


_MAPS: list = []  # sorted (start, end) of the read-only file mappings seen in /proc/self/maps
_MADVISE: list = []


def _madvise():
    if not _MADVISE:
        fn = None
        if os.name == "posix" and os.uname().sysname == "Linux" and os.path.exists("/proc/self/maps"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                fn = libc.madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _MADVISE.append(fn)
    return _MADVISE[0]


def _read_only_file_maps() -> list:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[1].startswith("r-") and parts[5].startswith("/"):
                start, end = parts[0].split("-")
                out.append((int(start, 16), int(end, 16)))
    return sorted(out)


def _advise_file_pages(ranges, advise) -> None:
    import bisect
    import mmap

    page = mmap.PAGESIZE
    refreshed = False
    for lo, hi in ranges:
        if hi - lo < 4 * page:
            continue
        for attempt in range(2):
            i = bisect.bisect_right(_MAPS, (lo, float("inf"))) - 1
            if i >= 0 and _MAPS[i][0] <= lo and hi <= _MAPS[i][1]:
                break
            if refreshed or attempt:
                i = -1
                break
            _MAPS[:] = _read_only_file_maps()
            refreshed = True
        if i < 0:
            continue  # not (wholly) in a read-only file mapping: leave it alone
        start = (lo + page - 1) // page * page
        end = hi // page * page
        if end > start:
            advise(start, end - start, 4)  # MADV_DONTNEED


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------


def load(source: str, *, split: str = "train", streaming: bool = False):
    """Open a dataset as a memory-mapped ``datasets.Dataset`` (or an ``IterableDataset`` when ``streaming``).

    Raises UsageError ("dataset not found: PATH") for a local path that does not exist and DataError for a file
    that cannot be read, is malformed (with the line number) or holds no records.
    """
    source = str(source)
    if not source.strip():
        raise UsageError("dataset path is empty: pass a file (.json, .jsonl, .csv, .parquet, .txt) or a Hub id")
    path = Path(source).expanduser()
    with quiet_datasets():
        if path.is_dir():
            ds = _load_dir(path, source, split, streaming)
        elif path.exists():
            if not path.is_file():
                raise UsageError(f"{source} is not a regular file (a pipe, socket or device cannot be a dataset)")
            ds = _load_file(path, source, streaming)
        elif looks_like_hub_id(source):
            ds = _load_hub(source, split, streaming)
        else:
            raise UsageError(
                f"dataset not found: {source} (no such file; pass an existing .json/.jsonl/.csv/.parquet/.txt "
                "file, a folder, or a Hugging Face Hub id like owner/name)"
            )
    if not streaming:
        if ds.num_rows == 0:
            raise DataError(f"dataset {source} is empty: it holds no records")
        release(ds.data)  # loading read (some of) it: nothing of it needs to stay resident
    return ds


def read_records(source: str, split: str = "train") -> list[dict]:
    """The records of a dataset as a list of dicts: a convenience for small data (tests, a look at a file).

    The preparation functions never call it (they work on the Arrow dataset from ``load``). A ``.txt`` file is one
    record ``{"text": whole file}``.
    """
    ds = load(source, split=split)
    if all(c in ds.column_names for c in PIECE_COLUMNS):
        return [{"text": "".join(ds["text"])}]
    return ds.to_list()


def head(ds, n: int = HEAD_ROWS) -> list[dict]:
    """The first n rows as dicts (what format detection looks at)."""
    import datasets

    if isinstance(ds, datasets.Dataset):
        return ds.select(range(min(n, ds.num_rows))).to_list()
    return list(ds.take(n))


def columns(ds, rows: list[dict] | None = None) -> list[str]:
    """Column names without the internal piece columns; for a stream of unknown schema, the keys of `rows`."""
    names = list(getattr(ds, "column_names", None) or [])
    if not names and rows:
        seen: dict[str, None] = {}
        for row in rows:
            for key in row:
                seen.setdefault(key, None)
        names = list(seen)
    return [c for c in names if c not in PIECE_COLUMNS]


def _load_file(path: Path, source: str, streaming: bool):
    suffix = path.suffix.lower()
    if suffix not in DATA_SUFFIXES:
        raise DataError(
            f"{source}: unsupported file type {suffix or '(no extension)'!r}; use .json, .jsonl, .csv, .parquet or .txt"
        )
    if suffix == ".parquet":
        return _load_parquet(path, source, streaming)
    first = _first_char(path, source)
    if first is None:
        raise DataError(f"dataset {source} is empty")
    if suffix == ".txt":
        return _load_txt(path, source, streaming)
    if suffix == ".jsonl":
        return _load_jsonl(path, source, streaming)
    if suffix == ".csv":
        return _load_csv(path, source, streaming)
    return _load_json(path, source, first, streaming)


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
                    obj = json.loads(raw)  # bytes: decoded inside, no copy of the line kept
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
    if has_long_line(path):
        # pyarrow's JSON reader needs ~10x a record's size for a record of many MB; read such files line by line
        # (~3x), falling back to the JSON reader when the records' types differ from row to row.
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


def _arrow_message(error: BaseException) -> str:
    root = _root(error)
    text = one_line(root)
    if "corresponds to no data" in text:
        return "it holds no records"
    if "couldn't cast" in text.lower() or "column names don't match" in text.lower():
        return f"its records do not all have the same columns and types ({text})"
    return f"{type(root).__name__}: {text}"


# --- .json ------------------------------------------------------------------------------------------------------


def _json_error(source: str, lineno: int, colno: int, msg: str) -> DataError:
    return DataError(
        f"{source}: invalid JSON at line {lineno}, column {colno}: {msg}; "
        "fix the file (a .json file must hold a list of objects, or use .jsonl with one object per line)"
    )


def json_list_records(path: str, source: str, stamp: str = "", chunk_bytes: int = _CHUNK) -> Iterator[dict]:
    """The records of a JSON file holding one list of objects, decoded one record at a time (memory: one record
    plus a read buffer), with errors naming the line and column."""
    decoder = json.JSONDecoder()
    chunks = iter_text(path, source, chunk_bytes=chunk_bytes)
    buf, pos, eof = "", 0, False
    line0, col0 = 1, 0  # line of buf[0], and how many characters of that line came before buf[0]

    def more(grow: bool = False) -> bool:
        """Drop the consumed text and read on (at least as much again as is buffered when `grow`)."""
        nonlocal buf, pos, line0, col0, eof
        if eof:
            return False
        dropped = buf[:pos]
        newlines = dropped.count("\n")
        if newlines:
            line0 += newlines
            col0 = len(dropped) - dropped.rfind("\n") - 1
        else:
            col0 += len(dropped)
        buf, pos = buf[pos:], 0
        want = max(1, len(buf)) if grow else 1
        added = []
        while want > 0:
            try:
                piece = next(chunks)
            except StopIteration:
                eof = True
                break
            added.append(piece)
            want -= len(piece)
        buf += "".join(added)
        return bool(added)

    def skip_ws() -> str | None:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(buf):
                return buf[pos]
            if not more():
                return None

    def fail(msg: str, at: int):
        newlines = buf.count("\n", 0, at)
        col = (col0 + at + 1) if newlines == 0 else at - buf.rfind("\n", 0, at)
        raise _json_error(source, line0 + newlines, col, msg)

    if skip_ws() != "[":
        fail("Expecting '['", pos)
    pos += 1
    index = 0
    if skip_ws() == "]":
        pos += 1
    else:
        while True:
            if skip_ws() is None:
                fail("Expecting value", pos)
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as e:
                    # cut by the end of the buffer: within an escape or a literal, or in an open string
                    truncated = e.pos >= len(buf) - 8 or e.msg.startswith("Unterminated string")
                    if not (truncated and more(grow=True)):
                        fail(e.msg, e.pos)
            index += 1
            if not isinstance(obj, dict):
                raise DataError(
                    f"{source}: record {index} is a JSON {json_type(obj)}, not an object; "
                    'the list must hold objects like {"instruction": ..., "output": ...}'
                )
            yield obj
            pos = end
            sep = skip_ws()
            if sep == ",":
                pos += 1
                continue
            if sep == "]":
                pos += 1
                break
            fail("Expecting ',' delimiter", pos)
    if skip_ws() is not None:
        fail("Extra data", pos)


def _records_of_object(data: Any, source: str) -> list[dict]:
    """The records held by a JSON document that is not a list streamed above (a small file parsed whole)."""
    if isinstance(data, dict):
        list_values = [v for v in data.values() if isinstance(v, list)]
        if set(data) & _RECORD_KEYS:  # a single record, e.g. {"messages": [...]}
            data = [data]
        elif len(list_values) == 1:  # {"data": [...]} or {"version": 1, "data": [...]}
            data = list_values[0]
        elif isinstance(data.get("train"), list):
            data = data["train"]
        else:
            raise DataError(
                f"{source}: expected a JSON list of objects (or an object holding one list), "
                f"found an object with keys {list(data)[:8]}; wrap the records in a list"
            )
    if not isinstance(data, list):
        raise DataError(f"{source}: expected a JSON list of objects, found a JSON {json_type(data)}")
    for i, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise DataError(
                f"{source}: record {i} is a JSON {json_type(item)}, not an object; "
                'the list must hold objects like {"instruction": ..., "output": ...}'
            )
    return data


def _first_line_is_object(path: Path, source: str) -> bool:
    """JSON Lines saved as .json: the first line is a complete object and more lines follow."""
    for obj in jsonl_records(str(path), source):
        return isinstance(obj, dict)
    return False


def _json_object_records(path: Path, source: str) -> list[dict] | None:
    """A .json file that starts with '{': the records of a single object, or None when it is JSON Lines."""
    size = path.stat().st_size
    if size > SINGLE_OBJECT_LIMIT:
        with open(path, "rb") as f:
            f.readline()
            second = any(line.strip() for line in iter(f.readline, b""))
        try:
            if second and _first_line_is_object(path, source):
                return None
        except DataError:
            pass
        raise DataError(
            f"{source} holds one JSON object of {size / 2**20:.0f} MiB, too big to parse at once; write the records "
            "as JSON Lines (.jsonl, one object per line) or as a JSON list"
        )
    text = "".join(iter_text(path, source))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":
            first = text.lstrip().split("\n", 1)[0]
            try:
                if isinstance(json.loads(first), dict):
                    return None
            except json.JSONDecodeError:
                pass
        raise _json_error(source, e.lineno, e.colno, e.msg) from None
    return _records_of_object(data, source)


def _cache_dir() -> Path:
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "posttrainllm" / "jsonl"


def _normalized_jsonl(path: Path, source: str, records) -> Path:
    """Write `records` (an iterable of dicts) once as JSON Lines in the datasets cache, keyed by the file's path,
    size and modification time; later runs reuse it."""
    key = hashlib.sha256(_stamp(path).encode()).hexdigest()[:16]
    out = _cache_dir() / f"{path.stem}-{key}.jsonl"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False))
                f.write("\n")
                n += 1
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def _load_json(path: Path, source: str, first: str, streaming: bool):
    if first == "[":
        if streaming:
            return _from_generator(
                json_list_records, {"path": str(path), "source": source, "stamp": _stamp(path)}, None, True
            )
        normalized = _normalized_jsonl(path, source, json_list_records(str(path), source))
    else:
        records = _json_object_records(path, source)
        if records is None:  # JSON Lines saved as .json
            return _load_jsonl(path, source, streaming)
        if not records:
            raise DataError(f"dataset {source} is empty: it holds no records")
        normalized = _normalized_jsonl(path, source, records)
    if normalized.stat().st_size == 0:
        raise DataError(f"dataset {source} is empty: it holds no records")
    return _load_jsonl(normalized, source, streaming)


# --- .csv / .parquet --------------------------------------------------------------------------------------------


def _load_csv(path: Path, source: str, streaming: bool):
    import csv

    import datasets

    scan_text(path, source)
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long cells (default limit: 128 KiB)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader(f), [])
    except csv.Error as e:
        raise DataError(f"{source}: line 1: malformed CSV ({e})") from None
    if not header:
        raise DataError(f"dataset {source} is empty")
    if any(not h.strip() for h in header):
        raise DataError(f"{source}: the CSV header has an empty column name: {header}")
    features = datasets.Features({h: datasets.Value("string") for h in header})
    try:
        return datasets.load_dataset(
            "csv",
            data_files=str(path),
            split="train",
            features=features,
            keep_default_na=False,
            encoding="utf-8-sig",
            streaming=streaming,
        )
    except Exception as e:  # noqa: BLE001
        text = one_line(_root(e))
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", text)
        if m:
            raise DataError(
                f"{source}: line {m[2]} has more cells than the header has columns ({m[1]}); "
                "quote cells that contain commas"
            ) from None
        if "corresponds to no data" in text:
            raise DataError(f"dataset {source} is empty: it holds no records") from None
        raise DataError(f"{source}: malformed CSV ({text})") from None


def _load_parquet(path: Path, source: str, streaming: bool):
    import datasets

    try:
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train", streaming=streaming)
        if streaming:
            next(iter(ds.take(1)), None)  # open the file now, so that a broken one fails here
        return ds
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid / OSError for non-parquet files
        root = _root(e)
        raise DataError(f"{source} is not a readable Parquet file ({type(root).__name__}: {one_line(root)})") from None


# --- folders and the Hub ----------------------------------------------------------------------------------------


def _load_dir(path: Path, source: str, split: str, streaming: bool):
    import datasets

    try:
        if any((path / name).exists() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise UsageError(f"{source}: no split {split!r} in the saved dataset (splits: {list(ds)})")
                ds = ds[split]
            return ds.to_iterable_dataset() if streaming else ds
        return datasets.load_dataset(str(path), split=split, streaming=streaming)
    except (UsageError, DataError):
        raise
    except Exception as e:
        raise DataError(f"cannot load the dataset folder {source}: {type(e).__name__}: {one_line(e)}") from None


def _load_hub(source: str, split: str, streaming: bool):
    import datasets

    try:
        ds = datasets.load_dataset(source, split=split, streaming=streaming)
    except FileNotFoundError as e:  # DatasetNotFoundError derives from it
        raise UsageError(
            f"dataset not found: {source} (no such local file, and not found on the Hugging Face Hub: {one_line(e)})"
        ) from None
    except ValueError as e:
        if "split" in str(e).lower():
            raise UsageError(f"dataset {source}: {one_line(e)}") from None
        raise DataError(f"cannot load dataset {source} from the Hugging Face Hub: {one_line(e)}") from None
    except Exception as e:
        raise DataError(
            f"{source} is not a local file, and loading it from the Hugging Face Hub failed "
            f"({type(e).__name__}: {one_line(e)}); check the path, or the network / HF_HUB_OFFLINE"
        ) from None
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):  # split=None
        ds = ds[split]
    return ds
