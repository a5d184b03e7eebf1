"""Formats: detection from the columns (and the first rows), and the conversion of one record to a trainer row.

==================== ===================================================== ==========================================
format               columns                                               becomes
==================== ===================================================== ==========================================
alpaca               instruction, output, [input], [system], [history]     prompt (Alpaca template) / completion
messages             messages: [{role, content}]                           messages
sharegpt             conversations: [{from, value}], [system]              messages (human->user, gpt->assistant, ..)
prompt_completion    prompt, completion (strings or message lists)         prompt / completion (as is)
text                 text                                                  text (sft) or token blocks (finetune)
preference           [prompt], chosen, rejected (strings or message lists) prompt / chosen / rejected
sharegpt_preference  conversations, chosen: {from, value}, rejected: {..}  prompt (messages) / chosen / rejected
unpaired             prompt, completion, label (true: desirable)           prompt / completion / label (KTO)
==================== ===================================================== ==========================================

The per-record functions here are the reference: ``convert.py`` applies them to a dataset batch by batch (and has
vectorized Arrow paths for the common cases that give the same rows). Degenerate rows (nothing to learn from) get a
reason from ``drop_reason`` and are dropped with a count; malformed ones raise DataError naming the record.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import DataError, shorten
from .reading import json_type

SFT_FORMATS = ("alpaca", "messages", "sharegpt", "prompt_completion", "text")
DPO_FORMATS = ("preference", "sharegpt_preference")
TEXT_FORMATS = ("text",)
KTO_FORMATS = ("unpaired",)

FORMAT_HELP = {
    "alpaca": "alpaca (instruction, input, output)",
    "messages": "messages (messages: [{role, content}])",
    "sharegpt": "sharegpt (conversations: [{from, value}])",
    "prompt_completion": "prompt_completion (prompt, completion)",
    "text": "text (text)",
    "preference": "preference (prompt, chosen, rejected; or chosen, rejected conversations that include the prompt)",
    "sharegpt_preference": "sharegpt_preference (conversations: [{from, value}], chosen: {from, value}, "
    "rejected: {from, value})",
    "unpaired": "unpaired (prompt, completion, label: true for a desirable completion, false for an undesirable one)",
}
TASK_FORMATS = {"sft": SFT_FORMATS, "dpo": DPO_FORMATS, "text": TEXT_FORMATS, "kto": KTO_FORMATS}
_TASK_COMMANDS = {"sft": "sft", "dpo": "dpo", "text": "finetune/pretrain", "kto": "kto"}

# What each format turns into (for `describe`).
CONVERSION = {
    "alpaca": "prompt/completion",
    "messages": "messages",
    "sharegpt": "messages",
    "prompt_completion": "prompt/completion",
    "text": "text",
    "preference": "prompt/chosen/rejected",
    "sharegpt_preference": "prompt/chosen/rejected (messages)",
    "unpaired": "prompt/completion/label",
}
# The columns each format converts to.
TARGET_COLUMNS = {
    "alpaca": ("prompt", "completion"),
    "messages": ("messages",),
    "sharegpt": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
    "preference": ("prompt", "chosen", "rejected"),
    "sharegpt_preference": ("prompt", "chosen", "rejected"),
    "unpaired": ("prompt", "completion", "label"),
}

# Stanford Alpaca's prompt templates (https://github.com/tatsu-lab/stanford_alpaca). The completion is the `output`.
ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)

ROLE_MAP = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "chatgpt": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "observation": "tool",
    "function": "tool",
    "ipython": "tool",
}

# Reasons a row is dropped (the banner counts them).
EMPTY_RECORD = "empty record"
EMPTY_COMPLETION = "empty completion"
NO_ASSISTANT = "no assistant content"
EMPTY_TEXT = "empty text"
SAME_PAIR = "chosen equals rejected"
EMPTY_PAIR = "empty chosen or rejected"
TOO_LONG_PROMPT = "prompt fills --max-length"
NULL_TEXT = "null or NaN text"
NO_LABEL = "null label"
EMPTY_PROMPT = "empty prompt"
REASON_TEXT = {
    EMPTY_RECORD: "empty",
    EMPTY_COMPLETION: "empty completion",
    NO_ASSISTANT: "no assistant content",
    EMPTY_TEXT: "empty text",
    SAME_PAIR: "chosen = rejected",
    EMPTY_PAIR: "empty chosen/rejected",
    TOO_LONG_PROMPT: "prompt ≥ --max-length, no completion token left",
    NULL_TEXT: "null/NaN text",
    NO_LABEL: "no label",
    EMPTY_PROMPT: "empty prompt",
}
# The columns that say a record has a format's shape, and the text columns a record of it cannot do without (a null
# or NaN there makes the record degenerate: dropped and counted, never the text "nan").
SHAPE_COLUMNS = {
    "alpaca": ("instruction", "output"),
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
    "preference": ("prompt", "chosen", "rejected"),
    "sharegpt_preference": ("conversations", "chosen", "rejected"),
    "unpaired": ("completion", "label"),
}
REQUIRED_TEXT = {
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("completion",),
    "text": ("text",),
    "preference": ("chosen", "rejected"),
    "sharegpt_preference": ("chosen", "rejected"),
    "unpaired": ("completion",),
}


# ----------------------------------------------------------------------------------------------------------------
# Conversion of one record
# ----------------------------------------------------------------------------------------------------------------


def where(source: str, index: int) -> str:
    return f"{source or 'dataset'}: record {index + 1}"


def is_null(value: Any) -> bool:
    """None, or a float NaN (JSON's NaN, a NaN in a parquet float column): no value at all, never the text "nan"."""
    return value is None or (isinstance(value, float) and value != value)


class NotTextError(DataError):
    """A text column holding a value that is not a string (a number, a boolean, an object, bytes); `column` names it,
    the message names the record."""

    def __init__(self, message: str, column: str):
        super().__init__(message)
        self.column = column

    def __reduce__(self):  # raised in a Dataset.map worker process: pickled with its column
        return type(self), (str(self), self.column)


def _not_text(where: str, key: str, value: Any) -> NotTextError:
    how = (
        "a binary column: cast it to string (e.g. pyarrow: table.cast(...) with pa.string()) and save the file again"
        if isinstance(value, (bytes, bytearray))
        else "quote it in the file if it is meant as text"
    )
    found = f"{json_type(value)} {shorten(repr(value), 40)}"
    return NotTextError(f"{where}: '{key}' must be a string, found {found} ({how})", key)


def maybe_json(value: Any) -> Any:
    if isinstance(value, str) and value.lstrip().startswith(("[", "{")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _content(value: Any, where: str) -> str:
    if is_null(value):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type", "text") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    raise DataError(f"{where}: message content must be a string, found {json_type(value)}")


def _message(msg: Any, where: str) -> dict:
    if not isinstance(msg, dict):
        raise DataError(f"{where}: each message must be an object with role/content, found {json_type(msg)}")
    # Arrow gives every message all the keys seen in the column (absent ones are None).
    if msg.get("role") is not None or ("role" in msg and msg.get("from") is None):
        role, content = msg.get("role"), msg.get("content")
    elif "from" in msg:
        role, content = msg.get("from"), msg.get("value")
    else:
        raise DataError(f"{where}: a message has keys {list(msg)}; expected role/content (or from/value)")
    mapped = ROLE_MAP.get(str(role).strip().lower())
    if mapped is None:
        raise DataError(
            f"{where}: unknown role {role!r}; expected system, user, assistant, tool "
            "(or ShareGPT's human, gpt, observation)"
        )
    return {"role": mapped, "content": _content(content, where)}


def _messages(value: Any, where: str, column: str) -> list[dict]:
    value = maybe_json(value)
    if not isinstance(value, list):
        raise DataError(f"{where}: '{column}' must be a list of messages, found {json_type(value)}")
    if not value:
        raise DataError(f"{where}: '{column}' is an empty list of messages")
    return [_message(m, where) for m in value]


def _string(record: dict, key: str, where: str, required: bool = True) -> str:
    value = record.get(key)
    if is_null(value):
        if required:
            raise DataError(f"{where}: '{key}' is missing or null")
        return ""
    if not isinstance(value, str):
        raise _not_text(where, key, value)
    return value


def _alpaca(record: dict, where: str) -> dict:
    instruction = _string(record, "instruction", where)
    inp = _string(record, "input", where, required=False)
    output = _string(record, "output", where)
    if not instruction.strip():
        raise DataError(f"{where}: 'instruction' is empty")
    prompt = (ALPACA_PROMPT if inp.strip() else ALPACA_PROMPT_NO_INPUT).format(instruction=instruction, input=inp)
    # LLaMA-Factory's optional alpaca columns: a system line and earlier [instruction, output] turns.
    history = maybe_json(record.get("history"))
    if history:
        pair = (list, tuple)
        if not isinstance(history, list) or not all(
            isinstance(t, pair) and len(t) == 2 and all(isinstance(x, str) for x in t) for t in history
        ):
            raise DataError(f"{where}: 'history' must be a list of [instruction, output] pairs of strings")
        turns = "".join(f"### Instruction:\n{q}\n\n### Response:\n{a}\n\n" for q, a in history)
        head, sep, tail = prompt.partition("### Instruction:\n")
        prompt = head + turns + sep + tail
    system = record.get("system")
    if isinstance(system, str) and system.strip():
        prompt = system.strip() + "\n\n" + prompt
    return {"prompt": prompt, "completion": output}


def _sharegpt(record: dict, where: str) -> dict:
    messages = _messages(record.get("conversations"), where, "conversations")
    system = record.get("system")
    if isinstance(system, str) and system.strip() and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}] + messages
    return {"messages": messages}


def is_msgs(value: Any) -> bool:
    value = maybe_json(value)
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def _as_messages(value, record: dict, key: str, role: str, where: str) -> list[dict]:
    """`value` (record[key]) as messages: a message list as it is, a plain string as one message of `role`."""
    return _messages(value, where, key) if is_msgs(value) else [{"role": role, "content": _string(record, key, where)}]


def _prompt_completion(record: dict, where: str) -> dict:
    prompt, completion = maybe_json(record.get("prompt")), maybe_json(record.get("completion"))
    if is_msgs(prompt) or is_msgs(completion):
        # Conversational: a plain string on one side becomes a single user / assistant message.
        p = _as_messages(prompt, record, "prompt", "user", where)
        c = _as_messages(completion, record, "completion", "assistant", where)
        return {"prompt": p, "completion": c}
    return {
        "prompt": _string(record, "prompt", where, required=False),
        "completion": _string(record, "completion", where),
    }


def _text(record: dict, where: str) -> dict:
    return {"text": _string(record, "text", where)}


def _common_prefix_len(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _preference(record: dict, where: str) -> dict:
    chosen, rejected = maybe_json(record.get("chosen")), maybe_json(record.get("rejected"))
    prompt = maybe_json(record.get("prompt"))
    if isinstance(chosen, dict) or isinstance(rejected, dict):  # {from, value} / {role, content} single messages
        chosen = [chosen] if isinstance(chosen, dict) else chosen
        rejected = [rejected] if isinstance(rejected, dict) else rejected
    conversational = is_msgs(chosen) or is_msgs(rejected) or is_msgs(prompt)
    if not conversational:
        c = _string(record, "chosen", where)
        r = _string(record, "rejected", where)
        if not is_null(prompt):
            return {"prompt": _string(record, "prompt", where), "chosen": c, "rejected": r}
        # Implicit prompt: the shared beginning of chosen and rejected, cut at a whitespace boundary.
        n = _common_prefix_len(list(c), list(r))
        while n > 0 and not c[n - 1].isspace():
            n -= 1
        return {"prompt": c[:n], "chosen": c[n:], "rejected": r[n:]}
    c = _as_messages(chosen, record, "chosen", "assistant", where)
    r = _as_messages(rejected, record, "rejected", "assistant", where)
    if is_msgs(prompt):
        return {"prompt": _messages(prompt, where, "prompt"), "chosen": c, "rejected": r}
    # chosen/rejected are full conversations: the shared leading messages are the prompt.
    n = _common_prefix_len(c, r)
    n = min(n, len(c) - 1, len(r) - 1)  # leave at least one message on each side
    if n > 0:
        return {"prompt": c[:n], "chosen": c[n:], "rejected": r[n:]}
    if isinstance(prompt, str) and prompt.strip():
        return {"prompt": [{"role": "user", "content": prompt}], "chosen": c, "rejected": r}
    raise DataError(
        f"{where}: chosen and rejected share no prompt messages and there is no 'prompt' column; "
        "add a prompt, or put the user turn(s) at the start of both conversations"
    )


def _sharegpt_preference(record: dict, where: str) -> dict:
    prompt = _messages(record.get("conversations"), where, "conversations")
    system = record.get("system")
    if isinstance(system, str) and system.strip() and prompt[0]["role"] != "system":
        prompt = [{"role": "system", "content": system}] + prompt
    out = {"prompt": prompt}
    for key in ("chosen", "rejected"):
        value = maybe_json(record.get(key))
        if isinstance(value, dict):
            msgs = [_message(value, where)]
        elif isinstance(value, list):
            msgs = _messages(value, where, key)
        elif isinstance(value, str):
            msgs = [{"role": "assistant", "content": value}]
        else:
            raise DataError(f"{where}: '{key}' must be a {{from, value}} message, found {json_type(value)}")
        out[key] = msgs
    return out


_LABELS = {"true": True, "false": False, "1": True, "0": False}


def _unpaired(record: dict, where: str) -> dict:
    """KTO's unpaired row: a prompt/completion (strings or messages) and whether the completion is desirable. The
    label is a boolean, 0/1, or the text true/false/1/0 (CSV); anything else is an error naming the record."""
    label = record.get("label")
    if isinstance(label, str) and label.strip().lower() in _LABELS:
        label = _LABELS[label.strip().lower()]
    elif isinstance(label, (int, float)) and not isinstance(label, bool) and label in (0, 1):
        label = bool(label)
    if not isinstance(label, bool):
        found = f"{json_type(label)} {shorten(repr(label), 40)}"
        raise DataError(f"{where}: 'label' must be true (desirable) or false (undesirable), found {found}")
    return {**_prompt_completion(record, where), "label": label}


CONVERTERS = {
    "alpaca": _alpaca,
    "messages": lambda rec, where: {"messages": _messages(rec.get("messages"), where, "messages")},
    "sharegpt": _sharegpt,
    "prompt_completion": _prompt_completion,
    "text": _text,
    "preference": _preference,
    "sharegpt_preference": _sharegpt_preference,
    "unpaired": _unpaired,
}
_ROLES_FOR = {"prompt": "user", "completion": "assistant", "chosen": "assistant", "rejected": "assistant"}


_PLAIN_OR_MESSAGES = ("prompt_completion", "preference", "unpaired")  # strings or message lists, one kind per set


def unify(row: dict, fmt: str, conversational: bool, where: str) -> dict:
    """One schema for the whole set: in conversational prompt_completion / preference data, string values become
    single user/assistant messages; plain-string data must not hold message lists."""
    if fmt not in _PLAIN_OR_MESSAGES:
        return row
    keys = [k for k in ("prompt", "completion", "chosen", "rejected") if k in row]
    if conversational:
        for k in keys:
            if isinstance(row[k], str):
                row[k] = [{"role": _ROLES_FOR[k], "content": row[k]}]
        if "prompt" in row and not row["prompt"]:  # TRL looks at message 0 of the prompt
            raise DataError(f"{where}: the prompt is empty")
    elif any(isinstance(row[k], list) for k in keys):
        raise DataError(
            f"{where}: holds message lists, but the first records of the dataset hold plain strings; "
            "use one kind for the whole dataset"
        )
    return row


def convert_record(record: dict, fmt: str, conversational: bool, where: str) -> dict:
    return unify(CONVERTERS[fmt](record, where), fmt, conversational, where)


def convert_records(records: list[dict], fmt: str, source: str = "") -> list[dict]:
    """Convert records of format `fmt` to trainer rows (for a few records; datasets go through
    ``convert.convert_dataset``). Raises DataError naming the record. Rows with message lists and rows with strings
    are not mixed: when some rows are conversational, the string rows are turned into single user/assistant
    messages so that the whole set has one Arrow schema."""
    convert = CONVERTERS[fmt]
    rows = [convert(rec, where(source, i)) for i, rec in enumerate(records)]
    if fmt in _PLAIN_OR_MESSAGES and rows:
        keys = [k for k in ("prompt", "completion", "chosen", "rejected") if k in rows[0]]
        conversational = any(isinstance(row[k], list) for row in rows for k in keys)
        rows = [unify(row, fmt, conversational, where(source, i)) for i, row in enumerate(rows)]
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Degenerate rows
# ----------------------------------------------------------------------------------------------------------------


def is_empty_record(record: dict) -> bool:
    """Every value missing, null or a blank string (a blank CSV row, a `{}` line)."""
    return all(is_null(v) or (isinstance(v, str) and not v.strip()) for v in record.values())


def null_reason(record: dict, fmt: str, where: str) -> str | None:
    """NULL_TEXT when a text column the format needs is null or NaN (a degenerate row), else None.

    A record with none of the format's columns (e.g. a preference pair in alpaca data) does not fit the dataset's
    format: a DataError naming it, not a dropped row."""
    if all(is_null(record.get(k)) for k in SHAPE_COLUMNS[fmt]):
        found = [k for k, v in record.items() if not is_null(v)]
        raise DataError(
            f"{where}: does not fit the dataset's format {fmt} ({', '.join(SHAPE_COLUMNS[fmt])}), which the records "
            f"before it have: it holds {found}; use one format for the whole file (or split it into one file per "
            "format)"
        )
    if any(is_null(record.get(k)) for k in REQUIRED_TEXT.get(fmt, ())):
        return NULL_TEXT
    return NO_LABEL if fmt == "unpaired" and is_null(record.get("label")) else None


def _has_text(value) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return any(m["content"].strip() for m in value)


def has_assistant_content(messages: list[dict]) -> bool:
    return any(m["role"] == "assistant" and m["content"].strip() for m in messages)


def drop_reason(row: dict, fmt: str) -> str | None:
    """Why a converted row teaches nothing (None when it is fine)."""
    if fmt in ("messages", "sharegpt"):
        return None if has_assistant_content(row["messages"]) else NO_ASSISTANT
    if fmt in ("alpaca", "prompt_completion", "unpaired"):
        completion = row["completion"]
        if isinstance(completion, list):
            return None if has_assistant_content(completion) else NO_ASSISTANT
        return None if completion.strip() else EMPTY_COMPLETION
    if fmt == "text":
        return None if row["text"].strip() else EMPTY_TEXT
    # preference data
    if not _has_text(row["chosen"]) or not _has_text(row["rejected"]):
        return EMPTY_PAIR
    if row["chosen"] == row["rejected"]:
        return SAME_PAIR
    return None


def placeholder(fmt: str, conversational: bool) -> dict:
    """A row of the right schema for a dropped record (removed before the data reaches a trainer)."""
    if fmt in ("messages", "sharegpt"):
        return {"messages": []}
    empty: Any = [] if conversational else ""
    row = {k: ([] if fmt == "sharegpt_preference" else empty) for k in TARGET_COLUMNS[fmt]}
    return {**row, "label": False} if fmt == "unpaired" else row
