"""Tiny vision-language models and processors built here (no download), for the VLM tests: LLaVA (a CLIP tower, a
projector, a llama decoder), LLaVA with a SigLIP tower, LLaVA-NeXT (a base tile plus a grid tile, image_sizes),
Idefics3 (SmolVLM's family: a pixel-shuffle connector), Gemma 3 (SigLIP, a pooling projector, tied embeddings,
token_type_ids) and PaliGemma (a BOS after the image tokens), each with hidden sizes of 16-32 and 2 blocks per
tower, a byte-level BPE tokenizer plus the family's image tokens, a small image processor built from its class, and
a ChatML chat template with `{% generation %}` markers (`chat_template(..., markers=False)`: without them).
`draw_image` draws the tiny synthetic images the tests use."""

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


def chat_template(image_placeholder: str, markers: bool = True) -> str:
    """The ChatML template with the family's image placeholder; `markers=False`: without `{% generation %}` markers
    (as many VLMs' own templates are)."""
    template = _TEMPLATE.replace("IMAGE", repr(image_placeholder))
    if not markers:
        template = template.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    return template


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


def _special_tokenizer(named: dict[str, str], bos: str | None = None):
    """A tokenizer whose family tokens are named attributes (`tok.boi_token`, `tok.image_token_id`, ...)."""
    specials = CHAT_SPECIALS + list(named.values()) + ([bos] if bos else [])
    return build_tokenizer(
        CORPUS, vocab_size=320, specials=specials, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token=bos,
        extra_special_tokens=named,
    )  # fmt: skip


def _siglip(image_size: int, patch: int, **extra):
    from transformers import SiglipVisionConfig

    return SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=image_size,
        patch_size=patch, **extra,
    )  # fmt: skip


def build_gemma3(image_size: int = 28, patch: int = 14):
    """(model, processor) of a tiny Gemma 3: a 2-block SigLIP tower, a pooling projector (4 tokens per image), a
    Gemma 3 decoder whose input and output embeddings are tied; the processor returns token_type_ids."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor, Gemma3TextConfig
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = _special_tokenizer(named)
    # one sliding and one full-attention layer (as the real model mixes them): the reply sees the image through it
    layers = {"head_dim": 8, "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}
    text = Gemma3TextConfig(**{**_decoder(tok), **layers, "tie_word_embeddings": True})
    config = Gemma3Config(
        text_config=text, vision_config=_siglip(image_size, patch), mm_tokens_per_image=4,
        boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id, image_token_index=tok.image_token_id,
    )  # fmt: skip
    images = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size})
    processor = Gemma3Processor(
        image_processor=images, tokenizer=tok, image_seq_length=4, chat_template=chat_template(named["boi_token"])
    )
    model = Gemma3ForConditionalGeneration(config)
    # transformers initializes the projection to zeros (no gradient would reach the tower); a trained one is not
    torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.2)
    return model, processor


def build_paligemma(image_size: int = 28, patch: int = 14):
    """(model, processor) of a tiny PaliGemma: a 2-block SigLIP tower, a linear projector, a Gemma decoder; the
    processor puts a BOS after the image tokens and returns token_type_ids."""
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tok = _special_tokenizer({"image_token": "<image>"}, bos="<bos>")
    images = SiglipImageProcessorPil(size={"height": image_size, "width": image_size})
    images.image_seq_length = (image_size // patch) ** 2
    processor = PaliGemmaProcessor(image_processor=images, tokenizer=tok, chat_template=chat_template("<image>"))
    text = GemmaConfig(**{**_decoder(tok), "vocab_size": len(tok), "head_dim": 8, "bos_token_id": tok.bos_token_id})
    config = PaliGemmaConfig(
        vision_config=_siglip(image_size, patch), text_config=text, projection_dim=32, hidden_size=32,
        image_token_id=tok.image_token_id,
    )  # fmt: skip
    return PaliGemmaForConditionalGeneration(config), processor


def build_llava_siglip(image_size: int = 28, patch: int = 14):
    """(model, processor) of a tiny LLaVA whose tower is SigLIP (no CLS token: one image token per patch)."""
    from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tok = _tokenizer(["<image>"])
    config = LlavaConfig(
        vision_config=_siglip(image_size, patch), text_config=LlamaConfig(**_decoder(tok)),
        image_token_id=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-1,
        vision_feature_select_strategy="full",
    )  # fmt: skip
    images = SiglipImageProcessorPil(size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(
        image_processor=images, tokenizer=tok, patch_size=patch, vision_feature_select_strategy="full",
        chat_template=chat_template("<image>"), num_additional_image_tokens=0,
    )  # fmt: skip
    return LlavaForConditionalGeneration(config), processor


def build_llava_next(image_size: int = 28, patch: int = 14):
    """(model, processor) of a tiny LLaVA-NeXT: a CLIP tower on a base tile plus one `image_size` grid tile, an
    `image_newline` row, a llama decoder; the processor returns image_sizes."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextProcessor,
    )
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    tok = _tokenizer(["<image>"])
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=image_size,
        patch_size=patch, projection_dim=16,
    )  # fmt: skip
    grid = [[image_size, image_size]]
    config = LlavaNextConfig(
        vision_config=vision, text_config=LlamaConfig(**_decoder(tok)), image_grid_pinpoints=grid,
        image_token_id=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )  # fmt: skip
    images = LlavaNextImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
        image_grid_pinpoints=grid,
    )  # fmt: skip
    processor = LlavaNextProcessor(
        image_processor=images, tokenizer=tok, patch_size=patch, vision_feature_select_strategy="default",
        chat_template=chat_template("<image>"), num_additional_image_tokens=1,
    )  # fmt: skip
    return LlavaNextForConditionalGeneration(config), processor


def build_mllama(image_size: int = 28, patch: int = 14):
    """(model, processor) of a tiny Mllama (Llama 3.2 Vision): a vision tower of 2 local and 1 global layers on one
    tile, a projector, a decoder whose block 1 cross-attends to the image; its processor puts a BOS before the
    text."""
    from transformers import MllamaConfig, MllamaForConditionalGeneration, MllamaProcessor
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    tok = _special_tokenizer({"image_token": "<|image|>"}, bos="<|begin_of_text|>")
    vision = dict(
        hidden_size=16, num_hidden_layers=2, num_global_layers=1, attention_heads=2, intermediate_size=32,
        vision_output_dim=48, image_size=image_size, patch_size=patch, max_num_tiles=1,
        supported_aspect_ratios=[[1, 1]], intermediate_layers_indices=[0, 1],
    )  # fmt: skip
    text = {**_decoder(tok), "cross_attention_layers": [1], "bos_token_id": tok.bos_token_id}
    config = MllamaConfig(vision_config=vision, text_config=text, image_token_index=tok.image_token_id)
    images = MllamaImageProcessorPil(size={"height": image_size, "width": image_size}, max_image_tiles=1)
    processor = MllamaProcessor(image_processor=images, tokenizer=tok, chat_template=chat_template("<|image|>"))
    return MllamaForConditionalGeneration(config), processor


def save_qwen2_vl(directory: Path, image_size: int = 28, patch: int = 14) -> Path:
    """A tiny Qwen2-VL (a 2-block ViT on 2x2-merged patches, a merger, a Qwen2 decoder with M-RoPE) saved in
    `directory` with the files of its processor (tokenizer, image processor, processor class, chat template) written
    one by one: transformers builds a Qwen2VLProcessor only with its video processor, which needs torchvision."""
    import json

    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    named = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"}
    tok = _special_tokenizer({**named, "vision_start": "<|vision_start|>", "vision_end": "<|vision_end|>"})
    text = {**_decoder(tok), "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2]}}
    vision = dict(depth=2, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=patch,
                  spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
    config = Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=tok.image_token_id, video_token_id=tok.video_token_id,
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
    )  # fmt: skip
    Qwen2VLForConditionalGeneration(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    pixels = image_size * image_size
    Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, min_pixels=pixels, max_pixels=pixels).save_pretrained(
        directory
    )
    (directory / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}))
    (directory / "chat_template.jinja").write_text(chat_template("<|vision_start|><|image_pad|><|vision_end|>"))
    return directory


def save_smolvlm(directory: Path, image_size: int = 28, patch: int = 14) -> Path:
    """A tiny SmolVLM (Idefics3's tower and connector, a llama decoder) saved in `directory` with its processor's
    files written one by one: transformers builds a SmolVLMProcessor only with its video processor (torchvision)
    and num2words."""
    import json

    from transformers import LlamaConfig, SmolVLMConfig, SmolVLMForConditionalGeneration
    from transformers.models.idefics3 import Idefics3VisionConfig
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    rows = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    tok = _tokenizer(["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *rows])
    vision = Idefics3VisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=image_size,
        patch_size=patch,
    )  # fmt: skip
    config = SmolVLMConfig(
        vision_config=vision, text_config=LlamaConfig(**_decoder(tok)), scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )  # fmt: skip
    SmolVLMForConditionalGeneration(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    edge = {"longest_edge": image_size}
    SmolVLMImageProcessorPil(size=edge, max_image_size=edge, do_image_splitting=False).save_pretrained(directory)
    processor = {"processor_class": "SmolVLMProcessor", "image_seq_len": (image_size // patch) ** 2 // 4}
    (directory / "processor_config.json").write_text(json.dumps(processor))
    (directory / "chat_template.jinja").write_text(chat_template("<image>"))
    return directory


# the families whose processor transformers builds only with torchvision (their video processor)
SAVED_WITHOUT_PROCESSOR = {"qwen2_vl": save_qwen2_vl, "smolvlm": save_smolvlm}


BUILDERS = {
    "llava": build_llava, "idefics3": build_idefics3, "gemma3": build_gemma3, "paligemma": build_paligemma,
    "llava_siglip": build_llava_siglip, "llava_next": build_llava_next, "mllama": build_mllama,
}  # fmt: skip
# the families sft (assistant-only loss), dpo and generate run end to end on; PaliGemma's processor inserts a BOS
# into the text and takes no text without images, which TRL's collators need (docs/vlm.md): its plan is tested
TRAINED = ("llava", "idefics3", "gemma3", "llava_siglip", "llava_next")


def save_vlm(family: str, directory: Path, seed: int = 0, markers: bool = True) -> Path:
    """A tiny VLM of `family` with its processor, saved in `directory` (what `--model` takes); `markers=False`: its
    chat template has no `{% generation %}` markers."""
    import torch

    torch.manual_seed(seed)
    model, processor = BUILDERS[family]()
    if not markers:
        processor.chat_template = processor.chat_template.replace("{%- generation -%}", "").replace(
            "{%- endgeneration -%}", ""
        )
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
