"""sft's padding-free batches: where they are exact, and the trainer mixin that turns them on.

Padding-free, TRL's collator concatenates a batch's examples into one row with per-example position ids and passes no
attention mask. transformers then finds the examples' boundaries in the position ids and builds a block-diagonal
causal mask (sdpa and eager attention, sliding-window layers included), so each example attends only to itself and
the loss equals the padded batch's: TRL masks the label across each boundary, and the token count the loss is
divided by is the same. An attention mask of ones would let the examples attend across each other, and an attention
kind that builds its mask another way may too, so padding-free is used only where it is verified:

- a text model of one of the `VERIFIED` model types (tests/unit/training/test_padding_free.py checks each: the
  padding-free per-token losses equal the padded ones, and without the position ids they do not);
- transformers' own class for it (not remote code, whose attention is not the one tested);
- sdpa or eager attention (flash kernels take the boundaries another way, not verified here).

Elsewhere the batches stay padded and the banner's "batches" row says why. Imports no torch at import time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

EXACT_ATTENTION = ("sdpa", "eager")
# model types whose padding-free loss the tests compare with the padded one
VERIFIED = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "olmo2",
        "smollm3",
        "granite",
    }
)
ROW = "padding-free (each batch's examples in one row, per-example position ids, no pad tokens)"


def _text_model(model):
    """The causal LM under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def padded_because(model) -> str | None:
    """Why padding-free batches are not verified exact for `model` (one phrase); None when they are."""
    lm = _text_model(model)
    config = getattr(lm, "config", None)
    if config is None:
        return f"{type(lm).__name__} has no config to check"
    if getattr(config, "vision_config", None) is not None:
        return "a vision-language model (TRL's padding-free batches take no images)"
    kind = getattr(config, "model_type", None)
    if kind not in VERIFIED:
        return f"{type(lm).__name__} ({kind}) is not an architecture whose padding-free loss is verified"
    if not type(lm).__module__.startswith("transformers.models."):
        return f"{type(lm).__name__} is the model repository's own code, not transformers' {kind} (not verified)"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in EXACT_ATTENTION:
        return f"its attention ({attention}) is not verified to keep the examples of one row apart (sdpa and eager are)"
    return None


def batches_row(cfg: RunConfig, model) -> tuple[str | None, dict[str, Any]]:
    """sft's banner row on its batches, and what run_config.json records of them (`padding_free_used`, and the
    reason, `padded_because`, when padded where padding-free was asked for). No row under --packing (its own row
    says it is padding-free)."""
    if cfg.packing:
        return None, {"padding_free_used": True}
    if not cfg.padding_free:
        return "padded to each batch's longest row (--no-padding-free)", {"padding_free_used": False}
    reason = padded_because(model)
    if reason is None:
        return ROW, {"padding_free_used": True}
    return f"padded: {reason}", {"padding_free_used": False, "padded_because": reason}


class PaddingFreeMixin:
    """Mixed in before TRL's SFTTrainer: with `padding_free` in its config (and no packing), the batches are
    padding-free where `padded_because(model)` finds that exact, else padded, and the config then says
    padding_free=False.

    TRL's padded path prepares the rows (tokenized, truncated to max_length): TRL refuses max_length with
    padding-free batches without packing, though it truncates the rows the same way. Then its collator is
    switched to padding-free, so both ways train on the same rows."""

    def __init__(self, *args, model=None, **kwargs):
        conf = kwargs.get("args")
        wanted = bool(conf is not None and getattr(conf, "padding_free", False) and not conf.packing)
        if wanted:
            conf.padding_free = False
        super().__init__(*args, model=model, **kwargs)
        if wanted and padded_because(self.model) is None:
            from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

            if type(self.data_collator) is DataCollatorForLanguageModeling:  # TRL's own text collator
                self.data_collator.padding_free = self.padding_free = conf.padding_free = True
