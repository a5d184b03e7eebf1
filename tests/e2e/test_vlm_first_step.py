"""One real training step of a tiny LLaVA (CLIP tower) on a drawn image, through transformers' Trainer with the
LLRD mixin: Adam's first step moves each element with a gradient by about its group's LR, so max|ΔW| of every
tensor that moved equals the closed form of its tower, depth and factor (tests/tower_families.py)."""

import pytest
import torch
from tower_families import BASE, GAMMA, GAMMA_V, PROJ, TEXT, VISION, expected_lr

IMAGE_TOKEN = TEXT["vocab_size"] - 1


def _llava():
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    cfg = LlavaConfig(
        vision_config=dict(VISION, model_type="clip_vision_model"),
        text_config=dict(TEXT, model_type="llama"),
        image_token_index=IMAGE_TOKEN,
        vision_feature_layer=-1,  # the last vision block feeds the projector, so every block gets a gradient
    )
    torch.manual_seed(0)
    return LlavaForConditionalGeneration(cfg)


def _example():
    """A drawn 28×28 image (a bright square on a dark field: 4 patches of 14, so 4 image tokens) and a caption."""
    pixels = torch.full((3, 28, 28), -1.0)
    pixels[:, 4:20, 8:24] = 1.0
    ids = torch.tensor([1, *[IMAGE_TOKEN] * 4, 5, 6, 7, 8, 9, 10, 2])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels, "labels": ids.clone()}


def test_first_trainer_step_moves_each_towers_weights_by_their_lr(tmp_path):
    from transformers import Trainer, TrainingArguments

    from posttrainllm.llrd import build_param_groups
    from posttrainllm.training.mixins import LLRDMixin

    class LLRDTrainer(LLRDMixin, Trainer):
        pass

    torch.set_num_threads(1)
    model = _llava()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = build_param_groups(model, BASE, GAMMA, vision_gamma=GAMMA_V, projector_scale=PROJ)
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, learning_rate=BASE, per_device_train_batch_size=2, weight_decay=0.0,
        lr_scheduler_type="constant", optim="adamw_torch", report_to=[], save_strategy="no", use_cpu=True,
        logging_strategy="no", max_grad_norm=0.0, adam_epsilon=1e-30,  # ε ≪ |g|: Δw = ±lr wherever g ≠ 0
    )  # fmt: skip
    trainer = LLRDTrainer(model=model, args=args, train_dataset=[_example(), _example()], llrd_plan=plan)
    trainer.train()
    moved, still = {}, []
    for name, p in model.named_parameters():
        change = (p.detach() - before[name]).abs().max().item()
        if change > 0:
            moved[name] = change
        else:
            still.append(name)
    for name, change in moved.items():
        assert change == pytest.approx(expected_lr("llava_clip", name), rel=1e-3), name
    # what did not move had no gradient: CLIP's post-norm (it normalizes the pooled output only)
    assert set(still) <= {"model.vision_tower.post_layernorm.weight", "model.vision_tower.post_layernorm.bias"}
    prefixes = (
        "model.vision_tower.encoder.layers.0.",
        "model.vision_tower.encoder.layers.1.",
        "model.vision_tower.embeddings.",
        "model.multi_modal_projector.",
        "model.language_model.layers.0.",
    )
    assert all(any(n.startswith(pre) for n in moved) for pre in prefixes)
