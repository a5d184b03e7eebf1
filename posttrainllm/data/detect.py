"""Which format a dataset is in, from its columns (or its first records), for a task (sft, dpo, text)."""

from __future__ import annotations

from ..errors import DataError, UsageError
from .formats import (
    _TASK_COMMANDS,
    DPO_FORMATS,
    FORMAT_HELP,
    TASK_FORMATS,
    is_empty_record,
    is_msgs,
    is_null,
    maybe_json,
)

# ----------------------------------------------------------------------------------------------------------------
# Detection
# ----------------------------------------------------------------------------------------------------------------


def _guess_pairs(cols: set[str]) -> str | None:
    if {"chosen", "rejected"} <= cols:
        return "sharegpt_preference" if "conversations" in cols else "preference"
    return None


def _guess_sft(cols: set[str]) -> str | None:
    for fmt, needed in (
        ("messages", {"messages"}),
        ("sharegpt", {"conversations"}),
        ("prompt_completion", {"prompt", "completion"}),
        ("alpaca", {"instruction", "output"}),
        ("text", {"text"}),
    ):
        if needed <= cols:
            return fmt
    return None


def accepts(task: str) -> str:
    return ", ".join(FORMAT_HELP[f] for f in TASK_FORMATS[task])


def _record_columns(records: list[dict], limit: int = 100) -> list[str]:
    seen: dict[str, None] = {}
    for rec in records[:limit]:
        for key in rec:
            seen.setdefault(key, None)
    return list(seen)


def detect_format(records, task: str, source: str = "") -> str:
    """The format of `records` for `task` ("sft", "dpo" or "text"), from column names.

    `records` is a list of dicts (the columns are the keys of the first 100) or a ``datasets`` dataset (its
    columns). Precedence for sft: messages > conversations (sharegpt) > prompt + completion > instruction + output
    (alpaca) > text, except that chosen + rejected without a messages column is preference data. For dpo:
    chosen + rejected with conversations (sharegpt_preference) > chosen + rejected (preference). For text: a text
    column. Raises DataError for unknown columns (listing the columns found and the formats the task accepts) and
    for data that fits another command.
    """
    if task not in TASK_FORMATS:
        raise UsageError(f"unknown task {task!r}: expected one of {', '.join(TASK_FORMATS)}")
    name = source or "dataset"
    if isinstance(records, list):
        if not records:
            raise DataError(f"dataset {name} is empty: it holds no records")
        cols = _record_columns(records)
    else:
        from .reading import columns

        cols = columns(records)
    return format_from_columns(cols, task, name)


def _guess(colset: set[str], task: str) -> str | None:
    if task == "kto":
        return "unpaired" if {"completion", "label"} <= colset else _guess_pairs(colset) or _guess_sft(colset)
    if task == "dpo":
        return _guess_pairs(colset) or ("unpaired" if {"completion", "label"} <= colset else _guess_sft(colset))
    if task == "text":
        return "text" if "text" in colset else (_guess_sft(colset) or _guess_pairs(colset))
    # sft: preference data (chosen/rejected without a messages column) is reported as such
    fmt = _guess_pairs(colset) if "messages" not in colset else None
    return fmt or _guess_sft(colset)


def format_of_records(cols: list[str], rows: list[dict], task: str, name: str) -> str:
    """The format of a dataset with columns `cols` whose first records are `rows`: the format of its first record
    with a value when that one suits `task`, else the one its columns say (``format_from_columns``).

    A file that changes format part way (alpaca records, then messages ones) is taken as what it starts with, so
    that the conversion names the first record that does not fit rather than blaming record 1."""
    first = next((r for r in rows if not is_empty_record(r)), None)
    if first is not None:
        fmt = _guess({k for k, v in first.items() if not is_null(v)}, task)
        if fmt in TASK_FORMATS[task]:
            return fmt
    return format_from_columns(cols, task, name)


def format_from_columns(cols: list[str], task: str, name: str) -> str:
    fmt = _guess(set(cols), task)
    if fmt in TASK_FORMATS[task]:
        return fmt
    if fmt is None:
        raise DataError(
            f"{name}: cannot tell the format from columns {cols}; {_TASK_COMMANDS[task]} accepts: {accepts(task)}"
        )
    # The data fits another command.
    if fmt in DPO_FORMATS:
        kind, fits = "preference data", "dpo"
    elif fmt == "unpaired":
        kind, fits = "unpaired preference data", "kto"
    elif fmt == "text":
        kind, fits = "raw text", "finetune/pretrain (or sft)"
    else:
        kind, fits = "SFT data", "sft"
    needs = {
        "sft": "sft needs instruction data: " + accepts("sft"),
        "dpo": "dpo needs prompt/chosen/rejected preference pairs (or ShareGPT conversations with chosen/rejected)",
        "text": "finetune/pretrain need raw text: a 'text' column or a .txt file",
        "kto": "kto needs unpaired preference data: prompt, completion and a true/false label per row",
    }[task]
    raise DataError(f"{name}: looks like {kind} ({fmt}); {needs}. Use the {fits} command for this data")


def is_conversational(fmt: str, rows: list[dict], features=None) -> bool:
    """Whether `fmt` data converts to message lists. prompt_completion and preference data are conversational when
    a column holds message lists (by its Arrow type, or in the first rows, also as JSON-encoded strings); then the
    string values of the other rows become single user/assistant messages, so the whole set has one schema."""
    if fmt in ("messages", "sharegpt", "sharegpt_preference"):
        return True
    if fmt not in ("prompt_completion", "preference", "unpaired"):
        return False
    keys = ("prompt", "chosen", "rejected") if fmt == "preference" else ("prompt", "completion")
    if features is not None:
        import datasets

        for key in keys:
            feature = features.get(key)
            if isinstance(feature, (list, dict, datasets.Sequence, getattr(datasets, "List", tuple))):
                return True
    for row in rows:
        for key in keys:
            value = maybe_json(row.get(key))
            if isinstance(value, dict) or is_msgs(value):
                return True
    return False
