"""What TRL's vision collators ask of a processor, checked on a drawn probe before the model loads (docs/vlm.md).

- The assistant-only loss (a template with `{% generation %}` markers): transformers finds the assistant's tokens
  from the rendered text's character offsets; a processor that rewrites the text (PaliGemma's puts a BOS after the
  image tokens) shifts that mask onto other tokens. The probe renders a one-image conversation, tokenizes it with
  the mask as TRL does, and checks that the masked tokens are the assistant's reply.
- Completion-only loss and dpo: the collators process the completions as text alone; a processor that takes no text
  without images (PaliGemma's) fails on them.

Each check returns a problem (a sentence) or None; the caller turns it into a UsageError. Nothing of the project is
imported (a leaf)."""

from __future__ import annotations

REPLY = "a probe reply"


def _image(processor):
    """A white image of the processor's input size, between 28x28 and 448x448 (the processor resizes it)."""
    from PIL import Image

    size = getattr(getattr(processor, "image_processor", None), "size", None)
    size = size if isinstance(size, dict) else {}
    side = next((v for k in ("height", "shortest_edge", "longest_edge") if isinstance(v := size.get(k), int)), 28)
    side = min(max(side, 28), 448)
    return Image.new("RGB", (side, side), "white")


def _template_kwargs() -> dict:
    """No special tokens added to the rendered template, as TRL's collator asks (transformers 5.4 moved the
    processor's keywords into `processor_kwargs`)."""
    import transformers
    from packaging.version import Version

    kwargs = {"add_special_tokens": False}
    return {"processor_kwargs": kwargs} if Version(transformers.__version__) >= Version("5.4.0") else kwargs


def assistant_mask_problem(processor) -> str | None:
    """None when the generation markers' mask covers exactly the assistant's reply (its end of turn may follow);
    else what the mask covers instead."""
    messages = [[
        {"role": "user", "content": [{"type": "image", "image": _image(processor)}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": REPLY}]},
    ]]  # fmt: skip
    try:
        out = processor.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **_template_kwargs()
        )
    except (ValueError, TypeError, KeyError, IndexError) as e:
        return f"its chat template with the assistant mask cannot be applied to a one-image conversation ({e})"
    ids, mask = out["input_ids"][0], out["assistant_masks"][0]
    masked = processor.tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    if masked.strip().startswith(REPLY):
        return None
    return (
        f"the assistant mask of its chat template falls on {masked[:40]!r}, not on the reply {REPLY!r} (the "
        "processor changes the template's text, e.g. inserts tokens after the image)"
    )


def text_alone_problem(processor) -> str | None:
    """None when the processor takes a text without images (the collators process completions so)."""
    try:
        processor(text=["a probe"], add_special_tokens=False)
    except (ValueError, TypeError) as e:
        return f"{type(processor).__name__} takes no text without images ({e})"
    return None
