"""The vectorized conversion path: a batch whose rows need no rewriting is checked and converted with Arrow compute
(no Python object per row); `fast_batch` returns None to leave anything unusual to the per-record reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import formats as F

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


def fast_batch(table, conv, indices) -> FastBatch | None:
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
        elif pa.types.is_floating(col.type):  # NaN is no value (formats.is_null)
            blank = pc.or_(blank, pc.fill_null(pc.is_nan(col), True))
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
