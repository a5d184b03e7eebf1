"""Tiny vision-language models of real transformers classes built from configs (Qwen2-VL, Qwen2.5-VL, LLaVA with a
CLIP or a SigLIP tower, LLaVA-NeXT, PaliGemma, Idefics3, SmolVLM, Gemma 3), and the LR each parameter must get under
the per-tower schedule (tests/unit/llrd/test_vlm_towers.py, tests/cli/test_vlm_plan_cli.py). Nothing is downloaded.

The expected LR of a parameter is computed from where the family puts it (the module paths transformers gives each
family, written out below) and the closed forms, never by asking the code under test:

    vision block j of M: lr × γ_v^(M-1-j)    vision embeddings: lr × γ_v^(M-1)    a norm/head after the blocks: lr
    projector: lr × projector_scale          decoder block i of N: lr × γ^(N-1-i)  embeddings: lr × γ^(N-1)  head: lr
"""

import re

import torch

BASE, GAMMA, GAMMA_V, PROJ = 1e-3, 0.7, 0.6, 3.0
N, M = 3, 2  # decoder blocks, vision blocks
TEXT = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=N, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=96, tie_word_embeddings=False,
)  # fmt: skip
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=M, num_attention_heads=2, image_size=28,
              patch_size=14)  # fmt: skip


def _qwen2_vl():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]})
    vision = dict(depth=M, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
    return Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision))


def _llava(vision_type):
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    vision = dict(VISION, model_type=vision_type)
    return LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=dict(TEXT, model_type="llama")))


def _idefics3():
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    cfg = Idefics3Config(vision_config=VISION, text_config=dict(TEXT, model_type="llama"), scale_factor=2)
    return Idefics3ForConditionalGeneration(cfg)


def _gemma3():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(TEXT, head_dim=8, sliding_window=16)  # ties its input and output embeddings
    cfg = Gemma3Config(text_config=text, vision_config=VISION, mm_tokens_per_image=4)
    return Gemma3ForConditionalGeneration(cfg)


def _qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]})
    vision = dict(depth=M, hidden_size=16, out_hidden_size=32, intermediate_size=32, num_heads=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[M - 1])  # fmt: skip
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision))


def _llava_next():
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

    vision = dict(VISION, model_type="clip_vision_model")
    cfg = LlavaNextConfig(
        vision_config=vision, text_config=dict(TEXT, model_type="llama"), image_grid_pinpoints=[[28, 28]]
    )
    return LlavaNextForConditionalGeneration(cfg)


def _paligemma():
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    cfg = PaliGemmaConfig(vision_config=VISION, text_config=dict(TEXT, model_type="gemma", head_dim=8))
    return PaliGemmaForConditionalGeneration(cfg)


def _smolvlm():
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    cfg = SmolVLMConfig(vision_config=VISION, text_config=dict(TEXT, model_type="llama"), scale_factor=2)
    return SmolVLMForConditionalGeneration(cfg)


# family: (builder, vision block prefix, vision prefix, projector prefixes, decoder block prefix, decoder prefix)
FAMILIES = {
    "qwen2_vl": (_qwen2_vl, "model.visual.blocks.", "model.visual.", ("model.visual.merger.",),
                 "model.language_model.layers.", "model.language_model."),
    "llava_clip": (lambda: _llava("clip_vision_model"), "model.vision_tower.encoder.layers.", "model.vision_tower.",
                   ("model.multi_modal_projector.",), "model.language_model.layers.", "model.language_model."),
    "llava_siglip": (lambda: _llava("siglip_vision_model"), "model.vision_tower.encoder.layers.",
                     "model.vision_tower.", ("model.multi_modal_projector.",), "model.language_model.layers.",
                     "model.language_model."),
    "gemma3": (_gemma3, "model.vision_tower.encoder.layers.", "model.vision_tower.", ("model.multi_modal_projector.",),
               "model.language_model.layers.", "model.language_model."),
    "qwen2_5_vl": (_qwen2_5_vl, "model.visual.blocks.", "model.visual.", ("model.visual.merger.",),
                   "model.language_model.layers.", "model.language_model."),
    "llava_next": (_llava_next, "model.vision_tower.encoder.layers.", "model.vision_tower.",
                   ("model.multi_modal_projector.", "model.image_newline"), "model.language_model.layers.",
                   "model.language_model."),
    "paligemma": (_paligemma, "model.vision_tower.encoder.layers.", "model.vision_tower.",
                  ("model.multi_modal_projector.",), "model.language_model.layers.", "model.language_model."),
    "smolvlm": (_smolvlm, "model.vision_model.encoder.layers.", "model.vision_model.", ("model.connector.",),
                "model.text_model.layers.", "model.text_model."),
    "idefics3": (_idefics3, "model.vision_model.encoder.layers.", "model.vision_model.", ("model.connector.",),
                 "model.text_model.layers.", "model.text_model."),
}  # fmt: skip
# vision parameters after the tower's blocks (post-norms, SigLIP's pooling head): the top block's scale
AFTER_BLOCKS = re.compile(r"post_layernorm|\.head\.")


def build(family):
    torch.manual_seed(0)
    return FAMILIES[family][0]()


def expected_lr(family, name, *, gamma=GAMMA, gamma_v=GAMMA_V, proj=PROJ, n=N, m=M, base=BASE):
    """The closed form for a parameter, from its name's place in the family's module tree (n decoder blocks, m
    vision blocks)."""
    N, M, BASE = n, m, base  # noqa: N806 (the formulas above, as written)
    _, vblock, vision, projector, block, decoder = FAMILIES[family]
    if name.startswith(projector):
        return BASE * proj
    if name.startswith(vblock):
        j = int(name[len(vblock) :].split(".")[0])
        return BASE * gamma_v ** (M - 1 - j)
    if name.startswith(vision):
        return BASE if AFTER_BLOCKS.search(name) else BASE * gamma_v ** (M - 1)
    if name.startswith(block):
        i = int(name[len(block) :].split(".")[0])
        return BASE * gamma ** (N - 1 - i)
    if name.startswith(decoder + "embed_tokens"):
        return BASE * gamma ** (N - 1)
    assert name == "lm_head.weight" or name.startswith(decoder + "norm"), name
    return BASE


class HiddenTower(torch.nn.Module):
    """A VLM whose vision tower holds no config: the tower cannot be found from the model."""

    def __init__(self):
        super().__init__()
        inner = build("llava_clip")
        self.config = inner.config
        self.vision = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(M)])
        self.patch = torch.nn.Linear(4, 16)
        self.language = inner.model.language_model
        self.lm_head = inner.lm_head

    def get_input_embeddings(self):
        return self.language.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head
