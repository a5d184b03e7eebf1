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

Elsewhere the batches stay padded and the banner's "batches" row says why.

Where it is exact, each batch is flattened only when that computes less (`CheaperLayout`): sdpa and eager attention
compute every pair of a row's positions (the block-diagonal mask is dense), so one row of a batch's ΣL positions
costs (ΣL)² attention pairs where the padded batch costs B·Lmax². Short rows gain from dropping the padding; long
ones lose to the attention (SmolLM2 on conversations of up to 512 tokens, batch 8: flattening every batch ran at 0.76×
the padded batches; docs/performance.md §7). Either layout gives the same per-row losses, so the choice changes the
speed, never the result. Imports no torch at import time."""

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
ROW = (
    "padding-free (each batch's examples in one row, per-example position ids, no pad tokens) where that computes "
    "less; a batch whose row's attention would cost more than its padding saves is padded"
)


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


# what a FLOP of masked attention costs against a FLOP of the matmuls: fitted to the two layouts measured on SmolLM2
# (flattened/padded time 0.92 on Alpaca at 256 tokens, 1.31 on conversations of up to 512; decision log 82)
PAIR_COST = 1.5


def layout_costs(config) -> tuple[float, float]:
    """(cost per token, cost per attention pair) of a forward pass of a model with `config`, in matmul FLOPs: per
    token the attention's projections, the MLP (gated: three matrices; a mixture of experts: its active experts) and
    the LM head; per pair the attention's q·k and weights·v over every layer, times PAIR_COST. The backward pass
    scales both alike."""
    get = lambda *names, default=None: next(  # noqa: E731
        (v for n in names if (v := getattr(config, n, None)) is not None), default
    )
    hidden = get("hidden_size", default=1)
    layers = get("num_hidden_layers", default=1)
    heads = get("num_attention_heads", default=1)
    head_dim = get("head_dim", default=hidden // max(heads, 1))
    kv_heads = get("num_key_value_heads", default=heads)
    experts = get("num_experts_per_tok", default=1)
    mlp = 3 * hidden * get("moe_intermediate_size", "intermediate_size", default=4 * hidden) * experts
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    per_token = 2 * (layers * (attention + mlp) + hidden * get("vocab_size", default=0))
    per_pair = 2 * 2 * heads * head_dim * layers * PAIR_COST
    return float(per_token), float(per_pair)


class CheaperLayout:
    """TRL's collator, padding-free or padded batch by batch, whichever layout computes less (module docstring):
    one row of ΣL positions costs per_token·ΣL + per_pair·(ΣL)², a padded batch of B rows of the longest length Lmax
    per_token·B·Lmax + per_pair·B·Lmax². `flattened` and `padded` count the batches of each."""

    def __init__(self, collator, per_token: float, per_pair: float):
        self.collator, self.per_token, self.per_pair = collator, per_token, per_pair
        self.flattened = self.padded = 0

    def flatten(self, lengths: list[int]) -> bool:
        total, longest, n = sum(lengths), max(lengths, default=0), len(lengths)
        row = self.per_token * total + self.per_pair * total * total
        return row <= self.per_token * n * longest + self.per_pair * n * longest * longest

    def __call__(self, examples):
        flat = self.flatten([len(e["input_ids"]) for e in examples])
        self.collator.padding_free = flat
        self.flattened, self.padded = self.flattened + flat, self.padded + (not flat)
        return self.collator(examples)

    def __getattr__(self, name):  # the collator's own attributes (pad_token_id, ...), as TRL reads them
        collator = self.__dict__.get("collator")  # absent while pickle or copy rebuilds the object
        if collator is None:
            raise AttributeError(name)
        return getattr(collator, name)


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
                costs = layout_costs(_text_model(self.model).config)
                self.data_collator = CheaperLayout(self.data_collator, *costs)
