"""Smoke: TRL's SFTTrainer / DPOTrainer train 2 steps on a tiny Llama on every shape the data package produces."""

from __future__ import annotations

import copy

import pytest
from data_samples import (
    ALPACA,
    MESSAGES,
    PREF_MSGS,
    PREF_STR,
    PROMPT_COMPLETION,
    PROMPT_COMPLETION_MSGS,
    SHAREGPT_PREF,
    write_json,
    write_jsonl,
)

from posttrainllm import data as D

# ---------------------------------------------------------------------------------------------------------------
# Smoke: TRL trainers accept the shapes
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """A tiny model on a shared 2-core machine: extra torch threads only contend (seconds -> milliseconds)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def _common_args(tmp_path):
    return dict(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        learning_rate=1e-3,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        max_length=64,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


@pytest.mark.smoke
@pytest.mark.parametrize("kind", ["alpaca", "messages", "prompt_completion", "prompt_completion_msgs", "replay"])
def test_sft_trainer_accepts_shapes(tmp_path, tokenizer, kind, one_thread):
    import math

    import datasets
    from trl import SFTConfig, SFTTrainer

    rows = {
        "alpaca": ALPACA,
        "replay": ALPACA,
        "messages": MESSAGES,
        "prompt_completion": PROMPT_COMPLETION,
        "prompt_completion_msgs": PROMPT_COMPLETION_MSGS,
    }[kind]
    path = write_jsonl(tmp_path / f"{kind}.jsonl", rows)
    prep = D.prepare_sft(str(path), tokenizer, eval_split=0.25, seed=0)
    train = prep.train
    if kind == "replay":
        train = D.mix_replay(train, datasets.Dataset.from_list([{"text": "Hello world. " * 4}]), 0.4, seed=0)
    model = _tiny_model(tokenizer)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**_common_args(tmp_path)),
        train_dataset=train,
        eval_dataset=prep.eval,
        processing_class=tokenizer,
    )
    # Alpaca / prompt-completion: the loss is on the completion only (prompt tokens labelled -100).
    sample = trainer.train_dataset[0]
    if "prompt" in train.column_names:
        assert -100 in sample["labels"] and any(t != -100 for t in sample["labels"])
    out = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(out.training_loss)
    assert math.isfinite(trainer.evaluate()["eval_loss"])


@pytest.mark.smoke
@pytest.mark.parametrize("kind", ["preference", "preference_msgs", "sharegpt_preference"])
def test_dpo_trainer_accepts_shapes(tmp_path, tokenizer, kind, one_thread):
    import math

    from trl import DPOConfig, DPOTrainer

    if kind == "sharegpt_preference":
        path = write_json(tmp_path / "sgp.json", SHAREGPT_PREF)
    else:
        path = write_jsonl(tmp_path / f"{kind}.jsonl", PREF_STR if kind == "preference" else PREF_MSGS)
    prep = D.prepare_dpo(str(path), tokenizer)
    assert prep.format == kind.removesuffix("_msgs")
    model = _tiny_model(tokenizer)
    trainer = DPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=DPOConfig(**_common_args(tmp_path)),
        train_dataset=prep.train,
        processing_class=tokenizer,
    )
    out = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(out.training_loss)
