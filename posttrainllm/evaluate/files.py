"""Evaluating several texts (files or strings) at once, each streamed (read, tokenized and scored a batch at a time),
with progress on stderr."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial

from posttrainllm.errors import DataError, UsageError
from posttrainllm.evaluate.progress import progress_meter
from posttrainllm.evaluate.scoring import _check_batch_size, _check_max_length, _score_batches
from posttrainllm.evaluate.sft import sft_completion_loss
from posttrainllm.evaluate.stream import file_chunks, string_chunks, text_batches


def _names_for_paths(paths: list[str], reserved: set[str]) -> list[str]:
    """Basenames; duplicates get as many parent directories as needed, identical paths get '#k'."""
    parts = [os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths]
    depth = [1] * len(paths)

    def name(k: int) -> str:
        return "/".join(parts[k][-depth[k] :])

    while True:
        names = [name(k) for k in range(len(paths))]
        clash = [
            k
            for k in range(len(paths))
            if names[k] in reserved or any(names[j] == names[k] and parts[j] != parts[k] for j in range(len(paths)))
        ]
        grow = [k for k in clash if depth[k] < len(parts[k])]
        if not grow:
            break
        for k in grow:
            depth[k] += 1
    out: list[str] = []
    for nm in names:
        cand, j = nm, 2
        while cand in out or cand in reserved:
            cand, j = f"{nm}#{j}", j + 1
        out.append(cand)
    return out


def _checked_file(path: str) -> str:
    if not os.path.exists(path):
        raise UsageError(f"evaluation file not found: {path}")
    if os.path.isdir(path):
        raise UsageError(f"evaluation path is a directory, expected a text file: {path}")
    if not os.path.isfile(path):
        raise UsageError(f"evaluation path is not a regular file: {path}")
    return path


def evaluate_files(
    model,
    tokenizer,
    texts: dict[str, str] | list[str],
    max_length: int,
    *,
    sft_examples=None,
    progress=True,
    batch_size: int = 8,
    reference=None,
) -> dict:
    """Perplexity of several texts, plus (optionally) the SFT completion loss.

    ``texts``: a dict name → text content, or a list of paths to UTF-8 text files (named by basename;
    duplicate basenames get parent directories, e.g. ``a/val.txt`` and ``b/val.txt``).
    Returns ``{name: text_perplexity(...) result, ..., "sft": sft_completion_loss(...) result}``. With a
    ``reference`` model (same tokenizer), each text's result also holds ``"kl"``: the mean per-token
    KL(reference ‖ model) over the same predicted positions (posttrainllm/evaluate/divergence.py).
    Each text is read, tokenized and scored as a stream (``posttrainllm.evaluate.stream``): memory follows the
    batch and the read chunk, not the text. A rich progress bar is shown on stderr when ``progress`` is true and
    stderr is a terminal, plain lines every ``progress.PROGRESS_EVERY`` seconds when it is not (a log file); a
    text's progress is the part of it read (the number of windows is known only at its end). Nothing is ever
    printed to stdout.
    """
    max_length = _check_max_length(max_length)
    batch_size = _check_batch_size(batch_size)
    sources = _sources(texts, sft_examples is not None)
    results: dict[str, dict] = {}
    meter = progress_meter(progress is True)
    with meter:
        for name, (chunks, total, unit, path) in sources.items():
            meter.start(name, total, unit)
            batches, prefix = text_batches(tokenizer, chunks(), max_length, batch_size)
            try:
                results[name] = _score_batches(model, batches, meter.advance, reference, prefix=prefix)
            except DataError as e:  # a reading error names the file already
                raise DataError(str(e) if path and path in str(e) else f"{name}: {e}") from None
            meter.finish()
        if sft_examples is not None:
            meter.start("sft", len(sft_examples) if hasattr(sft_examples, "__len__") else None, "examples")
            results["sft"] = sft_completion_loss(
                model, tokenizer, sft_examples, max_length, batch_size=batch_size, progress=meter.advance
            )
            meter.finish()
    return results


def _sources(texts, with_sft: bool) -> dict:
    """name → (a callable giving the text's (chunk, position) items, its size, the size's unit, its path or None),
    for a dict name → text or a list of file paths; every path is checked before anything is scored."""
    reserved = {"sft"} if with_sft else set()
    if isinstance(texts, Mapping):
        named = {str(k): v for k, v in texts.items()}
        if reserved & set(named):
            raise UsageError("a text may not be named 'sft' when SFT examples are evaluated too")
        for k, v in named.items():
            if not isinstance(v, str):
                raise DataError(f"text '{k}': expected a string, got {type(v).__name__}")
        return {name: (partial(string_chunks, t), len(t), "characters", None) for name, t in named.items()}
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise UsageError("texts must be a list of file paths or a dict name -> text")
    paths = [_checked_file(os.fspath(p)) for p in texts]
    named = dict(zip(_names_for_paths(paths, reserved), paths))
    return {name: (partial(file_chunks, p), os.path.getsize(p), "bytes", p) for name, p in named.items()}
