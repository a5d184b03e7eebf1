"""Text → token ids → batches of windows, streaming: memory follows the batch and the read chunk, not the text.

A file is read ``READ_BYTES`` at a time (``posttrainllm.data.reading.iter_text``: its BOM / encoding / NUL checks);
the text is cut into pieces at pre-tokenizer boundaries exactly as ``posttrainllm.data.text.split_text`` cuts the
whole text (a piece is only cut once the text past it has been read, so the pieces, and the ids, do not depend on
the read size); the ids of each chunk go into a small buffer from which the batches of windows are taken in the
order and shapes a whole-text pass gives (``batch_size`` full windows of ``max_length`` tokens at a time, then
the last full windows, then the shorter last window).

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


def window_batches(token_stream, max_length: int, batch_size: int):
    """(int64 array of windows, position) from (ids, position) items: ``batch_size`` full windows of
    ``max_length`` tokens whenever the buffer holds them, at the end the remaining full windows in one batch and
    the shorter last window (possibly a single token) alone."""
    import numpy as np

    step = max_length * batch_size
    buffer = np.zeros(0, dtype=np.int32)
    position = 0
    for ids, position in token_stream:
        buffer = np.concatenate([buffer, ids]) if len(buffer) else ids
        start = 0
        while len(buffer) - start >= step:
            yield buffer[start : start + step].astype(np.int64).reshape(batch_size, max_length), position
            start += step
        buffer = buffer[start:].copy() if start else buffer  # the rest only (< one batch), not the whole chunk
    full = len(buffer) // max_length
    if full:
        yield buffer[: full * max_length].astype(np.int64).reshape(full, max_length), position
    rest = buffer[full * max_length :]
    if len(rest):
        yield rest.astype(np.int64).reshape(1, len(rest)), position


def ids_batches(ids, max_length: int, batch_size: int):
    """The batches of already tokenized ids (an array or list), as ``window_batches`` gives them; position =
    tokens."""
    import numpy as np

    ids = np.asarray(ids)
    return window_batches([(ids, len(ids))] if len(ids) else [], max_length, batch_size)
