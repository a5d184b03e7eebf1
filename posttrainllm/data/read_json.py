""".json files: a list of records cut by a streaming decoder, JSON Lines saved as .json, or a single object."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import DataError
from .read_text import _load_jsonl, jsonl_records
from .textio import (
    _CHUNK,
    _RECORD_KEYS,
    SINGLE_OBJECT_LIMIT,
    _cache_dir,
    _from_generator,
    _stamp,
    iter_text,
    json_type,
    nonfinite_as_null,
)

# --- .json ------------------------------------------------------------------------------------------------------


def _json_error(source: str, lineno: int, colno: int, msg: str) -> DataError:
    return DataError(
        f"{source}: invalid JSON at line {lineno}, column {colno}: {msg}; "
        "fix the file (a .json file must hold a list of objects, or use .jsonl with one object per line)"
    )


class _Buffer:
    """The text of a JSON file read in chunks: `buf[pos:]` is what is left to decode; `line0`/`col0` place buf[0]
    in the file (its line, and how many characters of that line came before it) for error messages."""

    def __init__(self, path: str, source: str, chunk_bytes: int):
        self.chunks = iter_text(path, source, chunk_bytes=chunk_bytes)
        self.source = source
        self.buf, self.pos, self.eof = "", 0, False
        self.line0, self.col0 = 1, 0

    def more(self, grow: bool = False) -> bool:
        """Drop the consumed text and read on (at least as much again as is buffered when `grow`)."""
        if self.eof:
            return False
        dropped = self.buf[: self.pos]
        newlines = dropped.count("\n")
        if newlines:
            self.line0 += newlines
            self.col0 = len(dropped) - dropped.rfind("\n") - 1
        else:
            self.col0 += len(dropped)
        self.buf, self.pos = self.buf[self.pos :], 0
        want = max(1, len(self.buf)) if grow else 1
        added = []
        while want > 0:
            try:
                piece = next(self.chunks)
            except StopIteration:
                self.eof = True
                break
            added.append(piece)
            want -= len(piece)
        self.buf += "".join(added)
        return bool(added)

    def skip_ws(self) -> str | None:
        """The next non-blank character (not consumed), None at the end of the file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return None

    def fail(self, msg: str, at: int):
        newlines = self.buf.count("\n", 0, at)
        col = (self.col0 + at + 1) if newlines == 0 else at - self.buf.rfind("\n", 0, at)
        raise _json_error(self.source, self.line0 + newlines, col, msg)

    def value(self, decoder: json.JSONDecoder):
        """The next JSON value, reading on while the buffer cuts it short."""
        while True:
            try:
                obj, end = decoder.raw_decode(self.buf, self.pos)
                self.pos = end
                return obj
            except json.JSONDecodeError as e:
                # cut by the end of the buffer: within an escape or a literal, or in an open string
                truncated = e.pos >= len(self.buf) - 8 or e.msg.startswith("Unterminated string")
                if not (truncated and self.more(grow=True)):
                    self.fail(e.msg, e.pos)


def json_list_records(path: str, source: str, stamp: str = "", chunk_bytes: int = _CHUNK) -> Iterator[dict]:
    """The records of a JSON file holding one list of objects, decoded one record at a time (memory: one record
    plus a read buffer), with errors naming the line and column."""
    decoder = json.JSONDecoder(parse_constant=nonfinite_as_null)
    b = _Buffer(path, source, chunk_bytes)
    if b.skip_ws() != "[":
        b.fail("Expecting '['", b.pos)
    b.pos += 1
    index = 0
    if b.skip_ws() == "]":
        b.pos += 1
    else:
        while True:
            if b.skip_ws() is None:
                b.fail("Expecting value", b.pos)
            obj = b.value(decoder)
            index += 1
            if not isinstance(obj, dict):
                raise DataError(
                    f"{source}: record {index} is a JSON {json_type(obj)}, not an object; "
                    'the list must hold objects like {"instruction": ..., "output": ...}'
                )
            yield obj
            sep = b.skip_ws()
            if sep == ",":
                b.pos += 1
                continue
            if sep == "]":
                b.pos += 1
                break
            b.fail("Expecting ',' delimiter", b.pos)
    if b.skip_ws() is not None:
        b.fail("Extra data", b.pos)


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
        data = json.loads(text, parse_constant=nonfinite_as_null)
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
