"""LLRD on tiny random-init models of many families: every parameter's LR is checked against a scale derived
independently from its name (block index regex + per-family embedding prefixes; everything else is head)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import functools
import re
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from posttrainllm.errors import ModelStructureError
from posttrainllm.llrd import TIED_POLICIES, build_param_groups

BASE, GAMMA, N = 1e-3, 0.8, 3
BLOCK_RE = re.compile(r"(?:layers|h|layer)\.(\d+)\.")
LLAMA_EMB = ("model.embed_tokens.",)
_DECODER = dict(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=N, num_attention_heads=2,
                num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# family -> (config kwargs, embedding-name prefixes, model kind)
FAMILIES = {
    "llama": (_DECODER, LLAMA_EMB, "causal"),
    "qwen2": (_DECODER, LLAMA_EMB, "causal"),
    "qwen3": ({**_DECODER, "head_dim": 8}, LLAMA_EMB, "causal"),
    "mistral": (_DECODER, LLAMA_EMB, "causal"),
    "gemma2": ({**_DECODER, "head_dim": 8, "tie_word_embeddings": True}, LLAMA_EMB, "causal"),
    "phi3": (_DECODER, LLAMA_EMB, "causal"),
    "gpt2": (dict(vocab_size=100, n_embd=16, n_layer=N, n_head=2, n_positions=64),
             ("transformer.wte.", "transformer.wpe."), "causal"),
    "gpt_neox": (_DECODER, ("gpt_neox.embed_in.",), "causal"),
    "opt": (dict(vocab_size=100, hidden_size=16, ffn_dim=32, num_hidden_layers=N, num_attention_heads=2,
                 max_position_embeddings=64, word_embed_proj_dim=8, pad_token_id=0),
            ("model.decoder.embed_tokens.", "model.decoder.embed_positions.", "model.decoder.project_in."), "causal"),
    "falcon": (dict(vocab_size=100, hidden_size=16, num_hidden_layers=N, num_attention_heads=2),
               ("transformer.word_embeddings.",), "causal"),
    "olmo2": (_DECODER, LLAMA_EMB, "causal"),
    "mixtral": ({**_DECODER, "num_local_experts": 2, "num_experts_per_tok": 1}, LLAMA_EMB, "causal"),
    "qwen2_moe": ({**_DECODER, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
                   "shared_expert_intermediate_size": 16}, LLAMA_EMB, "causal"),
    "bert": (dict(vocab_size=100, hidden_size=16, num_hidden_layers=N, num_attention_heads=2, intermediate_size=32,
                  max_position_embeddings=64), ("bert.embeddings.",), "mlm"),
    "vit": (dict(hidden_size=16, num_hidden_layers=N, num_attention_heads=2, intermediate_size=32, image_size=8,
                 patch_size=4, num_labels=3), ("vit.embeddings.",), "image"),
}
TIED_BY_DEFAULT = {"gpt2", "gemma2", "opt", "falcon", "bert"}


@functools.lru_cache(maxsize=None)
def make(family):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageClassification, AutoModelForMaskedLM

    kwargs, _, kind = FAMILIES[family]
    try:
        cfg = AutoConfig.for_model(family, **kwargs)
    except (KeyError, ValueError) as err:
        pytest.skip(f"transformers {transformers.__version__} has no config class for {family!r}: {err}")
    torch.manual_seed(0)
    auto = {"causal": AutoModelForCausalLM, "mlm": AutoModelForMaskedLM, "image": AutoModelForImageClassification}
    return auto[kind].from_config(cfg)


def expected_scale(name, prefixes, tied_name=None, policy="embedding"):
    if name == tied_name:
        return GAMMA ** (N - 1) if policy == "embedding" else 1.0
    m = BLOCK_RE.search(name)
    if m:
        return GAMMA ** (N - 1 - int(m.group(1)))
    return GAMMA ** (N - 1) if name.startswith(prefixes) else 1.0


def lr_by_param(plan):
    return {name: g["lr"] for g in plan.groups for name in plan.param_names[g["name"]]}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_parameter_gets_the_scale_of_its_depth(family):
    model = make(family)
    prefixes = FAMILIES[family][1]
    for policy in TIED_POLICIES:
        plan = build_param_groups(model, BASE, GAMMA, 0.1, tied_policy=policy)
        assert plan.structure_found and plan.num_layers == N, plan.warnings
        lrs = lr_by_param(plan)
        assert sorted(lrs) == sorted(n for n, p in model.named_parameters() if p.requires_grad)
        for name, lr in lrs.items():
            want = BASE * expected_scale(name, prefixes, plan.tied_param_name, policy)
            assert lr == pytest.approx(want, rel=1e-12), (family, policy, name)
        assert all(g["params"] for g in plan.groups) and len(plan.groups) <= 2 * (N + 2)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tied_embeddings_are_detected_and_follow_the_policy(family):
    model = make(family)
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    really_tied = out is not None and out.weight is inp.weight
    assert really_tied == (family in TIED_BY_DEFAULT)
    for policy in TIED_POLICIES:
        plan = build_param_groups(model, BASE, GAMMA, tied_policy=policy)
        assert plan.tied == really_tied
        if not really_tied:
            assert plan.tied_param_name is None and plan.tied_lr is None
            continue
        assert plan.tied_param_name == next(n for n, p in model.named_parameters() if p is inp.weight)
        want = BASE * (GAMMA ** (N - 1) if policy == "embedding" else 1.0)
        assert plan.tied_lr == pytest.approx(want, rel=1e-12)
        assert plan.lr_of(plan.tied_param_name) == pytest.approx(want, rel=1e-12)


def test_opt_final_norm_and_project_out_registered_before_layers_still_go_to_head():
    plan = build_param_groups(make("opt"), BASE, GAMMA)
    for name in ("model.decoder.final_layer_norm.weight", "model.decoder.project_out.weight"):
        assert plan.lr_of(name) == BASE
    assert plan.lr_of("model.decoder.project_in.weight") == pytest.approx(BASE * GAMMA ** (N - 1))


def _lora_llama(**lora_kwargs):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**{**_DECODER, "num_hidden_layers": 4}))
    return get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], **lora_kwargs))


def test_lora_adapters_train_at_their_block_lr_with_n_from_the_base_model():
    model = _lora_llama(layers_to_transform=[2, 3])
    plan = build_param_groups(model, BASE, GAMMA, 0.1)
    assert plan.num_layers == 4 and plan.block_path == "base_model.model.model.layers"
    lrs = lr_by_param(plan)
    assert len(lrs) == 8 and all("lora_A" in n or "lora_B" in n for n in lrs)
    for name, lr in lrs.items():
        i = int(re.search(r"layers\.(\d+)\.", name).group(1))
        assert i in (2, 3)
        assert lr == pytest.approx(BASE * GAMMA ** (4 - 1 - i), rel=1e-12), name
    grouped = {id(p) for g in plan.groups for p in g["params"]}
    assert not any(id(p) in grouped for p in model.parameters() if not p.requires_grad)
    rows = {r["block"]: r for r in plan.rows}
    assert list(rows) == ["embeddings", "block_0", "block_1", "block_2", "block_3", "head"]
    for idle in ("embeddings", "block_0", "block_1", "head"):
        assert rows[idle]["n_params"] == 0 and not rows[idle]["trainable"]
    assert rows["block_2"]["trainable"] and rows["block_2"]["n_tensors"] == 4


def test_lora_modules_to_save_head_copy_trains_at_base_lr():
    model = _lora_llama(modules_to_save=["lm_head"])
    plan = build_param_groups(model, BASE, GAMMA)
    head_copies = [n for n in lr_by_param(plan) if "lm_head" in n]
    assert head_copies and all(plan.lr_of(n) == BASE for n in head_copies)


class _Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)


class PythonListBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=3)
        self.embed = nn.Embedding(10, 8)
        self.blocks_py = [_Blk() for _ in range(3)]  # not registered: invisible to named_modules
        self.head = nn.Linear(8, 10)


class ModuleDictBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.stages = nn.ModuleDict({f"s{i}": _Blk() for i in range(3)})
        self.heads = nn.ModuleList([nn.Linear(8, 10), nn.Linear(8, 2)])


@pytest.mark.parametrize("cls", [PythonListBlocks, ModuleDictBlocks])
def test_unknown_architecture_raises_model_structure_error(cls):
    with pytest.raises(ModelStructureError, match="--llrd-blocks") as exc:
        build_param_groups(cls(), BASE, GAMMA)
    assert cls.__name__ in str(exc.value) and "embed.weight" in str(exc.value)
