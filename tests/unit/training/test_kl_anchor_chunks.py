"""The KL anchor (posttrainllm/training/kl_to_base.py) holds the two models' full-vocabulary distributions one chunk
of loss tokens at a time: its sum and gradients equal the direct formula over all tokens at once, the chunk follows
divergence.chunk_positions, and a training step builds no (loss tokens × vocabulary) float32 tensor that the
plain run does not build too (the trainer's own logits)."""

from __future__ import annotations

import contextlib
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from conftest import build_tiny_model, build_tokenizer
from harness import cli_args
from torch.utils._python_dispatch import TorchDispatchMode
from typer.testing import CliRunner

from posttrainllm.evaluate import divergence
from posttrainllm.training import kl_to_base
from posttrainllm.training.kl_to_base import KLToBaseMixin


class _Anchor(KLToBaseMixin):
    """The mixin's KL without a trainer around it: a frozen base and no autocast."""

    def __init__(self, base):
        self.kl_base = base
        self.accelerator = SimpleNamespace(autocast=contextlib.nullcontext)


@pytest.fixture
def models():
    torch.manual_seed(0)
    tok = build_tokenizer()
    base, model = build_tiny_model(tok).eval(), build_tiny_model(tok).train()  # two different draws: KL > 0
    return model, base.requires_grad_(False)


def test_chunk_positions_follow_the_byte_budget():
    assert divergence.chunk_positions(320) == 1024  # a small vocabulary: the position cap
    assert divergence.chunk_positions(49_152) == 682  # SmolLM2: 128 MiB / (49,152 × 4 bytes)
    assert divergence.chunk_positions(262_144) == 128  # Gemma 3: 128 positions × 1 MiB
    assert divergence.chunk_positions(10**9) == 1


@pytest.mark.parametrize("chunk", [3, 7, 1024])
def test_the_chunked_kl_and_its_gradients_equal_the_direct_formula(models, monkeypatch, chunk):
    model, base = models
    monkeypatch.setattr(kl_to_base, "chunk_positions", lambda vocab: chunk)
    calls = []
    original = _Anchor._chunk_kl

    def counted(self, lm, hidden, base_hidden):
        calls.append(hidden.shape[0])
        return original(self, lm, hidden, base_hidden)

    monkeypatch.setattr(_Anchor, "_chunk_kl", counted)
    n, width = 20, model.config.hidden_size
    hidden = torch.randn(n, width, dtype=torch.float64).float().requires_grad_(True)
    base_hidden = torch.randn(n, width)
    kl = _Anchor(base)._kl_sum_of(model, hidden, base_hidden)
    kl.backward()
    got = (kl.detach(), hidden.grad.clone(), model.lm_head.weight.grad.clone())
    sizes = [min(chunk, n - s) for s in range(0, n, chunk)]
    assert calls == sizes + sizes[::-1]  # each chunk, then again in the backward pass (last first)

    hidden.grad, model.lm_head.weight.grad = None, None
    log_q = model.lm_head(hidden).log_softmax(-1)
    log_p = base.lm_head(base_hidden).log_softmax(-1)
    direct = (log_p.exp() * (log_p - log_q)).sum()  # Σ over all tokens of Σ_v p (log p − log q), at once
    direct.backward()
    assert got[0].item() > 1e-3
    torch.testing.assert_close(got[0], direct.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], hidden.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got[2], model.lm_head.weight.grad, rtol=1e-5, atol=1e-7)


class _Shapes(TorchDispatchMode):
    """The shapes of the float32 tensors every (non-view) op makes, forward and backward."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.shapes = vocab, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() and t.shape[-1] == self.vocab:
                    self.shapes[tuple(t.shape)] += 1
        return out


def _step_shapes(model_dir, data, out, monkeypatch, *extra) -> tuple[Counter, int]:
    """One sft step under _Shapes: the shapes of the (rows × vocabulary) float32 tensors with more rows than the
    anchor's chunk, and the loss tokens of the step's batch."""
    from transformers import AutoConfig
    from trl import SFTTrainer

    from posttrainllm.cli import app

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    mode, loss_tokens = _Shapes(vocab), []
    original = SFTTrainer.training_step

    def watched(self, model, inputs, *args, **kwargs):
        loss_tokens.append(int((inputs["labels"][:, 1:] != -100).sum()))
        with mode:
            return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "training_step", watched)
    args = cli_args("sft", model_dir, data, out, precision="fp32", batch_size=4, max_steps=1, save_steps=1000)
    r = CliRunner().invoke(app, [*args, *extra])
    assert r.exit_code == 0, r.output
    return Counter({s: c for s, c in mode.shapes.items() if s[0] > 4}), loss_tokens[0]


def test_a_step_with_the_anchor_builds_no_vocabulary_wide_tensor_over_the_loss_tokens(
    tiny_model_dir, alpaca_file, tmp_path, monkeypatch
):
    """With the chunk set to 4 loss tokens, the anchored step's float32 (rows × vocabulary) tensors of more than 4
    rows are exactly the plain step's (the trainer's own logits and their gradient): the base's and the model's
    distributions for the KL exist 4 rows at a time, forward and backward."""
    monkeypatch.setattr(kl_to_base, "chunk_positions", lambda vocab: 4)
    chunks = []
    original = KLToBaseMixin._chunk_kl

    def counted(self, lm, hidden, base_hidden):
        chunks.append(hidden.shape[0])
        return original(self, lm, hidden, base_hidden)

    monkeypatch.setattr(KLToBaseMixin, "_chunk_kl", counted)
    plain, _ = _step_shapes(tiny_model_dir, alpaca_file, tmp_path / "plain", monkeypatch)
    anchored, n = _step_shapes(tiny_model_dir, alpaca_file, tmp_path / "kl", monkeypatch, "--kl-to-base", "0.5")
    assert n > 8 and plain  # several chunks, and the trainer's logits are seen (the mode watches the step)
    assert anchored == plain, (anchored, plain)
    sizes = [min(4, n - s) for s in range(0, n, 4)]
    assert chunks == sizes + sizes[::-1]  # the forward's chunks, then the backward's
