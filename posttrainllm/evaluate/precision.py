"""The precision evaluation scores in: the one training picks (``--precision``, ``models.pick_precision``).

``bf16`` (auto on a GPU with bf16 and on a CPU with AVX512-BF16/AMX): the forward passes run under
``torch.autocast(dtype=bfloat16)`` over the weights as loaded, as the trainer's own evaluation does; the
log-probabilities are still taken in float32 (``scoring._row_nll_sum``, ``divergence.kl_sum``). ``fp16`` (GPU only):
the same with float16. ``fp32``: no autocast. bf16 rounds the logits (8 bits of mantissa), so a held-out perplexity
or KL measured in bf16 is compared only with one measured in bf16: the base cache's key holds the precision
(``base_cache.base_identity``), and ``--precision fp32`` gives the exact figure where two models differ very little.
"""

from __future__ import annotations

import contextlib

AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def scoring_autocast(precision: str):
    """A context manager: autocast to the precision's dtype on the device evaluation runs on (cuda when there is
    one, as ``report.load_for_eval`` places the model), nothing for fp32."""
    name = AUTOCAST_DTYPES.get(precision)
    if name is None:
        return contextlib.nullcontext()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.autocast(device_type=device, dtype=getattr(torch, name))
