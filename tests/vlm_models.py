"""Tiny vision-language models and processors built here (no download), for the VLM tests: a LLaVA (a CLIP vision
tower, a projector, a llama decoder) and an Idefics3 (SmolVLM's family: a SigLIP-style tower, a pixel-shuffle
connector, a llama decoder), each with
hidden sizes of 16-32 and 2 blocks per tower, a byte-level BPE tokenizer plus the family's image tokens, a small
image processor built from its class, and a ChatML chat template with `{% generation %}` markers. `draw_image`
draws the tiny synthetic images the tests use."""

from __future__ import annotations

from pathlib import Path

from conftest import CORPUS, build_tokenizer

# ChatML over content parts: a string, or a list of {"type": "text", "text"} / {"type": "image"} parts (an image part
# is the family's placeholder, which the processor expands to the image's tokens); the assistant's words and its
# end-of-turn are inside {% generation %} markers (the loss's assistant mask).
_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' -%}{{- IMAGE -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- generation -%}{{- render(message['content']) + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + render(message['content']) + '<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)
CHAT_SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]


def chat_template(image_placeholder: str) -> str:
    return _TEMPLATE.replace("IMAGE", repr(image_placeholder))


def _tokenizer(image_tokens: list[str]):
    return build_tokenizer(
        CORPUS, vocab_size=320, specials=CHAT_SPECIALS + image_tokens,
        eos_token="<|im_end|>", pad_token="<|pad|>", bos_token=None,
    )  # fmt: skip


def _decoder(tok, hidden: int = 32, layers: int = 2) -> dict:
    return dict(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
    )  # fmt: skip


def build_llava(image_size: int = 28, patch: int = 14):
    """(model, processor) of a tiny LLaVA: a 2-block CLIP tower on `image_size` images in `patch` patches."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tok = _tokenizer(["<image>"])
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=image_size,
        patch_size=patch, projection_dim=16,
    )  # fmt: skip
    config = LlavaConfig(
        vision_config=vision, text_config=LlamaConfig(**_decoder(tok)), image_token_id=tok.convert_tokens_to_ids(
            "<image>"), vision_feature_layer=-1, vision_feature_select_strategy="full", projector_hidden_act="gelu",
    )  # fmt: skip
    images = CLIPImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=images, tokenizer=tok, patch_size=patch, vision_feature_select_strategy="full",
        chat_template=chat_template("<image>"), num_additional_image_tokens=1,
    )  # fmt: skip
    return LlavaForConditionalGeneration(config), processor


def build_idefics3(image_size: int = 28, patch: int = 14):
    """(model, processor) of a tiny Idefics3 (SmolVLM's family): a 2-block SigLIP-style tower on `image_size`
    images in `patch` patches, pixel-shuffled by 2 (one image token per image), no image splitting."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, LlamaConfig
    from transformers.models.idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    rows = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    extra = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tok = _tokenizer(extra + rows)
    scale = 2
    vision = Idefics3VisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=image_size,
        patch_size=patch,
    )  # fmt: skip
    config = Idefics3Config(
        vision_config=vision, text_config=LlamaConfig(**_decoder(tok)), scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size}, do_image_splitting=False
    )
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tok, image_seq_len=(image_size // patch) ** 2 // scale**2,
        chat_template=chat_template("<image>"),
    )  # fmt: skip
    return Idefics3ForConditionalGeneration(config), processor


BUILDERS = {"llava": build_llava, "idefics3": build_idefics3}


def save_vlm(family: str, directory: Path, seed: int = 0) -> Path:
    """A tiny VLM of `family` with its processor, saved in `directory` (what `--model` takes)."""
    import torch

    torch.manual_seed(seed)
    model, processor = BUILDERS[family]()
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def draw_image(path: Path, size: int = 28, color: tuple[int, int, int] = (200, 30, 30)) -> Path:
    """A `size`x`size` RGB image: a colored square on white, drawn with PIL."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), "white")
    ImageDraw.Draw(image).rectangle([size // 4, size // 4, 3 * size // 4, 3 * size // 4], fill=color)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


COLORS = {"red": (200, 30, 30), "green": (30, 160, 60), "blue": (40, 60, 200), "black": (0, 0, 0)}


def sft_row(image: str, color: str) -> dict:
    """One image-text conversation: a user turn with an image part and a question, the assistant's answer."""
    return {
        "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color is the square?"}]},
            {"role": "assistant", "content": f"the square is {color}"},
        ],
        "images": [image],
    }


def write_images(directory: Path) -> dict[str, str]:
    """One drawn image per color under `directory`/pics: color -> its path relative to `directory`."""
    return {c: str(draw_image(directory / "pics" / f"{c}.png", color=rgb).relative_to(directory)) for c, rgb in
            COLORS.items()}  # fmt: skip


def write_sft_data(directory: Path, n: int = 4) -> Path:
    """`directory`/vlm_sft.jsonl: n conversations about drawn images, whose paths are relative to the file."""
    from conftest import write_jsonl

    images = write_images(directory)
    colors = list(COLORS)
    rows = [sft_row(images[colors[i % len(colors)]], colors[i % len(colors)]) for i in range(n)]
    return write_jsonl(directory / "vlm_sft.jsonl", rows)


def write_preference_data(directory: Path, n: int = 4) -> Path:
    """`directory`/vlm_pref.jsonl: n preference pairs (prompt with an image part, chosen, rejected, images)."""
    from conftest import write_jsonl

    images = write_images(directory)
    colors = list(COLORS)
    rows = []
    for i in range(n):
        color, wrong = colors[i % len(colors)], colors[(i + 1) % len(colors)]
        rows.append({
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which color?"}]}],
            "chosen": [{"role": "assistant", "content": f"the square is {color}"}],
            "rejected": [{"role": "assistant", "content": f"the square is {wrong}"}],
            "images": [images[color]],
        })  # fmt: skip
    return write_jsonl(directory / "vlm_pref.jsonl", rows)
