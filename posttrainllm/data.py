"""Reading datasets and converting them to the shapes the trainers accept.

Three jobs, one per command family:

* ``prepare_sft``  (``sft``): records -> TRL ``SFTTrainer`` rows: ``{"prompt", "completion"}`` (strings or message
  lists; the loss falls on the completion only, TRL's default for this shape), ``{"messages"}`` (loss on the whole
  conversation unless the trainer asks for ``assistant_only_loss``) or ``{"text"}``.
* ``prepare_dpo``  (``dpo``): records -> TRL ``DPOTrainer`` rows with an explicit prompt:
  ``{"prompt", "chosen", "rejected"}``, all strings or all message lists.
* ``prepare_text`` (``finetune``/``pretrain``): raw text -> fixed-length token blocks ``{"input_ids", "labels"}`` for
  transformers' ``Trainer``.

Accepted files: ``.json`` (a list of objects, an object holding one list of objects, or JSON Lines saved as .json),
``.jsonl``, ``.csv``, ``.parquet``, ``.txt`` (one record holding the whole file), a folder written by
``Dataset.save_to_disk`` (or a folder of data files), or a Hugging Face Hub dataset id (``owner/name`` or ``name``).

Formats (detected from the column names and value types of the records, see ``detect_format``):

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
==================== ===================================================== ==========================================

Importing this module is cheap: ``datasets``, ``transformers`` and ``pyarrow`` are imported inside the functions.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DataError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import datasets

__all__ = [
    "SFT_FORMATS",
    "DPO_FORMATS",
    "TEXT_FORMATS",
    "DEFAULT_CHAT_TEMPLATE",
    "ALPACA_PROMPT",
    "ALPACA_PROMPT_NO_INPUT",
    "PreparedData",
    "read_records",
    "detect_format",
    "convert_records",
    "ensure_chat_template",
    "prepare_sft",
    "prepare_dpo",
    "prepare_text",
    "describe",
    "mix_replay",
]

SFT_FORMATS = ("alpaca", "messages", "sharegpt", "prompt_completion", "text")
DPO_FORMATS = ("preference", "sharegpt_preference")
TEXT_FORMATS = ("text",)

_FORMAT_HELP = {
    "alpaca": "alpaca (instruction, input, output)",
    "messages": "messages (messages: [{role, content}])",
    "sharegpt": "sharegpt (conversations: [{from, value}])",
    "prompt_completion": "prompt_completion (prompt, completion)",
    "text": "text (text)",
    "preference": "preference (prompt, chosen, rejected; or chosen, rejected conversations that include the prompt)",
    "sharegpt_preference": "sharegpt_preference (conversations: [{from, value}], chosen: {from, value}, "
    "rejected: {from, value})",
}
_TASK_FORMATS = {"sft": SFT_FORMATS, "dpo": DPO_FORMATS, "text": TEXT_FORMATS}
_TASK_COMMANDS = {"sft": "sft", "dpo": "dpo", "text": "finetune/pretrain"}

# What each format turns into (for `describe`).
_CONVERSION = {
    "alpaca": "prompt/completion",
    "messages": "messages",
    "sharegpt": "messages",
    "prompt_completion": "prompt/completion",
    "text": "text",
    "preference": "prompt/chosen/rejected",
    "sharegpt_preference": "prompt/chosen/rejected (messages)",
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

# ChatML layout (as used by Qwen/OpenAI): every message is
#     <|im_start|>{role}\n{content}<|im_end|>\n
# and `add_generation_prompt=True` appends `<|im_start|>assistant\n`. Differences from plain ChatML:
#   * an assistant turn is followed by the tokenizer's eos token (when it has one) right after `<|im_end|>`, so a
#     model trained on it learns to stop with the default generation settings (the ChatML markers are ordinary
#     text for a tokenizer that does not have them as special tokens, so `<|im_end|>` alone would not stop it);
#   * no default system prompt, no tool-call rendering, no BOS token, no `{% generation %}` markers.
# The prompt rendered with `add_generation_prompt=True` is a prefix of the full conversation rendered without it,
# which is what TRL's prompt/completion and preference tokenisation relies on.
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' -}}"
    "{%- if message['role'] == 'assistant' and eos_token is defined and eos_token -%}{{- eos_token -}}{%- endif -%}"
    "{{- '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)

_ROLE_MAP = {
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

# Column names of the known formats: a JSON object holding one of them is one record, not a wrapper of records.
_RECORD_KEYS = {
    "messages", "conversations", "prompt", "completion", "chosen", "rejected", "instruction", "output", "text",
}

_DATA_SUFFIXES = {".json", ".jsonl", ".csv", ".parquet", ".txt"}
# Names that look like a file (any short alphanumeric extension) are never treated as a Hub id.
_FILE_LIKE = re.compile(r"\.(json|jsonl|ndjson|csv|tsv|parquet|txt|arrow|gz|zip|bz2|xz|zst|md|text)$", re.I)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")


@dataclass
class PreparedData:
    """A dataset ready for a trainer, plus what the banner and the run record need."""

    train: "datasets.Dataset"
    eval: "datasets.Dataset | None"
    format: str  # detected format (one of SFT_FORMATS / DPO_FORMATS / TEXT_FORMATS)
    n_train: int
    n_eval: int
    source: str
    template_note: str | None = None  # set when the default chat template was put on the tokenizer
    eval_source: str | None = None
    n_tokens: int | None = None  # prepare_text: tokens in the train+eval blocks
    block_size: int | None = None  # prepare_text: max_length of the blocks


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------


def _looks_like_hub_id(source: str) -> bool:
    if os.sep in source.replace("/", "") or (os.altsep and os.altsep in source.replace("/", "")):
        return False
    if source.startswith((".", "/", "~")) or _FILE_LIKE.search(source):
        return False
    return bool(_HUB_ID.match(source))


def read_records(source: str, split: str = "train") -> list[dict]:
    """Read a dataset into a list of dicts (see the module docstring for what is accepted).

    Raises UsageError ("dataset not found: PATH") for a local path that does not exist and DataError for a file
    that cannot be read, is malformed (with the line number) or holds no records.
    """
    source = str(source)
    if not source.strip():
        raise UsageError("dataset path is empty: pass a file (.json, .jsonl, .csv, .parquet, .txt) or a Hub id")
    path = Path(source).expanduser()
    if path.is_dir():
        records = _read_dir(path, source, split)
    elif path.exists():
        records = _read_file(path, source)
    elif _looks_like_hub_id(source):
        records = _read_hub(source, split)
    else:
        raise UsageError(
            f"dataset not found: {source} (no such file; pass an existing .json/.jsonl/.csv/.parquet/.txt file, "
            "a folder, or a Hugging Face Hub id like owner/name)"
        )
    if not records:
        raise DataError(f"dataset {source} is empty: it holds no records")
    return records


def _read_text(path: Path, source: str) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {source}: {e.strerror or _one_line(e)}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{source} is not a UTF-8 text file (undecodable byte 0x{raw[e.start]:02x} at offset {e.start}); "
            "save it as UTF-8 text, or use .parquet for binary data"
        ) from None
    if "\x00" in text:
        raise DataError(f"{source} is not a UTF-8 text file (it contains NUL bytes); is it a binary file?")
    return text


def _read_file(path: Path, source: str) -> list[dict]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path, source)
    if suffix not in _DATA_SUFFIXES:
        raise DataError(
            f"{source}: unsupported file type {suffix or '(no extension)'!r}; "
            "use .json, .jsonl, .csv, .parquet or .txt"
        )
    text = _read_text(path, source)
    if not text.strip():
        raise DataError(f"dataset {source} is empty")
    if suffix == ".txt":
        return [{"text": text}]
    if suffix == ".jsonl":
        return _parse_jsonl(text, source)
    if suffix == ".csv":
        return _parse_csv(text, source)
    return _parse_json(text, source)


def _parse_jsonl(text: str, source: str) -> list[dict]:
    records = []
    # split on "\n" only: str.splitlines() would also split on U+2028 etc., which JSON allows inside strings
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{source}: line {lineno} is not valid JSON ({e.msg} at column {e.colno}); "
                "each line of a .jsonl file must be one JSON object"
            ) from None
        if not isinstance(obj, dict):
            raise DataError(
                f"{source}: line {lineno} is a JSON {_json_type(obj)}, not an object; "
                "each line of a .jsonl file must be one JSON object like {\"instruction\": ..., \"output\": ...}"
            )
        records.append(obj)
    return records


def _parse_json(text: str, source: str) -> list[dict]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # JSON Lines saved as .json: the first line is a complete object and more lines follow.
        if e.msg == "Extra data":
            first = text.lstrip().split("\n", 1)[0]
            try:
                first_ok = isinstance(json.loads(first), dict)
            except json.JSONDecodeError:
                first_ok = False
            if first_ok:
                return _parse_jsonl(text, source)
        raise DataError(
            f"{source}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}; "
            "fix the file (a .json file must hold a list of objects, or use .jsonl with one object per line)"
        ) from None
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
        raise DataError(f"{source}: expected a JSON list of objects, found a JSON {_json_type(data)}")
    for i, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise DataError(
                f"{source}: record {i} is a JSON {_json_type(item)}, not an object; "
                "the list must hold objects like {\"instruction\": ..., \"output\": ...}"
            )
    return data


def _parse_csv(text: str, source: str) -> list[dict]:
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long cells (default limit: 128 KiB)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    records = []
    try:
        for row in reader:
            if None in row:  # more cells than header columns
                raise DataError(
                    f"{source}: line {reader.line_num} has more cells than the header has columns "
                    f"({len(reader.fieldnames or [])}); quote cells that contain commas"
                )
            if all(v in (None, "") for v in row.values()):
                continue
            records.append({k: ("" if v is None else v) for k, v in row.items()})
    except csv.Error as e:
        raise DataError(f"{source}: line {reader.line_num}: malformed CSV ({e})") from None
    if reader.fieldnames and any(not (f or "").strip() for f in reader.fieldnames):
        raise DataError(f"{source}: the CSV header has an empty column name: {reader.fieldnames}")
    return records


def _read_parquet(path: Path, source: str) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for non-parquet files
        raise DataError(f"{source} is not a readable Parquet file ({type(e).__name__}: {_one_line(e)})") from None
    return table.to_pylist()


def _read_dir(path: Path, source: str, split: str) -> list[dict]:
    import datasets

    try:
        if any((path / name).exists() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise UsageError(f"{source}: no split {split!r} in the saved dataset (splits: {list(ds)})")
                ds = ds[split]
        else:
            ds = datasets.load_dataset(str(path), split=split)
    except (UsageError, DataError):
        raise
    except Exception as e:
        raise DataError(f"cannot load the dataset folder {source}: {type(e).__name__}: {_one_line(e)}") from None
    return ds.to_list()


def _read_hub(source: str, split: str) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(source, split=split)
    except FileNotFoundError as e:  # DatasetNotFoundError derives from it
        raise UsageError(
            f"dataset not found: {source} (no such local file, and not found on the Hugging Face Hub: {_one_line(e)})"
        ) from None
    except ValueError as e:
        if "split" in str(e).lower():
            raise UsageError(f"dataset {source}: {_one_line(e)}") from None
        raise DataError(f"cannot load dataset {source} from the Hugging Face Hub: {_one_line(e)}") from None
    except Exception as e:
        raise DataError(
            f"{source} is not a local file, and loading it from the Hugging Face Hub failed "
            f"({type(e).__name__}: {_one_line(e)}); check the path, or the network / HF_HUB_OFFLINE"
        ) from None
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):  # split=None
        ds = ds[split]
    if isinstance(ds, datasets.IterableDataset):
        return list(ds)
    return ds.to_list()


def _one_line(error: BaseException) -> str:
    """An exception's text on one line (messages for people are one line)."""
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _json_type(obj: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(obj), "number" if isinstance(obj, (int, float)) else type(obj).__name__
    )


# ----------------------------------------------------------------------------------------------------------------
# Format detection
# ----------------------------------------------------------------------------------------------------------------


def _columns(records: list[dict], limit: int = 100) -> list[str]:
    seen: dict[str, None] = {}
    for rec in records[:limit]:
        for key in rec:
            seen.setdefault(key, None)
    return list(seen)


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


def _accepts(task: str) -> str:
    return ", ".join(_FORMAT_HELP[f] for f in _TASK_FORMATS[task])


def detect_format(records: list[dict], task: str, source: str = "") -> str:
    """The format of `records` for `task` ("sft", "dpo" or "text"), from column names (and the shape of values).

    Precedence for sft: messages > conversations (sharegpt) > prompt + completion > instruction + output
    (alpaca) > text, except that chosen + rejected without a messages column is preference data. For dpo:
    chosen + rejected with conversations (sharegpt_preference) > chosen + rejected (preference). For text: a
    text column. Raises DataError for unknown columns (listing the
    columns found and the formats the task accepts) and for data that fits another command.
    """
    if task not in _TASK_FORMATS:
        raise UsageError(f"unknown task {task!r}: expected one of {', '.join(_TASK_FORMATS)}")
    name = source or "dataset"
    if not records:
        raise DataError(f"dataset {name} is empty: it holds no records")
    cols = _columns(records)
    colset = set(cols)
    if task == "dpo":
        fmt = _guess_pairs(colset) or _guess_sft(colset)
    elif task == "text":
        fmt = "text" if "text" in colset else (_guess_sft(colset) or _guess_pairs(colset))
    else:  # sft: preference data (chosen/rejected without a messages column) is reported as such
        fmt = _guess_pairs(colset) if "messages" not in colset else None
        fmt = fmt or _guess_sft(colset)
    if fmt in _TASK_FORMATS[task]:
        return fmt
    if fmt is None:
        raise DataError(
            f"{name}: cannot tell the format from columns {cols}; {_TASK_COMMANDS[task]} accepts: {_accepts(task)}"
        )
    # The data fits another command.
    if fmt in DPO_FORMATS:
        kind, fits = "preference data", "dpo"
    elif fmt == "text":
        kind, fits = "raw text", "finetune/pretrain (or sft)"
    else:
        kind, fits = "SFT data", "sft"
    needs = {
        "sft": "sft needs instruction data: " + _accepts("sft"),
        "dpo": "dpo needs prompt/chosen/rejected preference pairs (or ShareGPT conversations with chosen/rejected)",
        "text": "finetune/pretrain need raw text: a 'text' column or a .txt file",
    }[task]
    raise DataError(f"{name}: looks like {kind} ({fmt}); {needs}. Use the {fits} command for this data")


# ----------------------------------------------------------------------------------------------------------------
# Conversion
# ----------------------------------------------------------------------------------------------------------------


def _where(source: str, index: int) -> str:
    return f"{source or 'dataset'}: record {index + 1}"


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str) and value.lstrip().startswith(("[", "{")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _content(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type", "text") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    raise DataError(f"{where}: message content must be a string, found {_json_type(value)}")


def _message(msg: Any, where: str) -> dict:
    if not isinstance(msg, dict):
        raise DataError(f"{where}: each message must be an object with role/content, found {_json_type(msg)}")
    if "role" in msg:
        role, content = msg.get("role"), msg.get("content")
    elif "from" in msg:
        role, content = msg.get("from"), msg.get("value")
    else:
        raise DataError(f"{where}: a message has keys {list(msg)}; expected role/content (or from/value)")
    mapped = _ROLE_MAP.get(str(role).strip().lower())
    if mapped is None:
        raise DataError(
            f"{where}: unknown role {role!r}; expected system, user, assistant, tool "
            "(or ShareGPT's human, gpt, observation)"
        )
    return {"role": mapped, "content": _content(content, where)}


def _messages(value: Any, where: str, column: str) -> list[dict]:
    value = _maybe_json(value)
    if not isinstance(value, list):
        raise DataError(f"{where}: '{column}' must be a list of messages, found {_json_type(value)}")
    if not value:
        raise DataError(f"{where}: '{column}' is an empty list of messages")
    return [_message(m, where) for m in value]


def _string(record: dict, key: str, where: str, required: bool = True) -> str:
    value = record.get(key)
    if value is None:
        if required:
            raise DataError(f"{where}: '{key}' is missing or null")
        return ""
    if not isinstance(value, str):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise DataError(f"{where}: '{key}' must be a string, found {_json_type(value)}")
    return value


def _alpaca(record: dict, where: str) -> dict:
    instruction = _string(record, "instruction", where)
    inp = _string(record, "input", where, required=False)
    output = _string(record, "output", where)
    if not instruction.strip():
        raise DataError(f"{where}: 'instruction' is empty")
    prompt = (ALPACA_PROMPT if inp.strip() else ALPACA_PROMPT_NO_INPUT).format(instruction=instruction, input=inp)
    # LLaMA-Factory's optional alpaca columns: a system line and earlier [instruction, output] turns.
    history = _maybe_json(record.get("history"))
    if history:
        if not isinstance(history, list) or not all(isinstance(t, (list, tuple)) and len(t) == 2 for t in history):
            raise DataError(f"{where}: 'history' must be a list of [instruction, output] pairs")
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


def _is_msgs(value: Any) -> bool:
    value = _maybe_json(value)
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def _prompt_completion(record: dict, where: str) -> dict:
    prompt, completion = _maybe_json(record.get("prompt")), _maybe_json(record.get("completion"))
    if _is_msgs(prompt) or _is_msgs(completion):
        # Conversational: a plain string on one side becomes a single user / assistant message.
        p = _messages(prompt, where, "prompt") if _is_msgs(prompt) else [
            {"role": "user", "content": _string(record, "prompt", where)}
        ]
        c = _messages(completion, where, "completion") if _is_msgs(completion) else [
            {"role": "assistant", "content": _string(record, "completion", where)}
        ]
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
    chosen, rejected = _maybe_json(record.get("chosen")), _maybe_json(record.get("rejected"))
    prompt = _maybe_json(record.get("prompt"))
    if isinstance(chosen, dict) or isinstance(rejected, dict):  # {from, value} / {role, content} single messages
        chosen = [chosen] if isinstance(chosen, dict) else chosen
        rejected = [rejected] if isinstance(rejected, dict) else rejected
    conversational = _is_msgs(chosen) or _is_msgs(rejected) or _is_msgs(prompt)
    if not conversational:
        c = _string(record, "chosen", where)
        r = _string(record, "rejected", where)
        if prompt is not None:
            return {"prompt": _string(record, "prompt", where), "chosen": c, "rejected": r}
        # Implicit prompt: the shared beginning of chosen and rejected, cut at a whitespace boundary.
        n = _common_prefix_len(list(c), list(r))
        while n > 0 and not c[n - 1].isspace():
            n -= 1
        return {"prompt": c[:n], "chosen": c[n:], "rejected": r[n:]}
    c = _messages(chosen, where, "chosen") if _is_msgs(chosen) else [
        {"role": "assistant", "content": _string(record, "chosen", where)}
    ]
    r = _messages(rejected, where, "rejected") if _is_msgs(rejected) else [
        {"role": "assistant", "content": _string(record, "rejected", where)}
    ]
    if _is_msgs(prompt):
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
        value = _maybe_json(record.get(key))
        if isinstance(value, dict):
            msgs = [_message(value, where)]
        elif isinstance(value, list):
            msgs = _messages(value, where, key)
        elif isinstance(value, str):
            msgs = [{"role": "assistant", "content": value}]
        else:
            raise DataError(f"{where}: '{key}' must be a {{from, value}} message, found {_json_type(value)}")
        out[key] = msgs
    return out


_CONVERTERS = {
    "alpaca": _alpaca,
    "messages": lambda rec, where: {"messages": _messages(rec.get("messages"), where, "messages")},
    "sharegpt": _sharegpt,
    "prompt_completion": _prompt_completion,
    "text": _text,
    "preference": _preference,
    "sharegpt_preference": _sharegpt_preference,
}


def convert_records(records: list[dict], fmt: str, source: str = "") -> list[dict]:
    """Convert records of format `fmt` to trainer rows (see the module docstring). Raises DataError naming the
    record. Rows with message lists and rows with strings are not mixed: when some rows are conversational, the
    string rows are turned into single user/assistant messages so that the whole set has one Arrow schema."""
    convert = _CONVERTERS[fmt]
    rows = [convert(rec, _where(source, i)) for i, rec in enumerate(records)]
    if fmt in ("prompt_completion", "preference") and rows:
        keys = [k for k in ("prompt", "completion", "chosen", "rejected") if k in rows[0]]
        if any(isinstance(row[k], list) for row in rows for k in keys):
            roles = {"prompt": "user", "completion": "assistant", "chosen": "assistant", "rejected": "assistant"}
            for row in rows:
                for k in keys:
                    if isinstance(row[k], str):
                        row[k] = [{"role": roles[k], "content": row[k]}]
            # An empty prompt list is not accepted by TRL (it looks at message 0).
            for i, row in enumerate(rows):
                if "prompt" in row and not row["prompt"]:
                    raise DataError(f"{_where(source, i)}: the prompt is empty")
    return rows


def _is_conversational_rows(rows: list[dict]) -> bool:
    row = rows[0]
    return any(isinstance(row.get(k), list) for k in ("messages", "prompt", "completion", "chosen", "rejected"))


def ensure_chat_template(tokenizer: Any) -> str | None:
    """Put DEFAULT_CHAT_TEMPLATE on a tokenizer that has no chat template; return a note saying so (else None)."""
    if tokenizer is None or getattr(tokenizer, "chat_template", None):
        return None
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return (
        "no chat template in tokenizer: applied the default ChatML template (posttrainllm.data.DEFAULT_CHAT_TEMPLATE)"
    )


# ----------------------------------------------------------------------------------------------------------------
# Preparing
# ----------------------------------------------------------------------------------------------------------------


def _check_args(eval_split: float, eval_source: str | None, max_samples: int | None) -> None:
    if not isinstance(eval_split, (int, float)) or isinstance(eval_split, bool) or not 0.0 <= eval_split < 1.0:
        raise UsageError(f"eval_split must be in [0, 1), got {eval_split!r}")
    if eval_split > 0 and eval_source:
        raise UsageError("give either eval_split or an eval dataset, not both")
    bad_int = not isinstance(max_samples, int) or isinstance(max_samples, bool)
    if max_samples is not None and (bad_int or max_samples < 1):
        raise UsageError(f"max_samples must be a positive integer, got {max_samples!r}")


def _split_indices(n: int, eval_split: float, source: str, unit: str = "rows") -> int:
    """How many of n items go to eval (0 when eval_split is 0)."""
    if eval_split <= 0:
        return 0
    if n < 2:
        raise DataError(
            f"dataset {source} has {n} {unit[:-1] if n == 1 else unit}: too few to split off an eval set "
            f"(eval_split={eval_split}); add data, or set eval_split to 0"
        )
    return min(n - 1, max(1, round(n * eval_split)))


def _split_rows(rows: list[dict], eval_split: float, seed: int, source: str) -> tuple[list[dict], list[dict]]:
    """Deterministic split: shuffle the indices with `seed`, the last fraction goes to eval; both parts keep the
    original file order."""
    n_eval = _split_indices(len(rows), eval_split, source)
    if n_eval == 0:
        return rows, []
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    train_idx, eval_idx = sorted(order[: len(rows) - n_eval]), sorted(order[len(rows) - n_eval :])
    return [rows[i] for i in train_idx], [rows[i] for i in eval_idx]


def _shape(rows: list[dict]) -> tuple:
    return tuple(sorted(rows[0])), _is_conversational_rows(rows)


def _load_rows(source: str, task: str, max_samples: int | None) -> tuple[list[dict], str]:
    records = read_records(source)
    fmt = detect_format(records, task, source)
    if max_samples is not None:
        records = records[:max_samples]
    return convert_records(records, fmt, source), fmt


def _prepare_pairs(task: str, source, tokenizer, eval_split, eval_source, seed, max_samples) -> PreparedData:
    import datasets

    _check_args(eval_split, eval_source, max_samples)
    source = str(source)
    rows, fmt = _load_rows(source, task, max_samples)
    if eval_source:
        eval_source = str(eval_source)
        eval_rows, eval_fmt = _load_rows(eval_source, task, None)
        if _shape(eval_rows) != _shape(rows):
            what = lambda s: "/".join(s[0]) + (" (messages)" if s[1] else " (strings)")  # noqa: E731
            raise DataError(
                f"eval data {eval_source} ({eval_fmt}) converts to {what(_shape(eval_rows))}, but the train data "
                f"{source} ({fmt}) to {what(_shape(rows))}; use the same kind of data for both"
            )
        train_rows = rows
    else:
        train_rows, eval_rows = _split_rows(rows, eval_split, seed, source)
    note = ensure_chat_template(tokenizer) if _is_conversational_rows(rows) else None
    train = datasets.Dataset.from_list(train_rows)
    eval_ds = datasets.Dataset.from_list(eval_rows) if eval_rows else None
    return PreparedData(
        train=train,
        eval=eval_ds,
        format=fmt,
        n_train=len(train_rows),
        n_eval=len(eval_rows),
        source=source,
        template_note=note,
        eval_source=eval_source or None,
    )


def prepare_sft(
    source,
    tokenizer,
    *,
    eval_split: float = 0.0,
    eval_source: str | None = None,
    seed: int = 42,
    max_samples: int | None = None,
) -> PreparedData:
    """Read `source` and convert it to SFTTrainer rows.

    alpaca -> {"prompt": Alpaca template, "completion": output}; messages -> {"messages"}; sharegpt -> {"messages"}
    (human/user -> user, gpt/assistant/model -> assistant, system -> system); prompt_completion -> as is;
    text -> {"text"}. Conversational rows need a chat template: a tokenizer without one gets DEFAULT_CHAT_TEMPLATE
    and `template_note` says so. `max_samples` keeps the first N records (before the eval split). `eval_split`
    splits deterministically (seeded shuffle, last fraction to eval, at least one eval row); `eval_source` reads a
    separate eval dataset instead (same kind of data).
    """
    return _prepare_pairs("sft", source, tokenizer, eval_split, eval_source, seed, max_samples)


def prepare_dpo(
    source,
    tokenizer,
    *,
    eval_split: float = 0.0,
    eval_source: str | None = None,
    seed: int = 42,
    max_samples: int | None = None,
) -> PreparedData:
    """Read `source` and convert it to DPOTrainer rows with an explicit prompt: {"prompt", "chosen", "rejected"}.

    preference: strings or message lists as they are; without a "prompt" column the shared leading messages of
    chosen and rejected become the prompt (for strings: their shared beginning, cut at whitespace).
    sharegpt_preference: prompt = conversations as messages, chosen/rejected = [{"role": "assistant", ...}].
    Same chat-template rule, max_samples and eval options as `prepare_sft`.
    """
    return _prepare_pairs("dpo", source, tokenizer, eval_split, eval_source, seed, max_samples)


def _text_blocks(source: str, tokenizer, max_length: int) -> tuple[list[list[int]], int]:
    records = read_records(source)
    detect_format(records, "text", source)
    texts = []
    for i, rec in enumerate(records):
        value = rec.get("text")
        if value is None:
            continue
        if not isinstance(value, str):
            raise DataError(f"{_where(source, i)}: 'text' must be a string, found {_json_type(value)}")
        if value.strip():
            texts.append(value)
    eos = getattr(tokenizer, "eos_token_id", None)
    ids: list[int] = []
    batch = 256
    for start in range(0, len(texts), batch):
        encoded = tokenizer(texts[start : start + batch], verbose=False)["input_ids"]
        for doc in encoded:
            ids.extend(doc)
            if eos is not None and (not doc or doc[-1] != eos):
                ids.append(eos)
    n_blocks = len(ids) // max_length
    if n_blocks == 0:
        raise DataError(
            f"{source}: the text has {len(ids)} tokens, fewer than one block of max_length={max_length}; "
            "use more text or a smaller max_length"
        )
    blocks = [ids[i * max_length : (i + 1) * max_length] for i in range(n_blocks)]
    return blocks, len(ids)


def prepare_text(
    source,
    tokenizer,
    *,
    max_length: int,
    eval_split: float = 0.0,
    eval_source: str | None = None,
    seed: int = 42,
    max_samples: int | None = None,
) -> PreparedData:
    """Tokenize raw text into consecutive blocks of exactly `max_length` tokens for causal-LM training.

    Every document (a record's "text"; a .txt file is one document) is tokenized with the tokenizer's own special
    tokens (e.g. a leading BOS) and followed by the eos token when the tokenizer has one; all documents are
    concatenated into one stream and cut into blocks. The trailing remainder shorter than `max_length` is dropped,
    so every block is full and no padding is needed. Rows are {"input_ids", "labels"} with labels == input_ids:
    use transformers' `default_data_collator` (DataCollatorForLanguageModeling(mlm=False) also works but sets the
    labels of pad tokens to -100, which hides the eos tokens when pad_token == eos_token).

    `eval_split` takes the LAST fraction of the blocks (contiguous, not shuffled, so eval text does not neighbour
    train text); `max_samples` keeps the first N blocks (before the split); `seed` is unused (kept for symmetry).
    A text shorter than one block raises DataError with the token count.
    """
    import datasets

    _check_args(eval_split, eval_source, max_samples)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise UsageError(f"max_length must be an integer >= 2, got {max_length!r}")
    if tokenizer is None:
        raise UsageError("prepare_text needs a tokenizer")
    source = str(source)
    blocks, n_tokens = _text_blocks(source, tokenizer, max_length)
    if max_samples is not None:
        blocks = blocks[:max_samples]
    if eval_source:
        eval_source = str(eval_source)
        eval_blocks, n_eval_tokens = _text_blocks(eval_source, tokenizer, max_length)
        train_blocks = blocks
    else:
        n_eval = _split_indices(len(blocks), eval_split, source, unit="blocks")
        train_blocks, eval_blocks = blocks[: len(blocks) - n_eval], blocks[len(blocks) - n_eval :]

    def to_ds(bl: list[list[int]]):
        return datasets.Dataset.from_dict({"input_ids": bl, "labels": [list(b) for b in bl]})

    return PreparedData(
        train=to_ds(train_blocks),
        eval=to_ds(eval_blocks) if eval_blocks else None,
        format="text",
        n_train=len(train_blocks),
        n_eval=len(eval_blocks),
        source=source,
        template_note=None,
        eval_source=eval_source or None,
        n_tokens=(len(train_blocks) + len(eval_blocks)) * max_length,
        block_size=max_length,
    )


def _short(source: str) -> str:
    path = Path(source)
    return path.name if path.exists() else source


def describe(prepared: PreparedData) -> str:
    """One line for the banner, e.g. "alpaca_en_demo.json · alpaca → prompt/completion · 900 train / 99 eval"."""
    if prepared.block_size:
        conversion = f"{prepared.block_size}-token blocks"
    else:
        conversion = _CONVERSION.get(prepared.format, prepared.format)
        if prepared.format == "prompt_completion" and prepared.train is not None and len(prepared.train):
            if isinstance(prepared.train[0].get("prompt"), list):
                conversion += " (messages)"
    counts = f"{prepared.n_train} train"
    if prepared.n_eval:
        counts += f" / {prepared.n_eval} eval"
        if prepared.eval_source:
            counts += f" (from {_short(prepared.eval_source)})"
    else:
        counts += ", no eval"
    return f"{_short(prepared.source)} · {prepared.format} → {conversion} · {counts}"


# ----------------------------------------------------------------------------------------------------------------
# Replay
# ----------------------------------------------------------------------------------------------------------------


def _chunks(text: str, chunk_chars: int) -> list[str]:
    """Split text into pieces of at most ~chunk_chars characters at line boundaries (long lines are cut)."""
    out, cur, size = [], [], 0
    for line in text.splitlines(keepends=True):
        while len(line) > chunk_chars:
            if cur:
                out.append("".join(cur))
                cur, size = [], 0
            out.append(line[:chunk_chars])
            line = line[chunk_chars:]
        if size + len(line) > chunk_chars and cur:
            out.append("".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += len(line)
    if cur:
        out.append("".join(cur))
    return [c for c in out if c.strip()]


def mix_replay(train, replay_texts_dataset, ratio: float, seed: int, *, chunk_chars: int = 2000):
    """Mix general-text "replay" rows into an SFT train set so that a fraction `ratio` of the rows are replay rows
    (against forgetting). The replay texts (a Dataset with a "text" column, or a list of strings) are cut into
    chunks of at most `chunk_chars` characters at line boundaries; chunks are drawn in a seeded order (repeated if
    more are needed) and the mixed set is shuffled with `seed`.

    A replay row takes the shape of the train rows, so that TRL sees one schema and puts the loss on the chunk:
      * prompt/completion strings -> {"prompt": "", "completion": chunk} (completion-only loss = the whole chunk);
      * prompt/completion messages -> {"prompt": [user ""], "completion": [assistant chunk]};
      * messages -> {"messages": [{"role": "assistant", "content": chunk}]} (the chat markers are trained too);
      * text -> {"text": chunk}.
    `ratio` 0 returns `train` unchanged; the number of replay rows is round(ratio * n / (1 - ratio)), at least 1.
    """
    import datasets

    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0.0 <= ratio < 1.0:
        raise UsageError(f"replay ratio must be in [0, 1), got {ratio!r}")
    if ratio == 0 or len(train) == 0:
        return train
    if isinstance(replay_texts_dataset, datasets.Dataset):
        if "text" not in replay_texts_dataset.column_names:
            raise DataError(
                f"the replay dataset needs a 'text' column; it has {replay_texts_dataset.column_names}"
            )
        texts = replay_texts_dataset["text"]
    else:
        texts = list(replay_texts_dataset)
    chunks = [c for t in texts if isinstance(t, str) for c in _chunks(t, chunk_chars)]
    if not chunks:
        raise DataError("the replay dataset holds no text")

    cols = set(train.column_names)
    first = train[0]
    if {"prompt", "completion"} <= cols and isinstance(first["prompt"], list):

        def make(c):
            return {"prompt": [{"role": "user", "content": ""}], "completion": [{"role": "assistant", "content": c}]}

    elif {"prompt", "completion"} <= cols:

        def make(c):
            return {"prompt": "", "completion": c}

    elif "messages" in cols:

        def make(c):
            return {"messages": [{"role": "assistant", "content": c}]}

    elif "text" in cols:

        def make(c):
            return {"text": c}

    else:
        raise DataError(f"cannot mix replay text into an SFT set with columns {train.column_names}")

    n = len(train)
    k = max(1, round(ratio * n / (1.0 - ratio)))
    order = list(range(len(chunks)))
    random.Random(seed).shuffle(order)
    picked = [chunks[order[i % len(order)]] for i in range(k)]
    rows = []
    for c in picked:
        row = make(c)
        rows.append({col: row.get(col) for col in train.column_names})
    replay = datasets.Dataset.from_list(rows, features=train.features)
    return datasets.concatenate_datasets([train, replay]).shuffle(seed=seed).flatten_indices()
