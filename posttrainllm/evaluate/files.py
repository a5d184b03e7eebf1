"""Evaluating several texts (files or strings) at once, with a progress bar on a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from posttrainllm.errors import DataError, UsageError
from posttrainllm.evaluate.scoring import (
    _check_batch_size,
    _check_max_length,
    _score_ids,
    _tokenize_chunks,
    _tokenize_text,
    _windows,
)
from posttrainllm.evaluate.sft import sft_completion_loss


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


def _tokenize_file(tokenizer, path: str):
    """Token ids of a UTF-8 text file, read in chunks by the data package's reader (its BOM / encoding / NUL
    checks), never whole."""
    from posttrainllm.data.reading import iter_text

    if not os.path.exists(path):
        raise UsageError(f"evaluation file not found: {path}")
    if os.path.isdir(path):
        raise UsageError(f"evaluation path is a directory, expected a text file: {path}")
    if not os.path.isfile(path):
        raise UsageError(f"evaluation path is not a regular file: {path}")
    return _tokenize_chunks(tokenizer, iter_text(path, path))


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
    KL(reference ‖ model) over the same predicted positions (posttrainllm/divergence.py).
    A rich progress bar is shown on stderr when ``progress`` is true and stderr is a terminal, plain lines every
    ``PROGRESS_EVERY`` seconds when it is not (a log file); nothing is ever printed to stdout.
    """
    max_length = _check_max_length(max_length)
    batch_size = _check_batch_size(batch_size)
    tokenized = _tokenized(tokenizer, texts, sft_examples is not None)
    results: dict[str, dict] = {}

    def run(update_for):
        for name, ids in tokenized.items():
            try:
                step = update_for(name, _windows(len(ids), max_length))
                results[name] = _score_ids(model, ids, max_length, batch_size, step, reference)
            except DataError as e:
                raise DataError(f"{name}: {e}") from None
        if sft_examples is not None:
            step = update_for("sft", len(sft_examples) if hasattr(sft_examples, "__len__") else None)
            results["sft"] = sft_completion_loss(
                model, tokenizer, sft_examples, max_length, batch_size=batch_size, progress=step
            )

    bar = _progress_bar() if progress is True and sys.stderr.isatty() else None
    if bar is None:
        run(_LineProgress() if progress is True else (lambda name, total: None))
    else:
        with bar:

            def update_for(name, total):
                task = bar.add_task(name, total=total)
                return lambda advance: bar.update(task, advance=advance)

            run(update_for)
    return results


def _tokenized(tokenizer, texts, with_sft: bool) -> dict:
    """name → token ids of each text (a dict name → text, or a list of file paths), tokenized before any scoring
    so the progress bar knows its total."""
    reserved = {"sft"} if with_sft else set()
    if isinstance(texts, Mapping):
        named = {str(k): v for k, v in texts.items()}
        if reserved & set(named):
            raise UsageError("a text may not be named 'sft' when SFT examples are evaluated too")
        for k, v in named.items():
            if not isinstance(v, str):
                raise DataError(f"text '{k}': expected a string, got {type(v).__name__}")
        return {name: _tokenize_text(tokenizer, text) for name, text in named.items()}
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise UsageError("texts must be a list of file paths or a dict name -> text")
    paths = [os.fspath(p) for p in texts]
    named = dict(zip(_names_for_paths(paths, reserved), paths))
    return {name: _tokenize_file(tokenizer, path) for name, path in named.items()}


PROGRESS_EVERY = 30.0  # seconds between two plain progress lines (stderr not a terminal)


class _LineProgress:
    """Progress as plain lines on stderr: `eval: NAME: k/total` when a text starts, at most every PROGRESS_EVERY
    seconds while it runs, and when it is done."""

    def __call__(self, name: str, total):
        import time

        done, last = [0], [time.monotonic()]
        unit = "examples" if name == "sft" else "windows"

        def line() -> None:
            of = f"/{total}" if total else ""
            print(f"eval: {name}: {done[0]}{of} {unit}", file=sys.stderr, flush=True)

        def advance(n: int) -> None:
            done[0] += n
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY or (total and done[0] >= total):
                last[0] = now
                line()

        line()
        return advance


def _progress_bar():
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}", style="bold", markup=False),  # a file name is text, not markup
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
