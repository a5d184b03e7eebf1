"""Text → token ids → batches of windows, streaming: memory follows the batch and the read chunk, not the text.

A file is read ``READ_BYTES`` at a time (``posttrainllm.data.reading.iter_text``: its BOM / encoding / NUL checks);
the text is cut into pieces at pre-tokenizer boundaries exactly as ``posttrainllm.data.text.split_text`` cuts the
whole text (a piece is only cut once the text past it has been read, so the pieces, and the ids, do not depend on
the read size); the ids of each chunk go into a small buffer from which the batches of windows are taken in the
order and shapes a whole-text pass gives (``batch_size`` full windows of ``max_length`` tokens at a time, then
the last full windows, then the shorter last window).

Every window starts as the model's texts start: with the tokenizer's prefix (``window_prefix``: the special tokens
it puts before a text, e.g. Gemma's and Llama 3's ``<bos>``), followed by ``max_length - len(prefix)`` tokens of the
text. The prefix is context, never a predicted token, so every token of the text is predicted exactly once. A
tokenizer without a prefix (GPT-2, Qwen, SmolLM) gives windows of ``max_length`` text tokens, as before the prefix
existed (decision log 67).

Every item carries the position in the input (bytes of a file, characters of a string) read so far: progress
follows the input, since the number of windows is only known at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

READ_BYTES = 1 << 20  # bytes (of a file) or characters (of a string) read at a time


def file_chunks(path: str) -> Iterator[tuple[str, int]]:
    """(text, bytes of the file read so far) of a UTF-8 text file, ``READ_BYTES`` at a time; a BOM counts as read
    only at the end."""
    from posttrainllm.data.reading import iter_text

    done = 0
    for text in iter_text(path, path, chunk_bytes=READ_BYTES):
        done += len(text) if text.isascii() else len(text.encode("utf-8"))
        yield text, done


def string_chunks(text: str) -> Iterator[tuple[str, int]]:
    """(slice, characters read so far) of an in-memory text, ``READ_BYTES`` characters at a time."""
    for start in range(0, len(text), READ_BYTES):
        yield text[start : start + READ_BYTES], min(start + READ_BYTES, len(text))


def token_chunks(tokenizer, chunks: Iterable[tuple[str, int]], limit: int | None = None):
    """(int32 ids, position) items: the ids of the pieces of the text that are complete once a chunk is read, in
    tokenizer calls of about ``CALL_CHARS`` characters. The last piece of a chunk is carried into the next:
    ``iter_split`` may only cut where it has seen the text past the cut (at most ``limit`` characters are carried).
    """
    from posttrainllm.data.text import CALL_CHARS, PIECE_CHARS, Tokenize, iter_split

    limit = PIECE_CHARS if limit is None else limit
    encoder = Tokenize(tokenizer, "")
    carry, position = "", 0
    for text, position in chunks:
        pieces = iter_split(carry + text, limit)
        carry = next(pieces)
        group: list[str] = []
        size = 0
        for piece in pieces:  # every piece but the last is complete
            group.append(carry)
            size += len(carry)
            carry = piece
            if size >= CALL_CHARS:
                yield _encode(encoder, group), position
                group, size = [], 0
        if group:
            yield _encode(encoder, group), position
    if carry:
        yield _encode(encoder, [carry]), position


def _encode(encoder, pieces: list[str]):
    import numpy as np

    return np.concatenate(encoder.encode(pieces))


def window_prefix(tokenizer) -> list[int]:
    """The ids every evaluation window starts with: the special tokens the tokenizer puts before a text (``[bos]``
    for Gemma and Llama 3, ``[]`` for GPT-2, Qwen and SmolLM)."""
    from posttrainllm.data.text import special_affixes

    return special_affixes(tokenizer)[0]


def _windows(ids, width: int, prefix):
    """int64 rows of ``width`` ids each from the flat `ids` (a multiple of `width` long), the prefix before each."""
    import numpy as np

    rows = ids.astype(np.int64).reshape(-1, width)
    if not len(prefix):
        return rows
    head = np.broadcast_to(np.asarray(prefix, dtype=np.int64), (rows.shape[0], len(prefix)))
    return np.concatenate([head, rows], axis=1)


def window_batches(token_stream, max_length: int, batch_size: int, prefix=()):
    """(int64 array of windows, position) from (ids, position) items: ``batch_size`` full windows of
    ``max_length`` tokens whenever the buffer holds them, at the end the remaining full windows in one batch and
    the shorter last window (possibly a single token of text) alone. Each window is `prefix` followed by
    ``max_length - len(prefix)`` tokens of the text."""
    import numpy as np

    from posttrainllm.errors import UsageError

    width = max_length - len(prefix)  # text tokens per window
    if width < 1:
        raise UsageError(f"max_length={max_length} leaves no room for text after the tokenizer's prefix {prefix}")
    step = width * batch_size
    buffer = np.zeros(0, dtype=np.int32)
    position = 0
    for ids, position in token_stream:
        buffer = np.concatenate([buffer, ids]) if len(buffer) else ids
        start = 0
        while len(buffer) - start >= step:
            yield _windows(buffer[start : start + step], width, prefix), position
            start += step
        buffer = buffer[start:].copy() if start else buffer  # the rest only (< one batch), not the whole chunk
    full = len(buffer) // width
    if full:
        yield _windows(buffer[: full * width], width, prefix), position
    rest = buffer[full * width :]
    if len(rest):
        yield _windows(rest, len(rest), prefix), position


def text_batches(tokenizer, chunks, max_length: int, batch_size: int):
    """(batches, prefix length) of a text given as its (chunk, position) items: the text's windows
    (``window_batches`` with the tokenizer's ``window_prefix``) and how many ids of each window are the prefix."""
    prefix = window_prefix(tokenizer)
    return window_batches(token_chunks(tokenizer, chunks), max_length, batch_size, prefix), len(prefix)


def ids_batches(ids, max_length: int, batch_size: int, prefix=()):
    """The batches of already tokenized ids (an array or list), as ``window_batches`` gives them; position =
    tokens."""
    import numpy as np

    ids = np.asarray(ids)
    return window_batches([(ids, len(ids))] if len(ids) else [], max_length, batch_size, prefix)
