"""How far a model's predictions moved from a reference's: the mean per-token KL(reference ‖ model).

On held-out text, at every predicted position t (the same windows and positions as the perplexity, see
posttrainllm/evaluate/scoring.py), with p = the reference's next-token distribution and q = the model's:

    KL(p ‖ q) = Σ_v p(v) · (log p(v) − log q(v)),   mean over the predicted positions.

It is 0 when the two predict alike, and grows as the tuned model moves away from the base on text it was not
trained on: forgetting tracks it (Shenfeld et al. 2025, "RL's Razor"), and, unlike a perplexity change, it does
not cancel out when training lowers some tokens' loss and raises others'. Log-probabilities are computed in
float32, a chunk of positions at a time (chunk_positions: at most 1024, and at most 128 MiB per float32 tensor of
the chunk), so memory follows the chunk, not the vocabulary times the text. The KL anchor of training
(posttrainllm/training/kl_to_base.py) chunks its positions the same way.
"""

from __future__ import annotations

from posttrainllm.errors import ModelError

_CHUNK = 1024  # positions whose log-probabilities are in float32 at once, at most
CHUNK_BYTES = 128 << 20  # ... and at most this many bytes in one (positions × vocabulary) float32 tensor


def chunk_positions(vocab: int) -> int:
    """How many positions' (vocabulary-wide) float32 distributions to hold at once: 1024, or fewer where the
    vocabulary is large (CHUNK_BYTES per tensor: 682 for SmolLM2's 49,152 tokens, 128 for Gemma 3's 262,144)."""
    return max(1, min(_CHUNK, CHUNK_BYTES // (4 * max(vocab, 1))))


def check_vocab(model_logits_dim: int, reference_logits_dim: int) -> int:
    """The vocabulary both distributions are compared over. A model whose embedding gained rows (an added pad or
    EOS token) is compared on the reference's rows, both renormalized there; anything else is an error."""
    if model_logits_dim == reference_logits_dim:
        return model_logits_dim
    small, large = sorted((model_logits_dim, reference_logits_dim))
    if large - small <= 16:
        return small
    raise ModelError(
        f"the model predicts over {model_logits_dim} tokens and the reference over {reference_logits_dim}: "
        "KL needs the same tokenizer (pass the model's own base as --reference)"
    )


def kl_sum(ref_logits, logits, mask=None) -> tuple[float, int]:
    """Σ over positions of KL(softmax(ref_logits) ‖ softmax(logits)), and the number of positions summed.

    `ref_logits`, `logits`: (T, V) aligned position by position, any float dtype; `mask` (T,) bool keeps positions
    (None: all). Vocabularies that differ by a few added rows are compared on the common ones (check_vocab)."""
    import torch
    import torch.nn.functional as F

    v = check_vocab(logits.shape[-1], ref_logits.shape[-1])
    total = torch.zeros((), dtype=torch.float64, device=logits.device)
    count = 0
    step = chunk_positions(v)
    for start in range(0, logits.shape[0], step):
        lq = logits[start : start + step, :v]
        lp = ref_logits[start : start + step, :v]
        if mask is not None:
            keep = mask[start : start + step]
            lq, lp = lq[keep], lp[keep]
        if lq.shape[0] == 0:
            continue
        log_q = F.log_softmax(lq.float(), dim=-1)
        log_p = F.log_softmax(lp.float(), dim=-1)
        kl = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)  # Σ p (log p − log q) per position
        total = total + kl.double().sum()
        count += lq.shape[0]
    return float(total.item()), count
