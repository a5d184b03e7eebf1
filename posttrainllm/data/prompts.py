"""Prompt data for online RL (`grpo`, `rloo`): each row becomes a ``prompt`` (a string, or messages for a chat
model), and every other column is kept as it is, since TRL hands those columns to the reward functions (an answer to
match, a test to run).

==================== ================================================ ==============================================
format               columns                                          prompt
==================== ================================================ ==============================================
prompt               prompt (a string or a message list), [others]    as is
messages             messages: [{role, content}], [others]            the messages up to the last user turn
alpaca               instruction, [input], [system], [others]         the Alpaca template sft uses
==================== ================================================ ==============================================

A row whose prompt is empty or null is dropped and counted; a malformed one is a DataError naming the record.
"""

from __future__ import annotations

from ..errors import DataError
from . import formats as F
from . import reading
from .chat import ensure_chat_template
from .formats import EMPTY_PROMPT
from .prepare import PreparedData, _check_args, _merge, _random_split

PROMPT_FORMATS = ("prompt", "messages", "alpaca")
_DROP = "_drop"
ACCEPTS = (
    "prompt (a string or [{role, content}] messages), messages ([{role, content}]: the prompt is everything up to "
    "the last user turn) or alpaca (instruction, [input]); other columns are passed to the reward functions"
)


def prompt_format(columns: list[str], source: str) -> str:
    """The format of prompt data from its columns: prompt, then messages, then alpaca; else a DataError that lists
    what the commands accept."""
    cols = set(columns)
    for fmt, needs in (("prompt", "prompt"), ("messages", "messages"), ("alpaca", "instruction")):
        if needs in cols:
            return fmt
    raise DataError(f"{source}: cannot tell the prompts from columns {sorted(cols)}; grpo/rloo accept: {ACCEPTS}")


def _prompt_of(record: dict, fmt: str, where: str):
    """The record's prompt: a string or a list of messages ("" when there is none: dropped)."""
    if fmt == "alpaca":
        if F.is_null(record.get("instruction")):
            return ""
        return F.CONVERTERS["alpaca"]({**record, "output": ""}, where)["prompt"]
    value = F.maybe_json(record.get(fmt))
    if F.is_null(value) or (isinstance(value, (str, list)) and not value):
        return ""
    if fmt == "prompt" and isinstance(value, str):
        return value
    if fmt == "prompt" and not F.is_msgs(value):
        raise DataError(f"{where}: 'prompt' must be a string or a list of messages, found {reading.json_type(value)}")
    messages = F._messages(value, where, fmt)
    if fmt == "messages":  # up to the last user turn: the completion is what the model samples
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users:
            raise DataError(f"{where}: 'messages' has no user turn to prompt with")
        messages = messages[: users[-1] + 1]
    return messages


class _Prompts:
    """The batched map function: a prompt column (and its drop reason) for a batch of records."""

    def __init__(self, fmt: str, source: str, conversational: bool):
        self.fmt, self.source, self.conversational = fmt, source, conversational

    def __call__(self, batch: dict, indices: list[int]) -> dict:
        keys = list(batch)
        prompts, reasons = [], []
        for index, values in zip(indices, zip(*(batch[k] for k in keys))):
            where = F.where(self.source, index)
            prompt = _prompt_of(dict(zip(keys, values)), self.fmt, where)
            if isinstance(prompt, str) and self.conversational:
                prompt = [{"role": "user", "content": prompt}] if prompt.strip() else []
            elif isinstance(prompt, list) and not self.conversational:
                raise DataError(
                    f"{where}: holds a message list, but the first records hold plain-string prompts; use one kind "
                    "for the whole dataset"
                )
            empty = not (prompt.strip() if isinstance(prompt, str) else any(m["content"].strip() for m in prompt))
            prompts.append(prompt)
            reasons.append(EMPTY_PROMPT if empty else None)
        return {"prompt": prompts, _DROP: reasons}


def _conversational(fmt: str, rows: list[dict]) -> bool:
    return fmt == "messages" or (fmt == "prompt" and any(F.is_msgs(r.get("prompt")) for r in rows))


def _load(source: str, tokenizer, max_samples, num_proc):
    """(prompt rows with the other columns kept, format, conversational, template note, dropped counts)."""
    import datasets

    ds = reading.load(source)
    rows = reading.head(ds)
    fmt = prompt_format(reading.columns(ds, rows), source)
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, ds.num_rows)))
    conversational = _conversational(fmt, rows)
    note = ensure_chat_template(tokenizer) if conversational else None
    string = datasets.Value("string")
    prompt_type = datasets.List({"role": string, "content": string}) if conversational else string
    features = {k: v for k, v in ds.features.items() if k != "prompt"}
    features = datasets.Features({**features, "prompt": prompt_type, _DROP: string})
    out = ds.map(
        _Prompts(fmt, source, conversational),
        batched=True,
        with_indices=True,
        batch_size=1000,
        num_proc=reading.processes(num_proc),
        features=features,
        desc="Reading prompts",
    )
    reasons = out[_DROP]
    dropped = {EMPTY_PROMPT: sum(r is not None for r in reasons)}
    keep = [i for i, r in enumerate(reasons) if r is None]
    out = out.select(keep).remove_columns(_DROP) if len(keep) < out.num_rows else out.remove_columns(_DROP)
    if out.num_rows == 0:
        raise DataError(f"{source}: nothing left to train on: all {ds.num_rows} prompts are empty; fix the data")
    return out, fmt, conversational, note, {k: v for k, v in dropped.items() if v}


def prepare_prompts(
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
    """Read `source` as prompts for GRPOTrainer / RLOOTrainer (module docstring): {"prompt", other columns}.
    Options as `prepare_sft`, without streaming (grpo and rloo do not offer it)."""
    if streaming:
        raise DataError("prompt data is not read as a stream")  # pragma: no cover - refused by the options
    _check_args(eval_split, eval_source, max_samples)
    source = str(source)
    with reading.progress_bars(source, eval_source):
        train, fmt, conversational, note, dropped = _load(source, tokenizer, max_samples, num_proc)
        if eval_source:
            eval_ds, _, eval_conv, _, eval_dropped = _load(str(eval_source), tokenizer, None, num_proc)
            if eval_conv != conversational:
                kinds = ("messages", "strings") if conversational else ("strings", "messages")
                raise DataError(
                    f"eval data {eval_source} holds prompts as {kinds[1]}, the train data {source} as {kinds[0]}; "
                    "use the same kind for both"
                )
            dropped = _merge(dropped, eval_dropped)
        else:
            train, eval_ds = _random_split(train, eval_split, split_seed, source)
    return PreparedData(
        train=train,
        eval=eval_ds,
        format=fmt,
        n_train=train.num_rows,
        n_eval=eval_ds.num_rows if eval_ds is not None else 0,
        source=source,
        template_note=note,
        eval_source=str(eval_source) if eval_source else None,
        dropped=dropped,
        conversational=conversational,
    )


def check_reward_columns(prepared: PreparedData, column: str | None) -> None:
    """--reward-match COLUMN must be a column of the prompt data (train and eval), and not one TRL keeps for itself."""
    from ..errors import UsageError

    if not column:
        return
    if column in ("prompt", "completion", "completion_ids"):
        raise UsageError(
            f"--reward-match {column}: TRL passes its own {column!r} to the rewards, so the dataset's column of that "
            "name never reaches them; rename the column (e.g. to 'answer')"
        )
    for name, ds in (("train", prepared.train), ("eval", prepared.eval)):
        if ds is not None and column not in ds.column_names:
            found = ", ".join(c for c in ds.column_names if c != "prompt") or "none besides the prompt"
            raise UsageError(f"--reward-match {column}: the {name} data has no column {column!r}; its columns: {found}")


def _prompt_tokens(tokenizer, prompts: list, conversational: bool) -> list[int]:
    """The token counts of prompts as TRL's samplers tokenize them: a chat template with the generation prompt, or
    the tokenizer on the string."""
    if conversational:
        ids = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True)
        return [len(i) for i in ids["input_ids"]]
    return [len(i) for i in tokenizer(text=prompts)["input_ids"]]


def fit_completion_length(prepared: PreparedData, tokenizer, positions: int | None, completion: int):
    """grpo / rloo / distill: a prompt and its completion must fit the model's positions (learned position embeddings
    fail past them). Prompts that leave no room for a completion are a UsageError with their count, before any model
    loads; when the longest prompt and --max-completion-length do not fit together, the completion length is clamped
    to what that prompt leaves, as sft clamps --max-length. Returns (completion length, note or None). Read in
    batches (memory follows the batch).

    E.g. 256 positions, --max-completion-length 256, prompts of at most 40 tokens: (216, "... cut at 216 tokens")."""
    from ..errors import UsageError

    if not positions:
        return completion, None
    longest = 0
    for name, ds in (("train", prepared.train), ("eval", prepared.eval)):
        if ds is None:
            continue
        over, most = 0, 0
        for batch in ds.select_columns(["prompt"]).iter(batch_size=256):
            lengths = _prompt_tokens(tokenizer, batch["prompt"], prepared.conversational)
            over += sum(n >= positions for n in lengths)
            most = max([most, *lengths])
        if over:
            raise UsageError(
                f"{over} of {ds.num_rows} {name} prompts do not fit the model's context: they hold {positions} tokens "
                f"or more (the longest {most}), and the model reads at most {positions}, completion included; shorten "
                "or drop those prompts"
            )
        longest = max(longest, most)
    if longest + completion <= positions:
        return completion, None
    room = positions - longest
    return room, (
        f"--max-completion-length {completion} does not fit the model's {positions} positions after the longest "
        f"prompt ({longest} tokens): completions are cut at {room} tokens"
    )
