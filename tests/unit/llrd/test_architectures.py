"""LLRD on tiny random-init models of many families: every parameter's LR is checked against a scale derived
independently from its name (block index regex + per-family embedding prefixes; everything else is head)."""

import functools
import re
from types import SimpleNamespace

import pytest
import torch
from families import BASE, DECODER, FAMILIES, GAMMA, N, expected_scale
from torch import nn

from posttrainllm.llrd import TIED_POLICIES, BlockStructureError, build_param_groups

TIED_BY_DEFAULT = {"gpt2", "gemma2", "opt", "falcon", "bert"}


@functools.cache
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
    base = LlamaForCausalLM(LlamaConfig(**{**DECODER, "num_hidden_layers": 4}))
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
def test_unknown_architecture_raises_block_structure_error(cls):
    with pytest.raises(BlockStructureError) as exc:
        build_param_groups(cls(), BASE, GAMMA)
    assert cls.__name__ in str(exc.value) and "embed.weight" in str(exc.value)


# ------------------------------------------------------------------------------ hierarchical (ConvNeXt / Swin) models
def _hf_convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(0)
    cfg = ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 2, 3, 1], image_size=32, num_labels=3)
    return ConvNextForImageClassification(cfg), "convnext.encoder.stages", "layers", "downsampling_layer"


def _hf_swin():
    from transformers import SwinConfig, SwinForImageClassification

    torch.manual_seed(0)
    cfg = SwinConfig(
        image_size=32,
        patch_size=4,
        embed_dim=8,
        depths=[2, 2, 4, 2],
        num_heads=[1, 1, 2, 2],
        window_size=2,
        num_labels=3,
    )
    return SwinForImageClassification(cfg), "swin.encoder.layers", "blocks", "downsample"


class _ConvBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.pw = nn.Linear(c, c)


class _Stage(nn.Module):
    """timm convnext layout: the downsample is registered BEFORE the blocks of its stage."""

    def __init__(self, c_in, c, depth):
        super().__init__()
        self.downsample = nn.Sequential(nn.LayerNorm(c_in), nn.Conv2d(c_in, c, 2, 2))
        self.blocks = nn.Sequential(*[_ConvBlock(c) for _ in range(depth)])


class TimmLikeConvNeXt(nn.Module):
    def __init__(self, depths=(2, 2, 3, 2), dims=(8, 8, 16, 16)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), nn.LayerNorm(dims[0]))
        self.stages = nn.Sequential(*[_Stage(dims[max(i - 1, 0)], dims[i], d) for i, d in enumerate(depths)])
        self.norm = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], 5)


def _stage_blocks(name, stage_list, block_list, extra):
    """(stage, block-in-stage) from a parameter name; block None for stage-level parameters (e.g. downsample)."""
    m = re.search(rf"{re.escape(stage_list)}\.(\d+)\.(?:{block_list}\.(\d+)|{extra})\.", name)
    if not m:
        return None
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)


@pytest.mark.parametrize(
    "build", [_hf_convnext, _hf_swin, lambda: (TimmLikeConvNeXt(), "stages", "blocks", "downsample")]
)
def test_hierarchical_models_get_depth_over_the_concatenated_stage_blocks(build):
    model, stage_list, block_list, extra = build()
    stages = dict(model.named_modules())[stage_list]
    depths = [len(getattr(s, block_list)) for s in stages]
    n = sum(depths)
    offset = [sum(depths[:i]) for i in range(len(depths))]
    order = [name for name, _ in stages[1].named_children()]
    downsample_first = order.index(extra) < order.index(block_list)
    plan = build_param_groups(model, BASE, GAMMA, 0.1)
    assert plan.structure_found and plan.hierarchical and plan.num_layers == n
    lrs = lr_by_param(plan)
    assert sorted(lrs) == sorted(name for name, _ in model.named_parameters())
    for name, lr in lrs.items():
        where = _stage_blocks(name, stage_list, block_list, extra)
        if where is None:  # stem / embeddings before the stages, final norm and classifier after them
            before = name.split(".")[0] in ("stem",) or ".embeddings." in name
            want = GAMMA ** (n - 1) if before else 1.0
        else:
            stage, block = where
            if block is None:
                block = 0 if downsample_first else depths[stage] - 1
            want = GAMMA ** (n - 1 - (offset[stage] + block))
        assert lr == pytest.approx(BASE * want, rel=1e-12), name


def test_a_block_list_holding_a_small_share_of_the_model_is_refused_not_silently_used():
    class Lopsided(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(64, 64)  # most of the compute, in no list
            self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
            self.head = nn.Linear(4, 2)

    with pytest.raises(BlockStructureError, match="ambiguous block structure.*blocks"):
        build_param_groups(Lopsided(), BASE, GAMMA)
    plan = build_param_groups(Lopsided(), BASE, 1.0)  # flat: the structure is not needed
    assert not plan.structure_found and any("ambiguous" in w for w in plan.warnings)
    assert build_param_groups(Lopsided(), BASE, GAMMA, block_path="blocks").num_layers == 3  # named: trusted


def test_t5_style_blocks_of_different_sublayers_are_not_taken_for_stages():
    class SelfAttn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(8, 8)

    class FF(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi = nn.Linear(8, 16)

    class T5Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.ModuleList([SelfAttn(), FF()])

    class T5Like(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(num_layers=4)
            self.shared = nn.Embedding(10, 8)
            self.block = nn.ModuleList([T5Block() for _ in range(4)])
            self.final_layer_norm = nn.LayerNorm(8)

    plan = build_param_groups(T5Like(), BASE, GAMMA)
    assert not plan.hierarchical and plan.num_layers == 4 and plan.block_path == "block"
    assert plan.lr_of("block.0.layer.1.wi.weight") == pytest.approx(BASE * GAMMA**3)


# ------------------------------------------------------------------------------------------ weight decay, ViT style
def test_vit_token_and_position_tensors_get_no_weight_decay():
    model = make("vit")
    plan = build_param_groups(model, BASE, GAMMA, 0.05)
    decayed = {n for g in plan.groups if g["weight_decay"] > 0 for n in plan.param_names[g["name"]]}
    assert "vit.embeddings.cls_token" not in decayed and "vit.embeddings.position_embeddings" not in decayed
    assert "vit.embeddings.patch_embeddings.projection.weight" in decayed  # a conv kernel: decays
    assert plan.lr_of("vit.embeddings.cls_token") == pytest.approx(BASE * GAMMA ** (N - 1))


def test_a_models_own_no_weight_decay_list_is_honoured():
    class TimmStyle(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(num_hidden_layers=2)
            self.register_token = nn.Parameter(torch.zeros(1, 4, 8))
            self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
            self.head = nn.Linear(8, 3)

        def no_weight_decay(self):
            return {"register_token"}

    plan = build_param_groups(TimmStyle(), BASE, GAMMA, 0.05)
    assert "register_token" in plan.param_names["embeddings.no_decay"]
    assert "blocks.0.weight" in plan.param_names["block_0"]
