"""The forgetting probe: how far a run moved, with no data of the user's.

Before training, `--forgetting-probe N` (default 8) texts are sampled from the starting model (temperature 1, from
BOS, at most `PROBE_TOKENS` tokens each, seeded by --seed: data/self_replay.py's `draw`) and kept in
OUT/forgetting_probe.jsonl (reused by --resume and by a later run with the same settings). After training, the
mean per-token KL(start ‖ tuned) over those texts is the probe: the forward KL over the starting model's own
distribution, which RL's Razor (Shenfeld et al. 2025, arXiv 2509.04259) found to track forgetting. Each text is
scored alone, as `eval` scores a text (a window starting with the tokenizer's prefix; posttrainllm/evaluate/). It
is exactly 0 for a model that did not move (the same weights give the same logits). Every run that starts from a
model and has no --ood-eval reports it; `--forgetting-probe 0` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from posttrainllm.rundir.layout import PROBE

PROBE_TOKENS = 64  # at most, with the BOS
PROBE_FILE = PROBE


def _settings(n: int, seed: int, model_identity, length: int) -> dict:
    return {"samples": n, "max_length": length, "seed": seed, "temperature": 1.0, "model": model_identity}


def probe_length(model) -> int:
    """Tokens a probe text may have: `PROBE_TOKENS`, or fewer where the model's positions end sooner."""
    from posttrainllm.models import POSITION_KEYS

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limits = [v for k in POSITION_KEYS if isinstance(v := getattr(config, k, None), int) and v > 1]
    return min([PROBE_TOKENS, *limits[:1]])


def _read(path: Path, settings: dict) -> list[str] | None:
    """The kept texts when the file holds these settings and its texts, else None (drawn again)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        head = json.loads(lines[0])
        texts = [json.loads(line)["text"] for line in lines[1:]]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    if head.get("settings") != settings or head.get("sha256") != _digest(texts):
        return None
    return texts


def _digest(texts: list[str]) -> str:
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()


def obtain(model, tokenizer, out: Path, *, n: int, seed: int, model_identity, length: int = PROBE_TOKENS):
    """The probe's texts: read from OUT/forgetting_probe.jsonl when it holds the same settings, else drawn from
    `model` (the starting model, before training: at most `length` tokens each, the prompt included) and written
    there (whole, then renamed into place)."""
    from posttrainllm.data.self_replay import draw, prompt_ids

    settings = _settings(n, seed, model_identity, length)
    path = Path(out) / PROBE_FILE
    kept = _read(path, settings)
    if kept is not None:
        return kept
    texts, _ = draw(model, tokenizer, prompt_ids(tokenizer, chat=False), n=n, max_length=length, seed=seed,
        batch_size=n)  # fmt: skip
    tmp = path.with_name(f".{PROBE_FILE}.{os.getpid()}")
    lines = [json.dumps({"settings": settings, "sha256": _digest(texts)})] + [json.dumps({"text": t}) for t in texts]
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return texts


def measure(model, reference, tokenizer, texts: list[str], length: int = PROBE_TOKENS) -> dict | None:
    """{"kl": mean per-token KL(reference ‖ model) over the texts' predicted positions (windows of `length`),
    "samples", "tokens"}; None when no text has a token to predict."""
    from posttrainllm.errors import DataError
    from posttrainllm.evaluate.files import evaluate_files

    total, count, used = 0.0, 0, 0
    for i, text in enumerate(texts):
        try:
            r = evaluate_files(model, tokenizer, {f"probe{i}": text}, length, progress=False,
                reference=reference)[f"probe{i}"]  # fmt: skip
        except DataError:  # an empty sample (EOS first): nothing to predict
            continue
        total += r["kl"] * r["predicted_tokens"]
        count += r["predicted_tokens"]
        used += 1
    if not count:
        return None
    return {"kl": total / count, "samples": used, "tokens": count}
