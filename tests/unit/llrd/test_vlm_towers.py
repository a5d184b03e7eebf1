"""Vision-language models: a layer-decay schedule per tower, on tiny Qwen2-VL, LLaVA (CLIP, SigLIP), Idefics3 and
Gemma 3 models (tests/tower_families.py): every parameter's LR against the closed form of its tower, depth and factor,
from the optimizer's groups and from first-step weight changes; --freeze-vision; the error paths."""

import pytest
import torch
from tower_families import BASE, FAMILIES, GAMMA, GAMMA_V, PROJ, TEXT, VISION, HiddenTower, M, N, build, expected_lr

from posttrainllm.llrd import BlockStructureError, LLRDArgumentError, apply_freeze, build_param_groups, count_blocks


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_parameter_is_in_one_group_at_its_towers_closed_form(family):
    model = build(family)
    plan = build_param_groups(model, BASE, GAMMA, 0.01, vision_gamma=GAMMA_V, projector_scale=PROJ)
    in_groups = [id(p) for g in plan.groups for p in g["params"]]
    assert sorted(in_groups) == sorted(id(p) for p in model.parameters())  # each exactly once
    lr_by_id = {id(p): g["lr"] for g in plan.groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert lr_by_id[id(p)] == pytest.approx(expected_lr(family, name), rel=1e-12), name
    assert plan.vision["num_layers"] == M and plan.num_layers == N and count_blocks(model) == N


@pytest.mark.parametrize("family", ["qwen2_vl", "llava_clip"])
def test_rows_run_input_to_output_with_each_towers_names_and_lrs(family):
    plan = build_param_groups(build(family), BASE, GAMMA, vision_gamma=GAMMA_V, projector_scale=PROJ)
    rows = {r["block"]: r for r in plan.rows}
    assert [r["depth"] for r in plan.rows] == list(range(N + M + 4))  # rows[d] is depth d, as for a text model
    assert [r["block"] for r in plan.display_order] == [
        "vision.embeddings", *(f"vision.block_{j}" for j in range(M)), "projector",
        "embeddings", *(f"block_{i}" for i in range(N)), "head",
    ]  # fmt: skip
    assert rows["vision.block_0"]["lr"] == pytest.approx(BASE * GAMMA_V ** (M - 1))
    assert rows[f"vision.block_{M - 1}"]["lr"] == pytest.approx(BASE)
    assert rows["projector"]["lr"] == pytest.approx(BASE * PROJ) and rows["projector"]["tower"] == "projector"
    assert rows["block_0"]["lr"] == pytest.approx(BASE * GAMMA ** (N - 1)) and rows["head"]["tower"] == "language"
    assert all(r["n_params"] > 0 for r in plan.rows)
    towers = {g["name"]: g["tower"] for g in plan.to_json()}
    assert towers["vision.block_0"] == "vision" and towers["projector"] == "projector" and towers["head"] == "language"


def test_vision_gamma_defaults_to_gamma_and_the_projector_to_one():
    model = build("llava_clip")
    plan = build_param_groups(model, BASE, GAMMA)
    for name, _ in model.named_parameters():
        assert plan.lr_of(name) == pytest.approx(expected_lr("llava_clip", name, gamma_v=GAMMA, proj=1.0)), name
    assert plan.vision["gamma"] == GAMMA and plan.vision["projector_scale"] == 1.0


@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3"])
def test_first_sgd_step_with_a_unit_gradient_moves_each_weight_by_its_lr(family):
    """SGD, unit gradient, float64: Δw = lr exactly (to rounding), for every tower's parameters."""
    model = build(family).double()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = build_param_groups(model, BASE, GAMMA, vision_gamma=GAMMA_V, projector_scale=PROJ)
    opt = torch.optim.SGD(plan.groups, lr=123.0)  # every group carries its own lr: the default is never used
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    for name, p in model.named_parameters():
        moved = (before[name] - p.detach()).abs()
        assert moved.min().item() == pytest.approx(expected_lr(family, name), rel=1e-9), name
        assert moved.max().item() == pytest.approx(expected_lr(family, name), rel=1e-9), name


def test_first_adamw_step_moves_each_towers_weights_by_about_their_lr():
    """Adam's first step moves an element with gradient g by lr × g / (|g| + eps) ≈ ±lr."""
    model = build("llava_siglip")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = build_param_groups(model, BASE, GAMMA, vision_gamma=GAMMA_V, projector_scale=PROJ)
    opt = torch.optim.AdamW(plan.groups, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen).sign()
    opt.step()
    for name, p in model.named_parameters():
        moved = (before[name] - p.detach()).abs().max().item()
        assert moved == pytest.approx(expected_lr("llava_siglip", name), rel=1e-3), name


@pytest.mark.parametrize("family", ["qwen2_vl", "llava_clip"])
def test_freeze_vision_leaves_the_tower_out_and_unmoved(family):
    model = build(family)
    _, _, vision, projector, _, _ = FAMILIES[family]
    tower = {n for n, _ in model.named_parameters() if n.startswith(vision) and not n.startswith(projector)}
    plan = build_param_groups(model, BASE, GAMMA, freeze_vision=True, projector_scale=PROJ)
    grouped = {n for g in plan.groups for n in plan.param_names[g["name"]]}
    assert not grouped & tower and set(plan.frozen_param_names) == tower
    assert grouped | tower == {n for n, _ in model.named_parameters()}
    assert apply_freeze(plan) == len(tower)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(plan.groups, lr=1.0)
    for p in model.parameters():
        p.grad = torch.ones_like(p) if p.requires_grad else None
    opt.step()
    for name, p in model.named_parameters():
        assert torch.equal(before[name], p.detach()) == (name in tower), name
        assert p.requires_grad == (name not in tower), name
    assert all(r["frozen"] == (r["tower"] == "vision") for r in plan.rows)


def test_projector_scale_zero_freezes_the_projector():
    model = build("idefics3")
    plan = build_param_groups(model, BASE, GAMMA, projector_scale=0.0)
    assert plan.frozen_param_names == ["model.connector.modality_projection.proj.weight"]


def test_min_scale_and_freeze_below_apply_to_the_vision_depths():
    model = build("llava_clip")
    plan = build_param_groups(model, BASE, 1.0, vision_gamma=0.5, min_scale=0.75)
    assert plan.lr_of("model.vision_tower.encoder.layers.0.mlp.fc1.weight") == pytest.approx(BASE * 0.75)
    plan = build_param_groups(model, BASE, 1.0, vision_gamma=0.5, freeze_below=0.75)
    frozen = set(plan.frozen_param_names)
    assert "model.vision_tower.encoder.layers.0.mlp.fc1.weight" in frozen
    assert "model.vision_tower.embeddings.patch_embedding.weight" in frozen
    assert not any(n.startswith("model.vision_tower.encoder.layers.1.") for n in frozen)


def test_lr_groups_compose_with_the_tower_scale():
    model = build("qwen2_vl")
    plan = build_param_groups(model, BASE, GAMMA, vision_gamma=GAMMA_V, lr_groups={r"\.mlp\.fc1\.": 0.5})
    assert plan.lr_of("model.visual.blocks.0.mlp.fc1.weight") == pytest.approx(BASE * GAMMA_V ** (M - 1) * 0.5)
    assert plan.lr_of("model.visual.blocks.1.mlp.fc2.weight") == pytest.approx(BASE)


def test_tied_embeddings_follow_the_policy_in_a_vlm():
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    cfg = LlavaConfig(
        vision_config=dict(VISION, model_type="clip_vision_model"),
        text_config=dict(TEXT, model_type="llama", tie_word_embeddings=True),
        tie_word_embeddings=True,
    )
    model = LlavaForConditionalGeneration(cfg)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    plan = build_param_groups(model, BASE, GAMMA, vision_gamma=GAMMA_V)
    assert plan.tied and plan.tied_lr == pytest.approx(BASE * GAMMA ** (N - 1))
    plan = build_param_groups(model, BASE, GAMMA, vision_gamma=GAMMA_V, tied_policy="head")
    assert plan.tied_lr == pytest.approx(BASE)
    assert sorted(id(p) for g in plan.groups for p in g["params"]) == sorted(id(p) for p in model.parameters())


def test_vision_settings_on_a_text_only_model_name_every_one():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**TEXT))
    with pytest.raises(LLRDArgumentError) as e:
        build_param_groups(model, BASE, GAMMA, vision_gamma=0.8, freeze_vision=True)
    assert e.value.fields == ("vision_gamma", "freeze_vision") and "no vision tower" in str(e.value)
    with pytest.raises(LLRDArgumentError) as e:
        build_param_groups(model, BASE, GAMMA, projector_scale=1.0)
    assert e.value.field == "projector_scale"
    plan = build_param_groups(model, BASE, GAMMA)  # no vision setting: the text plan, no tower rows
    assert plan.vision is None and [r["block"] for r in plan.rows][0] == "embeddings"
    assert "tower" not in plan.to_json()[0]


def test_vision_values_out_of_range_are_argument_errors():
    with pytest.raises(LLRDArgumentError) as e:
        build_param_groups(build("llava_clip"), BASE, GAMMA, vision_gamma=1.5, projector_scale=-1.0)
    assert e.value.fields == ("vision_gamma", "projector_scale")


def test_a_tower_not_found_names_what_was_found_and_the_flag_field():
    model = HiddenTower()
    with pytest.raises(BlockStructureError) as e:
        build_param_groups(model, BASE, GAMMA)
    assert e.value.field == "vision_block_path"
    assert "vision tower not found" in str(e.value) and "vision (2)" in str(e.value) and "language (" in str(e.value)
    # without any decay the structure is not needed: one flat group, with a warning
    flat = build_param_groups(model, BASE, 1.0)
    assert not flat.structure_found and flat.warnings
    # naming the vision blocks: the tower is the highest module above them holding no decoder parameter
    plan = build_param_groups(model, BASE, GAMMA, vision_gamma=GAMMA_V, vision_block_path="vision")
    assert plan.vision["num_layers"] == M and plan.vision["path"] == "vision"
    assert plan.lr_of("vision.0.weight") == pytest.approx(BASE * GAMMA_V ** (M - 1))
    assert plan.lr_of("patch.weight") == pytest.approx(BASE)  # neither tower nor decoder: the projector, factor 1
    assert {r["block"] for r in plan.rows if r["tower"] == "projector"} == {"projector"}


@pytest.mark.parametrize("family", ["qwen2_vl", "llava_clip"])
def test_lora_adapters_train_at_their_towers_lr(family):
    """PEFT wraps the model: adapters in vision blocks, the projector and decoder blocks take their place's LR."""
    from peft import LoraConfig, get_peft_model

    from posttrainllm.llrd import strip_wrappers

    targets = r".*\.(qkv|q_proj|v_proj|linear_1|mlp\.0)$"
    model = get_peft_model(build(family), LoraConfig(r=2, lora_alpha=4, target_modules=targets))
    plan = build_param_groups(model, BASE, GAMMA, vision_gamma=GAMMA_V, projector_scale=PROJ)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    grouped = [n for g in plan.groups for n in plan.param_names[g["name"]]]
    assert sorted(grouped) == sorted(trainable) and len(trainable) > 0
    towers = set()
    for name in trainable:
        plain = strip_wrappers(name)
        assert plan.lr_of(name) == pytest.approx(expected_lr(family, plain)), name
        towers.add(next(g["tower"] for g in plan.groups if name in plan.param_names[g["name"]]))
    assert towers == {"vision", "projector", "language"}


def test_a_wrong_vision_block_path_is_an_argument_error_about_it():
    with pytest.raises(LLRDArgumentError) as e:
        build_param_groups(build("llava_clip"), BASE, GAMMA, vision_block_path="model.no_such_list")
    assert e.value.field == "vision_block_path" and "model.vision_tower.encoder.layers (2)" in str(e.value)
