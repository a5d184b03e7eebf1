"""--kl-to-base β: an anchor to the starting model for sft and finetune (the ASFT-style loss).

    loss = the trainer's loss + β × KL̄,   KL̄ = mean over the loss tokens of Σ_v p_base(v) (log p_base(v) − log p(v))

The loss tokens are those of the LM loss: positions whose label is not -100, shifted as the LM loss shifts them
(the hidden state at t predicts token t+1), so the assistant-only / completion-only masks apply unchanged. KL̄ is
normalized like the trainer's loss: by the step's token count when the trainer passes one (`num_items_in_batch`,
then KL̄ over a whole accumulated step is the token mean), else by the micro-batch's own count. E.g. β = 0.1, an
LM loss of 2.0 and a mean KL of 0.3 nat over the loss tokens train on 2.03.

The model's distribution comes from the hidden states of the trainer's own forward (a hook on the backbone: no
second forward of the model); the base's from one extra forward of its backbone without gradients: a frozen copy in
eval mode (`kl_base`), or, under LoRA (`kl_base=None`), the same model with its adapters disabled, so no second copy
is held. Only the two (loss tokens × hidden) states are kept. Both go through the LM head a chunk of loss tokens at a
time (divergence.chunk_positions: at most 1024, fewer for a large vocabulary, e.g. 128 for Gemma 3's 262,144), and
each chunk is recomputed in the backward pass, the base's head included, so no (tokens × vocabulary) distribution of
either model exists beyond one chunk's. Both go through the same head function, so at the first step (model = base)
KL̄ is exactly 0 and the loss is the plain loss. Evaluation losses stay the plain loss of --loss-type.

`kl_to_base` (the token mean of KL̄ over the logging interval) is added to the trainer's logs, so it reaches the
progress lines, the trackers and trainer_state.json's log_history."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from posttrainllm.errors import ModelError
from posttrainllm.evaluate.divergence import chunk_positions

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

_SCALES = ("logit_scale", "output_multiplier", "lm_head_multiplier")  # multipliers of the logits, by family
_NOT_BACKBONE_INPUTS = ("labels", "shift_labels", "num_items_in_batch", "use_cache", "fused_lm_head")


def kl_to_base_kwargs(cfg: RunConfig, kl_base) -> dict:
    """The trainer constructor's keywords for KLToBaseMixin: {} when β is 0 or the command has no --kl-to-base
    (then the mixin is not installed and the run is the plain one)."""
    beta = getattr(cfg, "kl_to_base", None) or 0.0
    return {"kl_to_base": float(beta), "kl_base": kl_base} if beta > 0 else {}


def banner_row(cfg: RunConfig, kl_base) -> str | None:
    """The banner's "KL to base" row: the loss, what the base is, and what it costs."""
    beta = getattr(cfg, "kl_to_base", None) or 0.0
    if not beta:
        return None
    from posttrainllm.reporting.banner import fmt_bytes

    if kl_base is None:
        base = "the model with its LoRA adapters disabled (no second copy)"
    else:
        size = sum(p.numel() * p.element_size() for p in kl_base.parameters())
        base = f"a frozen copy of the starting model (+{fmt_bytes(size)} of weights)"
    return (
        f"loss + {beta:g} × mean KL(base ‖ model) over the loss tokens; base: {base}; cost per step: one extra "
        "forward of the base (no backward) and both models' LM heads over the loss tokens, a chunk at a time"
    )


class KLToBaseMixin:
    """Mixed in before a transformers Trainer / TRL SFTTrainer; takes `kl_to_base` (β > 0) and `kl_base` (the
    frozen base model, or None for the adapter-disabled PEFT model) as constructor keywords (module docstring)."""

    def __init__(self, *args, kl_to_base: float = 0.0, kl_base=None, **kwargs):
        self.kl_beta = float(kl_to_base)
        self.kl_base = kl_base
        self._kl_sum = None  # on-device Σ KL since the last log
        self._kl_count = None
        super().__init__(*args, **kwargs)
        if self.kl_base is not None:
            self.kl_base.to(self.args.device)
        elif self.kl_beta and not hasattr(self.model, "disable_adapter"):
            raise ModelError("--kl-to-base without a frozen base needs a LoRA model (its adapters off are the base)")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        plain = dict(return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if not self.kl_beta or not model.training or "labels" not in inputs:
            return super().compute_loss(model, inputs, **plain)
        lm = _causal_lm(self.model)
        captured = []
        handle = lm.base_model.register_forward_hook(lambda _m, _a, out: captured.append(_hidden(out)))
        try:
            result = super().compute_loss(model, inputs, **plain)
        finally:
            handle.remove()
        if not captured:
            raise ModelError(f"--kl-to-base: the forward of {type(lm).__name__} did not run its backbone")
        hidden = _at_loss_positions(captured[0], inputs)  # the first forward is the loss's (SFT may run another)
        kl_sum = self._kl_sum_of(lm, hidden, self._base_hidden(inputs))
        count = hidden.shape[0]
        loss = result[0] if return_outputs else result
        loss = loss + self.kl_beta * kl_sum / self._denominator(count, num_items_in_batch)
        self._kl_sum = kl_sum.detach() if self._kl_sum is None else self._kl_sum + kl_sum.detach()
        self._kl_count = count + (self._kl_count or 0)
        return (loss, result[1]) if return_outputs else loss

    def _denominator(self, count: int, num_items_in_batch):
        """What the trainer divides its own loss by: the step's token count (scaled back by the ranks when it counts
        every rank's tokens, as the trainers do) or this micro-batch's."""
        if num_items_in_batch is None:
            return max(count, 1)
        scale = 1
        if self.args.average_tokens_across_devices:
            tp = self.get_tp_size() if hasattr(self, "get_tp_size") else 1
            scale = self.accelerator.num_processes // tp
        return num_items_in_batch / scale

    def _base_hidden(self, inputs):
        """The base's last hidden states at the loss positions, (n, H): one forward of its backbone, no gradients,
        under the trainer's autocast (the model's own forward runs under it too)."""
        import torch

        fwd = {k: v for k, v in inputs.items() if k not in _NOT_BACKBONE_INPUTS}
        with torch.no_grad(), self._base() as base, self.accelerator.autocast():
            return _at_loss_positions(_hidden(base.base_model(**fwd, use_cache=False)), inputs)

    @contextmanager
    def _base(self):
        """The base causal LM: the frozen copy, or the PEFT model in eval mode with its adapters disabled."""
        if self.kl_base is not None:
            yield _causal_lm(self.kl_base)
            return
        peft_model, was_training = self.model, self.model.training
        peft_model.eval()
        try:
            with peft_model.disable_adapter():
                yield _causal_lm(peft_model)
        finally:
            peft_model.train(was_training)

    def _kl_sum_of(self, lm, hidden, base_hidden):
        """Σ over the loss tokens of KL(base ‖ model); both models' logits are made a chunk of loss tokens at a time
        and recomputed in the backward pass (only the two models' hidden states are kept)."""
        import torch
        from torch.utils.checkpoint import checkpoint

        total = hidden.new_zeros((), dtype=torch.float32)
        step = chunk_positions(_vocab(lm))
        with self.accelerator.autocast():
            for start in range(0, hidden.shape[0], step):
                part = slice(start, start + step)
                total = total + checkpoint(self._chunk_kl, lm, hidden[part], base_hidden[part], use_reentrant=False)
        return total

    def _chunk_kl(self, lm, hidden, base_hidden):
        """Σ over one chunk of loss tokens of KL(base ‖ model): the base's head without gradients (with its adapters
        off under LoRA, in case the head has some), then the model's."""
        import torch
        import torch.nn.functional as F

        with torch.no_grad(), self._base() as base:
            log_p = _head_logits(base, base_hidden).float().log_softmax(-1)
        log_q = _head_logits(lm, hidden).float().log_softmax(-1)
        return F.kl_div(log_q, log_p, log_target=True, reduction="sum")  # Σ p (log p − log q)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs and self._kl_count is not None:
            import torch

            mine = torch.stack([self._kl_sum.double(), torch.tensor(float(self._kl_count), dtype=torch.float64)])
            total, count = self.accelerator.reduce(mine.to(self.args.device), reduction="sum").tolist()
            logs["kl_to_base"] = total / count if count else 0.0
            self._kl_sum = self._kl_count = None
        super().log(logs, *args, **kwargs)


def _causal_lm(model):
    """The causal LM under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _hidden(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _at_loss_positions(hidden, inputs):
    """The (n, H) hidden states that predict a label of the loss: label != -100 one step ahead, or the pre-shifted
    `shift_labels` as given (context parallelism)."""
    if "shift_labels" in inputs:
        mask = inputs["shift_labels"] != -100
    else:
        hidden, mask = hidden[:, :-1], inputs["labels"][:, 1:] != -100
    return hidden[mask.to(hidden.device)]


def _head_logits(lm, hidden):
    """The LM head over hidden states, with the logit scale and final soft-capping of the models that have them
    (read from the config as TRL's fused head reads them)."""
    import torch

    logits = lm.get_output_embeddings()(hidden)
    text = lm.config.get_text_config()
    scale = next((v for k in _SCALES if (v := getattr(text, k, None)) is not None), None)
    if scale is None and getattr(text, "logits_scaling", None) is not None:  # Granite, MiniCPM3 divide by it
        scale = text.logits_scaling if text.model_type == "hyperclovax" else 1 / text.logits_scaling
    if scale is not None and scale != 1:
        logits = logits * scale
    cap = getattr(text, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _vocab(lm) -> int:
    """The number of logits per position (the head's rows; the config's vocabulary where the head does not say)."""
    head = lm.get_output_embeddings()
    rows = getattr(head, "out_features", None)
    return int(rows) if rows else int(lm.config.get_text_config().vocab_size)
