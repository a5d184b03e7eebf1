"""The KL anchor's working memory on a Gemma-sized LM head: whole-batch base log-probabilities against chunks.

    OMP_NUM_THREADS=1 nice python bench/kl_chunks.py [--tokens 1024] [--vocab 262144] [--hidden 640] [--json]

One KL(base ‖ model) sum over `--tokens` loss tokens and its backward, through two LM heads (the model's, trained,
and a frozen base's) of `--vocab` × `--hidden` (Gemma-3-270M's by default), computed two ways, each in a fresh
process so that its peak RSS is its own:

- `whole`: the base's float32 log-probabilities for every loss token at once (the anchor before issue #46), then the
  model's side a chunk of 1024 tokens at a time, recomputed in the backward pass;
- `chunked`: posttrainllm's KLToBaseMixin as it is: both sides a chunk at a time (divergence.chunk_positions),
  the base's head recomputed in the backward pass too.

Reported: the KL and the norm of the hidden states' gradient (equal both ways), the peak RSS above the two heads'
weights (which includes the head's weight gradient, vocab × hidden float32) and the CPU seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time
from types import SimpleNamespace


def _heads(vocab: int, hidden: int):
    import torch

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
            self.config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(model_type="bench"))

        def get_output_embeddings(self):
            return self.lm_head

    torch.manual_seed(0)
    return Head(), Head().requires_grad_(False)


def measure(way: str, tokens: int, vocab: int, hidden: int) -> dict:
    import torch
    from torch.utils.checkpoint import checkpoint

    from posttrainllm.training import kl_to_base

    model, base = _heads(vocab, hidden)
    h = torch.randn(tokens, hidden).requires_grad_(True)
    base_h = torch.randn(tokens, hidden)
    anchor = kl_to_base.KLToBaseMixin.__new__(kl_to_base.KLToBaseMixin)
    anchor.kl_base, anchor.accelerator = base, SimpleNamespace(autocast=contextlib.nullcontext)
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
    if way == "chunked":
        kl = anchor._kl_sum_of(model, h, base_h)
    else:
        with torch.no_grad():
            log_p = kl_to_base._head_logits(base, base_h).float().log_softmax(-1)

        def part_kl(lm, hidden_part, log_p_part):
            log_q = kl_to_base._head_logits(lm, hidden_part).float().log_softmax(-1)
            return torch.nn.functional.kl_div(log_q, log_p_part, log_target=True, reduction="sum")

        kl = sum(
            checkpoint(part_kl, model, h[s : s + 1024], log_p[s : s + 1024], use_reentrant=False)
            for s in range(0, tokens, 1024)
        )
    kl.backward()
    cpu = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "way": way,
        "kl": float(kl),
        "grad_norm": float(h.grad.norm()),
        "peak_rss_above_weights_mib": round((peak - before) / 1024),
        "cpu_s": round(cpu, 1),
        "chunk_tokens": kl_to_base.chunk_positions(vocab) if way == "chunked" else tokens,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=262_144)
    p.add_argument("--hidden", type=int, default=640)
    p.add_argument("--json", action="store_true")
    p.add_argument("--way", choices=("whole", "chunked"), help=argparse.SUPPRESS)  # one measurement, in-process
    a = p.parse_args()
    if a.way:
        print(json.dumps(measure(a.way, a.tokens, a.vocab, a.hidden)))
        return
    rows = []
    for way in ("whole", "chunked"):
        cmd = [sys.executable, __file__, "--way", way, "--tokens", str(a.tokens), "--vocab", str(a.vocab)]
        out = subprocess.run([*cmd, "--hidden", str(a.hidden)], capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    if a.json:
        print(json.dumps({"tokens": a.tokens, "vocab": a.vocab, "hidden": a.hidden, "rows": rows}, indent=2))
        return
    for r in rows:
        print(
            f"{r['way']:>8}: KL {r['kl']:.6f}, grad norm {r['grad_norm']:.6f}, peak RSS above the weights "
            f"{r['peak_rss_above_weights_mib']:,} MiB, {r['cpu_s']} CPU s (chunk of {r['chunk_tokens']} tokens)"
        )


if __name__ == "__main__":
    main()
