"""Demonstration data for self-distillation (`sdft`): each row becomes a ``prompt`` the student completes on its own
and a ``privileged_context``, the demonstration the teacher (the same model) is shown beside the prompt
(TRL's ``SDFTTrainer`` columns).

==================== ================================================ ==============================================
read as (sft's)      prompt                                           privileged_context (the demonstration)
==================== ================================================ ==============================================
prompt_completion    prompt (a string or messages)                    the completion (its text)
alpaca               the Alpaca template sft uses                     output
messages, sharegpt   every turn before the last assistant turn        the last assistant turn's text
==================== ================================================ ==============================================

A conversation whose last assistant turn does not follow a user turn cannot be a prompt (TRL's teacher prompt puts
the demonstration into the last user turn): a DataError naming the record. Text rows have no demonstration: a
DataError that says what sdft reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import DataError
from .prepare import PreparedData

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

ACCEPTS = "prompt/completion, alpaca (instruction, input, output), messages or sharegpt rows"


def _text(value: Any) -> str:
    """A completion's text: a string as is, messages as the text of their contents."""
    if isinstance(value, str):
        return value
    parts = []
    for message in value or []:
        content = message.get("content", "")
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content if part.get("type") == "text")
        parts.append(str(content))
    return "\n".join(p for p in parts if p)


def demonstration_of(row: dict[str, Any], where: str) -> dict[str, Any]:
    """One sft row (prompt/completion or messages) -> {"prompt", "privileged_context"}."""
    if "messages" in row:
        messages = list(row["messages"])
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last is None or last == 0 or messages[last - 1].get("role") != "user":
            raise DataError(
                f"{where}: sdft needs a user turn right before the last assistant turn (the prompt ends with it, "
                "the assistant turn is the demonstration)"
            )
        return {"prompt": messages[:last], "privileged_context": _text([messages[last]])}
    return {"prompt": row["prompt"], "privileged_context": _text(row["completion"])}


def to_demonstrations(prepared: PreparedData) -> PreparedData:
    """sft's prepared rows -> SDFT's prompt + privileged_context rows (train and eval), in place."""
    if prepared.format == "text":
        raise DataError(f"{prepared.source}: sdft learns from a prompt and its demonstration; it reads {ACCEPTS}")

    def convert(ds, name: str):
        if ds is None:
            return None
        columns = list(ds.column_names or [])
        return ds.map(
            lambda row, i: demonstration_of(row, f"{name} row {i + 1}"), with_indices=True, remove_columns=columns
        )

    prepared.train = convert(prepared.train, prepared.source)
    prepared.eval = convert(prepared.eval, prepared.eval_source or prepared.source)
    return prepared


def prepare(cfg: RunConfig, tokenizer, options: dict[str, Any]) -> PreparedData:
    """sdft's data (its spec's `prepare`): the dataset read as sft's rows, then each as a prompt and its
    demonstration."""
    from .prepare import prepare_sft

    return to_demonstrations(prepare_sft(cfg.dataset, tokenizer, **options))
