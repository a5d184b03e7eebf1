"""Evaluation: held-out perplexity of plain texts, SFT completion loss, and forgetting reports.

Perplexity definition (used everywhere in this project, so numbers are comparable between runs):

* the whole text is tokenized ONCE, without special tokens (no BOS/EOS); a long text is read and tokenized in
  pieces cut at pre-tokenizer boundaries (a newline followed by a non-space character), which gives the same ids
  as one call for byte-level BPE tokenizers, in bounded memory;
* the token ids are cut into consecutive, NON-overlapping windows of ``max_length`` tokens; the last window
  is whatever is left (it may be shorter); each window is scored on its own, with no context carried over;
* in a window of ``n`` tokens, tokens ``1..n-1`` are predicted from the tokens before them (``n - 1``
  predictions); a last window of a single token therefore predicts nothing;
* ``perplexity = exp(sum of NLL / number of predicted tokens)``, log-probabilities computed in float32.

Because windows do not overlap, the first tokens of every window have little context; the result depends on
``max_length`` and is higher than a sliding-window (strided) perplexity. Compare numbers only at equal
``max_length`` and tokenizer.

torch/transformers are imported inside the functions so that importing this module (and the CLI) stays fast.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from posttrainllm.errors import DataError, ModelError, UsageError, one_line

# Number of sequence positions whose logits are converted to float32 at a time (bounds memory for big vocabularies).
_NLL_CHUNK = 1024


def _alpaca_to_prompt_completion(ex: Mapping, where: str) -> tuple[Any, Any]:
    """Alpaca record -> (prompt, completion), exactly as SFT training builds it (posttrainllm.data.convert_records,
    which also handles the optional 'system' and 'history' columns)."""
    from posttrainllm.data import convert_records

    row = convert_records([dict(ex)], "alpaca", where)[0]
    return row["prompt"], row["completion"]


# --------------------------------------------------------------------------------------------------- helpers


def _model_device(model):
    import torch

    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _tokenize_text(tokenizer, text: str):
    """Token ids of ``text`` without special tokens (an int32 array). Long texts are tokenized in pieces cut at
    pre-tokenizer boundaries (``posttrainllm.data.text.split_text``): the same ids for byte-level BPE tokenizers,
    in bounded memory."""
    return _tokenize_chunks(tokenizer, [text])


def _tokenize_chunks(tokenizer, chunks):
    """Token ids (int32 array) of the concatenation of text chunks, tokenized piece by piece; a chunk boundary is
    kept only where it is a safe cut (else the text is carried into the next chunk)."""
    import numpy as np

    from posttrainllm.data.reading import safe_cut
    from posttrainllm.data.text import Tokenize, split_text

    encoder = Tokenize(tokenizer, "")
    out, pending = [], ""
    for chunk in chunks:
        pending += chunk
        cut = safe_cut(pending, len(pending) // 2) if len(pending) > (1 << 20) else None
        if cut is None:
            continue
        out.extend(encoder.encode(split_text(pending[:cut])))
        pending = pending[cut:]
    if pending:
        out.extend(encoder.encode(split_text(pending)))
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


def _windows(n_tokens: int, max_length: int) -> int:
    return -(-n_tokens // max_length)


def _score_ids(model, ids: list[int], max_length: int, batch_size: int, progress, reference=None) -> dict:
    """Perplexity of already tokenized text (see module docstring for the definition); with a `reference` model,
    also the mean per-token KL(reference ‖ model) at the same predicted positions (posttrainllm/divergence.py)."""
    import numpy as np
    import torch

    max_length = _check_max_length(max_length)
    batch_size = _check_batch_size(batch_size)
    n = len(ids)
    full = n // max_length
    rest = n - full * max_length
    device = _model_device(model)

    nll_sum = 0.0
    predicted = 0
    kl = _KL(reference)
    ids = np.asarray(ids, dtype=np.int64)
    with _EvalMode(model), kl:
        # Full windows: all of length max_length, batched without padding.
        for b0 in range(0, full, batch_size):
            b1 = min(b0 + batch_size, full)
            batch = torch.from_numpy(ids[b0 * max_length : b1 * max_length].reshape(b1 - b0, max_length)).to(device)
            logits = model(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False).logits
            for r in range(batch.shape[0]):
                s, c = _row_nll_sum(logits[r, :-1], batch[r, 1:])
                nll_sum += s
                predicted += c
            kl.add(batch, logits)
            del logits
            if progress is not None:
                progress(b1 - b0)
        # The last, shorter window runs alone (no padding). One token predicts nothing: not run at all.
        if rest >= 2:
            batch = torch.from_numpy(ids[full * max_length :].reshape(1, rest)).to(device)
            logits = model(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False).logits
            s, c = _row_nll_sum(logits[0, :-1], batch[0, 1:])
            nll_sum += s
            predicted += c
            kl.add(batch, logits)
            del logits
        if rest and progress is not None:
            progress(1)

    if predicted == 0:
        raise DataError(f"text too short to score: {n} token(s), at least 2 are needed")
    mean = nll_sum / predicted
    return {
        "perplexity": math.inf if mean >= 700 else math.exp(mean),  # NaN stays NaN
        "nll": mean,
        "tokens": n,
        "predicted_tokens": predicted,
        "windows": _windows(n, max_length),
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

    def add(self, batch, logits) -> None:
        import torch

        from posttrainllm.divergence import kl_sum

        if self.reference is None:
            return
        ref_in = batch.to(_model_device(self.reference))
        ref_logits = self.reference(input_ids=ref_in, attention_mask=torch.ones_like(ref_in), use_cache=False).logits
        ref_logits = ref_logits.to(logits.device)
        for r in range(batch.shape[0]):
            s, c = kl_sum(ref_logits[r, :-1], logits[r, :-1])
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
    ``callable(advance: int)``, called with the number of windows done (total = ``windows``).
    Raises ``DataError`` if the text has fewer than 2 tokens, ``UsageError`` for max_length < 2.
    """
    if not isinstance(text, str):
        raise DataError(f"text must be a string, got {type(text).__name__}")
    _check_max_length(max_length)
    return _score_ids(model, _tokenize_text(tokenizer, text), max_length, batch_size, progress)


def _example_prompt_completion(i: int, ex: Any) -> tuple[str, str]:
    where = f"SFT example {i + 1}"
    if not isinstance(ex, Mapping):
        raise DataError(f"{where}: expected an object, got {type(ex).__name__}")
    if "prompt" in ex and "completion" in ex:
        prompt, completion = ex["prompt"], ex["completion"]
    elif "instruction" in ex and "output" in ex:
        prompt, completion = _alpaca_to_prompt_completion(ex, where)
    else:
        raise DataError(
            f"{where}: needs 'prompt' and 'completion' (or Alpaca 'instruction'/'input'/'output'), "
            f"has keys {sorted(map(str, ex))}"
        )
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise DataError(f"{where}: prompt and completion must be strings (conversational data is not supported)")
    return prompt, completion


def _sft_token_rows(
    tokenizer, examples: Sequence[Mapping], max_length: int, start: int = 0
) -> list[tuple[list[int], int]]:
    """(input_ids, number of prompt tokens) per example, truncated to max_length."""
    eos = getattr(tokenizer, "eos_token_id", None)
    rows = []
    for i, ex in enumerate(examples, start=start):
        prompt, completion = _example_prompt_completion(i, ex)
        prompt_ids = list(tokenizer(prompt, add_special_tokens=True, verbose=False)["input_ids"])
        completion_ids = list(tokenizer(completion, add_special_tokens=False, verbose=False)["input_ids"])
        if eos is not None:
            completion_ids.append(int(eos))
        ids = (prompt_ids + completion_ids)[:max_length]
        rows.append((ids, min(len(prompt_ids), len(ids))))
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
    ``{"prompt", "completion"}`` or Alpaca ``{"instruction", "input", "output"}``: a list, or any iterable of
    them (e.g. a ``datasets.Dataset``), read in chunks of 4096.
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
                batch_rows = [rows[k] for k in idx if len(rows[k][0]) - rows[k][1] > 0 and len(rows[k][0]) >= 2]
                if batch_rows:
                    width = max(len(ids) for ids, _ in batch_rows)
                    input_ids = torch.full((len(batch_rows), width), pad, dtype=torch.long)
                    attention = torch.zeros((len(batch_rows), width), dtype=torch.long)
                    labels = torch.full((len(batch_rows), width), -100, dtype=torch.long)
                    for r, (ids, n_prompt) in enumerate(batch_rows):
                        t = torch.tensor(ids, dtype=torch.long)
                        input_ids[r, : len(ids)] = t
                        attention[r, : len(ids)] = 1
                        labels[r, n_prompt : len(ids)] = t[n_prompt:]
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
    A rich progress bar is shown on stderr when ``progress`` is true and stderr is a terminal; nothing is
    ever printed to stdout.
    """
    max_length = _check_max_length(max_length)
    batch_size = _check_batch_size(batch_size)
    reserved = {"sft"} if sft_examples is not None else set()
    if isinstance(texts, Mapping):
        named = {str(k): v for k, v in texts.items()}
        if reserved & set(named):
            raise UsageError("a text may not be named 'sft' when SFT examples are evaluated too")
        for k, v in named.items():
            if not isinstance(v, str):
                raise DataError(f"text '{k}': expected a string, got {type(v).__name__}")
    elif isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise UsageError("texts must be a list of file paths or a dict name -> text")
    else:
        paths = [os.fspath(p) for p in texts]
        named = dict(zip(_names_for_paths(paths, reserved), paths))

    # Tokenize first, so the progress bar knows its total.
    if isinstance(texts, Mapping):
        tokenized = {name: _tokenize_text(tokenizer, text) for name, text in named.items()}
    else:
        tokenized = {name: _tokenize_file(tokenizer, path) for name, path in named.items()}

    bar = None
    if progress is True and sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(
            TextColumn("{task.description}", style="bold", markup=False),  # a file name is text, not markup
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )

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

    if bar is None:
        run(lambda name, total: None)
    else:
        with bar:

            def update_for(name, total):
                task = bar.add_task(name, total=total)
                return lambda advance: bar.update(task, advance=advance)

            run(update_for)
    return results


def json_ready(results: Mapping) -> dict:
    """`results` as strict JSON (no NaN/Infinity, which JSON does not have): each non-finite number becomes null
    and its entry says why under "not_finite" (e.g. {"perplexity": "infinite: exp(mean NLL) overflows"})."""

    def why(key: str, v: float) -> str:
        if math.isnan(v):
            return "NaN: the model's outputs are not finite (do its weights hold NaN/inf?)"
        return "infinite: exp(mean NLL) overflows" if key == "perplexity" else "infinite"

    out: dict = {}
    for name, entry in results.items():
        if not isinstance(entry, Mapping):
            out[name] = None if isinstance(entry, float) and not math.isfinite(entry) else entry
            continue
        clean = dict(entry)
        bad = {k: why(k, v) for k, v in entry.items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:
            clean.update({k: None for k in bad})
            clean["not_finite"] = bad
        out[name] = clean
    return out


def _ppl_of(entry: Any) -> float | None:
    if isinstance(entry, Mapping):
        if entry.get("perplexity") is not None:
            return float(entry["perplexity"])
        if entry.get("loss") is not None:  # SFT entry: completion perplexity
            loss = float(entry["loss"])
            return math.inf if loss >= 700 else math.exp(loss)
        return None
    if isinstance(entry, (int, float)) and not isinstance(entry, bool):
        return float(entry)
    return None


def forgetting_report(before: dict, after: dict) -> dict:
    """Per name present in both: ``{"before": ppl, "after": ppl, "change_pct": 100 * (after / before - 1)}``,
    plus ``"kl"`` (KL(base ‖ tuned) per token) when the after-results hold one.

    Entries may be ``evaluate_files`` results (dicts with "perplexity"; an "sft" entry with only "loss" is
    compared as exp(loss)) or plain numbers. Names missing on either side are left out. ``change_pct`` is
    None when it cannot be computed (before is 0 or not finite).
    """
    report: dict[str, dict] = {}
    for name, b_entry in before.items():
        if name not in after:
            continue
        b, a = _ppl_of(b_entry), _ppl_of(after[name])
        if b is None or a is None:
            continue
        change = 100.0 * (a / b - 1.0) if (b != 0 and math.isfinite(b) and math.isfinite(a)) else None
        report[name] = {"before": b, "after": a, "change_pct": change}
        kl = after[name].get("kl") if isinstance(after[name], Mapping) else None
        if kl is not None:
            report[name]["kl"] = kl
    return report


# ------------------------------------------------------------------------------------------------- loading


def load_for_eval(model_path: str, *, device: str | None = None, dtype=None, trust_remote_code: bool = False):
    """Load ``(model, tokenizer)`` for evaluation from a local directory or a hub id, the way training loads them
    (``models.load_tokenizer`` / ``models.load_model``: same checks, same pad token), in eval mode on `device`.

    ``device``: None → "cuda" if available else "cpu". ``dtype``: None → the checkpoint's dtype ("auto") on
    cuda, float32 on cpu; a torch dtype or a name ("bfloat16", "float16", "float32", "auto") is accepted.
    A GGUF file (or a directory holding one) is converted once into the cache (``models.resolve_model``).
    Errors: a missing local path, a directory that is not a model, an offline hub id → ``UsageError``; a model or
    tokenizer that cannot be loaded → ``ModelError``.
    """
    import torch

    from posttrainllm import models
    from posttrainllm.refs import looks_local

    model_path = os.fspath(model_path)
    if not os.path.exists(os.path.expanduser(model_path)) and looks_local(model_path):
        raise UsageError(f"model path not found: {model_path}")
    model_path, _ = models.resolve_model(model_path, trust_remote_code=trust_remote_code)  # a GGUF file: converted
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = "auto" if str(device).startswith("cuda") else torch.float32
    elif isinstance(dtype, str) and dtype != "auto":
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise UsageError(f"unknown dtype: {dtype!r} (use bfloat16, float16, float32 or auto)")
        dtype = resolved
    tokenizer = models.load_tokenizer(model_path, trust_remote_code)
    model = models.load_model(model_path, trust_remote_code=trust_remote_code, model_args={"dtype": dtype})
    try:
        model.to(device)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"cannot move model to {device}: {one_line(e)}") from None
    model.eval()
    return model, tokenizer
