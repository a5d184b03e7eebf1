"""Results as strict JSON, the forgetting report (perplexity change per text, and KL), and loading a model for
evaluation."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from posttrainllm.errors import ModelError, UsageError, one_line


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
