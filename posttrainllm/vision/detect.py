"""Whether a model is a vision-language model, read from its config alone (no weights): a config with a
`vision_config`, or a model type that transformers maps to `AutoModelForImageTextToText`. A leaf: it imports nothing
of the project."""

from __future__ import annotations

from typing import Any


def is_vision_config(config: Any) -> bool:
    """A config with a vision tower: a `vision_config`, or a model type of transformers' image-text-to-text map."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    if getattr(config, "vision_config", None) is not None:
        return True
    return getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def read_config(ref: str, trust_remote_code: bool = False) -> Any | None:
    """The model's config (a LoRA adapter directory's: its base model's), or None when it cannot be read (a hub id
    not cached offline: the model load that follows reports the real problem)."""
    import json
    from pathlib import Path

    from transformers import AutoConfig

    adapter = Path(ref).expanduser() / "adapter_config.json"
    try:
        if adapter.is_file() and not adapter.with_name("config.json").is_file():
            ref = json.loads(adapter.read_text(encoding="utf-8"))["base_model_name_or_path"]
        return AutoConfig.from_pretrained(ref, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - the model load that follows reports the real problem
        return None


def is_vlm(ref: str, trust_remote_code: bool = False) -> bool:
    """Whether `ref` (a model directory or hub id) is a vision-language model, from its config."""
    config = read_config(ref, trust_remote_code)
    return config is not None and is_vision_config(config)


def describe_config(ref: str, trust_remote_code: bool = False) -> str:
    """What the config says the model is, for messages: its architecture (or model type)."""
    config = read_config(ref, trust_remote_code)
    if config is None:
        return "config unreadable"
    names = getattr(config, "architectures", None) or [getattr(config, "model_type", "?")]
    return f"{names[0]}, no vision_config"
