"""Preparing a command's data: read, detect, convert (or tokenize into blocks), drop degenerate rows, split off an
eval set; the result (`PreparedData`) carries what the banner and the run record show."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError, UsageError
from . import convert, reading, text
from .chat import CompletionBudget, ensure_chat_template
from .detect import detect_format, format_of_records, is_conversational
from .formats import CONVERSION, REASON_TEXT, TARGET_COLUMNS

if TYPE_CHECKING:  # pragma: no cover
    import datasets

STREAM_SHUFFLE_BUFFER = 1000  # rows (or blocks) held by a stream's shuffle buffer


@dataclass
class PreparedData:
    """A dataset ready for a trainer, plus what the banner and the run record need."""

    train: datasets.Dataset | datasets.IterableDataset
    eval: datasets.Dataset | None
    format: str  # detected format (one of SFT_FORMATS / DPO_FORMATS / TEXT_FORMATS)
    n_train: int | None  # None for a stream
    n_eval: int
    source: str
    template_note: str | None = None  # set when the default chat template was put on the tokenizer
    eval_source: str | None = None
    block_size: int | None = None  # prepare_text: max_length of the blocks
    dropped: dict[str, int] = field(default_factory=dict)  # degenerate rows dropped, by reason (train + eval)
    conversational: bool = False  # rows are message lists
    streaming: bool = False
    loss: Any = None  # sft: the LossMask of apply_loss_mask (what the loss falls on)
    desirable: int | None = None  # prepare_kto: train rows labelled true (None for a stream)
    self_replay: Any = None  # --self-replay: the samples mixed in (posttrainllm/data/self_replay.py's SelfReplay)


def _check_args(eval_split: float, eval_source: str | None, max_samples: int | None) -> None:
    if not isinstance(eval_split, (int, float)) or isinstance(eval_split, bool) or not 0.0 <= eval_split < 1.0:
        raise UsageError(f"eval_split must be in [0, 1), got {eval_split!r}")
    if eval_split > 0 and eval_source:
        raise UsageError("give either eval_split or an eval dataset, not both")
    bad_int = not isinstance(max_samples, int) or isinstance(max_samples, bool)
    if max_samples is not None and (bad_int or max_samples < 1):
        raise UsageError(f"max_samples must be a positive integer, got {max_samples!r}")


def _split_count(n: int, eval_split: float, source: str, unit: str = "rows") -> int:
    """How many of n items go to eval (0 when eval_split is 0)."""
    if eval_split <= 0:
        return 0
    if n < 2:
        raise DataError(
            f"dataset {source} has {n} {unit[:-1] if n == 1 else unit}: too few to split off an eval set "
            f"(eval_split={eval_split}); add data, or set eval_split to 0"
        )
    return min(n - 1, max(1, round(n * eval_split)))


def _stream_eval_count(eval_split: float, stream_rows: int | None) -> int:
    """Eval rows taken from the head of a stream: the fraction eval_split of what training reads plus them."""
    if eval_split <= 0:
        return 0
    if not stream_rows:
        raise UsageError("a streamed dataset has no length: eval_split needs the number of rows training reads")
    return max(1, round(eval_split * stream_rows / (1.0 - eval_split)))


def _random_split(ds, eval_split: float, seed: int, source: str):
    """Deterministic split: a seeded permutation, its last fraction to eval; both parts keep the file order."""
    import numpy as np

    n = ds.num_rows
    n_eval = _split_count(n, eval_split, source)
    if n_eval == 0:
        return ds, None
    order = np.random.default_rng(seed).permutation(n)
    return ds.select(np.sort(order[: n - n_eval])), ds.select(np.sort(order[n - n_eval :]))


def _head_dataset(stream, n: int, features):
    """The first n rows of a stream as a small in-memory Dataset (an eval set taken from the head)."""
    import datasets

    return datasets.Dataset.from_list(list(stream.take(n)), features=features)


def _what(columns: tuple, conversational: bool) -> str:
    return "/".join(sorted(columns)) + (" (messages)" if conversational else " (strings)")


def _no_rows_left(source: str, n: int, dropped: dict[str, int]) -> DataError:
    reasons = ", ".join(f"{count} {REASON_TEXT.get(r, r)}" for r, count in dropped.items())
    return DataError(f"{source}: nothing left to train on: all {n} rows were dropped ({reasons}); fix the data")


def _merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@dataclass
class _Part:
    ds: Any
    fmt: str
    conversational: bool
    dropped: dict[str, int]
    note: str | None


def _convert_source(task, source, tokenizer, *, max_samples, max_length, num_proc, streaming) -> _Part:
    ds = reading.load(source, streaming=streaming)
    rows = reading.head(ds)
    cols = reading.columns(ds, rows)
    fmt = format_of_records(cols, rows, task, source)
    if max_samples is not None:
        ds = ds.take(max_samples) if streaming else ds.select(range(min(max_samples, ds.num_rows)))
    conversational = is_conversational(fmt, rows, getattr(ds, "features", None))
    note = ensure_chat_template(tokenizer) if conversational else None
    budget = None
    if task == "sft" and conversational and max_length and tokenizer is not None:
        budget = CompletionBudget(tokenizer, max_length)
    if streaming:
        out = convert.convert_stream(ds, fmt, source, conversational=conversational, input_columns=cols, budget=budget)
        return _Part(out, fmt, conversational, {}, note)
    out, dropped = convert.convert_dataset(
        ds, fmt, source, conversational=conversational, budget=budget, num_proc=num_proc
    )
    if out.num_rows == 0:
        raise _no_rows_left(source, ds.num_rows, dropped)
    return _Part(out, fmt, conversational, dropped, note)


def _prepare_pairs(
    task: str,
    source,
    tokenizer,
    eval_split,
    eval_source,
    seed,
    split_seed,
    max_samples,
    max_length,
    num_proc,
    streaming,
    stream_rows,
) -> PreparedData:
    _check_args(eval_split, eval_source, max_samples)
    source = str(source)
    eval_source = str(eval_source) if eval_source else None
    with reading.progress_bars(source, eval_source, streaming=streaming):
        part = _convert_source(
            task,
            source,
            tokenizer,
            max_samples=max_samples,
            max_length=max_length,
            num_proc=num_proc,
            streaming=streaming,
        )
        dropped = part.dropped
        if eval_source:
            ev = _convert_source(
                task,
                eval_source,
                tokenizer,
                max_samples=None,
                max_length=max_length,
                num_proc=num_proc,
                streaming=False,
            )
            if (TARGET_COLUMNS[ev.fmt], ev.conversational) != (TARGET_COLUMNS[part.fmt], part.conversational):
                raise DataError(
                    f"eval data {eval_source} ({ev.fmt}) converts to "
                    f"{_what(TARGET_COLUMNS[ev.fmt], ev.conversational)}, but the train data {source} ({part.fmt}) "
                    f"to {_what(TARGET_COLUMNS[part.fmt], part.conversational)}; use the same kind of data for both"
                )
            train, eval_ds = part.ds, ev.ds
            dropped = _merge(dropped, ev.dropped)
        elif streaming:
            n_eval = _stream_eval_count(eval_split, stream_rows)
            features = convert.target_features(part.fmt, part.conversational, with_drop=False)
            eval_ds = _head_dataset(part.ds, n_eval, features) if n_eval else None
            train = part.ds.skip(n_eval) if n_eval else part.ds
        else:
            train, eval_ds = _random_split(part.ds, eval_split, split_seed, source)
        if streaming:
            train = train.shuffle(seed=seed, buffer_size=STREAM_SHUFFLE_BUFFER)
    return PreparedData(
        train=train,
        eval=eval_ds,
        format=part.fmt,
        n_train=None if streaming else train.num_rows,
        n_eval=eval_ds.num_rows if eval_ds is not None else 0,
        source=source,
        template_note=part.note,
        eval_source=eval_source,
        dropped=dropped,
        conversational=part.conversational,
        streaming=streaming,
    )


def prepare_sft(
    source,
    tokenizer,
    *,
    eval_split: float = 0.0,
    eval_source: str | None = None,
    seed: int = 42,
    split_seed: int = 0,
    max_samples: int | None = None,
    max_length: int | None = None,
    num_proc: int | None = None,
    streaming: bool = False,
    stream_rows: int | None = None,
) -> PreparedData:
    """Read `source` and convert it to SFTTrainer rows.

    alpaca -> {"prompt": Alpaca template, "completion": output}; messages -> {"messages"}; sharegpt -> {"messages"}
    (human/user -> user, gpt/assistant/model -> assistant, system -> system); prompt_completion -> as is;
    text -> {"text"}. Conversational rows need a chat template: a tokenizer without one gets DEFAULT_CHAT_TEMPLATE
    and `template_note` says so. Rows that teach nothing are dropped and counted in `dropped`: no assistant content,
    an empty completion or text, an empty record, and (conversational rows, when `max_length` is given) a prompt
    that fills `max_length` tokens so that no completion token survives truncation. `max_samples` keeps the first
    N records (before the eval split). `eval_split` splits deterministically (a permutation seeded by `split_seed`,
    not by `seed`, so that runs of several seeds share one eval set; last fraction to eval, at least one eval
    row); `eval_source` reads a separate eval dataset instead (same kind of data). `num_proc`: processes for the
    conversion. `streaming`: the train rows are an IterableDataset converted as it is read (shuffled through a
    buffer); an eval_split then takes the first eval_split / (1 - eval_split) × `stream_rows` rows (the rows
    training reads) from the head of the stream.
    """
    return _prepare_pairs(
        "sft",
        source,
        tokenizer,
        eval_split,
        eval_source,
        seed,
        split_seed,
        max_samples,
        max_length,
        num_proc,
        streaming,
        stream_rows,
    )


def prepare_dpo(
    source,
    tokenizer,
    *,
    eval_split: float = 0.0,
    eval_source: str | None = None,
    seed: int = 42,
    split_seed: int = 0,
    max_samples: int | None = None,
    num_proc: int | None = None,
    streaming: bool = False,
    stream_rows: int | None = None,
) -> PreparedData:
    """Read `source` and convert it to DPOTrainer rows with an explicit prompt: {"prompt", "chosen", "rejected"}.

    preference: strings or message lists as they are; without a "prompt" column the shared leading messages of
    chosen and rejected become the prompt (for strings: their shared beginning, cut at whitespace).
    sharegpt_preference: prompt = conversations as messages, chosen/rejected = [{"role": "assistant", ...}].
    Pairs whose chosen equals rejected, or whose chosen or rejected is empty, are dropped and counted.
    Same chat-template rule, max_samples, eval, num_proc and streaming options as `prepare_sft`.
    """
    return _prepare_pairs("dpo", source, tokenizer, eval_split, eval_source, seed, split_seed, max_samples, None,
        num_proc, streaming, stream_rows)  # fmt: skip


def prepare_kto(
    source,
    tokenizer,
    *,
    eval_split: float = 0.0,
    eval_source: str | None = None,
    seed: int = 42,
    split_seed: int = 0,
    max_samples: int | None = None,
    num_proc: int | None = None,
    streaming: bool = False,
    stream_rows: int | None = None,
) -> PreparedData:
    """Read `source` and convert it to KTOTrainer rows: {"prompt", "completion", "label"} (strings or message lists;
    label True for a desirable completion). Rows with an empty completion, a null text or a null label are dropped
    and counted; `desirable` counts the train rows labelled True. Options as `prepare_dpo`."""
    prepared = _prepare_pairs("kto", source, tokenizer, eval_split, eval_source, seed, split_seed, max_samples, None,
        num_proc, streaming, stream_rows)  # fmt: skip
    if not streaming:
        prepared.desirable = sum(1 for label in prepared.train["label"] if label)
    return prepared


def label_note(prepared: PreparedData) -> str | None:
    """The banner's warning when every KTO train row has the same label. TRL trains on it (desirable-only or
    undesirable-only KTO), but the run then learns no contrast between good and bad completions."""
    n, good = prepared.n_train, prepared.desirable
    if good is None or not n or 0 < good < n:
        return None
    which, other = ("true (desirable)", "false") if good == n else ("false (undesirable)", "true")
    return (
        f"every training row of {_short(prepared.source)} has label {which}: KTO then only moves those completions "
        f"against the reference, with no {other} rows to contrast; add rows labelled {other} for a preference signal"
    )


def _text_blocks(source: str, tokenizer, max_length: int, num_proc, streaming: bool):
    """(blocks, tokens in the text) for a dataset; a stream's token count is unknown (None)."""
    ds = text.load_texts(source, streaming=streaming)
    tokenized = text.tokenize(ds, tokenizer, source, num_proc)
    prefix = text.block_prefix(tokenizer)
    if streaming:
        return text.blocks_stream(tokenized, max_length, prefix), None
    n_tokens = text.count_tokens(tokenized)
    blocks = text.group(tokenized, max_length, n_tokens, prefix)
    if blocks.num_rows == 0:
        raise DataError(
            f"{source}: the text has {n_tokens} tokens, fewer than one block of max_length={max_length}; "
            "use more text or a smaller max_length"
        )
    return blocks, n_tokens


def prepare_text(
    source,
    tokenizer,
    *,
    max_length: int,
    eval_split: float = 0.0,
    eval_source: str | None = None,
    seed: int = 42,
    split_seed: int = 0,
    max_samples: int | None = None,
    num_proc: int | None = None,
    streaming: bool = False,
    stream_rows: int | None = None,
) -> PreparedData:
    """Tokenize raw text into consecutive blocks of exactly `max_length` tokens for causal-LM training.

    Every document (a record's "text"; a .txt file is one document) is tokenized with the tokenizer's own special
    tokens (e.g. a leading BOS) and followed by the eos token when the tokenizer has one; all documents are
    concatenated into one stream and cut into blocks (a batched map for the tokenization, with `num_proc`
    processes, then an ordered grouping pass; both cached by datasets). The trailing remainder shorter than
    `max_length` is dropped, so every block is full and no padding is needed. Rows are {"input_ids", "labels"} with
    labels == input_ids: use transformers' `default_data_collator` (DataCollatorForLanguageModeling(mlm=False) also
    works but sets the labels of pad tokens to -100, which hides the eos tokens when pad_token == eos_token).

    `eval_split` takes the LAST fraction of the blocks (contiguous, not shuffled, so eval text does not neighbour
    train text; `split_seed` is not used: nothing is drawn); `max_samples` keeps the first N blocks (before the
    split); `seed` only seeds a stream's shuffle buffer. A text shorter than one block raises DataError with the
    token count. `streaming`: blocks are made as the text is read; an eval_split then takes the first
    eval_split / (1 - eval_split) × `stream_rows` blocks.
    """
    _check_args(eval_split, eval_source, max_samples)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise UsageError(f"max_length must be an integer >= 2, got {max_length!r}")
    if tokenizer is None:
        raise UsageError("prepare_text needs a tokenizer")
    source = str(source)
    eval_source = str(eval_source) if eval_source else None
    with reading.progress_bars(source, eval_source, streaming=streaming):
        blocks, _ = _text_blocks(source, tokenizer, max_length, num_proc, streaming)
        if max_samples is not None:
            blocks = blocks.take(max_samples) if streaming else blocks.select(range(min(max_samples, blocks.num_rows)))
        if eval_source:
            eval_blocks, _ = _text_blocks(eval_source, tokenizer, max_length, num_proc, False)
            train_blocks = blocks
        elif streaming:
            n_eval = _stream_eval_count(eval_split, stream_rows)
            eval_blocks = _head_dataset(blocks, n_eval, text.block_features()) if n_eval else None
            train_blocks = blocks.skip(n_eval) if n_eval else blocks
        else:
            n = blocks.num_rows
            n_eval = _split_count(n, eval_split, source, unit="blocks")
            train_blocks = blocks.select(range(n - n_eval))
            eval_blocks = blocks.select(range(n - n_eval, n)) if n_eval else None
        if streaming:
            train_blocks = train_blocks.shuffle(seed=seed, buffer_size=STREAM_SHUFFLE_BUFFER)
    n_train = None if streaming else train_blocks.num_rows
    n_eval = eval_blocks.num_rows if eval_blocks is not None else 0
    return PreparedData(
        train=train_blocks,
        eval=eval_blocks,
        format="text",
        n_train=n_train,
        n_eval=n_eval,
        source=source,
        template_note=None,
        eval_source=eval_source,
        block_size=max_length,
        streaming=streaming,
    )


def _short(source: str) -> str:
    path = Path(source)
    return path.name if path.exists() else source


def describe(prepared: PreparedData) -> str:
    """One line for the banner, e.g. "alpaca_en_demo.json · alpaca → prompt/completion · 900 train / 99 eval"
    (plus the degenerate rows dropped, when there are any)."""
    if prepared.block_size:
        conversion = f"{prepared.block_size}-token blocks"
    else:
        conversion = CONVERSION.get(prepared.format, prepared.format)
        if prepared.format == "prompt_completion" and prepared.conversational:
            conversion += " (messages)"
    counts = "streamed" if prepared.streaming else f"{prepared.n_train} train"
    if prepared.n_eval:
        if prepared.streaming and not prepared.eval_source:
            counts += f", first {prepared.n_eval} {'blocks' if prepared.block_size else 'rows'} held out for eval"
        else:
            counts += f" / {prepared.n_eval} eval"
        if prepared.eval_source:
            counts += f" (from {_short(prepared.eval_source)})"
    else:
        counts += ", no eval"
    if prepared.desirable is not None and prepared.n_train:
        counts += f" ({prepared.desirable} desirable, {prepared.n_train - prepared.desirable} undesirable)"
    line = f"{_short(prepared.source)} · {prepared.format} → {conversion} · {counts}"
    if prepared.dropped:
        total = sum(prepared.dropped.values())
        reasons = ", ".join(f"{n} {REASON_TEXT.get(r, r)}" for r, n in prepared.dropped.items())
        line += f" · dropped {total} degenerate row{'s' if total != 1 else ''} ({reasons})"
    elif prepared.streaming and not prepared.block_size:
        line += " · degenerate rows dropped as they stream"
    return line


__all__ = [
    "PreparedData",
    "label_note",
    "prepare_kto",
    "prepare_sft",
    "prepare_dpo",
    "prepare_text",
    "describe",
    "detect_format",
]
