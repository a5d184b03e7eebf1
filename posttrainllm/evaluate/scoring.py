"""Scoring token ids: non-overlapping windows, NLL in float32 chunks, and the per-token KL to a reference (the
perplexity definition is in the package docstring, posttrainllm/evaluate/__init__.py)."""

from __future__ import annotations

import math

from posttrainllm.errors import DataError, UsageError

LOGITS_BYTES = 512 * 2**20  # at most this many bytes of float32 logits per forward (rows_per_forward)
# Number of sequence positions whose logits are converted to float32 at a time (bounds memory for big vocabularies).
_NLL_CHUNK = 1024


def _model_device(model):
    import torch

    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _tokenize_text(tokenizer, text: str):
    """Token ids of ``text`` without special tokens (an int32 array), tokenized the way ``text_perplexity`` streams
    it (``posttrainllm.evaluate.stream``): the ids of ``split_text``'s pieces, the same as one call for byte-level
    BPE tokenizers."""
    import numpy as np

    from posttrainllm.evaluate.stream import string_chunks, token_chunks

    out = [ids for ids, _ in token_chunks(tokenizer, string_chunks(text))]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int32)


def _check_max_length(max_length: int) -> int:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise UsageError(f"max_length must be an integer >= 2, got {max_length!r}")
    return max_length


def _check_batch_size(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return batch_size


def _row_nll_sum(logits_row, labels_row) -> tuple[float, int]:
    """Sum of NLL (float32) of ``labels_row[t]`` under ``logits_row[t]``; labels == -100 are ignored.

    ``logits_row``: (T, V) in the model's dtype, already aligned with ``labels_row`` (T,).
    """
    import torch
    import torch.nn.functional as F

    total = torch.zeros((), dtype=torch.float32, device=logits_row.device)
    count = 0
    for start in range(0, logits_row.shape[0], _NLL_CHUNK):
        lab = labels_row[start : start + _NLL_CHUNK]
        keep = lab != -100
        n = int(keep.sum().item())
        if n == 0:
            continue
        lg = logits_row[start : start + _NLL_CHUNK][keep].float()
        total = total + F.cross_entropy(lg, lab[keep], reduction="sum")
        count += n
    return float(total.item()), count


class _EvalMode:
    """Put the model in eval mode and no-grad/inference mode; restore the training flag afterwards."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        import torch

        self.was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        self._ctx = torch.inference_mode()
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        if self.was_training:
            self.model.train()
        return False


def rows_per_forward(model, length: int, rows: int) -> int:
    """How many windows of `length` tokens one forward scores: all `rows`, or fewer where their float32 logits
    (rows × length × vocabulary × 4 bytes) would pass LOGITS_BYTES. With a reference (the KL) two such tensors
    exist at once, so the whole batch's full-vocabulary distributions are never held together on a big vocabulary:
    SmolLM2 (49,152 tokens) keeps 10 windows of 256, Gemma 3 (262,144) scores 2 at a time."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    vocab = int(weight.shape[0]) if weight is not None and weight.dim() == 2 else 0
    if not vocab:
        return rows
    return max(1, min(rows, LOGITS_BYTES // (4 * vocab * max(length, 1))))


def _score_ids(model, ids, max_length: int, batch_size: int, progress, reference=None, prefix=()) -> dict:
    """Perplexity of already tokenized text (an array or list of ids), see ``_score_batches``; ``progress(windows)``.
    `prefix`: the ids each window starts with (``stream.window_prefix``)."""
    from posttrainllm.evaluate.stream import ids_batches

    max_length = _check_max_length(max_length)
    batch_size = _check_batch_size(batch_size)
    step = None if progress is None else (lambda windows, position: progress(windows))
    batches = ids_batches(ids, max_length, batch_size, prefix)
    return _score_batches(model, batches, step, reference, prefix=len(prefix))


def _score_batches(model, batches, progress, reference=None, kl=None, prefix: int = 0) -> dict:
    """Perplexity of a text given as its batches of windows (``stream.window_batches``: (int64 windows, position)
    items), see the package docstring for the definition; with a `reference` model, also the mean per-token
    KL(reference ‖ model) at the same predicted positions (posttrainllm/evaluate/divergence.py). ``progress(windows,
    position)`` after each batch. ``kl``: another tracker with the same interface as ``_KL`` (the base cache's,
    posttrainllm/evaluate/base_cache.py) in place of a reference model. `prefix`: how many ids of each window are
    the tokenizer's prefix (context: never predicted, not counted as the text's tokens). Memory follows the batch:
    only one batch of ids is held here."""
    import torch

    device = _model_device(model)
    first = max(prefix, 1)  # index of the first predicted token in a window
    nll_sum, predicted, tokens, windows = 0.0, 0, 0, 0
    kl = kl if kl is not None else _KL(reference)
    with _EvalMode(model), kl:
        for rows, position in batches:
            tokens += rows.size - prefix * rows.shape[0]
            windows += rows.shape[0]
            if rows.shape[1] > first:  # a last window of one token (no prefix) predicts nothing: not run at all
                whole = torch.from_numpy(rows).to(device)
                step = rows_per_forward(model, whole.shape[1], whole.shape[0])
                for start in range(0, whole.shape[0], step):  # the logits of a few rows at a time (a big vocabulary)
                    batch = whole[start : start + step]
                    logits = model(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False).logits
                    for r in range(batch.shape[0]):
                        s, c = _row_nll_sum(logits[r, first - 1 : -1], batch[r, first:])
                        nll_sum += s
                        predicted += c
                    kl.add(batch, logits, first)
                    del logits
            if progress is not None:
                progress(rows.shape[0], position)

    if predicted == 0:
        raise DataError(f"text too short to score: {tokens} token(s), at least 2 are needed")
    mean = nll_sum / predicted
    return {
        "perplexity": math.inf if mean >= 700 else math.exp(mean),  # NaN stays NaN
        "nll": mean,
        "tokens": tokens,
        "predicted_tokens": predicted,
        "windows": windows,
        **kl.result(),
    }


class _KL:
    """The running KL(reference ‖ model) of one text: the reference's forward on each batch the model scored."""

    def __init__(self, reference):
        self.reference, self.total, self.count = reference, 0.0, 0

    def __enter__(self):
        self._mode = _EvalMode(self.reference) if self.reference is not None else None
        if self._mode is not None:
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc) if self._mode is not None else False

    def add(self, batch, logits, first: int = 1) -> None:
        """Add the KL at the predicted positions of `batch` (those from index `first` on) to the running sum."""
        import torch

        from posttrainllm.evaluate.divergence import kl_sum

        if self.reference is None:
            return
        ref_in = batch.to(_model_device(self.reference))
        ref_logits = self.reference(input_ids=ref_in, attention_mask=torch.ones_like(ref_in), use_cache=False).logits
        ref_logits = ref_logits.to(logits.device)
        for r in range(batch.shape[0]):
            s, c = kl_sum(ref_logits[r, first - 1 : -1], logits[r, first - 1 : -1])
            self.total += s
            self.count += c
        del ref_logits

    def result(self) -> dict:
        if self.reference is None or not self.count:
            return {}
        return {"kl": self.total / self.count}


# ------------------------------------------------------------------------------------------------ public API


def text_perplexity(model, tokenizer, text: str, max_length: int, *, batch_size: int = 8, progress=None) -> dict:
    """Perplexity of ``text`` in non-overlapping windows of ``max_length`` tokens (see the module docstring).

    Returns ``{"perplexity", "nll" (mean NLL per predicted token), "tokens" (tokens in the text),
    "predicted_tokens", "windows" (= ceil(tokens / max_length))}``. ``progress``: optional
    ``callable(advance: int)``, called with the number of windows done after each batch (the total, ``windows``,
    is known at the end: the text is tokenized as it is scored).
    Raises ``DataError`` if the text has fewer than 2 tokens, ``UsageError`` for max_length < 2.
    """
    from posttrainllm.evaluate.stream import string_chunks, text_batches

    if not isinstance(text, str):
        raise DataError(f"text must be a string, got {type(text).__name__}")
    max_length = _check_max_length(max_length)
    batch_size = _check_batch_size(batch_size)
    batches, prefix = text_batches(tokenizer, string_chunks(text), max_length, batch_size)
    step = None if progress is None else (lambda windows, position: progress(windows))
    return _score_batches(model, batches, step, prefix=prefix)
