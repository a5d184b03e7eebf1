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

import contextlib
import re
from pathlib import Path

from ..errors import DataError, UsageError, one_line
from ..refs import looks_like_hub_id
from .memory import release
from .read_json import _load_json, json_list_records
from .read_text import _load_jsonl, _load_txt, jsonl_records, safe_cut, txt_features, txt_pieces
from .textio import (
    DATA_SUFFIXES,
    HEAD_ROWS,
    PIECE_COLUMNS,
    PROGRESS_BYTES,
    TXT_PIECE_BYTES,
    _first_char,
    _root,
    iter_text,
    json_type,
    scan_text,
)

__all__ = [
    "DATA_SUFFIXES",
    "PIECE_COLUMNS",
    "TXT_PIECE_BYTES",
    "columns",
    "head",
    "iter_text",
    "json_list_records",
    "json_type",
    "jsonl_records",
    "load",
    "local_json_records",
    "progress_bars",
    "quiet_datasets",
    "read_records",
    "release",
    "safe_cut",
    "scan_text",
    "txt_features",
    "txt_pieces",
]


def processes(num_proc: int | None) -> int | None:
    """datasets' `num_proc` for --dataset-num-proc N: None (this process) for N <= 1, since datasets 5 runs a map
    with num_proc=1 in a worker process of its own (a second process, its own copy of the tokenizer, nothing
    gained)."""
    return num_proc if (num_proc or 1) > 1 else None


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


def local_json_records(source: str):
    """The records of a local .jsonl file or .json list as Python's json reads them (exact types, one at a time),
    or None for any other source."""
    path = Path(str(source)).expanduser()
    if not path.is_file():
        return None
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return jsonl_records(str(path), str(source))
    if suffix == ".json" and _first_char(path, str(source)) == "[":
        return json_list_records(str(path), str(source))
    return None


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
