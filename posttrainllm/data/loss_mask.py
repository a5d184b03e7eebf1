"""What the SFT loss falls on: the assistant's turns by default (decision log entry 32), masked from the tokenizer's
own template; the banner's "loss on" row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import reading
from .prepare import PreparedData

if TYPE_CHECKING:  # pragma: no cover
    pass


LOSS_SAMPLE_ROWS = 1000  # rows the banner's "loss on" share is measured on


@dataclass
class LossMask:
    """How the SFT loss is limited, for the trainer config and the banner."""

    assistant_only_loss: bool = False  # TRL masks with the template's {% generation %} markers
    completion_only_loss: bool | None = None  # None: TRL's default (completion-only for prompt/completion rows)
    description: str = ""


def _share(pairs: list[tuple[int, int]]) -> str:
    trained, total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return f"{100 * trained / total:.0f}% of tokens" if total else "no tokens measured"


def apply_loss_mask(
    prepared: PreparedData, tokenizer, *, train_on_prompt: bool = False, num_proc: int | None = None
) -> LossMask:
    """Limit the SFT loss to what the model should learn to say, and say what it falls on (measured on the first
    LOSS_SAMPLE_ROWS training rows, replay rows included).

    * conversations (`messages`, ShareGPT): the assistant's turns, every one of them; system and user turns and the
      template's role headers are masked. A template with `{% generation %}` markers (the default ChatML one has
      them) goes through TRL's `assistant_only_loss`; any other template is masked here by rendering each
      conversation prefix by prefix (`chat.AssistantSpans`), which turns the rows into `input_ids` +
      `assistant_masks`;
    * prompt/completion rows (Alpaca, conversational or not): the completion (TRL's completion-only loss);
    * text rows: every token.

    `train_on_prompt` puts the loss on every token instead (whole conversations, prompts included).
    """
    from .chat import AssistantSpans, has_generation_markers

    rows = reading.head(prepared.train, LOSS_SAMPLE_ROWS)
    cols = set(rows[0]) if rows else set()
    n = len(rows)
    if "messages" in cols:
        turns = sum(len(r["messages"]) for r in rows)
        answers = sum(1 for r in rows for m in r["messages"] if m["role"] == "assistant")
        if train_on_prompt:
            return LossMask(
                description=f"every token of the conversations (--train-on-prompt; {answers} of "
                f"{turns} turns are the assistant's)"
            )
        if has_generation_markers(tokenizer):
            pairs = []
            for r in rows:
                out = tokenizer.apply_chat_template(
                    r["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
                )
                pairs.append((sum(out["assistant_masks"]), len(out["input_ids"])))
            how = "the template's generation markers"
            mask = LossMask(assistant_only_loss=True)
        else:
            spans = AssistantSpans(tokenizer)
            prepared.train = _tokenize_conversations(prepared.train, spans, prepared.source, num_proc)
            if prepared.eval is not None:
                prepared.eval = _tokenize_conversations(
                    prepared.eval, spans, prepared.eval_source or prepared.source, num_proc
                )
            masked = reading.head(prepared.train, LOSS_SAMPLE_ROWS)  # the same rows, tokenized and masked
            pairs = [(sum(r["assistant_masks"]), len(r["input_ids"])) for r in masked]
            how = "spans found by rendering each conversation prefix by prefix"
            mask = LossMask()
        mask.description = (
            f"assistant turns ({answers} of {turns} turns, {_share(pairs)}, first {n} rows; masked with {how})"
        )
        return mask
    if {"prompt", "completion"} <= cols:
        if train_on_prompt:
            return LossMask(completion_only_loss=False, description="every token, prompts included (--train-on-prompt)")
        pairs = []
        for r in rows:
            if isinstance(r["prompt"], list):
                p = tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                full = tokenizer.apply_chat_template(r["prompt"] + r["completion"], tokenize=False)
            else:
                p, full = r["prompt"], r["prompt"] + r["completion"]
            lp, lf = (len(x) for x in tokenizer([p, full], add_special_tokens=False)["input_ids"])
            pairs.append((lf - lp, lf))
        return LossMask(description=f"completions ({_share(pairs)}, first {n} rows)")
    return LossMask(description="every token of the text")


def _tokenize_conversations(ds, spans, source: str, num_proc: int | None):
    """{"messages"} rows -> {"input_ids", "assistant_masks"} (batched map; lazily for a stream)."""

    def batch(b, idx=None):
        wheres = [f"{source}: row {i + 1}" for i in idx] if idx is not None else [source] * len(b["messages"])
        ids, masks = spans.batch(b["messages"], wheres)
        return {"input_ids": ids, "assistant_masks": masks}

    import datasets

    if isinstance(ds, datasets.Dataset):
        return ds.map(
            batch,
            batched=True,
            with_indices=True,
            remove_columns=ds.column_names,
            num_proc=reading.processes(num_proc),
            desc="masking the assistant's turns",
        )
    return ds.map(batch, batched=True, remove_columns=["messages"])
