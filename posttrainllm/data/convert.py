"""Converting a whole dataset to trainer rows, batch by batch, with degenerate rows dropped and counted.

* The reference is ``formats.convert_record`` applied record by record (``Converter.rows``).
* For the common shapes of plain Arrow types (Alpaca strings, messages / ShareGPT conversations as lists of
  ``{role, content}`` / ``{from, value}`` structs, prompt/completion strings, text) ``fast_batch`` computes the
  same rows with pyarrow compute functions. Any row the fast path cannot vouch for (a null, an unknown role, an
  empty instruction, a string that may hold JSON messages, ...) sends the whole batch to the reference path, which
  gives the exact error message or row.
* ``convert_dataset`` (memory-mapped data): when the data is already in the trainer's shape (messages with the
  standard roles, prompt/completion strings, text), nothing is rewritten: one vectorized pass computes the drop
  reasons. Otherwise a batched ``Dataset.map`` (``num_proc`` processes, cached by datasets) writes the rows.
* ``convert_stream`` (``IterableDataset``): the reference path, lazily, as the stream is read.

Every batch yields a ``_drop`` column (the reason a row teaches nothing, or null); the dropped rows are counted
by reason with Arrow and removed by index.
"""

from __future__ import annotations

import os
from collections import Counter

from ..errors import DataError
from . import formats as F
from .fast_convert import fast_batch
from .reading import local_json_records, processes, release

DROP = "_drop"
FAST_BATCH = 10_000  # rows per vectorized pass when nothing is rewritten
MAP_BATCH = 1000  # rows per Dataset.map batch


def target_features(fmt: str, conversational: bool, with_drop: bool = True):
    import datasets

    string = datasets.Value("string")
    msgs = datasets.List({"role": string, "content": string})
    if fmt in ("messages", "sharegpt", "sharegpt_preference"):
        kind = msgs
    elif fmt in ("prompt_completion", "preference", "unpaired"):
        kind = msgs if conversational else string
    else:
        kind = string
    features = {c: kind for c in F.TARGET_COLUMNS[fmt]}
    if fmt == "unpaired":
        features["label"] = datasets.Value("bool")
    if with_drop:
        features[DROP] = string
    return datasets.Features(features)


def has_json_feature(features) -> bool:
    """Whether a column needs datasets' Python decoding (mixed-type JSON columns are stored as JSON text)."""
    import datasets

    json_type = getattr(datasets, "Json", None)

    def walk(f) -> bool:
        if json_type is not None and isinstance(f, json_type):
            return True
        if isinstance(f, dict):
            return any(walk(v) for v in f.values())
        if isinstance(f, (list, tuple)):
            return any(walk(v) for v in f)
        inner = getattr(f, "feature", None)
        return inner is not None and walk(inner)

    return features is None or walk(dict(features))


class Converter:
    """The batched map function: records -> trainer rows plus a drop reason per row."""

    def __init__(self, fmt: str, source: str, conversational: bool, budget=None):
        self.fmt = fmt
        self.source = source
        self.conversational = conversational
        self.budget = budget
        self.columns = F.TARGET_COLUMNS[fmt]
        self._previous = None  # the last Arrow batch seen, released at the next call

    def __getstate__(self):  # pickled (num_proc, datasets' fingerprint) without the batch
        return {**self.__dict__, "_previous": None}

    def __call__(self, batch, indices):
        import pyarrow as pa

        if isinstance(batch, pa.Table):
            # The rows returned may point into this batch's memory-mapped pages (an unchanged column): datasets
            # writes them before it asks for the next batch, so the previous batch's pages can go now.
            release(self._previous)
            self._previous = batch
            fast = fast_batch(batch, self, indices)
            if fast is not None:
                return pa.table({**fast.columns, DROP: fast.reasons})
            records = batch.to_pylist()
        else:
            keys = list(batch)
            records = [dict(zip(keys, values)) for values in zip(*(batch[k] for k in keys))]
        return self.rows(records, indices)

    def rows(self, records: list[dict], indices) -> dict[str, list]:
        out: dict[str, list] = {c: [] for c in self.columns}
        reasons: list[str | None] = []
        for record, index in zip(records, indices):
            where = F.where(self.source, index)
            # a record of only nulls and blanks, a null/NaN text (or a DataError: a record of another format)
            reason = F.EMPTY_RECORD if F.is_empty_record(record) else F.null_reason(record, self.fmt, where)
            if reason is None:
                row = F.convert_record(record, self.fmt, self.conversational, where)
                reason = F.drop_reason(row, self.fmt)
                if reason is None and self.budget is not None and self.budget.leaves_no_completion(row, where):
                    reason = F.TOO_LONG_PROMPT
            if reason is not None:
                row = F.placeholder(self.fmt, self.conversational)
            for c in self.columns:
                out[c].append(row[c])
            reasons.append(reason)
        out[DROP] = reasons
        return out

    def first_error(self, records) -> DataError | None:
        """The reference path's error for the first of `records` (dicts) that fails, None when none does."""
        for index, record in enumerate(records):
            try:
                self.rows([record], [index])
            except DataError as e:
                return e
        return None


def _exact_error(conv: Converter, error: F.NotTextError) -> DataError:
    """The types datasets gives may not be the file's: a JSON column of mixed types is kept as JSON text and the
    string "81" comes back as the number 81 (pandas, its fallback reader, does the same). So when a text column
    holds a value that is not text, a local JSON file is read again with Python's json (exact types) and the record
    that really holds one is named."""
    records = local_json_records(conv.source)
    if records is None:
        return error
    try:
        return conv.first_error(records) or error
    except DataError:  # the file cannot be read this way (e.g. a single JSON object): datasets' reading stands
        return error


# ----------------------------------------------------------------------------------------------------------------
# Whole datasets
# ----------------------------------------------------------------------------------------------------------------


def _identity(ds, conv: Converter):
    """When the data is already in the trainer's shape: the drop reasons from one vectorized pass, else None."""
    import pyarrow as pa

    if conv.fmt not in ("messages", "prompt_completion", "text") or has_json_feature(ds.features):
        return None
    from concurrent.futures import ThreadPoolExecutor

    def check(job):
        offset, table = job
        fast = fast_batch(table, conv, range(offset, offset + table.num_rows))
        release(table)
        return None if fast is None or fast.changed else fast.reasons

    def jobs():
        offset = 0
        for table in _batches(ds):
            yield offset, table
            offset += table.num_rows

    reasons: list = []
    # pyarrow's kernels and madvise release the GIL: two batches at a time use two cores (a few submitted ahead)
    workers = min(2, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: list = []
        for job in jobs():
            pending.append(pool.submit(check, job))
            if len(pending) > 2 * workers:
                result = pending.pop(0).result()
                if result is None:
                    return None
                reasons.append(result)
        for future in pending:
            result = future.result()
            if result is None:
                return None
            reasons.append(result)
    return ds.select_columns(list(conv.columns)), pa.chunked_array(reasons, type=pa.string())


def _batches(ds):
    """The dataset's Arrow data in tables of about FAST_BATCH rows, made of its record batches (no copy)."""
    import pyarrow as pa

    if getattr(ds, "_indices", None) is not None:  # an index mapping: let datasets gather the rows
        yield from ds.with_format("arrow").iter(batch_size=FAST_BATCH)
        return
    group, rows = [], 0
    for batch in ds.data.table.to_batches(max_chunksize=FAST_BATCH):  # record batches, grouped, never copied
        group.append(batch)
        rows += batch.num_rows
        if rows >= FAST_BATCH:
            yield pa.Table.from_batches(group)
            group, rows = [], 0
    if group:
        yield pa.Table.from_batches(group)


def convert_dataset(ds, fmt: str, source: str, *, conversational: bool, budget=None, num_proc: int | None = None):
    """Convert a ``datasets.Dataset`` of `fmt` records: returns (rows, {reason: count of dropped rows})."""
    import numpy as np
    import pyarrow.compute as pc

    conv = Converter(fmt, source, conversational, budget)
    done = _identity(ds, conv)
    if done is not None:
        out, reasons = done
    else:
        features = target_features(fmt, conversational)
        src = ds if has_json_feature(ds.features) else ds.with_format("arrow")
        try:
            out = src.map(
                conv,
                batched=True,
                with_indices=True,
                batch_size=MAP_BATCH,
                remove_columns=ds.column_names,
                num_proc=processes(num_proc),
                features=features,
                desc="Converting",
            ).with_format(None)
        except F.NotTextError as e:
            raise _exact_error(conv, e) from None
        reasons = out.data.column(DROP)
        out = out.remove_columns(DROP)
    dropped = {}
    if reasons.null_count < len(reasons):
        counts = pc.value_counts(reasons.combine_chunks()).to_pylist()
        dropped = {c["values"]: c["counts"] for c in counts if c["values"] is not None}
        keep = np.flatnonzero(pc.is_null(reasons).to_numpy(zero_copy_only=False))
        out = out.select(keep)
    return out, dict(Counter(dropped).most_common())


def convert_stream(ds, fmt: str, source: str, *, conversational: bool, input_columns: list[str], budget=None):
    """Convert an ``IterableDataset`` lazily (the reference path); dropped rows are filtered out as they come."""
    conv = Converter(fmt, source, conversational, budget)
    features = target_features(fmt, conversational)
    out = ds.map(
        conv, batched=True, with_indices=True, batch_size=256, remove_columns=input_columns or None, features=features
    )
    out = out.select_columns(list(conv.columns) + [DROP])
    return out.filter(_kept, input_columns=[DROP]).remove_columns(DROP)


def _kept(reason) -> bool:
    return reason is None
