"""SFT completion loss: the mean NLL of the completion tokens of an instruction set, scored in chunks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from posttrainllm.errors import DataError
from posttrainllm.evaluate.scoring import _check_batch_size, _check_max_length, _EvalMode, _model_device, _row_nll_sum


def _alpaca_to_prompt_completion(ex: Mapping, where: str) -> tuple[Any, Any]:
    """Alpaca record -> (prompt, completion), exactly as SFT training builds it (posttrainllm.data.convert_records,
    which also handles the optional 'system' and 'history' columns)."""
    from posttrainllm.data import convert_records

    row = convert_records([dict(ex)], "alpaca", where)[0]
    return row["prompt"], row["completion"]


# --------------------------------------------------------------------------------------------------- helpers


def _conversation(ex: Mapping, where: str) -> list[dict] | None:
    """The conversation an example holds, as sft reads it: `messages`, ShareGPT `conversations`, or prompt and
    completion as message lists (the prompt's turns, then the completion's); None for string examples."""
    from posttrainllm.data import convert_records

    if "messages" in ex or "conversations" in ex:
        return convert_records([dict(ex)], "messages" if "messages" in ex else "sharegpt", where)[0]["messages"]
    if isinstance(ex.get("prompt"), list) or isinstance(ex.get("completion"), list):
        row = convert_records([dict(ex)], "prompt_completion", where)[0]
        return list(row["prompt"]) + list(row["completion"])
    return None


def _example_prompt_completion(ex: Mapping, where: str) -> tuple[str, str]:
    if "prompt" in ex and "completion" in ex:
        prompt, completion = ex["prompt"], ex["completion"]
    elif "instruction" in ex and "output" in ex:
        prompt, completion = _alpaca_to_prompt_completion(ex, where)
    else:
        raise DataError(
            f"{where}: needs 'prompt' and 'completion', Alpaca 'instruction'/'input'/'output', or a conversation "
            f"('messages' or ShareGPT 'conversations'); has keys {sorted(map(str, ex))}"
        )
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise DataError(f"{where}: prompt and completion must both be strings or both be message lists")
    return prompt, completion


def _sft_token_rows(
    tokenizer, examples: Sequence[Mapping], max_length: int, start: int = 0
) -> list[tuple[list[int], list[int]]]:
    """(input_ids, scored mask) per example, truncated to max_length: a string example's completion (and EOS), a
    conversation's assistant turns (the template's end-of-turn tokens included), as sft's loss falls on them."""
    from posttrainllm.data import ensure_chat_template
    from posttrainllm.data.chat import AssistantSpans

    eos = getattr(tokenizer, "eos_token_id", None)
    rows: list[tuple[list[int], list[int]]] = []
    chats: list[tuple[int, list[dict], str]] = []  # (row, conversation, where): rendered together below
    for i, ex in enumerate(examples, start=start):
        where = f"SFT example {i + 1}"
        if not isinstance(ex, Mapping):
            raise DataError(f"{where}: expected an object, got {type(ex).__name__}")
        conversation = _conversation(ex, where)
        if conversation is not None:
            chats.append((len(rows), conversation, where))
            rows.append(([], []))
            continue
        prompt, completion = _example_prompt_completion(ex, where)
        prompt_ids = list(tokenizer(prompt, add_special_tokens=True, verbose=False)["input_ids"])
        completion_ids = list(tokenizer(completion, add_special_tokens=False, verbose=False)["input_ids"])
        if eos is not None:
            completion_ids.append(int(eos))
        ids = prompt_ids + completion_ids
        rows.append((ids[:max_length], ([0] * len(prompt_ids) + [1] * len(completion_ids))[:max_length]))
    if chats:
        ensure_chat_template(tokenizer)  # as sft does for a tokenizer without one (its default ChatML template)
        ids, masks = AssistantSpans(tokenizer).batch([c for _, c, _ in chats], [w for _, _, w in chats])
        for (r, _, _), row_ids, mask in zip(chats, ids, masks):
            rows[r] = (list(row_ids)[:max_length], list(mask)[:max_length])
    return rows


_SFT_CHUNK = 4096  # examples tokenized and scored at a time (memory follows the chunk, not the dataset)


def _in_chunks(examples, size: int):
    chunk = []
    for ex in examples:
        chunk.append(ex)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def sft_completion_loss(model, tokenizer, examples, max_length: int, *, batch_size: int = 8, progress=None) -> dict:
    """Mean NLL over completion tokens only (prompt tokens masked), like the SFT training loss.

    Each example is tokenized as ``tokenizer(prompt)`` (with the tokenizer's own special tokens, e.g. BOS)
    + ``tokenizer(completion, add_special_tokens=False)`` + EOS (if the tokenizer has one), then truncated
    to ``max_length`` tokens (from the right: a completion cut away is simply not scored). Examples are
    ``{"prompt", "completion"}`` or Alpaca ``{"instruction", "input", "output"}``; a conversation (``messages``,
    ShareGPT ``conversations``, or prompt and completion as message lists) is rendered with the tokenizer's chat
    template (the default ChatML one when it has none, as sft gives it) and scored on the assistant's turns, as sft
    trains on them (``data.chat.AssistantSpans``). A list, or any iterable of them (e.g. a ``datasets.Dataset``),
    read in chunks of 4096.
    Returns ``{"loss", "completion_tokens", "examples"}``. ``progress(advance)`` counts examples.
    """
    import torch

    max_length = _check_max_length(max_length)
    batch_size = _check_batch_size(batch_size)
    if isinstance(examples, (str, bytes, Mapping)):
        raise DataError("SFT examples must be a list of objects")
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    pad = 0 if pad is None else int(pad)
    device = _model_device(model)

    nll_sum = 0.0
    counted = 0
    n_examples = 0
    with _EvalMode(model):
        for chunk in _in_chunks(examples, _SFT_CHUNK):
            rows = _sft_token_rows(tokenizer, chunk, max_length, start=n_examples)
            n_examples += len(rows)
            # Sort by length so batches carry little padding (the result does not depend on the order).
            order = sorted(range(len(rows)), key=lambda k: len(rows[k][0]))
            for b0 in range(0, len(order), batch_size):
                idx = order[b0 : b0 + batch_size]
                batch_rows = [rows[k] for k in idx if any(rows[k][1][1:]) and len(rows[k][0]) >= 2]
                if batch_rows:
                    width = max(len(ids) for ids, _ in batch_rows)
                    input_ids = torch.full((len(batch_rows), width), pad, dtype=torch.long)
                    attention = torch.zeros((len(batch_rows), width), dtype=torch.long)
                    labels = torch.full((len(batch_rows), width), -100, dtype=torch.long)
                    for r, (ids, mask) in enumerate(batch_rows):
                        t = torch.tensor(ids, dtype=torch.long)
                        input_ids[r, : len(ids)] = t
                        attention[r, : len(ids)] = 1
                        labels[r, : len(ids)] = torch.where(torch.tensor(mask, dtype=torch.bool), t, -100)
                    input_ids, attention, labels = input_ids.to(device), attention.to(device), labels.to(device)
                    logits = model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits
                    for r in range(len(batch_rows)):
                        s, c = _row_nll_sum(logits[r, :-1], labels[r, 1:])
                        nll_sum += s
                        counted += c
                    del logits
                if progress is not None:
                    progress(len(idx))

    if counted == 0:
        raise DataError(
            f"no completion tokens to score in {n_examples} SFT example(s) "
            f"(empty data, or prompts fill max_length={max_length})"
        )
    return {"loss": nll_sum / counted, "completion_tokens": counted, "examples": n_examples}
