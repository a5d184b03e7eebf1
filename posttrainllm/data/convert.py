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
from dataclasses import dataclass
from typing import Any

from . import formats as F
from .reading import release

DROP = "_drop"
FAST_BATCH = 10_000  # rows per vectorized pass when nothing is rewritten
MAP_BATCH = 1000  # rows per Dataset.map batch


def target_features(fmt: str, conversational: bool, with_drop: bool = True):
    import datasets

    string = datasets.Value("string")
    msgs = datasets.List({"role": string, "content": string})
    if fmt in ("messages", "sharegpt", "sharegpt_preference"):
        kind = msgs
    elif fmt in ("prompt_completion", "preference"):
        kind = msgs if conversational else string
    else:
        kind = string
    features = {c: kind for c in F.TARGET_COLUMNS[fmt]}
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
            reason = None
            if F.is_empty_record(record):
                reason = F.EMPTY_RECORD
            else:
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


# ----------------------------------------------------------------------------------------------------------------
# Vectorized paths
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class FastBatch:
    columns: dict[str, Any]  # pyarrow arrays, the trainer rows
    reasons: Any  # pyarrow string array: drop reason or null
    changed: bool  # False when the rows are the input columns unchanged


def _split_template(template: str) -> list[str]:
    head, rest = template.split("{instruction}")
    if "{input}" in rest:
        middle, tail = rest.split("{input}")
        return [head, middle, tail]
    return [head, rest]


_WITH_INPUT = _split_template(F.ALPACA_PROMPT)
_NO_INPUT = _split_template(F.ALPACA_PROMPT_NO_INPUT)
_ROLE_KEYS = list(F.ROLE_MAP)
_ROLE_VALUES = [F.ROLE_MAP[k] for k in _ROLE_KEYS]
_CANONICAL_ROLES = sorted(set(_ROLE_VALUES))
# A character that is not whitespace by Python's str.isspace (RE2's \s alone is ASCII): checked for U+0000-U+FFFF.
_NOT_SPACE = r"[^\t\n\x{0b}\f\r\x{1c}-\x{1f}\x{85}\p{Z}]"


def _column(table, name: str):
    if name not in table.column_names:
        return None
    column = table.column(name)
    return column.chunk(0) if column.num_chunks == 1 else column  # never combined: that would copy the strings


def _single(arr):
    """One Array from a possibly chunked one (copies only when there are several chunks)."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        return arr.chunk(0) if arr.num_chunks == 1 else pa.concat_arrays(arr.chunks)
    return arr


def _is_str(arr) -> bool:
    import pyarrow as pa

    return arr is not None and arr.type == pa.string()


def _absent(arr) -> bool:
    import pyarrow as pa

    return arr is None or pa.types.is_null(arr.type) or arr.null_count == len(arr)


def _blank(arr):
    """Empty or whitespace only (str.isspace's whitespace), without building trimmed copies; null stays null."""
    import pyarrow.compute as pc

    return pc.invert(pc.match_substring_regex(arr, _NOT_SPACE))


def _reasons(mask, reason: str):
    """A string array: `reason` where mask (a numpy or Arrow bool array) is true, else null."""
    import numpy as np
    import pyarrow as pa

    mask = np.asarray(mask, dtype=bool)
    return pa.array(np.where(mask, reason, None), type=pa.string()) if mask.any() else pa.nulls(len(mask), pa.string())


def _may_hold_json(arr) -> bool:
    import pyarrow.compute as pc

    start = pc.utf8_slice_codeunits(pc.utf8_ltrim_whitespace(arr), 0, 1)
    return bool(pc.any(pc.is_in(start, value_set=_pa_strings("[", "{"))).as_py())


def _pa_strings(*values):
    import pyarrow as pa

    return pa.array(list(values), type=pa.string())


def fast_batch(table, conv: Converter, indices) -> FastBatch | None:
    """The rows of `table` computed with Arrow, or None when the reference path must handle this batch."""
    fn = {
        "alpaca": _fast_alpaca,
        "messages": _fast_messages,
        "sharegpt": _fast_sharegpt,
        "prompt_completion": _fast_prompt_completion,
        "text": _fast_text,
    }.get(conv.fmt)
    if fn is None or table.num_rows == 0:
        return None
    if conv.fmt == "prompt_completion" and conv.conversational:
        return None
    fast = fn(table, conv, indices)
    if fast is not None:
        empty = _empty_records(table)
        if empty.any():  # every value null or blank: the reference's reason
            import numpy as np
            import pyarrow as pa

            reasons = np.where(empty, F.EMPTY_RECORD, np.asarray(fast.reasons.to_pylist(), dtype=object))
            fast.reasons = pa.array(reasons, type=pa.string())
    return fast


def _empty_records(table):
    """Rows whose values are all null or blank strings (what formats.is_empty_record says)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = np.ones(table.num_rows, dtype=bool)
    for name in table.column_names:
        col = _column(table, name)
        blank = pc.is_null(col)
        if col.type == pa.string():
            blank = pc.or_(blank, pc.fill_null(_blank(col), True))
        empty &= blank.to_numpy(zero_copy_only=False)
        if not empty.any():
            break
    return empty


def _fast_alpaca(table, conv, indices):
    import pyarrow as pa
    import pyarrow.compute as pc

    ins, out = _column(table, "instruction"), _column(table, "output")
    if not (_is_str(ins) and _is_str(out)) or ins.null_count or out.null_count:
        return None
    if not _absent(_column(table, "history")):
        return None
    inp, system = _column(table, "input"), _column(table, "system")
    if _absent(inp):
        inp = pa.repeat("", len(ins))
    elif not _is_str(inp):
        return None
    else:
        inp = pc.fill_null(inp, "")
    if pc.any(_blank(ins)).as_py():
        return None  # the reference path says which record has an empty instruction
    has_input = pc.invert(_blank(inp))
    prompt = pc.if_else(
        has_input,
        pc.binary_join_element_wise(_WITH_INPUT[0], ins, _WITH_INPUT[1], inp, _WITH_INPUT[2], ""),
        pc.binary_join_element_wise(_NO_INPUT[0], ins, _NO_INPUT[1], ""),
    )
    if not _absent(system):
        if not _is_str(system):
            return None
        trimmed = pc.utf8_trim_whitespace(pc.fill_null(system, ""))
        with_system = pc.binary_join_element_wise(trimmed, "\n\n", prompt, "")
        prompt = pc.if_else(pc.invert(_blank(trimmed)), with_system, prompt)
    reasons = _reasons(_blank(out).to_numpy(zero_copy_only=False), F.EMPTY_COMPLETION)
    return FastBatch({"prompt": prompt, "completion": out}, reasons, changed=True)


def _fast_text(table, conv, indices):
    text = _column(table, "text")
    if not _is_str(text) or text.null_count:
        return None
    reasons = _reasons(_blank(text).to_numpy(zero_copy_only=False), F.EMPTY_TEXT)
    return FastBatch({"text": text}, reasons, changed=False)


def _fast_prompt_completion(table, conv, indices):
    import pyarrow.compute as pc

    prompt, completion = _column(table, "prompt"), _column(table, "completion")
    if not (_is_str(prompt) and _is_str(completion)) or completion.null_count:
        return None
    if _may_hold_json(prompt) or _may_hold_json(completion):
        return None  # maybe JSON-encoded messages: the reference path decides
    changed = prompt.null_count > 0
    prompt = pc.fill_null(prompt, "")
    reasons = _reasons(_blank(completion).to_numpy(zero_copy_only=False), F.EMPTY_COMPLETION)
    return FastBatch({"prompt": prompt, "completion": completion}, reasons, changed=changed)


def _fast_messages(table, conv, indices):
    return _fast_conversation(table, conv, indices, "messages", "role", "content")


def _fast_sharegpt(table, conv, indices):
    system = _column(table, "system")
    if not _absent(system):
        import pyarrow.compute as pc

        if not _is_str(system) or not pc.all(_blank(pc.fill_null(system, ""))).as_py():
            return None  # a system column with text: the reference path adds the system message
    return _fast_conversation(table, conv, indices, "conversations", "from", "value")


def _fast_conversation(table, conv, indices, column: str, role_key: str, content_key: str):
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    col = _column(table, column)
    if col is None or not pa.types.is_list(col.type) or col.null_count:
        return None
    struct = col.type.value_type
    if not pa.types.is_struct(struct):
        return None
    names = [struct.field(i).name for i in range(struct.num_fields)]
    if role_key not in names or content_key not in names:
        return None
    if ("from" if column == "messages" else "role") in names:
        return None  # mixed role/content and from/value messages: the reference path
    if struct.field(role_key).type != pa.string() or struct.field(content_key).type != pa.string():
        return None
    n = len(col)
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    if (lengths == 0).any():
        return None
    flat = pc.list_flatten(col)
    role, content = pc.struct_field(flat, role_key), pc.struct_field(flat, content_key)
    if role.null_count:
        return None
    if pc.all(pc.is_in(role, value_set=_pa_strings(*_CANONICAL_ROLES))).as_py():
        mapped, renamed = role, False  # the usual case: nothing to map
    else:
        idx = pc.index_in(pc.utf8_lower(pc.utf8_trim_whitespace(role)), value_set=_pa_strings(*_ROLE_KEYS))
        if idx.null_count:
            return None
        mapped, renamed = pc.take(_pa_strings(*_ROLE_VALUES), idx), True
    changed = column != "messages" or set(names) != {"role", "content"} or content.null_count > 0 or renamed
    content = pc.fill_null(content, "")
    parents = np.repeat(np.arange(n), lengths)
    is_asst = pc.equal(mapped, "assistant").to_numpy(zero_copy_only=False)
    # assistant messages whose content has a non-space character (the regex stops at the first one)
    has = is_asst & pc.match_substring_regex(content, _NOT_SPACE).to_numpy(zero_copy_only=False)
    row_has = np.bincount(parents[has], minlength=n) > 0
    reasons = np.where(row_has, None, F.NO_ASSISTANT).astype(object)
    if conv.budget is not None and row_has.any():
        _budget_reasons(conv, indices, reasons, row_has, has, parents, lengths, mapped, content)
    if changed:
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = pa.StructArray.from_arrays([_single(mapped), _single(content)], names=["role", "content"])
        col = pa.ListArray.from_arrays(pa.array(offsets), values)
    return FastBatch({"messages": col}, pa.array(reasons, type=pa.string()), changed=changed)


def _budget_reasons(conv, indices, reasons, row_has, has, parents, lengths, roles, contents) -> None:
    """Mark rows whose prompt part (the messages before the first assistant message with content) fills
    --max-length; exact rendering only for rows the byte bound cannot clear."""
    import numpy as np
    import pyarrow.compute as pc

    budget = conv.budget
    n = len(lengths)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    pos = np.arange(len(parents)) - starts[parents]
    first = np.full(n, np.iinfo(np.int64).max)
    with_content = np.flatnonzero(has)  # sorted by row, then position: the first of each row is where the row changes
    rows = parents[with_content]
    leading = np.r_[True, rows[1:] != rows[:-1]] if len(rows) else np.zeros(0, dtype=bool)
    first[rows[leading]] = pos[with_content[leading]]
    in_prompt = pos < first[parents]
    nbytes = pc.binary_length(contents).to_numpy(zero_copy_only=False)
    prompt_bytes = np.bincount(parents[in_prompt], weights=nbytes[in_prompt], minlength=n)
    prompt_msgs = np.bincount(parents[in_prompt], minlength=n)
    upper = prompt_bytes + budget.base + np.maximum(prompt_msgs - 1, 0) * budget.per_message + budget.SLACK
    unclear = np.flatnonzero(row_has & (upper >= budget.max_length))
    budget.unclear += len(unclear)
    if not len(unclear):
        return
    prompts = []
    for i in unclear:
        s = int(starts[i])
        prompts.append(
            [{"role": roles[s + k].as_py(), "content": contents[s + k].as_py()} for k in range(int(first[i]))]
        )
    wheres = [F.where(conv.source, indices[i]) for i in unclear]
    for i, full in zip(unclear, budget.decide(prompts, [int(prompt_bytes[i]) for i in unclear], wheres)):
        if full:
            reasons[i] = F.TOO_LONG_PROMPT


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
        out = src.map(
            conv,
            batched=True,
            with_indices=True,
            batch_size=MAP_BATCH,
            remove_columns=ds.column_names,
            num_proc=num_proc if (num_proc or 1) > 1 else None,
            features=features,
            desc="Converting",
        ).with_format(None)
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
