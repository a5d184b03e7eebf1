"""Replay: general text mixed into the training rows against forgetting, for ``sft`` (text chunks shaped like the
SFT rows) and ``finetune`` (token blocks), on memory-mapped datasets and on streams, in one place."""

from __future__ import annotations

from ..errors import DataError, UsageError


def chunks(text: str, chunk_chars: int) -> list[str]:
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


class _Chunk:
    """Batched map: texts -> chunks of at most `chunk_chars` characters."""

    def __init__(self, chunk_chars: int):
        self.chunk_chars = chunk_chars

    def __call__(self, batch):
        return {"text": [c for t in batch["text"] if isinstance(t, str) for c in chunks(t, self.chunk_chars)]}


class _Shape:
    """Batched map: chunks -> rows shaped like the SFT rows, with the loss on the chunk (see `mix_replay`)."""

    def __init__(self, kind: str, columns: list[str]):
        self.kind = kind
        self.columns = columns

    def row(self, c: str) -> dict:
        if self.kind == "prompt_messages":
            return {"prompt": [{"role": "user", "content": ""}], "completion": [{"role": "assistant", "content": c}]}
        if self.kind == "prompt_strings":
            return {"prompt": "", "completion": c}
        if self.kind == "messages":
            return {"messages": [{"role": "assistant", "content": c}]}
        return {"text": c}

    def __call__(self, batch):
        rows = [self.row(c) for c in batch["text"]]
        return {col: [r.get(col) for r in rows] for col in self.columns}


def _row_kind(train) -> str:
    import datasets

    cols = set(train.column_names or [])
    if {"prompt", "completion"} <= cols:
        feature = (train.features or {}).get("prompt")
        return "prompt_messages" if isinstance(feature, (list, datasets.List, datasets.Sequence)) else "prompt_strings"
    if "messages" in cols:
        return "messages"
    if "text" in cols:
        return "text"
    raise DataError(f"cannot mix replay text into an SFT set with columns {train.column_names}")


def _replay_rows(train, replay, chunk_chars: int, streaming: bool):
    """Replay rows in the train rows' shape: token blocks as they are, texts cut into chunks and shaped."""
    import datasets

    cols = list(train.column_names or [])
    if "input_ids" in cols:
        if "input_ids" not in (replay.column_names or []):
            raise DataError("the replay data for token blocks must be token blocks (prepare_text) too")
        return replay.select_columns(cols) if replay.column_names else replay
    if isinstance(replay, (list, tuple)):
        replay = datasets.Dataset.from_dict({"text": [t for t in replay if isinstance(t, str)]})
    if "text" not in (replay.column_names or ["text"]):
        raise DataError(f"the replay dataset needs a 'text' column; it has {replay.column_names}")
    kind = _row_kind(train)
    src = replay.select_columns(["text"]) if replay.column_names else replay
    text_features = datasets.Features({"text": datasets.Value("string")})
    if streaming:
        pieces = src.map(_Chunk(chunk_chars), batched=True, remove_columns=["text"], features=text_features)
        return pieces.map(_Shape(kind, cols), batched=True, remove_columns=["text"], features=train.features)
    pieces = src.map(
        _Chunk(chunk_chars),
        batched=True,
        batch_size=64,
        remove_columns=["text"],
        features=text_features,
        desc="Cutting replay text",
    )
    if pieces.num_rows == 0:
        raise DataError("the replay dataset holds no text")
    return pieces, _Shape(kind, cols)


def replay_rows(n_train: int, ratio: float) -> int:
    """The replay rows `mix_replay` appends to `n_train` training rows (a dataset) at `ratio`: round(ratio * n /
    (1 - ratio)), at least 1. E.g. 24 rows at 0.25: 8."""
    return max(1, round(ratio * n_train / (1.0 - ratio)))


def mix_replay(train, replay, ratio: float, seed: int, *, chunk_chars: int = 2000):
    """Mix "replay" rows into the train rows so that a fraction `ratio` of the rows are replay rows.

    `train`: SFT rows (prompt/completion, messages or text) or token blocks ({"input_ids", "labels"}), a
    ``Dataset`` or a stream. `replay`: for SFT rows, texts (a dataset with a "text" column, or a list of strings)
    cut into chunks of at most `chunk_chars` characters at line boundaries; for token blocks, blocks of the same
    length (``prepare_text(...).train``).

    A replay row takes the shape of the train rows, so that TRL sees one schema and puts the loss on the chunk:
      * prompt/completion strings -> {"prompt": "", "completion": chunk} (completion-only loss = the whole chunk);
      * prompt/completion messages -> {"prompt": [user ""], "completion": [assistant chunk]};
      * messages -> {"messages": [{"role": "assistant", "content": chunk}]} (the chat markers are trained too);
      * text -> {"text": chunk}.

    Datasets: round(ratio * n / (1 - ratio)) replay rows (at least 1), drawn as a seeded permutation of the replay
    rows (repeated when more are needed), appended, and the whole set shuffled with `seed` (an index mapping, no
    copy). Streams: ``datasets.interleave_datasets`` with probabilities (1 - ratio, ratio), seeded, the replay
    stream restarting when it runs out. `ratio` 0 returns `train` unchanged.
    """
    import datasets
    import numpy as np

    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0.0 <= ratio < 1.0:
        raise UsageError(f"replay ratio must be in [0, 1), got {ratio!r}")
    if ratio == 0:
        return train
    if isinstance(train, datasets.IterableDataset):
        if isinstance(replay, datasets.Dataset):
            replay = replay.to_iterable_dataset()
        rows = _replay_rows(train, replay, chunk_chars, streaming=True)
        return datasets.interleave_datasets(
            [train, rows], probabilities=[1.0 - ratio, ratio], seed=seed, stopping_strategy="all_exhausted"
        )
    if train.num_rows == 0:
        return train
    prepared = _replay_rows(train, replay, chunk_chars, streaming=False)
    pool, shape = prepared if isinstance(prepared, tuple) else (prepared, None)
    if pool.num_rows == 0:
        raise DataError("the replay dataset holds no rows")
    k = replay_rows(train.num_rows, ratio)
    m = pool.num_rows
    idx = np.random.default_rng(seed).permutation(np.resize(np.arange(m), max(k, m)))[:k]
    picked = pool.select(idx)
    if shape is not None:
        picked = picked.map(
            shape, batched=True, remove_columns=["text"], features=train.features, desc="Shaping replay rows"
        )
    else:
        picked = picked.cast(train.features)
    return datasets.concatenate_datasets([train, picked]).shuffle(seed=seed)
