"""The tiny model families the LLRD tests build (tests/unit/llrd/test_architectures.py, tests/cli/test_cli_models.py):
their configs, embedding-name prefixes and kinds, and the scale each parameter's LR must have."""

import re

BASE, GAMMA, N = 1e-3, 0.8, 3
BLOCK_RE = re.compile(r"(?:layers|h|layer)\.(\d+)\.")
LLAMA_EMB = ("model.embed_tokens.",)
DECODER = dict(
    vocab_size=100,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=N,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# family -> (config kwargs, embedding-name prefixes, model kind)
FAMILIES = {
    "llama": (DECODER, LLAMA_EMB, "causal"),
    "qwen2": (DECODER, LLAMA_EMB, "causal"),
    "qwen3": ({**DECODER, "head_dim": 8}, LLAMA_EMB, "causal"),
    "mistral": (DECODER, LLAMA_EMB, "causal"),
    "gemma2": ({**DECODER, "head_dim": 8, "tie_word_embeddings": True}, LLAMA_EMB, "causal"),
    "phi3": (DECODER, LLAMA_EMB, "causal"),
    "gpt2": (
        dict(vocab_size=100, n_embd=16, n_layer=N, n_head=2, n_positions=64),
        ("transformer.wte.", "transformer.wpe."),
        "causal",
    ),
    "gpt_neox": (DECODER, ("gpt_neox.embed_in.",), "causal"),
    "opt": (
        dict(
            vocab_size=100,
            hidden_size=16,
            ffn_dim=32,
            num_hidden_layers=N,
            num_attention_heads=2,
            max_position_embeddings=64,
            word_embed_proj_dim=8,
            pad_token_id=0,
        ),
        ("model.decoder.embed_tokens.", "model.decoder.embed_positions.", "model.decoder.project_in."),
        "causal",
    ),
    "falcon": (
        dict(vocab_size=100, hidden_size=16, num_hidden_layers=N, num_attention_heads=2),
        ("transformer.word_embeddings.",),
        "causal",
    ),
    "olmo2": (DECODER, LLAMA_EMB, "causal"),
    "mixtral": ({**DECODER, "num_local_experts": 2, "num_experts_per_tok": 1}, LLAMA_EMB, "causal"),
    "qwen2_moe": (
        {
            **DECODER,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16,
        },
        LLAMA_EMB,
        "causal",
    ),
    "bert": (
        dict(
            vocab_size=100,
            hidden_size=16,
            num_hidden_layers=N,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
        ),
        ("bert.embeddings.",),
        "mlm",
    ),
    "vit": (
        dict(
            hidden_size=16,
            num_hidden_layers=N,
            num_attention_heads=2,
            intermediate_size=32,
            image_size=8,
            patch_size=4,
            num_labels=3,
        ),
        ("vit.embeddings.",),
        "image",
    ),
}


def expected_scale(name, prefixes, tied_name=None, policy="embedding"):
    if name == tied_name:
        return GAMMA ** (N - 1) if policy == "embedding" else 1.0
    m = BLOCK_RE.search(name)
    if m:
        return GAMMA ** (N - 1 - int(m.group(1)))
    return GAMMA ** (N - 1) if name.startswith(prefixes) else 1.0
