"""--loss-type dft: Dynamic Fine-Tuning (arXiv 2508.05629) for transformers' Trainer (`finetune`, on raw text),
and the plain evaluation loss for both commands that take it.

    loss = Σ over the loss tokens of −p(y)·log p(y), p(y) detached, ÷ the trainer's own token count

sft gets the same loss from TRL (SFTConfig.loss_type="dft"); transformers' Trainer has none, so this mixin hands
its training forward a `compute_loss_func` (the Trainer's own hook for a custom loss: the same forward, the same
normalization as its cross-entropy, `num_items_in_batch` when the trainer counts the step's tokens, else this
micro-batch's, and the same scaling across ranks). The loss tokens are the LM loss's: label != -100, shifted as the
LM loss shifts them. Only training uses it: the evaluation loss (eval_loss) stays the plain NLL, so that a DFT run's
in-domain loss is on the same scale as every other run's (a sweep's frontier compares them). TRL's SFTTrainer would
evaluate its DFT loss; PlainEvalLossMixin (sft's) has it evaluate the NLL instead."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def dft_loss(outputs, labels, num_items_in_batch=None):
    """Σ over the loss tokens of −p(y)·log p(y) (p detached) ÷ `num_items_in_batch` (else the loss tokens' count);
    a batch without loss tokens gives a finite 0."""
    import torch
    import torch.nn.functional as F

    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    target = labels[:, 1:].to(logits.device)
    mask = target != -100
    nll = F.cross_entropy(logits[:, :-1][mask].float(), target[mask], reduction="none")
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    return (nll * torch.exp(-nll).detach()).sum() / torch.as_tensor(count, device=nll.device).clamp(min=1)


def trainer_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """The constructor keywords of DFTLossMixin for a run: whether its training loss is DFT."""
    return {"dft": getattr(cfg, "sft_loss_type", "nll") == "dft"}


class DFTLossMixin:
    """Mixed in before transformers' Trainer; `dft=True` makes the training loss DFT (module docstring), else the
    trainer is unchanged."""

    def __init__(self, *args, dft: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.dft = bool(dft)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        plain = dict(return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if not self.dft or not model.training or "labels" not in inputs or self.compute_loss_func is not None:
            return super().compute_loss(model, inputs, **plain)
        self.compute_loss_func = dft_loss
        try:  # a copy: the Trainer pops the labels it hands to the function, and an outer mixin still reads them
            return super().compute_loss(model, dict(inputs), **plain)
        finally:
            self.compute_loss_func = None


class PlainEvalLossMixin:
    """Mixed in before TRL's SFTTrainer: under `loss_type="dft"`, the evaluation loss is TRL's NLL (the same tokens,
    the same normalization), the training loss stays DFT."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        plain = dict(return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if model.training or getattr(self.args, "loss_type", "nll") != "dft":
            return super().compute_loss(model, inputs, **plain)
        self.args.loss_type = "nll"
        try:
            return super().compute_loss(model, inputs, **plain)
        finally:
            self.args.loss_type = "dft"
